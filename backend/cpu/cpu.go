// Package cpu is the reference implementation of backend.Backend: float32
// tensors in host memory, GEMMs through linalg.MatMulT, attention through
// attention.Causal over a per-sequence KV cache, experts through moe.Experts
// (or moe.EP with emulated expert-parallel ranks).
//
// Errors: Weight returns an error for tensors it cannot convert. The ops have
// no error result; they panic, with a message naming the op and the shapes,
// only on programming errors of the caller: a tensor of another backend, shapes
// that do not fit together, out-of-range token ids or rows, a batch that does
// not match the KV cache. Models check their configs and the engine its
// batches before calling, so a panic here is a bug upstream.
//
// A Backend is safe for concurrent use by several goroutines as long as they
// do not run Attention on the same sequence at the same time.
package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/internal/fastmath"
	"github.com/mkserve/mkserve/linalg"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
	"github.com/mkserve/mkserve/transport"
)

// Options configures a Backend.
type Options struct {
	// EPRanks is the number of expert-parallel ranks emulated in process for
	// MoE layers (moe.EP); 0 or 1 runs the experts directly.
	EPRanks int
	// EPComm, when set, makes this backend one rank of an expert-parallel
	// world of separate processes (transport.JoinGRPC): every MoE layer
	// keeps only the experts its rank owns (moe.EPRank) and exchanges
	// token rows with the other ranks, which must run the same steps. It
	// excludes EPRanks.
	EPComm transport.Comm
	// F32Weights keeps a BF16 checkpoint's matrices in float32, as every
	// weight was before bf16 storage (the same results, bit for bit; twice
	// the memory and the bytes a decode step streams): for comparisons.
	F32Weights bool
	// Weights is how matrices are held (WeightsAuto, the zero value, by
	// default); F32Weights overrides it.
	Weights WeightFormat
	// KVBF16 keeps the paged KV cache in bf16 (keys and values rounded to
	// nearest even as they are written): half the memory — twice the
	// tokens in the same kv_cache_bytes — and half the bytes long-context
	// attention reads; float32 otherwise.
	KVBF16 bool
}

// WeightFormat chooses how the backend holds a checkpoint's matrices.
type WeightFormat int

const (
	// WeightsAuto holds a bf16 matrix in the smallest form that holds
	// every value exactly — linalg.FP4 (5/16 of the bytes: an MXFP4
	// checkpoint's experts, gpt-oss's, which dequantize to bf16 as they
	// load), else linalg.Q8 (9/16) — and every other matrix as the
	// checkpoint stores it. The results are the stored weights' (to
	// float32 rounding for FP4).
	WeightsAuto WeightFormat = iota
	// WeightsStored holds every matrix as stored: bf16 as bf16, any other
	// dtype as float32.
	WeightsStored
	// WeightsQ8 holds every matrix with rows a multiple of linalg.Q8Group
	// long as Q8 but the routers, rounding each value Q8 cannot hold to
	// within 1/254 of its group's largest: 9/16 of bf16's bytes, decode
	// ~1.5× faster where the weights' bytes bound it. A router (names
	// ending in "gate.weight" or "router.weight": the MoE gates and
	// Qwen2-MoE's shared-expert gate) keeps its stored values, since a
	// rounded router can send a token to other experts.
	WeightsQ8
)

// weightFormats are the WeightFormat names ParseWeightFormat takes.
var weightFormats = []string{"auto", "stored", "q8"}

// String is the format's name.
func (f WeightFormat) String() string {
	if f < 0 || int(f) >= len(weightFormats) {
		return fmt.Sprintf("WeightFormat(%d)", int(f))
	}
	return weightFormats[f]
}

// ParseWeightFormat reads a WeightFormat by name: auto, stored or q8.
func ParseWeightFormat(s string) (WeightFormat, error) {
	if i := slices.Index(weightFormats, s); i >= 0 {
		return WeightFormat(i), nil
	}
	return 0, fmt.Errorf("cpu weights %q: want one of %s", s, strings.Join(weightFormats, ", "))
}

// IsRouter reports whether the weight named name is a router, which
// WeightsQ8 leaves as stored.
func IsRouter(name string) bool {
	return strings.HasSuffix(name, "gate.weight") || strings.HasSuffix(name, "router.weight")
}

// Backend is the CPU backend. The zero value is not usable; call New.
type Backend struct {
	opts Options

	kvMu  sync.Mutex
	kv    map[uint64]*seqCache // sequence ID → its layers' KV caches (unpaged spans)
	paged *pagedKV             // the paged pool (spans with a block table), after InitKV

	load backend.ExpertLoad // tokens per expert per layer since the last TakeExpertLoad

	epMu sync.Mutex
	eps  map[*backend.MoELayer]*epWorld // one EP world per MoE layer, kept for the backend's life
	// placements are PlaceExperts' per-layer placements (by layer index).
	placements map[int]*moe.Placement
	// epRanks are the layers' ranks of the process world (Options.EPComm).
	epRanks map[*backend.MoELayer]*epRankWorld

	held [4]atomic.Int64 // bytes of the weights Weight made: float32, bf16, Q8, FP4
}

// WeightBytes is the memory of the weights a backend holds, by form (an
// FP4 group here: 16 code bytes and a float32 scale, 20 bytes).
type WeightBytes = backend.WeightBytes

// WeightBytes reports the bytes of the weights Weight has made so far, by
// the form Options.Weights chose for each.
func (be *Backend) WeightBytes() WeightBytes {
	return WeightBytes{F32: be.held[0].Load(), BF16: be.held[1].Load(), Q8: be.held[2].Load(), FP4: be.held[3].Load(), FP4Group: 20}
}

// count adds t's bytes to the weights held.
func (be *Backend) count(t *Tensor) *Tensor {
	switch {
	case t.fp4 != nil:
		be.held[3].Add(int64(len(t.fp4)))
	case t.q8 != nil:
		be.held[2].Add(int64(len(t.q8)))
	case t.bf != nil:
		be.held[1].Add(2 * int64(len(t.bf)))
	default:
		be.held[0].Add(4 * int64(len(t.data)))
	}
	return t
}

var (
	_ backend.FP4Loader     = (*Backend)(nil)
	_ backend.Backend       = (*Backend)(nil)
	_ backend.ExpertCounter = (*Backend)(nil)
	_ backend.ExpertPlacer  = (*Backend)(nil)
	_ backend.KVAllocator   = (*Backend)(nil)
)

// New returns a CPU backend.
func New(opts Options) *Backend {
	return &Backend{opts: opts, kv: map[uint64]*seqCache{}, eps: map[*backend.MoELayer]*epWorld{}}
}

// Name is "cpu".
func (be *Backend) Name() string { return "cpu" }

// littleEndian reports whether this machine stores a uint16 as safetensors
// does (little-endian), so that bf16 weights load by copying.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// weightChunk is the number of elements converted per goroutine in Weight.
const weightChunk = 1 << 20

// Weight converts h (F32, F16 or BF16) to a float32 tensor; more than 2 dims
// are flattened to [shape[0]*...*shape[n-2], shape[n-1]], a scalar becomes [1].
// A BF16 matrix keeps its bf16 values (half the memory and of the bytes a
// decode step streams; Tensor).
func (be *Backend) Weight(h *tensor.Host) (backend.Tensor, error) {
	shape, err := backend.WeightShape(h)
	if err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	n := h.Len()
	q8able := len(shape) == 2 && shape[1]%linalg.Q8Group == 0 && !be.opts.F32Weights
	if h.DType == tensor.BF16 && len(shape) == 2 && !be.opts.F32Weights {
		if len(h.Data) != 2*n {
			return nil, fmt.Errorf("cpu: weight %s: %d bytes for %d bf16 values", h.Name, len(h.Data), n)
		}
		bf := make([]uint16, n)
		parallelRows((n+weightChunk-1)/weightChunk, weightChunk, func(lo, hi int) {
			lo, hi = lo*weightChunk, min(hi*weightChunk, n)
			if littleEndian { // the file's bytes are the values' memory: a copy
				copy(unsafe.Slice((*byte)(unsafe.Pointer(&bf[0])), 2*n)[2*lo:2*hi], h.Data[2*lo:2*hi])
				return
			}
			for i := lo; i < hi; i++ {
				bf[i] = binary.LittleEndian.Uint16(h.Data[2*i:])
			}
		})
		t := &Tensor{shape: shape, bf: bf}
		switch {
		case !q8able || be.opts.Weights == WeightsStored:
		case be.opts.Weights == WeightsQ8 && !IsRouter(h.Name):
			t = quantized(t)
		case be.opts.Weights == WeightsAuto:
			if f := exactFP4(t); f != nil {
				t = f
			} else if q := exactQ8(t); q != nil {
				t = q
			}
		}
		return be.count(t), nil
	}
	data := make([]float32, n)
	// Convert in chunks on all cores: each chunk is a 1-D view of h.
	chunks := (n + weightChunk - 1) / weightChunk
	errs := make([]error, chunks)
	parallelRows(chunks, weightChunk, func(lo, hi int) {
		for c := lo; c < hi; c++ {
			e0, e1 := c*weightChunk, min((c+1)*weightChunk, n)
			sz := h.DType.Size()
			part := &tensor.Host{Name: h.Name, DType: h.DType, Shape: []int{e1 - e0}, Data: h.Data[e0*sz : e1*sz]}
			errs[c] = part.Float32Into(data[e0:e1])
		}
	})
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("cpu: weight: %w", err)
		}
	}
	t := &Tensor{shape: shape, data: data}
	if q8able && be.opts.Weights == WeightsQ8 && !IsRouter(h.Name) {
		t = quantized(t)
	}
	return be.count(t), nil
}

// exactFP4 is the bf16 matrix t as an FP4 matrix if FP4 holds every value
// exactly, else nil.
func exactFP4(t *Tensor) *Tensor {
	q := exactForm(t, linalg.FP4RowBytes, linalg.FP4ExactBF16, linalg.QuantizeFP4BF16)
	if q == nil {
		return nil
	}
	return &Tensor{shape: t.shape, fp4: q}
}

// exactQ8 is the bf16 matrix t as a Q8 matrix if Q8 holds every value
// exactly, else nil.
func exactQ8(t *Tensor) *Tensor {
	q := exactForm(t, linalg.Q8RowBytes, linalg.Q8ExactBF16, linalg.QuantizeQ8BF16)
	if q == nil {
		return nil
	}
	return &Tensor{shape: t.shape, q8: q}
}

// exactForm is the bf16 matrix t [N, K] converted by convert (rows of
// rowBytes(K) bytes) if it holds every value exactly, else nil; converted
// on all cores. A matrix whose first row exact refuses — a plain bf16
// weight's, at its first group — costs nothing more.
func exactForm(t *Tensor, rowBytes func(int) int, exact func([]uint16, int, int) bool, convert func([]byte, []uint16, int, int) bool) []byte {
	N, K := t.dims()
	if N == 0 || !exact(t.bf[:K], 1, K) {
		return nil
	}
	ld := rowBytes(K)
	q := make([]byte, N*ld)
	var inexact atomic.Bool
	parallelRows(N, K, func(lo, hi int) {
		if !inexact.Load() && !convert(q[lo*ld:hi*ld], t.bf[lo*K:hi*K], hi-lo, K) {
			inexact.Store(true)
		}
	})
	if inexact.Load() {
		return nil
	}
	return q
}

// quantized is the matrix t (bf16 or float32, rows a multiple of
// linalg.Q8Group long) as a Q8 matrix, converted on all cores.
func quantized(t *Tensor) *Tensor {
	N, K := t.dims()
	ld := linalg.Q8RowBytes(K)
	q := make([]byte, N*ld)
	parallelRows(N, K, func(lo, hi int) {
		if t.bf != nil {
			linalg.QuantizeQ8BF16(q[lo*ld:hi*ld], t.bf[lo*K:hi*K], hi-lo, K)
		} else {
			linalg.QuantizeQ8(q[lo*ld:hi*ld], t.data[lo*K:hi*K], hi-lo, K)
		}
	})
	return &Tensor{shape: t.shape, q8: q}
}

// ToHost returns a copy of x's values, row-major.
func (be *Backend) ToHost(x backend.Tensor) []float32 {
	return slices.Clone(tensorOf("ToHost", "x", x).data)
}

// Embed gathers rows of table [V, H] → [len(ids), H]. An id outside [0, V)
// panics.
func (be *Backend) Embed(table backend.Tensor, ids []int32) backend.Tensor {
	t, V := weightMatrix("Embed", "table", table, -1)
	_, H := t.dims()
	out := newTensor(len(ids), H)
	for i, id := range ids {
		if id < 0 || int(id) >= V {
			panicf("Embed", "ids[%d] = %d outside table %v", i, id, t.shape)
		}
		switch {
		case t.bf != nil:
			linalg.WidenBF16(out.data[i*H:(i+1)*H], t.bf[int(id)*H:(int(id)+1)*H])
		case t.q8 != nil:
			ld := linalg.Q8RowBytes(H)
			linalg.DequantQ8(out.data[i*H:(i+1)*H], t.q8[int(id)*ld:(int(id)+1)*ld], 1, H)
		case t.fp4 != nil:
			ld := linalg.FP4RowBytes(H)
			linalg.DequantFP4(out.data[i*H:(i+1)*H], t.fp4[int(id)*ld:(int(id)+1)*ld], 1, H)
		default:
			copy(out.data[i*H:(i+1)*H], t.data[int(id)*H:])
		}
	}
	return out
}

// Linear is x·wᵀ (+ bias): x [T, K], w [N, K], bias [N] or nil → [T, N].
func (be *Backend) Linear(x, w, bias backend.Tensor) backend.Tensor {
	wt, N := weightMatrix("Linear", "w", w, -1)
	_, K := wt.dims()
	xt, T := matrix("Linear", "x", x, K)
	b := vector("Linear", "bias", bias, N)
	return linear(xt.data, wt.weights(), b, T, N, K)
}

// linear is x [T, K] · w [N, K]ᵀ + b [N] (b may be nil) → [T, N].
func linear(x []float32, w linalg.Weights, b []float32, T, N, K int) *Tensor {
	out := newTensor(T, N)
	w.MulT(out.data, x, T, N, K)
	if b != nil {
		parallelRows(T, N, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				row := out.data[t*N : (t+1)*N]
				for n, v := range b {
					row[n] += v
				}
			}
		})
	}
	return out
}

// RMSNorm normalises each group of len(w) columns of x [T, G*len(w)]:
// y = x / sqrt(mean(x²) + eps) * w, in float32 as transformers computes it
// (the sum of squares is accumulated in float64, standing in for torch's
// blocked float32 reduction).
func (be *Backend) RMSNorm(x, w backend.Tensor, eps float32) backend.Tensor {
	wt := tensorOf("RMSNorm", "w", w)
	if r, _ := wt.dims(); r != 1 || len(wt.data) == 0 {
		panicf("RMSNorm", "w has shape %v, want [n] with n > 0", wt.shape)
	}
	n := len(wt.data)
	xt, T := matrix("RMSNorm", "x", x, -1)
	_, C := xt.dims()
	if C%n != 0 {
		panicf("RMSNorm", "x has shape %v, not a multiple of len(w) = %d columns", xt.shape, n)
	}
	out := newTensor(T, C)
	parallelRows(T, C, func(lo, hi int) {
		for g := lo * C / n; g < hi*C/n; g++ {
			src, dst := xt.data[g*n:(g+1)*n], out.data[g*n:(g+1)*n]
			var ss float64
			for _, v := range src {
				ss += float64(v * v)
			}
			r := float32(1 / math.Sqrt(float64(float32(ss/float64(n))+eps)))
			for i, v := range src {
				dst[i] = wt.data[i] * (v * r)
			}
		}
	})
	return out
}

// Add is a + b, same shapes.
func (be *Backend) Add(a, b backend.Tensor) backend.Tensor {
	at, bt := tensorOf("Add", "a", a), tensorOf("Add", "b", b)
	if !slices.Equal(at.shape, bt.shape) {
		panicf("Add", "shapes %v and %v differ", at.shape, bt.shape)
	}
	out := &Tensor{shape: slices.Clone(at.shape), data: make([]float32, len(at.data))}
	parallelRows(len(out.data), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			out.data[i] = at.data[i] + bt.data[i]
		}
	})
	return out
}

// Clamp limits every element to [-limit, limit]; NaN stays NaN.
func (be *Backend) Clamp(x backend.Tensor, limit float32) backend.Tensor {
	xt := tensorOf("Clamp", "x", x)
	out := &Tensor{shape: slices.Clone(xt.shape), data: make([]float32, len(xt.data))}
	parallelRows(len(out.data), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			v := xt.data[i]
			if v > limit {
				v = limit
			} else if v < -limit {
				v = -limit
			}
			out.data[i] = v
		}
	})
	return out
}

// SwiGLU is silu(gate)*up on x [T, 2*I] laid out as [gate | up] → [T, I].
func (be *Backend) SwiGLU(x backend.Tensor) backend.Tensor {
	xt, T := matrix("SwiGLU", "x", x, -1)
	_, C := xt.dims()
	if C%2 != 0 {
		panicf("SwiGLU", "x has shape %v, want an even number of columns", xt.shape)
	}
	return swiglu(xt.data, T, C/2)
}

// swiglu is silu(x[:, :I]) * x[:, I:] for x [T, 2I].
func swiglu(x []float32, T, I int) *Tensor {
	out := newTensor(T, I)
	parallelRows(T, 2*I, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			gate, up := x[t*2*I:t*2*I+I], x[t*2*I+I:(t+1)*2*I]
			dst := out.data[t*I : (t+1)*I]
			for i, g := range gate {
				dst[i] = g / (1 + fastmath.Exp32(-g)) * up[i]
			}
		}
	})
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
	parts := make([]*Tensor, len(sizes))
	for i, s := range sizes {
		parts[i] = newTensor(T, heads*s)
	}
	parallelRows(T, heads*sum, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			src := xt.data[t*heads*sum:]
			for h := 0; h < heads; h++ {
				off := h * sum
				for i, s := range sizes {
					copy(parts[i].data[(t*heads+h)*s:(t*heads+h+1)*s], src[off:off+s])
					off += s
				}
			}
		}
	})
	out := make([]backend.Tensor, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out
}

// ConcatCols is the inverse of SplitCols: parts[i] is [T, h_i*sizes[i]]
// where h_i is heads or 1 (a single head broadcast to every head).
func (be *Backend) ConcatCols(heads int, parts []backend.Tensor, sizes []int) backend.Tensor {
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
	cps := make([]colPart, len(parts))
	for i, s := range sizes {
		cps[i] = colPart{data: pts[i].data, ld: heads * s, size: s, shared: bcast[i]}
		if bcast[i] {
			cps[i].ld = s
		}
	}
	return &Tensor{shape: []int{T, width}, data: concatHeads(T, heads, cps)}
}

// colPart is one input of concatHeads: rows ld values apart holding, per
// head, size values (one block of size for every head when shared).
type colPart struct {
	data     []float32
	ld, size int
	shared   bool
}

// concatHeads builds [rows, heads*Σsize] whose head h is, part after part,
// each part's head h (or its shared block): ConcatCols on raw rows.
func concatHeads(rows, heads int, parts []colPart) []float32 {
	sum := 0
	for _, p := range parts {
		sum += p.size
	}
	out := make([]float32, rows*heads*sum)
	parallelRows(rows, heads*sum, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			dst := out[t*heads*sum:]
			for h := 0; h < heads; h++ {
				off := h * sum
				for _, p := range parts {
					src := t*p.ld + h*p.size
					if p.shared {
						src = t * p.ld
					}
					copy(dst[off:off+p.size], p.data[src:])
					off += p.size
				}
			}
		}
	})
	return out
}

// RoPE rotates the first rope.Dim columns of every head of x [T, heads*headDim]
// at positions pos [T] (attention.RoPE.Apply on a copy).
func (be *Backend) RoPE(x backend.Tensor, heads, headDim int, rope *attention.RoPE, pos []int32) backend.Tensor {
	if heads <= 0 || headDim <= 0 || rope == nil {
		panicf("RoPE", "heads %d, headDim %d, rope %v", heads, headDim, rope)
	}
	xt, T := matrix("RoPE", "x", x, heads*headDim)
	if len(pos) != T {
		panicf("RoPE", "%d positions for x %v", len(pos), xt.shape)
	}
	out := &Tensor{shape: []int{T, heads * headDim}, data: slices.Clone(xt.data)}
	rope.Apply(out.data, T, heads, headDim, pos)
	return out
}

// MLP runs a dense gated MLP: Linear(x, GateUp) → SwiGLU → Linear(·, Down).
func (be *Backend) MLP(x backend.Tensor, m *backend.MLP) backend.Tensor {
	if m == nil {
		panicf("MLP", "nil MLP")
	}
	gu, I2 := weightMatrix("MLP", "GateUp", m.GateUp, -1)
	_, H := gu.dims()
	down, DH := weightMatrix("MLP", "Down", m.Down, I2/2)
	if I2%2 != 0 || DH != H {
		panicf("MLP", "GateUp %v and Down %v do not form [2I, H] and [H, I]", gu.shape, down.shape)
	}
	xt, T := matrix("MLP", "x", x, H)
	return mlp(xt.data, gu.weights(), down.weights(), T, H, I2/2)
}

// mlp is down(silu(gate(x)) * up(x)) for x [T, H], gateUp [2I, H], down [H, I].
func mlp(x []float32, gateUp, down linalg.Weights, T, H, I int) *Tensor {
	h := linear(x, gateUp, nil, T, 2*I, H)
	a := swiglu(h.data, T, I)
	return linear(a.data, down, nil, T, H, I)
}

// Rows selects rows of x [T, C] → [len(rows), C].
func (be *Backend) Rows(x backend.Tensor, rows []int) backend.Tensor {
	xt, T := matrix("Rows", "x", x, -1)
	_, C := xt.dims()
	out := newTensor(len(rows), C)
	for i, r := range rows {
		if r < 0 || r >= T {
			panicf("Rows", "rows[%d] = %d outside x %v", i, r, xt.shape)
		}
		copy(out.data[i*C:(i+1)*C], xt.data[r*C:])
	}
	return out
}

// WantFP4 implements backend.FP4Loader: under WeightsAuto an MXFP4
// checkpoint's experts are held as FP4 (what exactFP4 would make of their
// bf16 values, without the bf16 on the way).
func (be *Backend) WantFP4() bool { return be.opts.Weights == WeightsAuto && !be.opts.F32Weights }

// WeightMXFP4 implements backend.FP4Loader: the MXFP4 matrix [n, k] as
// linalg's FP4 — a group's 16 code bytes as they are (the same nibble
// order and codes; linalg's codes stand for doubled E2M1 values, so its
// scale is the E8M0 one halved).
func (be *Backend) WeightMXFP4(name string, blocks, scales []byte, n, k int) (backend.Tensor, error) {
	g := n * k / linalg.Q8Group
	if n <= 0 || k <= 0 || k%linalg.Q8Group != 0 || len(blocks) != g*16 || len(scales) != g {
		return nil, fmt.Errorf("cpu: weight %s: MXFP4 [%d, %d] with %d block and %d scale bytes", name, n, k, len(blocks), len(scales))
	}
	const gb = linalg.Q8Group/2 + 4
	q := make([]byte, g*gb)
	parallelRows(n, k, func(lo, hi int) {
		for i := lo * k / linalg.Q8Group; i < hi*k/linalg.Q8Group; i++ {
			copy(q[i*gb:], blocks[i*16:i*16+16])
			binary.LittleEndian.PutUint32(q[i*gb+16:], math.Float32bits(float32(math.Ldexp(1, int(scales[i])-128))))
		}
	})
	return be.count(&Tensor{shape: []int{n, k}, fp4: q}), nil
}
