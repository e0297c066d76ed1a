package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/tensor"
)

func init() { benches["ring"] = benchRing }

// ringBenchOpts are the flags of `mkserve bench ring`.
type ringBenchOpts struct {
	attnShape
	seqs, ranks []int
	iters       int
	repeat      int // measurements of each (seq, ranks), each with its buffers elsewhere
	spacerMB    int // repetition i allocates i·spacerMB MB before its buffers
}

// ringBenchResult is one (sequence length, ranks) measurement (one JSON object).
type ringBenchResult struct {
	Seq          int     `json:"seq"`
	Ranks        int     `json:"ranks"`
	Heads        int     `json:"heads"`
	KVHeads      int     `json:"kv_heads"`
	HeadDim      int     `json:"head_dim"`
	VHeadDim     int     `json:"v_head_dim"`
	Causal       bool    `json:"causal"`
	Window       int     `json:"window"`
	Iters        int     `json:"iters"`
	Ms           float64 `json:"ms"`               // ring attention, one persistent launch, the buffers the backend picks (Buffers): median
	Buffers      string  `json:"buffers"`          // "gather" or "double" (kernels.RingPreferGather)
	GatherMs     float64 `json:"gather_ms"`        // the launch with gather buffers: median (0 for one rank)
	DoubleMs     float64 `json:"double_buffer_ms"` // the launch with two receive buffers per rank: median
	SingleRankMs float64 `json:"single_rank_ms"`   // FlashAttention over the whole sequence on one rank: median
	SeparateMs   float64 `json:"separate_ms"`      // the ring from separate launches, copies and merges: median
	TFLOPs       float64 `json:"tflops"`           // attnFLOPs / Ms
	SingleTFLOPs float64 `json:"single_rank_tflops"`
	Overhead     float64 `json:"overhead"`            // Ms / SingleRankMs − 1
	SpeedupSep   float64 `json:"speedup_vs_separate"` // SeparateMs / Ms
	RelErr       float64 `json:"rel_err"`             // ms's ring output vs the single-rank FlashAttention output (relative L2, all elements)
	DoubleRelErr float64 `json:"double_buffer_rel_err"`
	SepRelErr    float64 `json:"separate_rel_err"` // the same for the separate ring
	Device       string  `json:"device"`
	Switches     string  `json:"switches,omitempty"`  // the kernel library's MK_RING_* settings in effect (ringSwitches), so a row records what it timed
	Rep          int     `json:"rep,omitempty"`       // --repeat: the repetition (0 first)
	SpacerMB     int     `json:"spacer_mb,omitempty"` // --repeat: MB allocated before this repetition's buffers
}

// parseRingBench parses and checks the flags.
func parseRingBench(args []string) (*ringBenchOpts, error) {
	fs := newFlags("bench ring")
	o := &ringBenchOpts{}
	seq := fs.String("seq", "16384,65536", "comma-separated total sequence lengths")
	ranks := fs.String("ranks", "4", "comma-separated emulated rank counts (1..8)")
	o.register(fs)
	fs.IntVar(&o.iters, "iters", 10, "timed launches per method (median reported; at least 3)")
	fs.IntVar(&o.repeat, "repeat", 1, "measure each (seq, ranks) this many times, each with its buffers at other addresses (one JSON object each)")
	fs.IntVar(&o.spacerMB, "spacer-mb", 40, "with --repeat: repetition i allocates i × this many MB before its buffers")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil, err
		}
		return nil, fmt.Errorf("bench ring: %w", err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("bench ring: unexpected arguments %q", fs.Args())
	}
	o.finish()
	var err error
	if o.seqs, err = parsePositiveInts("seq", *seq); err != nil {
		return nil, fmt.Errorf("bench ring: %w", err)
	}
	if o.ranks, err = parsePositiveInts("ranks", *ranks); err != nil {
		return nil, fmt.Errorf("bench ring: %w", err)
	}
	for _, r := range o.ranks {
		if r > kernels.RingMaxRanks {
			return nil, fmt.Errorf("bench ring: --ranks %d: at most %d", r, kernels.RingMaxRanks)
		}
	}
	for _, n := range o.seqs {
		if n > 1<<22 {
			return nil, fmt.Errorf("bench ring: --seq: %d is not a length in [1, 2^22]", n)
		}
		if e := int64(n) * int64(o.heads) * int64(max(o.headDim, o.vHeadDim)); e > 1<<31 {
			return nil, fmt.Errorf("bench ring: --seq %d × --heads %d is too large", n, o.heads)
		}
	}
	switch {
	case o.heads < 1 || o.kvHeads < 1 || o.heads%o.kvHeads != 0:
		return nil, fmt.Errorf("bench ring: --heads %d must be a positive multiple of --kv-heads %d", o.heads, o.kvHeads)
	case o.headDim < 1 || o.headDim > kernels.FlashMaxHeadDim || o.vHeadDim < 1 || o.vHeadDim > kernels.FlashMaxHeadDim:
		return nil, fmt.Errorf("bench ring: --head-dim %d and --v-head-dim %d must be in [1, %d]",
			o.headDim, o.vHeadDim, kernels.FlashMaxHeadDim)
	case o.window < 0 || (o.window > 0 && !o.causal):
		return nil, fmt.Errorf("bench ring: --window %d must be >= 0 and needs --causal", o.window)
	case o.iters < 3:
		return nil, fmt.Errorf("bench ring: --iters %d: at least 3", o.iters)
	case o.repeat < 1 || o.repeat > 64:
		return nil, fmt.Errorf("bench ring: --repeat %d must be in [1, 64]", o.repeat)
	case o.spacerMB < 0 || o.spacerMB > 4096:
		return nil, fmt.Errorf("bench ring: --spacer-mb %d must be in [0, 4096]", o.spacerMB)
	case o.device < 0:
		return nil, fmt.Errorf("bench ring: --device %d", o.device)
	}
	return o, nil
}

// benchRing times RingAttention with gather buffers (gather_ms) and with
// two receive buffers (double_buffer_ms; ms is the one
// kernels.RingPreferGather picks) against FlashAttention on the whole
// sequence (single_rank_ms) and RingSeparate (separate_ms), CUDA events,
// random bf16 inputs, the sequence split zigzag over the ranks.
func benchRing(args []string, stdout io.Writer) error {
	o, err := parseRingBench(args)
	if err != nil {
		return err
	}
	g, err := kernels.Open(o.device)
	if err != nil {
		return fmt.Errorf("bench ring: %w", err)
	}
	defer g.Close()
	var res []ringBenchResult
	for _, s := range o.seqs {
		for _, R := range o.ranks {
			for rep := range o.repeat {
				var r ringBenchResult
				spacer := int64(rep) * int64(o.spacerMB) << 20
				if err := g.Do(func(d *kernels.Device) error {
					var err error
					r, err = ringBenchOne(d, o, s, R, spacer)
					return err
				}); err != nil {
					return fmt.Errorf("bench ring: seq %d ranks %d: %w", s, R, err)
				}
				r.Device = g.Info().Name
				r.Switches = ringSwitches(os.Environ())
				if o.repeat > 1 {
					r.Rep, r.SpacerMB = rep, rep*o.spacerMB
				}
				res = append(res, r)
			}
		}
	}
	return printRingBench(stdout, o.json, res)
}

// printRingBench writes one JSON array, or a table.
func printRingBench(w io.Writer, asJSON bool, res []ringBenchResult) error {
	if asJSON {
		return printJSONArray(w, res)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "seq\tranks\theads\tkv_heads\thead_dim\tcausal\tbuffers\tms\tgather_ms\tdouble_ms\tsingle_ms\tseparate_ms\tTFLOP/s\toverhead\tvs_separate\trel_err\t")
	for _, r := range res {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%v\t%s\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.1f\t%+.1f%%\t%.2fx\t%.2g\t\n", r.Seq,
			r.Ranks, r.Heads, r.KVHeads, r.HeadDim, r.Causal, r.Buffers, r.Ms, r.GatherMs, r.DoubleMs, r.SingleRankMs,
			r.SeparateMs, r.TFLOPs, 100*r.Overhead, r.SpeedupSep, r.RelErr)
	}
	return tw.Flush()
}

// ringBenchOne measures one (seq, ranks), its buffers allocated after a
// spacer of that many bytes (0: none), which moves them to other addresses
// (the ring's timings were bimodal from run to run: does placement decide?).
func ringBenchOne(d *kernels.Device, o *ringBenchOpts, seq, R int, spacer int64) (ringBenchResult, error) {
	res := ringBenchResult{Seq: seq, Ranks: R, Heads: o.heads, KVHeads: o.kvHeads, HeadDim: o.headDim,
		VHeadDim: o.vHeadDim, Causal: o.causal, Window: o.window, Iters: o.iters}
	H, KV, D, DV := o.heads, o.kvHeads, o.headDim, o.vHeadDim
	r := rand.New(rand.NewPCG(uint64(seq), uint64(R)))
	var bufs []*kernels.Buffer
	defer func() {
		for _, b := range bufs {
			b.Free()
		}
	}()
	alloc := func(n int64) (*kernels.Buffer, error) {
		b, err := d.Malloc(max(n, 1))
		if err == nil {
			bufs = append(bufs, b)
		}
		return b, err
	}
	if spacer > 0 {
		if _, err := alloc(spacer); err != nil {
			return res, err
		}
	}
	upload := func(x []uint16) (*kernels.Buffer, error) {
		b, err := alloc(int64(2 * len(x)))
		if err != nil {
			return nil, err
		}
		return b, kernels.Upload(d, b, x)
	}
	q, err := upload(randomBF16s(r, seq*H*D))
	if err != nil {
		return res, err
	}
	k, err := upload(randomBF16s(r, seq*KV*D))
	if err != nil {
		return res, err
	}
	v, err := upload(randomBF16s(r, seq*KV*DV))
	if err != nil {
		return res, err
	}
	// Single rank: FlashAttention over the whole sequence.
	idx, err := alloc(12)
	if err != nil {
		return res, err
	}
	if err := kernels.Upload(d, idx, []int32{0, int32(seq), 0}); err != nil {
		return res, err
	}
	qStart, _ := idx.View(0, 8)
	zero, _ := idx.View(0, 4) // past = 0 and kv_start = 0
	flashOut, err := alloc(int64(2 * seq * H * DV))
	if err != nil {
		return res, err
	}
	scale := float32(1 / math.Sqrt(float64(D)))
	fa := kernels.FlashArgs{Batch: 1, MaxQLen: seq, Tokens: seq, Heads: H, KVHeads: KV, HeadDim: D, VHeadDim: DV,
		PoolRows: seq, Scale: scale, Window: o.window, Causal: o.causal, Out: kernels.BF16}
	// The ranks' shards, copied out of the global tensors.
	ra := kernels.RingArgs{QSpans: kernels.RingZigzag(seq, R), Heads: H, KVHeads: KV, HeadDim: D, VHeadDim: DV,
		Scale: scale, Window: o.window, Causal: o.causal, Out: kernels.BF16, Timeout: 10 * kernels.RingDefaultTimeout}
	maxLk := 0
	for _, sp := range ra.QSpans {
		maxLk = max(maxLk, sp[0].Len()+sp[1].Len())
	}
	ranks := make([]kernels.RingRank, R)
	gather := func(src *kernels.Buffer, width int, sp [2]kernels.RingSpan) (*kernels.Buffer, error) {
		rows := sp[0].Len() + sp[1].Len()
		b, err := alloc(int64(2 * rows * width))
		if err != nil {
			return nil, err
		}
		off := int64(0)
		for _, s := range sp {
			if s.Len() == 0 {
				continue
			}
			n := int64(2 * s.Len() * width)
			from, err := src.View(int64(2*s.Lo*width), n)
			if err != nil {
				return nil, err
			}
			to, err := b.View(off, n)
			if err != nil {
				return nil, err
			}
			if err := d.Copy(to, from, n); err != nil {
				return nil, err
			}
			off += n
		}
		return b, nil
	}
	for i, sp := range ra.QSpans {
		rk := &ranks[i]
		if rk.Q, err = gather(q, H*D, sp); err != nil {
			return res, err
		}
		if rk.K, err = gather(k, KV*D, sp); err != nil {
			return res, err
		}
		if rk.V, err = gather(v, KV*DV, sp); err != nil {
			return res, err
		}
		for j := range 2 {
			if rk.KBuf[j], err = alloc(int64(2 * maxLk * KV * D)); err != nil {
				return res, err
			}
			if rk.VBuf[j], err = alloc(int64(2 * maxLk * KV * DV)); err != nil {
				return res, err
			}
		}
		if R > 1 {
			if rk.KGather, err = alloc(int64(2 * (R - 1) * maxLk * KV * D)); err != nil {
				return res, err
			}
			if rk.VGather, err = alloc(int64(2 * (R - 1) * maxLk * KV * DV)); err != nil {
				return res, err
			}
		}
		if rk.Out, err = alloc(int64(2 * (sp[0].Len() + sp[1].Len()) * H * DV)); err != nil {
			return res, err
		}
	}
	ws, err := d.NewRingWorkspace(ra)
	if err != nil {
		return res, err
	}
	bufs = append(bufs, ws)
	s, err := d.NewStream()
	if err != nil {
		return res, err
	}
	defer s.Destroy()

	flash := func() error { return d.FlashAttention(s, flashOut, q, k, v, qStart, zero, zero, nil, nil, fa) }
	// double: the same ranks without their gather buffers.
	double := slices.Clone(ranks)
	for i := range double {
		double[i].KGather, double[i].VGather = nil, nil
	}
	ring := func() error { return d.RingAttention(s, ranks, nil, ws, ra) }
	ring2 := func() error { return d.RingAttention(s, double, nil, ws, ra) }
	sep := func() error { return d.RingSeparate(s, double, nil, ws, ra) }

	// Correctness first: each ring's output against FlashAttention's.
	if err := flash(); err != nil {
		return res, err
	}
	want := make([]uint16, seq*H*DV)
	if err := s.Sync(d); err != nil {
		return res, err
	}
	if err := kernels.Download(d, want, flashOut); err != nil {
		return res, err
	}
	relErr := func(launch func() error) (float64, error) {
		for _, rk := range ranks {
			if err := kernels.Upload(d, rk.Out, nanBF16(int(rk.Out.Bytes()/2))); err != nil {
				return 0, err
			}
		}
		if err := launch(); err != nil {
			return 0, err
		}
		if err := d.RingCheck(ws); err != nil {
			return 0, err
		}
		var num, den float64
		for i, sp := range ra.QSpans {
			got := make([]uint16, (sp[0].Len()+sp[1].Len())*H*DV)
			if err := kernels.Download(d, got, ranks[i].Out); err != nil {
				return 0, err
			}
			off := 0
			for _, span := range sp {
				for row := span.Lo; row < span.Hi; row++ {
					for c := range H * DV {
						gv := float64(tensor.BF16ToF32(got[off*H*DV+c]))
						wv := float64(tensor.BF16ToF32(want[row*H*DV+c]))
						num += (gv - wv) * (gv - wv)
						den += wv * wv
					}
					off++
				}
			}
		}
		e := math.Sqrt(num / math.Max(den, 1e-300))
		if math.IsNaN(e) || math.IsInf(e, 0) {
			return e, fmt.Errorf("outputs are not finite (rel_err %v)", e)
		}
		return e, nil
	}
	gatherErr, err := relErr(ring)
	if err != nil {
		return res, fmt.Errorf("ring, gather buffers: %w", err)
	}
	if res.DoubleRelErr, err = relErr(ring2); err != nil {
		return res, fmt.Errorf("ring, two receive buffers: %w", err)
	}
	res.RelErr = res.DoubleRelErr
	if kernels.RingPreferGather(seq, R) {
		res.RelErr = gatherErr
	}
	if res.SepRelErr, err = relErr(sep); err != nil {
		return res, fmt.Errorf("separate: %w", err)
	}

	// Timing: the methods interleaved launch by launch (one of each per
	// round, CUDA events around each), after three untimed rounds, so a
	// change of clock or power state during the run falls on every method
	// alike (sequential blocks put single_rank_ms and ms in different
	// phases: a ring's overhead moved ±5 % between runs, fifty-first pass).
	// Before each timed launch an untimed read of 128 MB (bench moe's graph
	// flush) leaves L2 clean and empty of the operands, so no method pays
	// for the dirty lines or gains from the data the one before it left.
	var fb moeBenchBufs
	defer fb.free()
	fl, err := newGraphFlush(d, &fb, 7)
	if err != nil {
		return res, err
	}
	if err := d.Sync(); err != nil {
		return res, err
	}
	flush := func() error {
		return d.Gemm(s, fl.out, kernels.F32, fl.w, fl.w, 1, graphFlushRows, graphFlushCols)
	}
	type method struct {
		launch func() error
		ms     *float64
	}
	methods := []method{{flash, &res.SingleRankMs}, {ring2, &res.DoubleMs}, {sep, &res.SeparateMs}}
	if R > 1 {
		methods = append(methods, method{ring, &res.GatherMs})
	}
	ev := make([]*kernels.Event, 2*len(methods)*o.iters)
	for i := range ev {
		if ev[i], err = d.NewEvent(); err != nil {
			return res, err
		}
		defer ev[i].Destroy()
	}
	for range 3 {
		for _, m := range methods {
			if err := m.launch(); err != nil {
				return res, err
			}
		}
	}
	for i := range o.iters {
		for j, m := range methods {
			k := 2 * (i*len(methods) + j)
			if err := flush(); err != nil {
				return res, err
			}
			if err := ev[k].Record(s); err != nil {
				return res, err
			}
			if err := m.launch(); err != nil {
				return res, err
			}
			if err := ev[k+1].Record(s); err != nil {
				return res, err
			}
		}
	}
	if err := ev[len(ev)-1].Sync(); err != nil {
		return res, err
	}
	for j, m := range methods {
		ms := make([]float64, o.iters)
		for i := range ms {
			k := 2 * (i*len(methods) + j)
			e, err := kernels.Elapsed(ev[k], ev[k+1])
			if err != nil {
				return res, err
			}
			ms[i] = float64(e)
		}
		*m.ms = median(ms)
	}
	res.Ms, res.Buffers = res.DoubleMs, "double"
	if kernels.RingPreferGather(seq, R) {
		res.Ms, res.Buffers = res.GatherMs, "gather"
	}
	if err := d.RingCheck(ws); err != nil {
		return res, err
	}
	flops := attnFLOPs(&attnBenchOpts{batch: 1, attnShape: attnShape{heads: H, headDim: D, vHeadDim: DV, causal: o.causal, window: o.window}}, seq)
	res.TFLOPs = flops / (res.Ms * 1e-3) / 1e12
	res.SingleTFLOPs = flops / (res.SingleRankMs * 1e-3) / 1e12
	res.Overhead = res.Ms/res.SingleRankMs - 1
	res.SpeedupSep = res.SeparateMs / res.Ms
	return res, nil
}

// nanBF16 is n bf16 NaNs (poison before a launch).
func nanBF16(n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = 0x7fc0
	}
	return out
}

// ringSwitches lists the MK_RING_* assignments of env (os.Environ's form),
// sorted and space-separated: the ring kernel's measurement and opt-out
// switches (kernels/README.md, ring attention), read by the library.
func ringSwitches(env []string) string {
	var sw []string
	for _, kv := range env {
		if strings.HasPrefix(kv, "MK_RING_") {
			sw = append(sw, kv)
		}
	}
	slices.Sort(sw)
	return strings.Join(sw, " ")
}
