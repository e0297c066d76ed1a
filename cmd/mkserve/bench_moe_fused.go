package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tuning"
)

// moeFusedBench is the fused path's state: the experts placed in blocks
// over the emulated ranks, each rank's weights and token buffers.
type moeFusedBench struct {
	o      *moeBenchOpts
	place  *kernels.MoEPlacement
	table  []int32
	gate   *kernels.Buffer   // [E, H] bf16 router
	shGU   *kernels.Buffer   // [2·SI, H] bf16 or nil
	shDown *kernels.Buffer   // [H, SI] bf16 or nil
	sbias  *kernels.Buffer   // [E] f32 or nil
	flush  *graphFlush       // --graph: run before each replay
	gu, dn []*kernels.Buffer // per rank [slots, 2I, H], [slots, H, I]
	w      moeBenchBufs
}

// runMoEFusedBench times the fused layer and its separate baseline per token
// count (tokens per rank) over o.ranks emulated ranks.
func runMoEFusedBench(d *kernels.Device, o *moeBenchOpts) ([]moeBenchRow, error) {
	E, H, I, R := o.experts, o.hidden, o.inter, o.ranks
	b := &moeFusedBench{o: o, place: kernels.MoEBlockPlacement(E, R)}
	defer b.w.free()
	var err error
	if b.table, err = b.place.Table(); err != nil {
		return nil, err
	}
	fill := func(buf *kernels.Buffer, n int64, seed uint64, scale float64) error {
		return d.FillRandomBF16(nil, buf, n, seed, float32(scale))
	}
	if b.gate, err = b.w.alloc(d, int64(E*H)*2); err != nil {
		return nil, err
	}
	if err := fill(b.gate, int64(E*H), o.seed+1, 1/math.Sqrt(float64(H))); err != nil {
		return nil, err
	}
	for r := range R {
		S := int64(b.place.Slots[r])
		gu, err := b.w.alloc(d, S*int64(2*I)*int64(H)*2)
		if err != nil {
			return nil, fmt.Errorf("rank %d expert weights: %w", r, err)
		}
		dn, err := b.w.alloc(d, S*int64(H)*int64(I)*2)
		if err != nil {
			return nil, fmt.Errorf("rank %d expert weights: %w", r, err)
		}
		if err := fill(gu, S*int64(2*I)*int64(H), o.seed+100+uint64(r), 1/math.Sqrt(float64(H))); err != nil {
			return nil, err
		}
		if err := fill(dn, S*int64(H)*int64(I), o.seed+200+uint64(r), 1/math.Sqrt(float64(I))); err != nil {
			return nil, err
		}
		b.gu, b.dn = append(b.gu, gu), append(b.dn, dn)
	}
	SI := o.shared * I
	if SI > 0 {
		if b.shGU, err = b.w.alloc(d, int64(2*SI*H)*2); err != nil {
			return nil, err
		}
		if b.shDown, err = b.w.alloc(d, int64(H*SI)*2); err != nil {
			return nil, err
		}
		if err := fill(b.shGU, int64(2*SI*H), o.seed+11, 1/math.Sqrt(float64(H))); err != nil {
			return nil, err
		}
		if err := fill(b.shDown, int64(H*SI), o.seed+12, 1/math.Sqrt(float64(SI))); err != nil {
			return nil, err
		}
	}
	if o.graph {
		if b.flush, err = newGraphFlush(d, &b.w, o.seed+13); err != nil {
			return nil, err
		}
	}
	cfg := o.router()
	var sbias []float32
	if cfg.Scoring == moe.Sigmoid {
		sbias = o.scoreBiases(E)
		if b.sbias, err = b.w.alloc(d, int64(E)*4); err != nil {
			return nil, err
		}
		if err := kernels.Upload(d, b.sbias, sbias); err != nil {
			return nil, err
		}
	}
	var rows []moeBenchRow
	for _, T := range o.tokens {
		row, err := b.best(d, cfg, sbias, T, d.Info().SMs)
		if err != nil {
			return rows, fmt.Errorf("tokens %d: %w", T, err) // the counts measured before it, too
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// tuneChoice is one launch --tune tries.
type tuneChoice struct{ tile, ctas, dispatch int }

// tuneChoices are the launches --tune tries: each row tile (16 and 64:
// mma.sync, two CTAs a multiprocessor at 64; 128: wgmma, one), with every
// co-resident CTA or (mma.sync) one per SM, and every CTA or 8, 16, 32 or
// 64 of them starting on the dispatch role. A tile the flags fix (--tile)
// is the only one tried.
func tuneChoices(sms, tile int) []tuneChoice {
	tiles := kernels.MoEFusedTiles
	if tile != 0 {
		tiles = []int{tile}
	}
	var out []tuneChoice
	for _, tl := range tiles {
		ctas := []int{0, sms}
		if tl == 128 {
			ctas = ctas[:1] // every co-resident CTA is one per SM
		}
		for _, c := range ctas {
			for _, dsp := range []int{0, 8, 16, 32, 64} {
				out = append(out, tuneChoice{tl, c, dsp})
			}
		}
	}
	return out
}

// best times token count T with the flags' launch, or with every tune
// choice under --tune, keeping the fastest.
func (b *moeFusedBench) best(d *kernels.Device, cfg moe.RouterConfig, sbias []float32, T, sms int) (moeBenchRow, error) {
	o := b.o
	if o.tuneOut == "" {
		return b.tokens(d, cfg, sbias, T)
	}
	ctas, disp, tile := o.ctas, o.dispatchCTAs, o.tile
	defer func() { o.ctas, o.dispatchCTAs, o.tile = ctas, disp, tile }()
	var best moeBenchRow
	for i, ch := range tuneChoices(sms, tile) {
		o.ctas, o.dispatchCTAs, o.tile = ch.ctas, ch.dispatch, ch.tile
		row, err := b.tokens(d, cfg, sbias, T)
		if err != nil {
			return row, fmt.Errorf("tile %d ctas %d dispatch %d: %w", ch.tile, ch.ctas, ch.dispatch, err)
		}
		if i == 0 || row.MS < best.MS {
			best = row
		}
	}
	return best, nil
}

// recordMoETuning merges the fastest launch per token count into the
// --tune table.
func recordMoETuning(o *moeBenchOpts, device string, rows []moeBenchRow) error {
	t, err := tuning.LoadMoE(o.tuneOut)
	if err != nil {
		return err
	}
	key := tuning.MoEKey{Device: device, Hidden: o.hidden, Intermediate: o.inter, Experts: o.experts, TopK: o.topk, Ranks: o.ranks}
	for _, r := range rows {
		t.Put(key, tuning.MoEChoice{Tokens: r.Tokens, Tile: r.Tile, CTAs: r.CTAs, DispatchCTAs: r.DispatchCTAs, MS: r.MS})
	}
	return t.Save(o.tuneOut)
}

// tokens times one token count (per rank).
func (b *moeFusedBench) tokens(d *kernels.Device, cfg moe.RouterConfig, sbias []float32, T int) (moeBenchRow, error) {
	o := b.o
	E, K, H, I, R := o.experts, o.topk, o.hidden, o.inter, o.ranks
	SI := o.shared * I
	row := moeBenchRow{Tokens: T, Path: "fused", Ranks: R, Iters: o.iters, CTAs: o.ctas, DispatchCTAs: o.dispatchCTAs}
	bufs := &moeBenchBufs{}
	defer bufs.free()
	tokens := make([]int, R)
	for r := range tokens {
		tokens[r] = T
	}
	// Both paths route inside their call (MoERoute's launch before the plan),
	// so ms and separate_ms both include the routing.
	rt := moeRouterKernels(cfg)
	args := kernels.MoEFusedArgs{Tokens: tokens, Slots: b.place.Slots, Experts: E, TopK: K, H: H, I: I,
		CTAs: o.ctas, DispatchCTAs: o.dispatchCTAs, Tile: o.tile, Router: &rt, ScoreBias: b.sbias}
	if o.maxRowsFactor > 0 {
		args.MaxRows = int(math.Ceil(o.maxRowsFactor * float64(T*K)))
		row.MaxRows = args.MaxRows
	}
	ctlBytes, rankBytes, tileM, err := d.MoEFusedWorkspace(args, true)
	if err != nil {
		return row, err
	}
	row.Tile = tileM
	if args.Table, err = bufs.alloc(d, int64(len(b.table))*4); err != nil {
		return row, err
	}
	if err := kernels.Upload(d, args.Table, b.table); err != nil {
		return row, err
	}
	var ctl *kernels.Buffer
	if o.traceOut != "" {
		ctl, err = d.NewMoEFusedTracedControl(ctlBytes, moeTraceRecords)
	} else {
		ctl, err = d.NewMoEFusedControl(ctlBytes)
	}
	if err != nil {
		return row, err
	}
	bufs.all = append(bufs.all, ctl)
	ranks := make([]kernels.MoEFusedRank, R)
	logits := make([]*kernels.Buffer, R)
	alloc := func(n int64) *kernels.Buffer {
		if err != nil {
			return nil
		}
		var x *kernels.Buffer
		x, err = bufs.alloc(d, n)
		return x
	}
	for r := range R {
		rk := &ranks[r]
		rk.X, logits[r] = alloc(int64(T*H)*2), alloc(int64(T*E)*4)
		rk.Logits = logits[r]
		rk.IDs, rk.Weights, rk.Out = alloc(int64(T*K)*4), alloc(int64(T*K)*4), alloc(int64(T*H)*4)
		if SI > 0 {
			rk.Shared = alloc(int64(T*H) * 4)
		}
		rk.GateUp, rk.Down = b.gu[r], b.dn[r]
		rk.WS = alloc(rankBytes[r])
	}
	var sh, sa *kernels.Buffer
	if SI > 0 {
		sh, sa = alloc(int64(T*2*SI)*2), alloc(int64(T*SI)*2)
	}
	if err != nil {
		return row, fmt.Errorf("buffers for %d ranks × %d tokens (workspace %d MB per rank): %w", R, T, rankBytes[0]>>20, err)
	}
	var ev [4]*kernels.Event
	for i := range ev {
		if ev[i], err = d.NewEvent(); err != nil {
			return row, err
		}
		defer ev[i].Destroy()
	}
	front := func() error { // router GEMMs and shared experts of every rank (routing: in the call)
		for r := range R {
			rk := &ranks[r]
			if err := benchRouter(d, logits[r], rk.X, b.gate, T, E, H); err != nil {
				return err
			}
			if SI > 0 {
				if err := d.Gemm(nil, sh, kernels.BF16, rk.X, b.shGU, T, 2*SI, H); err != nil {
					return err
				}
				if err := d.SwiGLU(nil, sa, sh, T, SI); err != nil {
					return err
				}
				if err := d.Gemm(nil, rk.Shared, kernels.F32, sa, b.shDown, T, H, SI); err != nil {
					return err
				}
			}
		}
		return nil
	}
	timeOne := func(fused bool) (ms, ems float64, err error) {
		if err := ev[0].Record(nil); err != nil {
			return 0, 0, err
		}
		if err := front(); err != nil {
			return 0, 0, err
		}
		if err := ev[1].Record(nil); err != nil {
			return 0, 0, err
		}
		if fused {
			err = d.MoEFused(nil, ranks, ctl, args)
		} else {
			err = d.MoEFusedSeparate(nil, ranks, ctl, args)
		}
		if err != nil {
			return 0, 0, err
		}
		if err := ev[2].Record(nil); err != nil {
			return 0, 0, err
		}
		if err := ev[2].Sync(); err != nil {
			return 0, 0, err
		}
		if err := d.MoEFusedCheck(ctl); err != nil {
			return 0, 0, err
		}
		a, err := kernels.Elapsed(ev[0], ev[2])
		if err != nil {
			return 0, 0, err
		}
		e, err := kernels.Elapsed(ev[1], ev[2])
		return float64(a), float64(e), err
	}
	// Graphs of the two layers (--graph): the router and shared experts,
	// then the persistent launch or the separate ones.
	var graphs [2]*kernels.StepGraph // separate, fused
	if o.graph {
		for i, fused := range []bool{false, true} {
			g, err := captureLayer(d, func() error {
				if err := front(); err != nil {
					return err
				}
				if fused {
					return d.MoEFused(nil, ranks, ctl, args)
				}
				return d.MoEFusedSeparate(nil, ranks, ctl, args)
			})
			if err != nil {
				return row, err
			}
			defer func() { _ = g.Destroy(d) }()
			graphs[i] = g
		}
		row.Graph = true
	}
	fresh := func(seed uint64) error {
		for r := range R {
			if err := d.FillRandomBF16(nil, ranks[r].X, int64(T*H), seed+uint64(r), 1); err != nil {
				return err
			}
		}
		return nil
	}
	hostIDs := make([]int32, T*K)
	var times, etimes, stimes []float64
	var gtimes [2][]float64 // graph replays: separate, fused
	touched := 0.0
	for it := -2; it < o.iters; it++ {
		seed := o.seed*1000003 + uint64(T)*31 + uint64(it+2)*131
		for i, g := range graphs {
			if g == nil {
				continue
			}
			if err := fresh(seed ^ uint64(0x9e3779b97f4a7c15>>i)); err != nil {
				return row, err
			}
			ms, err := replayMS(d, g, b.flush)
			if err == nil {
				err = d.MoEFusedCheck(ctl)
			}
			if err != nil {
				return row, fmt.Errorf("graph of the %s layer: %w", [2]string{"separate", "fused"}[i], err)
			}
			if it >= 0 {
				gtimes[i] = append(gtimes[i], ms)
			}
		}
		// The eager runs last: the check and the trace read the fused one.
		if err := fresh(seed); err != nil {
			return row, err
		}
		sms, _, err := timeOne(false)
		if err != nil {
			return row, fmt.Errorf("separate: %w", err)
		}
		ms, ems, err := timeOne(true)
		if err != nil {
			return row, fmt.Errorf("fused: %w", err)
		}
		if it < 0 {
			continue
		}
		times, etimes, stimes = append(times, ms), append(etimes, ems), append(stimes, sms)
		seen := make([]bool, E)
		n := 0
		for r := range R {
			if err := kernels.Download(d, hostIDs, ranks[r].IDs); err != nil {
				return row, err
			}
			for _, e := range hostIDs {
				if e >= 0 && int(e) < E && !seen[e] {
					seen[e] = true
					n++
				}
			}
		}
		touched += float64(n)
	}
	if o.traceOut != "" {
		// A task's tile: rows × columns (GEMM1's columns half gate, half up).
		tm, tn := float64(row.Tile), float64(moeFusedTileCols(row.Tile))
		flop := map[string]float64{"gemm1": 2 * tm * tn * float64(H), "gemm2": 2 * tm * tn * float64(I)}
		wbytes := map[string]float64{"gemm1": 2 * tn * float64(H), "gemm2": 2 * tn * float64(I)} // a block's bf16 weights
		if row.Trace, err = writeMoETrace(d, ctl, o.traceOut, T, flop, wbytes); err != nil {
			return row, err
		}
	}
	sort.Float64s(times)
	sort.Float64s(etimes)
	sort.Float64s(stimes)
	row.MS, row.MinMS, row.ExpertsMS = times[len(times)/2], times[0], etimes[len(etimes)/2]
	sep := stimes[len(stimes)/2]
	row.SeparateMS = &sep
	if row.Graph {
		eager, eagerSep := row.MS, sep
		row.EagerMS, row.EagerSepMS = &eager, &eagerSep
		for _, g := range gtimes {
			sort.Float64s(g)
		}
		row.MS, row.MinMS = gtimes[1][len(gtimes[1])/2], gtimes[1][0]
		gsep := gtimes[0][len(gtimes[0])/2]
		row.SeparateMS = &gsep
	}
	row.ExpertsTouched = touched / float64(o.iters)
	sec := row.MS / 1e3
	row.TFLOPS = 2 * 3 * float64(R*T) * float64(K) * float64(H) * float64(I) / sec / 1e12
	row.WeightGBps = (row.ExpertsTouched*3*float64(H)*float64(I)*2 + float64(2*3*SI*H)) / sec / 1e9
	row.Reference = fmt.Sprintf("CPU float64 on %d sampled tokens of ranks 0 and %d (bf16 x and weights, activation rounded to bf16), routing vs moe.Route on the GPU's logits", min(o.checkRows, T), R-1)
	if o.checkRows > 0 {
		var num, den float64
		for _, r := range []int{0, R - 1} {
			rk := &ranks[r]
			n, dd, mism, err := moeCheckRows(d, o, cfg, sbias, T, moeCheckIn{x: rk.X, logits: logits[r], ids: rk.IDs,
				wts: rk.Weights, out: rk.Out, shGU: b.shGU, shDown: b.shDown,
				expert: func(e int) (*kernels.Buffer, int64, *kernels.Buffer, int64) {
					c := b.place.Replicas[e][0] // the experts' weights read from a rank holding them
					return b.gu[c.Rank], int64(c.Slot) * int64(2*I*H), b.dn[c.Rank], int64(c.Slot) * int64(H*I)
				}})
			if err != nil {
				return row, err
			}
			num, den = num+n, den+dd
			row.RouteMismatch += mism
			if R == 1 {
				break
			}
		}
		row.RelErr = math.Sqrt(num / math.Max(den, 1e-300))
	}
	return row, nil
}

// moeFusedTileCols is the fused kernel's task columns for its row tile
// (moe_fused.cu's kTiles: 16 × 64, 64 × 128, 128 × 256).
func moeFusedTileCols(tileM int) int {
	switch tileM {
	case 16:
		return 64
	case 64:
		return 128
	}
	return 256
}

// moeTraceRecords is the trace's room per launch (--trace): more than the
// tasks of DeepSeek-V3's layer at 16384 tokens (~65 000).
const moeTraceRecords = 1 << 18

// writeMoETrace reads the last launch's trace on ctl, appends its records
// and summary for token count T to path (one JSON object a line) and
// returns the summary; flop and wbytes are one unsplit GEMM block's FLOP
// and weight bytes by kind.
func writeMoETrace(d *kernels.Device, ctl *kernels.Buffer, path string, T int, flop, wbytes map[string]float64) (*kernels.MoETraceSummary, error) {
	recs, wanted, err := d.MoEFusedTrace(ctl)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("--trace: the launch wrote no records")
	}
	sum, err := kernels.SummarizeMoETrace(recs, wanted)
	if err != nil {
		return nil, err
	}
	for kind, f := range flop {
		sum.SetTaskFLOP(kind, f)
	}
	for kind, b := range wbytes {
		sum.SetTaskBytes(kind, b)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	line, err := json.Marshal(struct {
		Tokens  int                     `json:"tokens"`
		Summary kernels.MoETraceSummary `json:"summary"`
		Records []kernels.MoETraceRec   `json:"records"`
	}{T, sum, recs})
	if err == nil {
		_, err = f.Write(append(line, '\n'))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	fmt.Fprintf(os.Stderr, "tokens %d: %s", T, sum)
	return &sum, err
}
