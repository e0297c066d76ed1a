// Package cuda implements backend.Backend on an NVIDIA GPU through the
// kernels of libmkernel (package kernels, loaded with purego: no cgo).
//
// Design (a first, exact version; speed is later work):
//   - Weights are uploaded once in their precision: BF16 tensors as bf16,
//     F32/F16 tensors as float32. A norm or bias that needs float32 widens a
//     bf16 weight once on the device and keeps the copy with the tensor.
//   - Activations are float32 on the device, so the residual stream keeps
//     float32 precision.
//   - GEMMs (Linear, MLP, MoE experts and router) follow the weight: a weight
//     with float32 memory (F32/F16 checkpoints) runs a full-FP32 cuBLAS GEMM
//     on the float32 activations (no TF32, no rounding anywhere); a bf16
//     weight runs bf16 GEMMs with float32 accumulation and output. With
//     Options.SplitActivations (the default) the activation x is split into
//     hi = bf16(x) and lo = bf16(x − hi) and C = hi·Wᵀ + lo·Wᵀ (two GEMMs, the
//     second accumulating into C), which keeps ~16 bits of x's mantissa; with
//     it off, x is rounded to bf16 once (half the GEMM work, ~3 significant
//     digits).
//   - Attention keeps a paged KV pool per layer (InitKV), bf16 or float32
//     (Options.KVCacheF32), read in place through the block tables: the
//     bf16 pool by the paged attention kernels of decode.cu (split-KV for
//     long contexts, tensor cores for large GQA groups), the float32 pool
//     by the exact float32 kernel. Spans without a block table use a
//     private pool of 16-token blocks per sequence that grows on demand.
//   - MoE, when the expert weights are bf16 and activations are not split
//     (the fast profile): router GEMM (always with split activations:
//     discrete choices flip on rounded near-ties), routing on the device
//     (kernels.MoERoute, moe.Route's semantics), grouped expert GEMMs with
//     the activation in GEMM1's epilogue and a deterministic combine
//     (kernels.MoEExpertsRun); no host synchronisation. Otherwise (split
//     activations, float32 experts) the exact path: routing on the host with
//     moe.Route, two GEMMs per expert, scatter-add. Expert loads are counted
//     on the device and read by TakeExpertLoad.
//   - Sample (backend.Sampler) picks tokens on the device (sample.cu).
//
// Errors: New and Weight return errors (New's wrap kernels.ErrUnavailable
// when there is no GPU or libmkernel.so). The ops have no error result; like
// the CPU backend they panic, naming the op, on programming errors of the
// caller (foreign tensors, shapes that do not fit, out-of-range ids or rows,
// a batch that does not match the KV cache), and also when the device fails
// (out of memory, a CUDA error), which they cannot report otherwise.
//
// Every device call runs on the GPU's owning goroutine (kernels.GPU.Do), so
// a Backend is safe for concurrent use; the work is serialized.
//
//   - Decode steps of the fast profile run as CUDA graphs (graph.go,
//     GraphStep); context-parallel spans as ring attention over emulated
//     ranks (ring.go).
//   - With Options.EPRanks > 1 the MoE layers run on emulated
//     expert-parallel ranks through the fused kernel (moe_fused.go), and
//     the backend is a backend.ExpertPlacer: the engine's rebalancer may
//     give a layer another placement (moe_place.go: per-rank copies of
//     the experts, replicas of hot ones), installed between steps.
//
// Verification status (H200, 2026-11-29; kernels/README.md and
// docs/PERF.md): op, engine, sampling, MoE, graph and ring tests pass;
// TestGolden passes all six families in the exact profile (logits relative
// L2 to transformers' float32 1e-6 to 3e-5, argmax 40/40) and in the fast
// profiles, whose bound is relaxed where bf16 rounding flips a router
// near-tie (deepseek_v3: 8.6e-2 with the bf16 KV cache, routing differs).
package cuda

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/tensor"
	"github.com/mkserve/mkserve/transport"
	"github.com/mkserve/mkserve/tuning"
)

// Options configures a Backend.
type Options struct {
	// Device is the CUDA device ordinal (0 for the first GPU).
	Device int
	// EPRanks > 1 runs every MoE layer as that many expert-parallel ranks
	// emulated on this GPU (at most kernels.MoEFusedMaxRanks), through the
	// fused MoE kernel: it needs MoEPath "fused" and the fast profile.
	EPRanks int
	// MoEPath is "grouped" (the default: routing, grouped expert GEMMs and
	// combine as separate launches) or "fused" (kernels.MoEFused, one
	// persistent launch per layer); empty reads MKSERVE_MOE_PATH.
	MoEPath string
	// MoETuning, when set, gives the fused MoE kernel's launch choices
	// (persistent and dispatch CTAs) measured for this device and shape
	// (`mkserve bench moe --tune`); unset shapes use the kernel's defaults.
	MoETuning *tuning.MoETable
	// SplitActivations (nil means true) runs every GEMM against a bf16
	// weight as two bf16 GEMMs on the hi and lo bf16 halves of the float32
	// activations, so activations keep ~16 bits of mantissa instead of 8.
	// Cost: twice the GEMM work and weight reads for bf16 weights, plus a
	// split pass. false is the fast mode: one GEMM on bf16-rounded
	// activations. GEMMs against float32 weights are full FP32 either way.
	SplitActivations *bool
	// KVCacheF32 (nil means the same as SplitActivations) keeps the KV
	// cache in float32 and attends with the exact float32 kernel; false
	// keeps it in bf16 (half the memory and bytes per decode step, keys and
	// values rounded once) and attends with the paged bf16 kernels. The two
	// together make the precision profiles: exact (split, float32 KV; the
	// default) and fast (bf16 activations into GEMMs, bf16 KV).
	KVCacheF32 *bool
	// World, when set, makes this backend one rank of an expert-parallel
	// world of processes (world.go): each MoE layer's experts are split in
	// contiguous blocks over the ranks and their partial outputs summed
	// through CUDA IPC. Every rank must make the same calls (dist mirrors
	// rank 0's); Device should be the rank's own GPU. Not with EPRanks > 1
	// or the fused MoE path.
	World transport.Comm
	// WorldTransport is how the world's ranks sum their partial outputs:
	// "ipc" (the default: kernels.AllReduceSumF32 through CUDA IPC
	// workspaces, captured in decode graphs) or "nccl" (the fallback:
	// NCCL's all-reduce, libnccl loaded at run time; decode graphs off).
	WorldTransport string
	// NoGraphs runs every step eagerly (no CUDA graphs for decode steps;
	// see GraphStep). The environment variable MKSERVE_CUDA_GRAPHS=0 does
	// the same for every backend of the process.
	NoGraphs bool
	// Weights is how expert matrices are held (WeightsAuto when empty; see
	// fp4.go): WeightsStored keeps every weight as the checkpoint gives it
	// (bf16); WeightsFP4 holds an MXFP4 checkpoint's experts as FP4 (4.25
	// bits a value, exact); WeightsAuto does so when their bf16 form would
	// take more than 60 % of the GPU's memory (gpt-oss-120b on an H200, not
	// gpt-oss-20b). The fast profile's FP4 experts read x rounded to bf16;
	// the exact profile's run an expert at a time dequantized (moeHost).
	Weights string
}

// Backend is the CUDA backend. The zero value is not usable; call New.
type Backend struct {
	g           *kernels.GPU
	alloc       *allocator
	split       bool            // Options.SplitActivations
	kvF32       bool            // Options.KVCacheF32
	noGraphs    bool            // Options.NoGraphs
	slowReplays bool            // every replay runs the model's Go code again (tests; GraphFastEnv for everyone)
	moePath     string          // "grouped" or "fused" (Options.MoEPath)
	weights     string          // Options.Weights (parsed: never empty)
	fp4Held     atomic.Int64    // weights uploaded as FP4
	held        [3]atomic.Int64 // bytes of the weights made: float32, bf16, FP4 (codes and scales)
	fp4Auto     atomic.Bool     // PlanExperts: WeightsAuto holds this model's MXFP4 experts as FP4
	epRanks     int             // emulated expert-parallel ranks of the fused path (≥ 1)
	moeTuning   *tuning.MoETable
	fused       fusedState
	world       *world // Options.World, or nil

	ropeMu sync.Mutex
	ropes  map[attention.RoPE]*ropeFreqs
	// decodeFit remembers kernels.PagedDecodeFits per (heads, kv heads,
	// head dims, rotation dims); under ropeMu.
	decodeFit map[[5]int]bool
	attnMemo  attnMemo // the paged attention group every layer of a step shares (be.kvMu)
	posCache  i32Cache // RoPE positions: every layer (q and k) of a step sends the same
	// stepArrays: the int32 arrays every layer of a step sends alike
	// (flashSpans' span records, worldCPAttention's block tables and chunk
	// records, a span each), uploaded once a step.
	stepArrays i32Caches

	kvMu  sync.Mutex
	paged *pagedKV   // after InitKV
	priv  *privateKV // unpaged spans

	gr   graphState // CUDA graphs of decode steps (graph.go)
	st   stamps     // per-op clock stamps of captured steps (stamps.go)
	feed feedState  // overlapped decode: sampling picks kept on the device (feed.go)

	load      backend.ExpertLoad // host-routed MoE layers' expert counts
	moe       moeDevState        // device-routed MoE layers' expert counters
	layer     layerState         // the persistent decode layer's counters and shapes (layer.go)
	layerMode int8               // 0: LayerEnv decides (off unless 1); 1: layer kernel on; -1: off (tests)
	prof      opProfile          // ProfileOps
}

var (
	_ backend.Backend       = (*Backend)(nil)
	_ backend.ExpertCounter = (*Backend)(nil)
	_ backend.ExpertPlacer  = (*Backend)(nil)
	_ backend.KVAllocator   = (*Backend)(nil)
	_ backend.StepGrapher   = (*Backend)(nil)
)

// DirectEnv names the environment variable that, set to 1, runs the GPU
// calls on the calling goroutines instead of handing each to the GPU's
// owning goroutine (kernels.GPU.SetDirect; experimental, off by default).
const DirectEnv = "MKSERVE_GPU_DIRECT"

// The process opens each GPU once (libmkernel keeps its context on the
// owning thread); every Backend on that device shares it.
var (
	gpuMu sync.Mutex
	gpus  = map[int]*kernels.GPU{}
)

func openGPU(ordinal int) (*kernels.GPU, error) {
	gpuMu.Lock()
	defer gpuMu.Unlock()
	if g := gpus[ordinal]; g != nil {
		return g, nil
	}
	g, err := kernels.Open(ordinal)
	if err != nil {
		return nil, err
	}
	if os.Getenv(DirectEnv) == "1" {
		if err := g.SetDirect(true); err != nil {
			return nil, err
		}
	}
	gpus[ordinal] = g
	return g, nil
}

// New opens the GPU (once per process and device) and returns a backend on
// it. Errors meaning the machine cannot run CUDA wrap kernels.ErrUnavailable.
func New(opts Options) (*Backend, error) {
	path, err := moePath(opts.MoEPath)
	if err != nil {
		return nil, err
	}
	split0 := opts.SplitActivations == nil || *opts.SplitActivations
	switch {
	case opts.EPRanks > kernels.MoEFusedMaxRanks:
		return nil, fmt.Errorf("cuda: expert parallelism over %d ranks: the fused MoE kernel takes at most %d", opts.EPRanks, kernels.MoEFusedMaxRanks)
	case opts.EPRanks > 1 && (path != "fused" || split0):
		return nil, fmt.Errorf("cuda: expert parallelism (EPRanks = %d) runs through the fused MoE kernel: it needs MoE path fused (%s=fused) and the fast profile", opts.EPRanks, MoEPathEnv)
	case opts.World != nil && (opts.EPRanks > 1 || path == "fused"):
		return nil, fmt.Errorf("cuda: a world of processes runs the MoE layers on the grouped or host path: not with emulated ranks (EPRanks = %d) or MoE path %s", opts.EPRanks, path)
	}
	var wd *world
	if opts.World != nil {
		if wd, err = newWorld(opts.World, opts.WorldTransport); err != nil {
			return nil, err
		}
	}
	g, err := openGPU(opts.Device)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	if wd != nil && wd.kind == "nccl" {
		// Every rank makes its communicator here (a collective).
		ctx, cancel := context.WithTimeout(context.Background(), worldTimeout)
		wd.nccl, err = kernels.NewNCCLComm(ctx, g, opts.World)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("cuda: the world's NCCL transport: %w", err)
		}
		opts.NoGraphs = true // NCCL's collectives are not captured here
	}
	split := opts.SplitActivations == nil || *opts.SplitActivations
	weights, err := parseWeights(opts.Weights)
	if err != nil {
		return nil, err
	}
	kvF32 := split
	if opts.KVCacheF32 != nil {
		kvF32 = *opts.KVCacheF32
	}
	return &Backend{g: g, alloc: newAllocator(largePoolMax(g.Info().TotalMem)), split: split, kvF32: kvF32, noGraphs: opts.NoGraphs,
		moePath: path, epRanks: max(opts.EPRanks, 1), moeTuning: opts.MoETuning, world: wd, weights: weights,
		ropes: map[attention.RoPE]*ropeFreqs{}, priv: newPrivateKV()}, nil
}

// Name is "cuda".
func (be *Backend) Name() string { return "cuda" }

// Info describes the GPU.
func (be *Backend) Info() kernels.DeviceInfo { return be.g.Info() }

// ---- tensors ----

// Tensor is the CUDA backend's tensor: 1-D or 2-D, row-major, in device
// memory as float32 and/or bf16 (see the package doc). Tensors are
// immutable once made; their memory returns to the backend's pool when the
// Go value is collected.
type Tensor struct {
	shape  []int
	st     *store
	parent *Tensor // a view's owner, kept alive (its cleanup frees the memory)
}

// store is a tensor's device memory; views are made on demand.
type store struct {
	n      int             // elements
	f32    *kernels.Buffer // [n] float32, or nil
	bf16   *kernels.Buffer // [n] bf16, or nil
	fp4    *kernels.FP4    // an expert weight held as FP4 (fp4.go), or nil
	weight bool            // made by Weight: lives across steps
	pooled bool            // a cleanup pools every buffer it holds when its tensor dies
	// released: Release took its buffers back before its tensor died; any
	// later use is a caller's error (tensorOf panics naming the op).
	released bool
}

// Shape returns a copy of the tensor's dimensions.
func (t *Tensor) Shape() []int { return slices.Clone(t.shape) }

func (t *Tensor) dims() (rows, cols int) {
	if len(t.shape) == 1 {
		return 1, t.shape[0]
	}
	return t.shape[0], t.shape[1]
}

// wrap makes a tensor of st and arranges for its memory to be pooled again
// when the tensor dies, except in a graph replay: there every buffer is the
// arena's (tapeGet), whose put is a no-op, and a cleanup per tensor (about
// 1200 a Qwen3-30B-A3B step) was most of the replay's garbage-collector work.
func (be *Backend) wrap(shape []int, st *store) *Tensor {
	t := &Tensor{shape: shape, st: st}
	if be.graphMode() != graphReplaying {
		a := be.alloc
		st.pooled = true
		runtime.AddCleanup(t, func(s *store) {
			a.put(s.f32)
			a.put(s.bf16)
			if s.fp4 != nil {
				a.put(s.fp4.Codes)
				a.put(s.fp4.Scales)
			}
		}, st)
	}
	return t
}

// attach makes b (from be.alloc) part of t's store in field *dst: pooled
// with the rest when t dies, or, for a store wrapped in a replay (no
// cleanup), by a cleanup of its own unless b is an arena buffer of a replay
// too.
func (be *Backend) attach(t *Tensor, dst **kernels.Buffer, b *kernels.Buffer) {
	*dst = b
	if t.st.pooled || be.graphMode() == graphReplaying {
		return
	}
	runtime.AddCleanup(t, be.alloc.put, b)
}

// newF32 allocates a [rows, cols] float32 tensor (contents undefined).
func (be *Backend) newF32(d *kernels.Device, rows, cols int) *Tensor {
	b := be.alloc.get(d, int64(rows)*int64(cols)*4)
	return be.wrap([]int{rows, cols}, &store{n: rows * cols, f32: b})
}

// newBF16 allocates a [rows, cols] tensor held in bf16 only (contents
// undefined): its bf16 values are the tensor; f32 converts on first use.
func (be *Backend) newBF16(d *kernels.Device, rows, cols int) *Tensor {
	b := be.alloc.get(d, int64(rows)*int64(cols)*2)
	return be.wrap([]int{rows, cols}, &store{n: rows * cols, bf16: b})
}

// f32 returns t's float32 memory, converting from bf16 once.
func (be *Backend) f32(d *kernels.Device, t *Tensor) *kernels.Buffer {
	if t.st.f32 == nil {
		if t.st.weight {
			be.graphGuard("a float32 copy of a weight")
		}
		be.fp4Values(d, t)
		b := be.alloc.get(d, int64(t.st.n)*4)
		if t.st.n > 0 {
			must("convert", d.ConvertBF16ToF32(nil, b, t.st.bf16, t.st.n))
		}
		be.attach(t, &t.st.f32, b)
	}
	return t.st.f32
}

// memoOK reports whether t may keep its bf16 rounding with it: a float32
// activation made by wrap (its cleanup pools st.bf16 too), not a view.
func memoOK(t *Tensor) bool { return t.st.f32 != nil && !t.st.weight && t.parent == nil }

// bf16Of is activation t [n] rounded to bf16 (RN), converted once and kept
// with t (tensors are immutable), so that the GEMMs and kernels that read
// one activation in bf16 (q, k and v from one normed row; the MoE router's
// split and the experts) share one conversion. temp reports a buffer the
// caller puts back (t cannot keep it: a view).
func (be *Backend) bf16Of(d *kernels.Device, t *Tensor) (b *kernels.Buffer, temp bool) {
	if t.st.bf16 != nil {
		return t.st.bf16, false
	}
	b = be.alloc.get(d, int64(t.st.n)*2)
	if t.st.n > 0 {
		must("convert", d.ConvertF32ToBF16(nil, b, t.st.f32, t.st.n))
	}
	if !memoOK(t) {
		return b, true
	}
	be.attach(t, &t.st.bf16, b)
	return b, false
}

// ---- GEMMs ----

// weightMem is a GEMM weight's memory and whether it is float32 (then the
// GEMM is full FP32) or bf16.
func weightMem(t *Tensor) (b *kernels.Buffer, isF32 bool) {
	if t.st.f32 != nil {
		return t.st.f32, true
	}
	return t.st.bf16, false
}

// gemmIn is a float32 activation [rows, K] prepared for GEMMs against one
// kind of weight: f32 for a float32 weight; hi (and lo when splitting) for a
// bf16 weight.
type gemmIn struct {
	f32, hi, lo *kernels.Buffer
	owned       bool // hi and lo return to the pool in release
}

// prepare readies x [n values] for GEMMs against float32 (wF32) or bf16 weights.
func (be *Backend) prepare(d *kernels.Device, x *kernels.Buffer, n int, wF32 bool) gemmIn {
	return be.prepareMode(d, x, n, wF32, be.split)
}

// prepareMode is prepare with the activation split chosen by the caller.
func (be *Backend) prepareMode(d *kernels.Device, x *kernels.Buffer, n int, wF32, split bool) gemmIn {
	if wF32 {
		return gemmIn{f32: x}
	}
	in := gemmIn{hi: be.alloc.get(d, int64(n)*2), owned: true}
	if split {
		in.lo = be.alloc.get(d, int64(n)*2)
		must("split", d.SplitBF16(nil, in.hi, in.lo, x, n))
	} else {
		must("convert", d.ConvertF32ToBF16(nil, in.hi, x, n))
	}
	return in
}

// rows is the view of rows [r0, r0+n) of an input with K columns.
func (in gemmIn) rows(r0, n, K int) gemmIn {
	v := func(b *kernels.Buffer, size int64) *kernels.Buffer {
		if b == nil {
			return nil
		}
		return view(b, int64(r0*K)*size, int64(n*K)*size)
	}
	return gemmIn{f32: v(in.f32, 4), hi: v(in.hi, 2), lo: v(in.lo, 2)}
}

// release returns the bf16 halves to the pool.
func (be *Backend) release(in gemmIn) {
	if in.owned {
		be.alloc.put(in.hi)
		be.alloc.put(in.lo)
	}
}

// gemm writes c [T, N] (float32) = in [T, K] · w [N, K]ᵀ; w is float32 when
// in was prepared for a float32 weight, else bf16.
func (be *Backend) gemm(d *kernels.Device, c *kernels.Buffer, in gemmIn, w *kernels.Buffer, T, N, K int) {
	if in.lo == nil && in.hi != nil { // a bf16 activation against a bf16 weight
		switch {
		case pickGemv(in.hi, w, T, K): // one or two rows: the GEMV streams w
			must("Gemv", d.GemvBF16(nil, c, in.hi, w, T, N, K))
			return
		case pickSkinny(in.hi, w, T, N, K): // a few to 64 rows: the expert GEMM's weight-streaming tiles
			ws, err := d.SkinnyWorkspace(T, N, K)
			must("GemmSkinny", err)
			var work *kernels.Buffer
			if ws > 0 {
				work = be.alloc.get(d, ws)
				defer be.alloc.put(work)
			}
			must("GemmSkinny", d.GemmSkinnyBF16(nil, c, in.hi, w, nil, work, T, N, K))
			return
		}
	}
	if in.f32 != nil {
		must("GemmF32", d.GemmF32(nil, c, in.f32, w, T, N, K))
		return
	}
	must("Gemm", d.Gemm(nil, c, kernels.F32, in.hi, w, T, N, K))
	if in.lo != nil {
		must("GemmAdd", d.GemmAdd(nil, c, kernels.F32, in.lo, w, T, N, K))
	}
}

// view is bytes [off, off+n) of b (must succeed).
func view(b *kernels.Buffer, off, n int64) *kernels.Buffer {
	v, err := b.View(off, n)
	must("view", err)
	return v
}

// upload copies host values into a fresh pooled buffer (freed with put).
func upload[T kernels.Elem](be *Backend, d *kernels.Device, v []T) *kernels.Buffer {
	var z T
	b := be.alloc.get(d, int64(len(v))*int64(sizeOf(z)))
	must("upload", kernels.Upload(d, b, v))
	return b
}

func sizeOf[T kernels.Elem](T) int {
	var z T
	switch any(z).(type) {
	case uint8, int8:
		return 1
	case uint16, int16:
		return 2
	case uint64, int64, float64:
		return 8
	}
	return 4
}

// do runs f on the GPU goroutine; a device error panics naming op. keep
// lists tensors whose memory f uses, kept alive until f has run.
func (be *Backend) do(op string, f func(d *kernels.Device) error, keep ...any) {
	var t0 time.Time
	prof := be.prof.enabled()
	if prof {
		t0 = time.Now()
	}
	var err error
	switch be.graphMode() {
	case graphReplaying:
		err = be.doReplay(f)
	case graphCapturing:
		err = be.g.Do(be.stamped(op, f))
	default:
		err = be.g.Do(f)
	}
	if prof {
		be.prof.record(op, time.Since(t0))
	}
	runtime.KeepAlive(keep)
	if err != nil {
		panicf(op, "%v", err)
	}
}

// panicf reports a programming error of the caller (or a device failure).
func panicf(op, format string, args ...any) {
	panic(fmt.Sprintf("cuda.%s: %s", op, fmt.Sprintf(format, args...)))
}

// must panics (inside GPU.Do: Do turns it into an error) on a device error.
func must(what string, err error) {
	if err != nil {
		panic(fmt.Sprintf("%s: %v", what, err))
	}
}

func tensorOf(op, name string, x backend.Tensor) *Tensor {
	t, ok := x.(*Tensor)
	if !ok || t == nil {
		panicf(op, "%s is %T, want a non-nil *cuda.Tensor", name, x)
	}
	if t.st.released || (t.parent != nil && t.parent.st.released) {
		panicf(op, "%s was released (Backend.Release) and is used again", name)
	}
	return t
}

// ReleaseEnv names the environment variable that, set to 0, makes Release
// do nothing (tensors then return to the pool only when collected: the
// behaviour before the twenty-seventh pass, for comparisons).
const ReleaseEnv = "MKSERVE_RELEASE"

var releaseOn = sync.OnceValue(func() bool { return os.Getenv(ReleaseEnv) != "0" })

// Release implements backend.Releaser: the tensors' buffers go back to the
// pool now, on the GPU goroutine after the work queued before (which still
// reads them: all work runs in order on one stream). Only outside graph
// steps: a captured step's buffers come from its arena and a replay's are
// fixed, so there the call does nothing. Weights, views and tensors of a
// replay are left to their owners.
func (be *Backend) Release(ts ...backend.Tensor) {
	if be.graphMode() != graphOff || !releaseOn() {
		return
	}
	var sts []*store
	for _, x := range ts {
		t, ok := x.(*Tensor)
		if !ok || t == nil || t.parent != nil || t.st.weight || !t.st.pooled || t.st.released {
			continue
		}
		sts = append(sts, t.st)
	}
	if len(sts) == 0 {
		return
	}
	be.do("Release", func(*kernels.Device) error {
		for _, st := range sts {
			be.alloc.put(st.f32)
			be.alloc.put(st.bf16)
			st.f32, st.bf16, st.released = nil, nil, true
		}
		return nil
	})
}

func optional(op, name string, x backend.Tensor) *Tensor {
	if x == nil {
		return nil
	}
	if t, ok := x.(*Tensor); ok && t == nil {
		return nil
	}
	return tensorOf(op, name, x)
}

func matrix(op, name string, x backend.Tensor, cols int) (t *Tensor, rows int) {
	t = tensorOf(op, name, x)
	r, c := t.dims()
	if cols >= 0 && c != cols {
		panicf(op, "%s has shape %v, want %d columns", name, t.shape, cols)
	}
	return t, r
}

// vector unwraps an optional [n] (or [1, n]) tensor; nil stays nil.
func vector(op, name string, x backend.Tensor, n int) *Tensor {
	t := optional(op, name, x)
	if t == nil {
		return nil
	}
	if r, c := t.dims(); r != 1 || c != n {
		panicf(op, "%s has shape %v, want [%d]", name, t.shape, n)
	}
	return t
}

// flat unwraps an optional tensor of n values in any shape.
func flat(op, name string, x backend.Tensor, n int) *Tensor {
	t := optional(op, name, x)
	if t != nil && t.st.n != n {
		panicf(op, "%s has shape %v, want %d values", name, t.shape, n)
	}
	return t
}

// ---- device memory pool ----

// allocator pools device buffers by size class (class): powers of two
// from 256 bytes up to poolMax, eighths of an octave above it. Buffers
// above poolMax are pooled up to largeMax bytes in all and freed beyond
// that. Released buffers may be reused by later work at once: all work
// runs in order on the default stream.
type allocator struct {
	mu       sync.Mutex
	pool     map[int64][]*kernels.Buffer
	pending  []*kernels.Buffer // buffers to free on the GPU goroutine
	large    int64             // bytes pooled in classes above poolMax
	largeMax int64             // the most bytes pooled above poolMax (largePoolMax)
	// largeAuto: largeMax is the default, to be lowered to half the memory
	// free at the first large allocation (weights and KV cache in place by
	// then), so that the pool never takes what the device does not spare.
	largeAuto bool

	tape  *tapeState               // the running graph step's tape, or nil
	owned map[*kernels.Buffer]bool // the graphs' arena (graph.go): never pooled again
	// handles maps each handle a graph step got (a whole-buffer view, one
	// per get) to its arena buffer until the handle is put, or to nil once
	// the arena is freed. A tensor of an earlier step that dies during a
	// capture puts its own handle, which the capture never handed out, so
	// it cannot free a buffer the capture took again (graph.go).
	handles map[*kernels.Buffer]*kernels.Buffer

	// made counts the buffers get allocated outside the arena and not yet
	// freed (pooled or held by tensors and caches): with the pool's length,
	// what tests check for leaks.
	made atomic.Int64
	// mallocs and frees count the device allocations and frees (AllocCounts).
	mallocs, frees atomic.Int64
}

// newAllocator returns an empty pool that keeps up to largeMax bytes of
// buffers above poolMax (with auto, at most half the memory free at its
// first large allocation).
func newAllocator(largeMax int64, auto bool) *allocator {
	return &allocator{pool: map[int64][]*kernels.Buffer{}, largeMax: largeMax, largeAuto: auto}
}

// settleLargeMax lowers an automatic largeMax to half the memory free now
// (once; on the GPU goroutine, outside graph captures).
func (a *allocator) settleLargeMax(d *kernels.Device) {
	free, err := d.FreeMem()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.largeAuto {
		return
	}
	a.largeAuto = false
	if err == nil {
		a.largeMax = min(a.largeMax, int64(free/2))
	}
}

// LargePoolEnv names the environment variable that sets how many MiB of
// buffers above 64 MiB the CUDA backend keeps for reuse (default: an
// eighth of the device's memory, at most 16384, and at most half of what
// is free at the first such allocation; 0 frees each when released, as
// before the twenty-seventh pass). A long
// prefill's activations are such buffers (8192 tokens × 4096 × 4 bytes is
// 128 MiB), and cudaFree synchronises the device while cudaMalloc of
// hundreds of MiB costs host time, so freeing them made every layer of
// an 8k prefill wait. The pool is freed whenever an allocation fails.
const LargePoolEnv = "MKSERVE_LARGE_POOL_MB"

// largePoolMax reads LargePoolEnv (bytes, auto false); without it, an
// eighth of total bytes of device memory, at most 16 GiB (an H200's 141
// GB: 16 GiB), and auto (settleLargeMax lowers it to half the free memory).
func largePoolMax(total uint64) (bytes int64, auto bool) {
	if v := os.Getenv(LargePoolEnv); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			panic(fmt.Sprintf("%s=%q: want a non-negative number of MiB", LargePoolEnv, v))
		}
		return n << 20, false
	}
	return min(int64(total>>20)/8, 16384) << 20, true
}

// AllocCounts reports how many device allocations and frees the backend's
// pool has made so far (its buffers, not weights' or caches' own).
func (be *Backend) AllocCounts() (mallocs, frees int64) {
	return be.alloc.mallocs.Load(), be.alloc.frees.Load()
}

// outside is how many buffers of the allocator are held outside the pool
// and the arena: by live tensors and caches, or leaked (tests).
func (a *allocator) outside() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := a.made.Load()
	for _, l := range a.pool {
		n -= int64(len(l))
	}
	return n - int64(len(a.pending))
}

const poolMax = 64 << 20

// class is the size a request of bytes gets: the next power of two up to
// poolMax, above it the next eighth of its octave (≤ 12.5 % more), so that
// prefills of similar lengths reuse each other's buffers.
func class(bytes int64) int64 {
	if bytes <= 256 {
		return 256
	}
	if bytes > 1<<61 {
		return bytes // no allocation of this size succeeds; no overflow below
	}
	c := int64(1) << bits.Len64(uint64(bytes-1)) // the next power of two
	if c <= poolMax {
		return c
	}
	step := c / 16 // an eighth of the octave [c/2, c)
	return (bytes + step - 1) / step * step
}

// put returns b to the pool (any goroutine; nil is ignored).
func (a *allocator) put(b *kernels.Buffer) {
	if b == nil || b.Ptr() == 0 {
		return // nil, or freed with its graph
	}
	a.mu.Lock()
	if base, ok := a.handles[b]; ok {
		delete(a.handles, b)
		if base != nil {
			a.tapePut(b, base)
		}
		a.mu.Unlock()
		return
	}
	if a.owned[b] {
		a.mu.Unlock()
		return
	}
	if n := b.Bytes(); n > poolMax && a.large+n > a.largeMax {
		a.pending = append(a.pending, b)
	} else {
		if n > poolMax {
			a.large += n
		}
		a.pool[n] = append(a.pool[n], b)
	}
	a.mu.Unlock()
}

// get returns a buffer of at least bytes (≥ 1) bytes; on the GPU goroutine.
// When the device is full it collects garbage (releasing dead tensors),
// frees the pool and tries once more; failing that it panics.
func (a *allocator) get(d *kernels.Device, bytes int64) *kernels.Buffer {
	c := class(max(bytes, 1))
	a.mu.Lock()
	if a.tape != nil {
		defer a.mu.Unlock()
		return a.tapeGet(d, c)
	}
	auto := a.largeAuto
	a.mu.Unlock()
	if auto && c > poolMax {
		a.settleLargeMax(d)
	}
	a.freePending(false)
	a.mu.Lock()
	if l := a.pool[c]; len(l) > 0 {
		b := l[len(l)-1]
		a.pool[c] = l[:len(l)-1]
		if c > poolMax {
			a.large -= c
		}
		a.mu.Unlock()
		return b
	}
	a.mu.Unlock()
	b, err := d.Malloc(c)
	if err != nil {
		runtime.GC()
		time.Sleep(20 * time.Millisecond) // let the cleanups return buffers
		a.freePending(true)
		b, err = d.Malloc(c)
	}
	if err != nil {
		panic(fmt.Sprintf("device memory: %v", err))
	}
	a.made.Add(1)
	a.mallocs.Add(1)
	return b
}

// freePending frees the released large buffers, and with all the pool too.
func (a *allocator) freePending(all bool) {
	a.mu.Lock()
	fr := a.pending
	a.pending = nil
	if all {
		for c, l := range a.pool {
			fr = append(fr, l...)
			delete(a.pool, c)
		}
		a.large = 0
	}
	a.mu.Unlock()
	var errs []error
	for _, b := range fr {
		errs = append(errs, b.Free())
	}
	a.made.Add(-int64(len(fr)))
	a.frees.Add(int64(len(fr)))
	if err := errors.Join(errs...); err != nil {
		panic(fmt.Sprintf("freeing device memory: %v", err))
	}
}

// ---- weights and host copies ----

// Weight uploads h (F32, F16 or BF16): BF16 as bf16, the others as float32.
// More than 2 dims are flattened to [shape[0]*...*shape[n-2], shape[n-1]],
// a scalar becomes [1].
func (be *Backend) Weight(h *tensor.Host) (backend.Tensor, error) {
	shape, err := backend.WeightShape(h)
	if err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	n := h.Len()
	var f32 []float32
	if h.DType != tensor.BF16 {
		if f32, err = h.Float32(); err != nil {
			return nil, fmt.Errorf("cuda: weight %q: %w", h.Name, err)
		}
	}
	if st, err := be.fp4Weight(h, shape); st != nil || err != nil {
		if err != nil {
			return nil, err
		}
		return be.wrap(shape, st), nil
	}
	st := &store{n: n, weight: true}
	err = be.g.Do(func(d *kernels.Device) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%v", r)
			}
		}()
		if f32 != nil {
			st.f32 = be.alloc.get(d, int64(n)*4)
			return kernels.Upload(d, st.f32, f32)
		}
		st.bf16 = be.alloc.get(d, int64(n)*2)
		return kernels.Upload(d, st.bf16, h.Data)
	})
	if err != nil {
		be.alloc.put(st.f32)
		be.alloc.put(st.bf16)
		return nil, fmt.Errorf("cuda: weight %q: %w", h.Name, err)
	}
	if st.f32 != nil {
		be.held[0].Add(int64(n) * 4)
	} else {
		be.held[1].Add(int64(n) * 2)
	}
	return be.wrap(shape, st), nil
}

// FromFloat32 uploads v as a float32 tensor of the given shape (1-D or 2-D);
// for tests and callers that build activations on the host. It panics if
// the shape does not hold len(v) values.
func (be *Backend) FromFloat32(shape []int, v []float32) *Tensor {
	if len(shape) < 1 || len(shape) > 2 || tensor.NumElements(shape) != len(v) || slices.ContainsFunc(shape, func(d int) bool { return d < 0 }) {
		panicf("FromFloat32", "shape %v for %d values", shape, len(v))
	}
	var t *Tensor
	be.do("FromFloat32", func(d *kernels.Device) error {
		b := be.alloc.get(d, int64(len(v))*4)
		t = be.wrap(slices.Clone(shape), &store{n: len(v), f32: b})
		return kernels.Upload(d, b, v)
	})
	return t
}

// ToHost copies x back as float32, row-major.
func (be *Backend) ToHost(x backend.Tensor) []float32 {
	t := tensorOf("ToHost", "x", x)
	out := make([]float32, t.st.n)
	if len(out) == 0 {
		return out
	}
	be.do("ToHost", func(d *kernels.Device) error {
		if err := kernels.Download(d, out, be.f32(d, t)); err != nil {
			return err
		}
		if err := be.world.check(d); err != nil {
			return err
		}
		return be.checkWatchdogs(d)
	}, t)
	return out
}

// ---- ops ----

// Embed gathers rows of table [V, H] → [len(ids), H]. An id outside [0, V)
// panics.
func (be *Backend) Embed(table backend.Tensor, ids []int32) backend.Tensor {
	t, V := matrix("Embed", "table", table, -1)
	_, H := t.dims()
	for i, id := range ids {
		if id < 0 || int(id) >= V {
			panicf("Embed", "ids[%d] = %d outside table %v", i, id, t.shape)
		}
	}
	return be.gather("Embed", t, V, H, ids)
}

// gather is rows idx of t [rows, cols] as a float32 tensor.
func (be *Backend) gather(op string, t *Tensor, rows, cols int, idx []int32) *Tensor {
	var out *Tensor
	be.do(op, func(d *kernels.Device) error {
		out = be.newF32(d, len(idx), cols)
		if len(idx) == 0 || cols == 0 {
			return nil
		}
		src, dt := t.st.f32, kernels.F32
		if src == nil {
			src, dt = t.st.bf16, kernels.BF16
		}
		if sb := be.gr.batch; op == "Embed" && be.graphMode() != graphOff && sb != nil && aliases(idx, sb.Tokens) {
			// A graph step's token ids: the host's, or the previous
			// step's picks on the device (feed.go), so that a replay
			// can be launched before those reach the host.
			ids, err := be.feedIDs(sb, rows)
			if err != nil {
				return err
			}
			picks, err := be.picksBuf(d)
			if err != nil {
				return err
			}
			ib := upload(be, d, ids)
			defer be.alloc.put(ib)
			be.noteInput(d, be.feedInput(rows))
			return d.GatherRowsFeedF32(nil, out.st.f32, src, dt, ib, picks, feedMaxRows, len(idx), cols, rows)
		}
		ib := upload(be, d, idx)
		defer be.alloc.put(ib)
		return d.GatherRowsF32(nil, out.st.f32, src, dt, ib, len(idx), cols, rows)
	}, t)
	return out
}

// Linear is x·wᵀ (+ bias): x [T, K], w [N, K], bias [N] or nil → [T, N],
// through a float32 or (split) bf16 GEMM by w's storage (see the package doc).
func (be *Backend) Linear(x, w, bias backend.Tensor) backend.Tensor {
	wt, N := matrix("Linear", "w", w, -1)
	_, K := wt.dims()
	xt, T := matrix("Linear", "x", x, K)
	b := vector("Linear", "bias", bias, N)
	var out *Tensor
	be.do("Linear", func(d *kernels.Device) error {
		out = be.linearT(d, xt, wt, b, T, N, K, be.split)
		return nil
	}, xt, wt, b)
	return out
}

// routerLinear is Linear with split activations whatever the profile: the
// MoE router's logits decide discrete expert choices, and bf16-rounded
// activations flip near-ties (a router GEMM is E×H, so the second GEMM
// costs little).
func (be *Backend) routerLinear(x, w, bias *Tensor) *Tensor {
	_, N := matrix("MoE", "Gate", w, -1)
	_, K := w.dims()
	_, T := matrix("MoE", "x", x, K)
	var out *Tensor
	be.do("MoE router", func(d *kernels.Device) error {
		if wb, wF32 := weightMem(w); !wF32 && routerGEMVFits(x, wb, T, K) {
			// A few tokens: one float32 GEMV launch that also rounds x to
			// bf16 for the experts, in place of a split and two GEMMs.
			out = be.newF32(d, T, N)
			var xb, bb *kernels.Buffer
			if x.st.bf16 == nil {
				xb = be.alloc.get(d, int64(T*K)*2)
			}
			if bias != nil {
				bb = be.f32(d, bias)
			}
			must("router", d.MoERouterF32(nil, out.st.f32, be.f32(d, x), wb, bb, xb, T, N, K))
			if xb != nil {
				be.attach(x, &x.st.bf16, xb) // the same rounding as bf16Of, kept with x
			}
			return nil
		}
		out = be.linearT(d, x, w, bias, T, N, K, true)
		return nil
	}, x, w, bias)
	return out
}

// GemvEnv names the environment variable that, set to 0, keeps the MoE
// router on the split GEMMs and the dense projections on cuBLASLt at every
// batch size (comparisons).
const GemvEnv = "MKSERVE_GEMV"

var gemvOn = sync.OnceValue(func() bool { return os.Getenv(GemvEnv) != "0" })

// gemvMaxRows is the most rows a dense projection runs as the skinny GEMM
// (kernels.GemvBF16) instead of cuBLASLt. Measured with ncu on
// Qwen3-30B-A3B's projections (H200, 2026-11-29), one row: k and v (2 MB)
// 4.4 µs against cuBLASLt's 6.3, o (16.7 MB) 7.7 against 10.7 (split-K
// and its reduction), q (16.7 MB) 9.0 against 7.6 (the first version); at
// eight rows the skinny kernel loses (19 µs for o). A fixed bound, not a
// per-shape timing: a timed pick came out differently for 3 and 4 rows,
// so a graph step (padded to 4 rows) and an eager one (3) disagreed in the
// last bits; the skinny kernel's rows do not depend on how many there are.
const gemvMaxRows = 2

// gemvFits reports whether a [T, K] · w [N, K]ᵀ can run on the skinny
// kernels (gemv.cu) with at most maxRows rows: on, the shape and the
// 16-byte alignment they take.
func gemvFits(a, w *kernels.Buffer, T, K, maxRows int) bool {
	return gemvOn() && T >= 1 && T <= maxRows && K%8 == 0 && a != nil && w != nil &&
		a.Ptr()%16 == 0 && w.Ptr()%16 == 0
}

// pickGemv reports whether c [T, N] = a [T, K] · w [N, K]ᵀ (bf16) runs as
// the skinny GEMM.
func pickGemv(a, w *kernels.Buffer, T, K int) bool { return gemvFits(a, w, T, K, gemvMaxRows) }

// SkinnyEnv names the environment variable that, set to 0, keeps dense
// projections of gemvMaxRows+1 to 64 rows on cuBLASLt instead of
// kernels.GemmSkinnyBF16, for comparisons. Measured in the ninth pass
// (whole Qwen3-30B-A3B decode steps): without a split over K the kernel
// lost (one "expert" gives N/64 CTAs: batch 32 19.7 against 17.2 ms); with
// it, batch 4 7.07 against 7.37 ms, batch 8 10.04 against 10.28, batch 32
// even (17.24, 17.26).
const SkinnyEnv = "MKSERVE_SKINNY"

var skinnyOn = sync.OnceValue(func() bool { return os.Getenv(SkinnyEnv) != "0" })

// pickSkinny reports whether c [T, N] = a [T, K] · w [N, K]ᵀ (bf16) runs on
// kernels.GemmSkinnyBF16 (unless SkinnyEnv is 0): more rows than the GEMV
// takes, at most 64. The motive (ncu, ninth pass, Qwen3-30B-A3B at 32 rows):
// cuBLASLt's kernels read the q, k, v and o weights at 1.1–1.5 TB/s, 40 µs
// a layer for 38 MB. A fixed bound by rows, as gemvMaxRows: every row
// count of a graph key and of its eager steps takes the same kernel, whose
// rows do not depend on each other.
func pickSkinny(a, w *kernels.Buffer, T, N, K int) bool {
	return skinnyOn() && T > gemvMaxRows && T <= kernels.SkinnyMaxRows && N%8 == 0 && K%8 == 0 &&
		a.Ptr()%16 == 0 && w.Ptr()%16 == 0
}

// routerGEMVFits reports whether the router GEMM of x [T, K] against the
// bf16 weight wb runs as kernels.MoERouterF32: a decode-sized batch and an
// activation that can keep its bf16 rounding.
func routerGEMVFits(x *Tensor, wb *kernels.Buffer, T, K int) bool {
	return memoOK(x) && gemvFits(x.st.f32, wb, T, K, kernels.GemvMaxRows)
}

// linearT is linearMode of activation tensor xt, sharing its bf16 rounding
// (bf16Of) with other ops: the fast profile's GEMMs read the kept rounding
// instead of converting again, and a split (hi + lo) leaves hi, the same
// rounding, with xt.
func (be *Backend) linearT(d *kernels.Device, xt *Tensor, w *Tensor, b *Tensor, T, N, K int, split bool) *Tensor {
	// bf16Only: held in bf16 only (newBF16, e.g. a prefill's attention
	// output with PrefillBF16Env): without a split its values are what the
	// GEMM reads, no float32 copy made.
	bf16Only := xt.st.f32 == nil && xt.st.bf16 != nil && !xt.st.weight && !split
	if _, wF32 := weightMem(w); wF32 || T*N*K == 0 || !(memoOK(xt) || bf16Only) {
		return be.linearMode(d, be.f32(d, xt), w, b, T, N, K, split)
	}
	var in gemmIn
	switch {
	case !split:
		in.hi, in.owned = be.bf16Of(d, xt)
	case xt.st.bf16 != nil: // hi is kept already; the split makes both halves again
		in = be.prepareMode(d, be.f32(d, xt), T*K, false, true)
	default:
		in = be.prepareMode(d, be.f32(d, xt), T*K, false, true)
		be.attach(xt, &xt.st.bf16, in.hi) // kept with xt (the same values as bf16Of)
		in.hi = nil
	}
	out := be.newF32(d, T, N)
	wb, _ := weightMem(w)
	be.gemm(d, out.st.f32, in.withHi(xt.st.bf16), wb, T, N, K)
	be.release(in)
	if b != nil {
		must("bias", d.BiasAddF32(nil, out.st.f32, be.f32(d, b), T, N))
	}
	return out
}

// withHi is in with hi set to h where in has none (hi kept by the tensor).
func (in gemmIn) withHi(h *kernels.Buffer) gemmIn {
	if in.hi == nil {
		in.hi = h
	}
	return in
}

// linearMode is linear with the activation split chosen by the caller.
func (be *Backend) linearMode(d *kernels.Device, x *kernels.Buffer, w *Tensor, b *Tensor, T, N, K int, split bool) *Tensor {
	out := be.newF32(d, T, N)
	if T == 0 || N == 0 {
		return out
	}
	if K == 0 {
		must("zero", kernels.Upload(d, out.st.f32, make([]float32, T*N)))
	} else {
		wb, wF32 := weightMem(w)
		in := be.prepareMode(d, x, T*K, wF32, split)
		be.gemm(d, out.st.f32, in, wb, T, N, K)
		be.release(in)
	}
	if b != nil {
		must("bias", d.BiasAddF32(nil, out.st.f32, be.f32(d, b), T, N))
	}
	return out
}

// RMSNorm normalises each group of len(w) columns of x [T, G*len(w)] and scales by w.
func (be *Backend) RMSNorm(x, w backend.Tensor, eps float32) backend.Tensor {
	wt := tensorOf("RMSNorm", "w", w)
	if r, _ := wt.dims(); r != 1 || wt.st.n == 0 {
		panicf("RMSNorm", "w has shape %v, want [n] with n > 0", wt.shape)
	}
	n := wt.st.n
	xt, T := matrix("RMSNorm", "x", x, -1)
	_, C := xt.dims()
	if C%n != 0 {
		panicf("RMSNorm", "x has shape %v, not a multiple of len(w) = %d columns", xt.shape, n)
	}
	var out *Tensor
	be.do("RMSNorm", func(d *kernels.Device) error {
		out = be.newF32(d, T, C)
		if T*C == 0 {
			return nil
		}
		return d.RMSNormF32(nil, out.st.f32, be.f32(d, xt), be.f32(d, wt), T, C, n, eps)
	}, xt, wt)
	return out
}

// elementwise runs f over a fresh tensor of x's shape.
func (be *Backend) elementwise(op string, x *Tensor, f func(d *kernels.Device, out *kernels.Buffer) error, keep ...any) *Tensor {
	var out *Tensor
	be.do(op, func(d *kernels.Device) error {
		b := be.alloc.get(d, int64(x.st.n)*4)
		out = be.wrap(slices.Clone(x.shape), &store{n: x.st.n, f32: b})
		if x.st.n == 0 {
			return nil
		}
		return f(d, b)
	}, keep...)
	return out
}

// Add is a + b, same shapes.
func (be *Backend) Add(a, b backend.Tensor) backend.Tensor {
	at, bt := tensorOf("Add", "a", a), tensorOf("Add", "b", b)
	if !slices.Equal(at.shape, bt.shape) {
		panicf("Add", "shapes %v and %v differ", at.shape, bt.shape)
	}
	return be.elementwise("Add", at, func(d *kernels.Device, out *kernels.Buffer) error {
		return d.AddF32(nil, out, be.f32(d, at), be.f32(d, bt), at.st.n)
	}, at, bt)
}

// AddRMSNorm implements backend.AddNormer: x + r and its RMSNorm · w [cols]
// in one launch (kernels.AddRMSNormF32), the values of Add then RMSNorm.
func (be *Backend) AddRMSNorm(x, r, w backend.Tensor, eps float32) (backend.Tensor, backend.Tensor) {
	xt, rt := tensorOf("AddRMSNorm", "x", x), tensorOf("AddRMSNorm", "r", r)
	if !slices.Equal(xt.shape, rt.shape) {
		panicf("AddRMSNorm", "shapes %v and %v differ", xt.shape, rt.shape)
	}
	T, C := xt.dims()
	wt := vector("AddRMSNorm", "w", w, C)
	if wt == nil {
		panicf("AddRMSNorm", "nil w")
	}
	var sum, out *Tensor
	be.do("AddRMSNorm", func(d *kernels.Device) error {
		sum, out = be.newF32(d, T, C), be.newF32(d, T, C)
		if T*C == 0 {
			return nil
		}
		var ob *kernels.Buffer
		if !be.split { // the fast profile's GEMMs read the normed rows in bf16: round them here (bf16Of's values)
			ob = be.alloc.get(d, int64(T*C)*2)
			be.attach(out, &out.st.bf16, ob)
		}
		return d.AddRMSNormF32(nil, sum.st.f32, out.st.f32, be.f32(d, xt), be.f32(d, rt), be.f32(d, wt), ob, T, C, eps)
	}, xt, rt, wt)
	return sum, out
}

// Clamp limits every element to [-limit, limit]; NaN stays NaN.
func (be *Backend) Clamp(x backend.Tensor, limit float32) backend.Tensor {
	xt := tensorOf("Clamp", "x", x)
	return be.elementwise("Clamp", xt, func(d *kernels.Device, out *kernels.Buffer) error {
		return d.ClampF32(nil, out, be.f32(d, xt), xt.st.n, limit)
	}, xt)
}

// SwiGLU is silu(gate)*up on x [T, 2*I] laid out as [gate | up] → [T, I].
func (be *Backend) SwiGLU(x backend.Tensor) backend.Tensor {
	xt, T := matrix("SwiGLU", "x", x, -1)
	_, C := xt.dims()
	if C%2 != 0 {
		panicf("SwiGLU", "x has shape %v, want an even number of columns", xt.shape)
	}
	var out *Tensor
	be.do("SwiGLU", func(d *kernels.Device) error {
		out = be.newF32(d, T, C/2)
		if T*C == 0 {
			return nil
		}
		return d.SwiGLUF32(nil, out.st.f32, be.f32(d, xt), T, C/2, false, 0, 0)
	}, xt)
	return out
}

// SplitCols splits x [T, heads*Σsizes] by head: part i is [T, heads*sizes[i]]
// taking, from every head's block, the columns of the i-th size.
func (be *Backend) SplitCols(x backend.Tensor, heads int, sizes ...int) []backend.Tensor {
	sum, err := backend.SplitShape(heads, sizes)
	if err != nil {
		panicf("SplitCols", "%v", err)
	}
	xt, T := matrix("SplitCols", "x", x, heads*sum)
	out := make([]backend.Tensor, len(sizes))
	be.do("SplitCols", func(d *kernels.Device) error {
		off := 0
		for i, s := range sizes {
			p := be.newF32(d, T, heads*s)
			out[i] = p
			if T > 0 && s > 0 {
				if err := d.CopyColsF32(nil, p.st.f32, be.f32(d, xt), kernels.ColCopy{
					DstLd: heads * s, DstHead: s, SrcLd: heads * sum, SrcOff: off, SrcHead: sum,
					Rows: T, Heads: heads, Width: s}); err != nil {
					return err
				}
			}
			off += s
		}
		return nil
	}, xt)
	return out
}

// ConcatCols is the inverse of SplitCols: parts[i] is [T, h_i*sizes[i]]
// where h_i is heads or 1 (a single head broadcast to every head).
func (be *Backend) ConcatCols(heads int, parts []backend.Tensor, sizes []int) backend.Tensor {
	return be.concatCols(heads, parts, sizes, false)
}

// concatCols is ConcatCols into float32, or with toBF16 into a tensor held
// in bf16 only (each value rounded to nearest even; kernels.CopyColsBF16):
// what the tensor cores read, without a float32 copy first.
func (be *Backend) concatCols(heads int, parts []backend.Tensor, sizes []int, toBF16 bool) *Tensor {
	pts := make([]*Tensor, len(parts))
	dims := make([][2]int, len(parts))
	for i, p := range parts {
		t, r := matrix("ConcatCols", fmt.Sprintf("parts[%d]", i), p, -1)
		_, c := t.dims()
		pts[i], dims[i] = t, [2]int{r, c}
	}
	T, width, bcast, err := backend.ConcatShape(heads, dims, sizes)
	if err != nil {
		panicf("ConcatCols", "%v", err)
	}
	sum := width / heads
	var out *Tensor
	be.do("ConcatCols", func(d *kernels.Device) error {
		copyCols, dst := d.CopyColsF32, (*kernels.Buffer)(nil)
		if toBF16 {
			out = be.newBF16(d, T, heads*sum)
			copyCols, dst = d.CopyColsBF16, out.st.bf16
		} else {
			out = be.newF32(d, T, heads*sum)
			dst = out.st.f32
		}
		off := 0
		for i, s := range sizes {
			if T > 0 && s > 0 {
				c := kernels.ColCopy{DstLd: heads * sum, DstOff: off, DstHead: sum,
					SrcLd: heads * s, SrcHead: s, Rows: T, Heads: heads, Width: s}
				if bcast[i] {
					c.SrcLd, c.SrcHead = s, 0
				}
				if err := copyCols(nil, dst, be.f32(d, pts[i]), c); err != nil {
					return err
				}
			}
			off += s
		}
		return nil
	}, pts)
	return out
}

// ropeFreqs is one RoPE's inverse frequencies on the device.
type ropeFreqs struct {
	inv  *kernels.Buffer // [Dim/2] float32
	attn float32
}

// freqs returns (uploading once) the device inverse frequencies of r.
func (be *Backend) freqs(d *kernels.Device, r *attention.RoPE) *ropeFreqs {
	be.ropeMu.Lock()
	defer be.ropeMu.Unlock()
	if f := be.ropes[*r]; f != nil {
		return f
	}
	be.graphGuard("a RoPE table")
	inv, attn := r.Freqs()
	v := make([]float32, len(inv))
	for i, x := range inv {
		v[i] = float32(x)
	}
	b, err := d.Malloc(int64(max(1, len(v))) * 4)
	must("rope frequencies", err)
	must("rope frequencies", kernels.Upload(d, b, v))
	f := &ropeFreqs{inv: b, attn: float32(attn)}
	be.ropes[*r] = f
	return f
}

// RoPE rotates the first rope.Dim columns of every head of x [T, heads*headDim]
// at positions pos [T], as attention.RoPE.Apply does.
func (be *Backend) RoPE(x backend.Tensor, heads, headDim int, rope *attention.RoPE, pos []int32) backend.Tensor {
	if heads <= 0 || headDim <= 0 || rope == nil {
		panicf("RoPE", "heads %d, headDim %d, rope %v", heads, headDim, rope)
	}
	if err := rope.Validate(); err != nil || rope.Dim > headDim {
		panicf("RoPE", "rope %+v for head dim %d: %v", *rope, headDim, err)
	}
	xt, T, style := ropeInput("RoPE", x, heads*headDim, rope, pos)
	return be.elementwise("RoPE", xt, func(d *kernels.Device, out *kernels.Buffer) error {
		if err := d.Copy(out, be.f32(d, xt), int64(xt.st.n)*4); err != nil {
			return err
		}
		if rope.Dim == 0 {
			return nil
		}
		f := be.freqs(d, rope)
		pb := be.positions(d, pos)
		return d.RoPEF32(nil, out, pb, T, heads, headDim, rope.Dim, style, f.inv, f.attn)
	}, xt)
}

// ropeInput checks op's x [T, cols] and positions [T] (none negative) and
// returns x, T and the kernels' name of rope's style.
func ropeInput(op string, x backend.Tensor, cols int, rope *attention.RoPE, pos []int32) (*Tensor, int, kernels.RoPEStyle) {
	xt, T := matrix(op, "x", x, cols)
	if len(pos) != T {
		panicf(op, "%d positions for x %v", len(pos), xt.shape)
	}
	for _, p := range pos {
		if p < 0 {
			panicf(op, "negative position %d", p)
		}
	}
	if rope.Style == attention.Interleaved {
		return xt, T, kernels.RoPEInterleaved
	}
	return xt, T, kernels.RoPENeoX
}

// NormRoPE implements backend.NormRoPEr: RoPE of the per-head RMSNorm of
// q and of k in one launch (kernels.NormRoPEF32) instead of six nodes (the
// norm, a copy and the rotation, for q and for k), for norm weights of
// headDim values or none and head dims up to kernels.NormRoPEMaxHeadDim;
// other shapes (OLMoE's norms over all heads) return ok false. The fast
// profile (no split activations) takes the kernel's float32 arithmetic
// (sincosf, rsqrtf: a few ulp, before q and k are rounded to bf16), the
// exact one its float64 arithmetic. In the fast profile the launch also
// writes q rounded to bf16, kept with it for the attention's kernels.
func (be *Backend) NormRoPE(q, k, qw, kw backend.Tensor, eps float32, heads, kvHeads, headDim int,
	rope *attention.RoPE, pos []int32) (backend.Tensor, backend.Tensor, bool) {
	if heads <= 0 || kvHeads <= 0 || headDim <= 0 || headDim > kernels.NormRoPEMaxHeadDim || rope == nil ||
		rope.Dim == 0 || rope.Dim > headDim || rope.Validate() != nil {
		return nil, nil, false
	}
	qwt, ok1 := headNormWeight("NormRoPE", qw, headDim)
	kwt, ok2 := headNormWeight("NormRoPE", kw, headDim)
	if !ok1 || !ok2 {
		return nil, nil, false
	}
	qt, T, style := ropeInput("NormRoPE", q, heads*headDim, rope, pos)
	kt, _ := matrix("NormRoPE", "k", k, kvHeads*headDim)
	if kT, _ := kt.dims(); kT != T {
		panicf("NormRoPE", "q has %d rows, k %d", T, kT)
	}
	var qo, ko *Tensor
	be.do("NormRoPE", func(d *kernels.Device) error {
		qo, ko = be.newF32(d, T, heads*headDim), be.newF32(d, T, kvHeads*headDim)
		if T == 0 {
			return nil
		}
		f := be.freqs(d, rope)
		pb := be.positions(d, pos)
		part := func(out, x, w *Tensor, h int) kernels.NormRoPEPart {
			p := kernels.NormRoPEPart{Out: out.st.f32, X: be.f32(d, x), Heads: h}
			if w != nil {
				p.W = be.f32(d, w)
			}
			return p
		}
		parts := []kernels.NormRoPEPart{part(qo, qt, qwt, heads), part(ko, kt, kwt, kvHeads)}
		if !be.split {
			// The fast profile's attention reads q in bf16 (bf16Of's
			// rounding): written by the same launch, kept with qo.
			b := be.alloc.get(d, int64(T*heads*headDim)*2)
			be.attach(qo, &qo.st.bf16, b)
			parts[0].OutBF16 = b
		}
		return d.NormRoPEF32(nil, parts, pb, T, headDim, rope.Dim, style, f.inv, f.attn, eps, !be.split)
	}, qt, kt, qwt, kwt)
	return qo, ko, true
}

// headNormWeight is w as a per-head norm weight of headDim values for op:
// ok false when it is not one (a norm over all heads, OLMoE's); nil, true
// for no norm.
func headNormWeight(op string, w backend.Tensor, headDim int) (*Tensor, bool) {
	if w == nil {
		return nil, true
	}
	wt := tensorOf(op, "w", w)
	r, _ := wt.dims()
	return wt, r == 1 && wt.st.n == headDim
}

// LinearMulti implements backend.MultiLinear: in the fast profile, up to
// kernels.GemvMaxOuts projections of one decode-sized activation (at most
// gemvMaxRows rows) against bf16 weights run as one skinny-GEMM launch
// (kernels.GemvBF16Multi: q, k and v), reading the activation's kept bf16
// rounding; other cases return ok false.
func (be *Backend) LinearMulti(x backend.Tensor, ws, biases []backend.Tensor) ([]backend.Tensor, bool) {
	if be.split || len(ws) == 0 || len(ws) > kernels.GemvMaxOuts || (biases != nil && len(biases) != len(ws)) {
		return nil, false
	}
	wts := make([]*Tensor, len(ws))
	bts := make([]*Tensor, len(ws))
	ns := make([]int, len(ws))
	K := -1
	for i, w := range ws {
		wt, N := matrix("LinearMulti", "w", w, -1)
		_, k := wt.dims()
		if wb, wF32 := weightMem(wt); wF32 || wb == nil || (K >= 0 && k != K) {
			return nil, false
		}
		K, wts[i], ns[i] = k, wt, N
		if biases != nil {
			bts[i] = vector("LinearMulti", "bias", biases[i], N)
		}
	}
	xt, T := matrix("LinearMulti", "x", x, K)
	if !memoOK(xt) || T < 1 || T > gemvMaxRows {
		return nil, false
	}
	for _, wt := range wts {
		if wb, _ := weightMem(wt); !gemvFits(xt.st.f32, wb, T, K, gemvMaxRows) {
			return nil, false
		}
	}
	outs := make([]backend.Tensor, len(ws))
	ok := true
	be.do("LinearMulti", func(d *kernels.Device) error {
		hi, _ := be.bf16Of(d, xt) // kept with xt (memoOK)
		if hi.Ptr()%16 != 0 {
			ok = false
			return nil
		}
		g := make([]kernels.GemvOut, len(ws))
		for i, wt := range wts {
			o := be.newF32(d, T, ns[i])
			outs[i] = o
			wb, _ := weightMem(wt)
			g[i] = kernels.GemvOut{C: o.st.f32, B: wb, N: ns[i]}
			if bts[i] != nil {
				g[i].Bias = be.f32(d, bts[i])
			}
		}
		return d.GemvBF16Multi(nil, hi, T, K, g)
	}, xt, wts, bts)
	if !ok {
		return nil, false
	}
	return outs, true
}

// MLP runs a dense gated MLP: Linear(x, GateUp) → SwiGLU → Linear(·, Down).
func (be *Backend) MLP(x backend.Tensor, m *backend.MLP) backend.Tensor {
	if m == nil {
		panicf("MLP", "nil MLP")
	}
	gu, I2 := matrix("MLP", "GateUp", m.GateUp, -1)
	_, H := gu.dims()
	down, DH := matrix("MLP", "Down", m.Down, I2/2)
	if I2%2 != 0 || DH != H {
		panicf("MLP", "GateUp %v and Down %v do not form [2I, H] and [H, I]", gu.shape, down.shape)
	}
	xt, _ := matrix("MLP", "x", x, H)
	return be.Linear(be.SwiGLU(be.Linear(xt, gu, nil)), down, nil)
}

// Rows selects rows of x [T, C] → [len(rows), C].
func (be *Backend) Rows(x backend.Tensor, rows []int) backend.Tensor {
	xt, T := matrix("Rows", "x", x, -1)
	_, C := xt.dims()
	idx := make([]int32, len(rows))
	for i, r := range rows {
		if r < 0 || r >= T {
			panicf("Rows", "rows[%d] = %d outside x %v", i, r, xt.shape)
		}
		idx[i] = int32(r)
	}
	return be.gather("Rows", xt, T, C, idx)
}
