package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"text/tabwriter"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/tensor"
)

func init() { benches["attention"] = benchAttention }

// attnBenchOpts are the flags of `mkserve bench attention`.
type attnBenchOpts struct {
	attnShape
	batch, iters int
	blockSize    int // > 0: paged keys and values (the engine's layout), blocks of this many rows
	seqs         []int
}

// attnBenchResult is one sequence length's measurement (one JSON object).
type attnBenchResult struct {
	Seq      int     `json:"seq"`
	Batch    int     `json:"batch"`
	Heads    int     `json:"heads"`
	KVHeads  int     `json:"kv_heads"`
	HeadDim  int     `json:"head_dim"`
	VHeadDim int     `json:"v_head_dim"`
	Causal   bool    `json:"causal"`
	Window   int     `json:"window"`
	Block    int     `json:"block_size"` // 0: contiguous keys and values
	Iters    int     `json:"iters"`
	Ms       float64 `json:"ms"`     // median over Iters timed launches
	MinMs    float64 `json:"min_ms"` // fastest launch
	TFLOPs   float64 `json:"tflops"` // FLOPs (see attnFLOPs) / median time
	RelErr   float64 `json:"rel_err"`
	Device   string  `json:"device"`
}

// parseAttnBench parses and checks the flags.
func parseAttnBench(args []string) (*attnBenchOpts, error) {
	fs := newFlags("bench attention")
	o := &attnBenchOpts{}
	fs.IntVar(&o.batch, "batch", 1, "sequences per launch")
	seq := fs.String("seq", "1024,4096,16384", "comma-separated sequence lengths (query rows = keys per sequence)")
	o.register(fs)
	fs.IntVar(&o.iters, "iters", 20, "timed launches per length (median reported; at least 10)")
	fs.IntVar(&o.blockSize, "block-size", 0, "paged keys and values in blocks of this many rows, as the engine's cache (0: contiguous; each --seq a multiple of it)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil, err
		}
		return nil, fmt.Errorf("bench attention: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("bench attention: unexpected arguments %q", fs.Args())
	}
	o.finish()
	seqs, err := parsePositiveInts("seq", *seq)
	if err != nil {
		return nil, fmt.Errorf("bench attention: %w", err)
	}
	for _, n := range seqs {
		if n > 1<<24 {
			return nil, fmt.Errorf("bench attention: --seq: %d is not a length in [1, 2^24]", n)
		}
	}
	o.seqs = seqs
	switch {
	case o.batch < 1 || o.batch > 65535:
		return nil, fmt.Errorf("bench attention: --batch %d must be in [1, 65535]", o.batch)
	case o.heads < 1 || o.kvHeads < 1 || o.heads%o.kvHeads != 0:
		return nil, fmt.Errorf("bench attention: --heads %d must be a positive multiple of --kv-heads %d", o.heads, o.kvHeads)
	case o.headDim < 1 || o.headDim > kernels.FlashMaxHeadDim || o.vHeadDim < 1 || o.vHeadDim > kernels.FlashMaxHeadDim:
		return nil, fmt.Errorf("bench attention: --head-dim %d and --v-head-dim %d must be in [1, %d]",
			o.headDim, o.vHeadDim, kernels.FlashMaxHeadDim)
	case o.window < 0 || (o.window > 0 && !o.causal):
		return nil, fmt.Errorf("bench attention: --window %d must be >= 0 and needs --causal", o.window)
	case o.iters < 10:
		return nil, fmt.Errorf("bench attention: --iters %d: at least 10", o.iters)
	case o.blockSize < 0:
		return nil, fmt.Errorf("bench attention: --block-size %d must be >= 0", o.blockSize)
	case o.device < 0:
		return nil, fmt.Errorf("bench attention: --device %d", o.device)
	}
	for _, s := range o.seqs {
		if o.blockSize > 0 && s%o.blockSize != 0 {
			return nil, fmt.Errorf("bench attention: --seq %d is not a multiple of --block-size %d", s, o.blockSize)
		}
		if e := int64(o.batch) * int64(s) * int64(o.heads) * int64(max(o.headDim, o.vHeadDim)); e > 1<<32 {
			return nil, fmt.Errorf("bench attention: --batch %d × --seq %d × --heads %d is too large", o.batch, s, o.heads)
		}
	}
	return o, nil
}

// attnFLOPs counts the multiply-adds of QKᵀ and PV as 2 FLOPs each:
// 2·batch·heads·(head_dim+v_head_dim)·pairs, where pairs is seq² without a
// mask and seq²/2 with a causal one (FlashAttention's convention: for
// head_dim = v_head_dim = d that is 4·seq²·heads·d/2); with a window, the
// pairs actually attended.
func attnFLOPs(o *attnBenchOpts, seq int) float64 {
	s := float64(seq)
	pairs := s * s
	if o.causal {
		pairs = s * s / 2
		if o.window > 0 && o.window < seq {
			w := float64(o.window)
			pairs = w*(w+1)/2 + (s-w)*w // rows < w see p+1 keys, the rest w
		}
	}
	return 2 * float64(o.batch) * float64(o.heads) * float64(o.headDim+o.vHeadDim) * pairs
}

// benchAttention times kernels.FlashAttention on random bf16 inputs
// (contiguous KV, past 0) with CUDA events.
func benchAttention(args []string, stdout io.Writer) error {
	o, err := parseAttnBench(args)
	if err != nil {
		return err
	}
	g, err := kernels.Open(o.device)
	if err != nil {
		return fmt.Errorf("bench attention: %w", err)
	}
	defer g.Close()
	var res []attnBenchResult
	for _, s := range o.seqs {
		var r attnBenchResult
		if err := g.Do(func(d *kernels.Device) error {
			var err error
			r, err = attnBenchOne(d, o, s)
			return err
		}); err != nil {
			return fmt.Errorf("bench attention: seq %d: %w", s, err)
		}
		r.Device = g.Info().Name
		res = append(res, r)
	}
	return printAttnBench(stdout, o.json, res)
}

// printAttnBench writes one JSON array, or a table.
func printAttnBench(w io.Writer, asJSON bool, res []attnBenchResult) error {
	if asJSON {
		return printJSONArray(w, res)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "seq\tbatch\theads\tkv_heads\thead_dim\tv_head_dim\tcausal\twindow\tms\tmin_ms\tTFLOP/s\trel_err\t")
	for _, r := range res {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%v\t%d\t%.4f\t%.4f\t%.1f\t%.2g\t\n", r.Seq, r.Batch, r.Heads, r.KVHeads,
			r.HeadDim, r.VHeadDim, r.Causal, r.Window, r.Ms, r.MinMs, r.TFLOPs, r.RelErr)
	}
	return tw.Flush()
}

// attnBenchOne allocates random inputs for one length, times o.iters
// launches after a warm-up, and checks sampled rows against a float64 CPU
// reference (rel_err).
func attnBenchOne(d *kernels.Device, o *attnBenchOpts, seq int) (attnBenchResult, error) {
	res := attnBenchResult{Seq: seq, Batch: o.batch, Heads: o.heads, KVHeads: o.kvHeads, HeadDim: o.headDim,
		VHeadDim: o.vHeadDim, Causal: o.causal, Window: o.window, Block: o.blockSize, Iters: o.iters}
	T := o.batch * seq
	r := rand.New(rand.NewPCG(uint64(seq), 0x5eed))
	qh := randomBF16s(r, T*o.heads*o.headDim)
	kh := randomBF16s(r, T*o.kvHeads*o.headDim)
	vh := randomBF16s(r, T*o.kvHeads*o.vHeadDim)
	qStart := make([]int32, o.batch+1)
	past := make([]int32, o.batch)
	kvStart := make([]int32, o.batch)
	for b := range o.batch {
		qStart[b+1] = int32((b + 1) * seq)
		kvStart[b] = int32(b * seq)
	}
	// Paged: sequence b's blocks start at entry b·seq/bs of the block list,
	// whose blocks are in order, so key j is pool row b·seq + j as when
	// contiguous (the same reference), reached through the block table.
	var blockIDs []int32
	if bs := o.blockSize; bs > 0 {
		for b := range o.batch {
			kvStart[b] = int32(b * seq / bs)
		}
		blockIDs = make([]int32, T/bs)
		for i := range blockIDs {
			blockIDs[i] = int32(i)
		}
	}
	var bufs []*kernels.Buffer
	defer func() {
		for _, b := range bufs {
			b.Free()
		}
	}()
	up := func(n int64, f func(b *kernels.Buffer) error) (*kernels.Buffer, error) {
		b, err := d.Malloc(n)
		if err != nil {
			return nil, err
		}
		bufs = append(bufs, b)
		return b, f(b)
	}
	q, err := up(int64(2*len(qh)), func(b *kernels.Buffer) error { return kernels.Upload(d, b, qh) })
	if err != nil {
		return res, err
	}
	k, err := up(int64(2*len(kh)), func(b *kernels.Buffer) error { return kernels.Upload(d, b, kh) })
	if err != nil {
		return res, err
	}
	v, err := up(int64(2*len(vh)), func(b *kernels.Buffer) error { return kernels.Upload(d, b, vh) })
	if err != nil {
		return res, err
	}
	qs, err := up(int64(4*len(qStart)), func(b *kernels.Buffer) error { return kernels.Upload(d, b, qStart) })
	if err != nil {
		return res, err
	}
	ps, err := up(int64(4*len(past)), func(b *kernels.Buffer) error { return kernels.Upload(d, b, past) })
	if err != nil {
		return res, err
	}
	ks, err := up(int64(4*len(kvStart)), func(b *kernels.Buffer) error { return kernels.Upload(d, b, kvStart) })
	if err != nil {
		return res, err
	}
	nOut := T * o.heads * o.vHeadDim
	out, err := up(int64(2*nOut), func(b *kernels.Buffer) error {
		nan := make([]uint16, nOut)
		for i := range nan {
			nan[i] = 0x7fc0
		}
		return kernels.Upload(d, b, nan)
	})
	if err != nil {
		return res, err
	}
	var blocks *kernels.Buffer
	if len(blockIDs) > 0 {
		if blocks, err = up(int64(4*len(blockIDs)), func(b *kernels.Buffer) error { return kernels.Upload(d, b, blockIDs) }); err != nil {
			return res, err
		}
	}
	a := kernels.FlashArgs{Batch: o.batch, MaxQLen: seq, Tokens: T, Heads: o.heads, KVHeads: o.kvHeads,
		HeadDim: o.headDim, VHeadDim: o.vHeadDim, PoolRows: T, Scale: float32(1 / math.Sqrt(float64(o.headDim))),
		Window: o.window, Causal: o.causal, Out: kernels.BF16, BlockSize: o.blockSize, NumBlocks: len(blockIDs)}
	s, err := d.NewStream()
	if err != nil {
		return res, err
	}
	defer s.Destroy()
	launch := func() error { return d.FlashAttention(s, out, q, k, v, qs, ps, ks, blocks, nil, a) }
	if err := launch(); err != nil {
		return res, err
	}
	if err := s.Sync(d); err != nil {
		return res, err
	}
	// Check sampled rows before timing.
	got := make([]uint16, nOut)
	if err := kernels.Download(d, got, out); err != nil {
		return res, err
	}
	res.RelErr = attnSampleErr(r, o, seq, qh, kh, vh, got)
	if math.IsNaN(res.RelErr) || math.IsInf(res.RelErr, 0) {
		return res, fmt.Errorf("sampled outputs are not finite (rel_err %v)", res.RelErr)
	}
	for range 3 {
		if err := launch(); err != nil {
			return res, err
		}
	}
	ev := make([]*kernels.Event, 2*o.iters)
	for i := range ev {
		if ev[i], err = d.NewEvent(); err != nil {
			return res, err
		}
		defer ev[i].Destroy()
	}
	for i := range o.iters {
		if err := ev[2*i].Record(s); err != nil {
			return res, err
		}
		if err := launch(); err != nil {
			return res, err
		}
		if err := ev[2*i+1].Record(s); err != nil {
			return res, err
		}
	}
	if err := ev[len(ev)-1].Sync(); err != nil {
		return res, err
	}
	ms := make([]float64, o.iters)
	for i := range ms {
		e, err := kernels.Elapsed(ev[2*i], ev[2*i+1])
		if err != nil {
			return res, err
		}
		ms[i] = float64(e)
	}
	slices.Sort(ms)
	res.Ms = ms[len(ms)/2]
	if len(ms)%2 == 0 {
		res.Ms = (ms[len(ms)/2-1] + ms[len(ms)/2]) / 2
	}
	res.MinMs = ms[0]
	res.TFLOPs = attnFLOPs(o, seq) / (res.Ms * 1e-3) / 1e12
	return res, nil
}

// randomBF16s draws n uniform values in [-1, 1) as bf16 bits.
func randomBF16s(r *rand.Rand, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = tensor.F32ToBF16(float32(2*r.Float64() - 1))
	}
	return out
}

// attnSampleErr is the relative L2 error of up to 16 random (row, head)
// outputs against a float64 reference; NaN anywhere in them gives NaN.
func attnSampleErr(r *rand.Rand, o *attnBenchOpts, seq int, q, k, v, got []uint16) float64 {
	H, KH, D, DV := o.heads, o.kvHeads, o.headDim, o.vHeadDim
	scale := float64(float32(1 / math.Sqrt(float64(D))))
	var num, den float64
	for range 16 {
		b, i, h := r.IntN(o.batch), r.IntN(seq), r.IntN(H)
		row := b*seq + i
		kvh := h / (H / KH)
		lo, hi := 0, seq-1
		if o.causal {
			hi = i
			if o.window > 0 {
				lo = max(0, i-o.window+1)
			}
		}
		sc := make([]float64, hi-lo+1)
		m := math.Inf(-1)
		for j := lo; j <= hi; j++ {
			kr := b*seq + j
			var s float64
			for e := range D {
				s += float64(tensor.BF16ToF32(q[(row*H+h)*D+e])) * float64(tensor.BF16ToF32(k[(kr*KH+kvh)*D+e]))
			}
			sc[j-lo] = s * scale
			m = math.Max(m, sc[j-lo])
		}
		want := make([]float64, DV)
		var z float64
		for j := lo; j <= hi; j++ {
			w := math.Exp(sc[j-lo] - m)
			z += w
			vr := b*seq + j
			for e := range DV {
				want[e] += w * float64(tensor.BF16ToF32(v[(vr*KH+kvh)*DV+e]))
			}
		}
		for e := range DV {
			g := float64(tensor.BF16ToF32(got[(row*H+h)*DV+e]))
			w := want[e] / z
			num += (g - w) * (g - w)
			den += w * w
		}
	}
	return math.Sqrt(num / math.Max(den, 1e-300))
}
