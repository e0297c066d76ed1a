package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
)

// `mkserve bench moe --path fused --world R`: the fused MoE layer with its
// R expert-parallel ranks in R processes, one per GPU (issue #7), through
// MoEFusedRankLocal and CUDA IPC. Every rank draws the router and every
// expert from the seed (expert e from its own seeds, so any rank can make
// any expert), holds its block of experts (MoEBlockPlacement), and draws
// its own tokens. Per shape and tokens per rank, each rank checks sampled
// output rows against the float64 CPU reference, then times --iters
// consecutive layers (router GEMM + routing + the rank-local fused launch;
// the epochs make the calls wait for each other, no host sync between
// them) with CUDA events, and then the same layer without communication:
// the router and routing on its tokens plus the fused launch at R = 1 on
// the rows it received (its experts, the same rows per expert, top-1).

// moeShape is a named MoE layer shape (scripts/bench_moe_torch.py's SHAPES).
type moeShape struct {
	name                   string
	hidden, inter, experts int
	topk                   int
	routing                string
}

var moeShapes = map[string]moeShape{
	"deepseek_v3":   {"deepseek_v3", 7168, 2048, 256, 8, "grouped"},
	"qwen3_30b_a3b": {"qwen3_30b_a3b", 2048, 768, 128, 8, "softmax"},
	"mixtral_8x7b":  {"mixtral_8x7b", 4096, 14336, 8, 2, "softmax"},
	"tiny":          {"tiny", 256, 128, 16, 4, "softmax"}, // for tests
}

// moeEPDefaultShapes and moeEPDefaultTokens are --world's defaults.
const (
	moeEPDefaultShapes = "qwen3_30b_a3b,mixtral_8x7b,deepseek_v3"
	moeEPDefaultTokens = "16,256,1024,4096"
)

// parseMoEShapes reads --shapes: named shapes, or "custom" for the
// --hidden/--intermediate/--experts/--topk/--routing flags.
func parseMoEShapes(s string, o *moeBenchOpts) ([]moeShape, error) {
	var out []moeShape
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		sh, ok := moeShapes[n]
		if n == "custom" {
			sh, ok = moeShape{"custom", o.hidden, o.inter, o.experts, o.topk, o.routing}, true
		}
		if !ok {
			names := slices.Sorted(func(yield func(string) bool) {
				for k := range moeShapes {
					if !yield(k) {
						return
					}
				}
			})
			return nil, fmt.Errorf("--shapes: unknown shape %q (known: %s, custom)", n, strings.Join(names, ", "))
		}
		if sh.experts < o.world.size {
			return nil, fmt.Errorf("--shapes %s: %d experts for %d ranks (every rank needs one)", n, sh.experts, o.world.size)
		}
		if sh.routing == "grouped" && (sh.experts%8 != 0 || sh.topk > sh.experts/2) {
			return nil, fmt.Errorf("--shapes %s: grouped routing needs experts divisible by 8 and topk ≤ experts/2", n)
		}
		out = append(out, sh)
	}
	return out, nil
}

func (sh moeShape) router() moe.RouterConfig {
	o := moeBenchOpts{experts: sh.experts, topk: sh.topk, routing: sh.routing}
	return o.router()
}

// moeEPRank is one rank's result of one case (JSON, gathered at rank 0).
type moeEPRank struct {
	Rank, Device   int
	MS, MinMS      float64 // median and min per layer over --iters, CUDA events
	LocalMS        float64 // median: the same rank's layer without communication
	RelErr         float64 // worst of the check before and after the timed calls
	RouteMismatch  int     // sampled tokens whose GPU routing differs from moe.Route on the GPU's logits
	RowsReceived   int64   // (token, k) rows its experts received
	CTAs           int
	WorkspaceBytes int64
}

// moeEPRow is one case over all ranks: the slowest rank's median, that
// rank's layer without communication, the worst error.
type moeEPRow struct {
	Shape         string      `json:"shape"`
	Tokens        int         `json:"tokens_per_rank"`
	Ranks         int         `json:"ranks"`
	MS            float64     `json:"ms"`       // max over ranks of the median
	LocalMS       float64     `json:"local_ms"` // the same rank's layer without communication
	VisibleComm   float64     `json:"visible_comm"`
	RelErr        float64     `json:"rel_err"` // max over ranks
	RouteMismatch int         `json:"route_mismatch"`
	Iters         int         `json:"iters"`
	PerRank       []moeEPRank `json:"per_rank"`
}

// benchMoEWorld runs `bench moe --world R` on this process's rank.
func benchMoEWorld(o *moeBenchOpts, args []string, stdout io.Writer) error {
	shapes, err := parseMoEShapes(o.shapes, o)
	if err != nil {
		return err
	}
	if o.world.rank == 0 { // fail before starting any process
		if n, err := kernels.DeviceCount(); err != nil || n < 1 {
			return fmt.Errorf("bench moe --world needs a GPU (%d devices): %v", n, err)
		}
	}
	argv := append([]string{"bench", "moe"}, args...)
	var rows []moeEPRow
	err = runWorld(context.Background(), o.world, argv, func(ctx context.Context, wd *world) error {
		var err error
		rows, err = runMoEEP(ctx, wd, o, shapes)
		return err
	})
	if err != nil {
		return err
	}
	if o.world.rank != 0 {
		return nil
	}
	return printMoEEP(stdout, o, rows)
}

// printMoEEP writes the table (or JSON lines), then one `mk moe_ep` line per
// case, and fails when a case's error is above 1e-2.
func printMoEEP(w io.Writer, o *moeBenchOpts, rows []moeEPRow) error {
	if o.json {
		for _, r := range rows {
			b, err := json.Marshal(r)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%s\n", b)
		}
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "shape\ttokens/rank\tranks\tms\tlocal ms\tvisible comm\trel err\troute diff\trows recv (slowest)\t\n")
		for _, r := range rows {
			var recv int64
			for _, p := range r.PerRank {
				if p.MS == r.MS {
					recv = p.RowsReceived
				}
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.4f\t%.4f\t%.1f%%\t%.2g\t%d\t%d\t\n", r.Shape, r.Tokens, r.Ranks, r.MS, r.LocalMS,
				100*r.VisibleComm, r.RelErr, r.RouteMismatch, recv)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "ms: the slowest rank's median of %d consecutive layers (router GEMM + routing + rank-local fused launch, "+
			"CUDA events); local ms: that rank's router + routing + the fused launch at R = 1 on the rows it received "+
			"(top-1, no communication); visible comm = (ms - local)/ms; rel err: sampled rows of every rank vs the float64 CPU reference\n", o.iters)
	}
	bad := []string{}
	for _, r := range rows {
		fmt.Fprintf(w, "mk moe_ep %s %d %d %.4f %.4f %.2e\n", r.Shape, r.Tokens, r.Ranks, r.MS, r.LocalMS, r.RelErr)
		if !(r.RelErr <= 1e-2) {
			bad = append(bad, fmt.Sprintf("%s tokens %d: %.2e", r.Shape, r.Tokens, r.RelErr))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("relative error above 1e-2: %s", strings.Join(bad, "; "))
	}
	return nil
}

// moeEPSeeds are the seeds every rank derives its inputs from.
type moeEPSeeds struct{ base uint64 }

func (s moeEPSeeds) gate() uint64        { return s.base*7919 + 1 }
func (s moeEPSeeds) gateUp(e int) uint64 { return s.base*7919 + 1000 + 2*uint64(e) }
func (s moeEPSeeds) down(e int) uint64   { return s.base*7919 + 1001 + 2*uint64(e) }
func (s moeEPSeeds) x(rank, T int) uint64 {
	return s.base*1000003 + uint64(T)*31 + uint64(rank)*131 + 7
}

// runMoEEP is one rank's part: every shape and token count, then the
// results gathered at rank 0 (nil elsewhere).
func runMoEEP(ctx context.Context, wd *world, o *moeBenchOpts, shapes []moeShape) ([]moeEPRow, error) {
	ndev, err := kernels.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("bench moe --world needs GPUs: %w", err)
	}
	dev := wd.rank % ndev
	sharing := 0 // ranks on this GPU
	for r := range wd.size {
		if r%ndev == dev {
			sharing++
		}
	}
	g, err := kernels.Open(dev)
	if err != nil {
		return nil, fmt.Errorf("bench moe --world: device %d: %w", dev, err)
	}
	defer g.Close()
	ctas := o.ctas
	if ctas == 0 && sharing > 1 { // every rank's CTAs must be co-resident
		ctas = g.Info().SMs / sharing
	}
	fmt.Fprintf(moeEPStdout, "rank %d of %d on device %d (%s, %d SMs), %d rank(s) on it, CTAs %d (0: every co-resident one)\n",
		wd.rank, wd.size, dev, g.Info().Name, g.Info().SMs, sharing, ctas)
	var mine []moeEPRank
	err = g.Do(func(d *kernels.Device) error {
		for _, sh := range shapes {
			res, err := runMoEEPShape(ctx, wd, d, o, sh, ctas)
			if err != nil {
				return fmt.Errorf("%s: %w", sh.name, err)
			}
			for i := range res {
				res[i].Device = dev
			}
			mine = append(mine, res...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(mine)
	if err != nil {
		return nil, err
	}
	all, err := wd.gather(ctx, b)
	if err != nil {
		return nil, fmt.Errorf("gathering the results: %w", err)
	}
	if wd.rank != 0 {
		return nil, nil
	}
	per := make([][]moeEPRank, wd.size)
	for r, b := range all {
		if err := json.Unmarshal(b, &per[r]); err != nil {
			return nil, fmt.Errorf("rank %d's results: %w", r, err)
		}
		if len(per[r]) != len(shapes)*len(o.tokens) {
			return nil, fmt.Errorf("rank %d sent %d results, want %d", r, len(per[r]), len(shapes)*len(o.tokens))
		}
	}
	var rows []moeEPRow
	i := 0
	for _, sh := range shapes {
		for _, T := range o.tokens {
			row := moeEPRow{Shape: sh.name, Tokens: T, Ranks: wd.size, Iters: o.iters, MS: -1}
			for r := range wd.size {
				p := per[r][i]
				row.PerRank = append(row.PerRank, p)
				if p.MS > row.MS {
					row.MS, row.LocalMS = p.MS, p.LocalMS
				}
				if !(p.RelErr <= row.RelErr) { // NaN wins
					row.RelErr = p.RelErr
				}
				row.RouteMismatch += p.RouteMismatch
			}
			if row.MS > 0 {
				row.VisibleComm = (row.MS - row.LocalMS) / row.MS
			}
			rows = append(rows, row)
			i++
		}
	}
	return rows, nil
}

// moeEPBufs tracks device buffers to free.
type moeEPBufs struct{ all []*kernels.Buffer }

func (b *moeEPBufs) alloc(d *kernels.Device, bytes int64) (*kernels.Buffer, error) {
	x, err := d.Malloc(bytes)
	if err == nil {
		b.all = append(b.all, x)
	}
	return x, err
}

// allocer returns an allocator that stops at the first error, which it
// leaves in *err (nil buffers after it), so a run of allocations needs one check.
func (b *moeEPBufs) allocer(d *kernels.Device, err *error) func(int64) *kernels.Buffer {
	return func(n int64) *kernels.Buffer {
		if *err != nil {
			return nil
		}
		var x *kernels.Buffer
		x, *err = b.alloc(d, n)
		return x
	}
}

func (b *moeEPBufs) free() {
	for _, x := range b.all {
		_ = x.Free()
	}
	b.all = nil
}

// zeroBuffer clears b in chunks (a rank-local workspace must start zeroed).
func zeroBuffer(d *kernels.Device, b *kernels.Buffer) error {
	const chunk = 64 << 20
	zeros := make([]byte, min(chunk, b.Bytes()))
	for off := int64(0); off < b.Bytes(); off += chunk {
		n := min(chunk, b.Bytes()-off)
		v, err := b.View(off, n)
		if err != nil {
			return err
		}
		if err := kernels.Upload(d, v, zeros[:n]); err != nil {
			return err
		}
	}
	return nil
}

// moeEPShapeState is one rank's weights of one shape.
type moeEPShapeState struct {
	sh     moeShape
	seeds  moeEPSeeds
	place  *kernels.MoEPlacement
	table  []int32
	slots  []int // this rank's slot → expert
	gate   *kernels.Buffer
	sbias  *kernels.Buffer
	hbias  []float32
	gu, dn *kernels.Buffer // [S, 2I, H], [S, H, I]
}

// runMoEEPShape makes this rank's experts of one shape and runs its token counts.
func runMoEEPShape(ctx context.Context, wd *world, d *kernels.Device, o *moeBenchOpts, sh moeShape, ctas int) ([]moeEPRank, error) {
	E, H, I, R, me := sh.experts, sh.hidden, sh.inter, wd.size, wd.rank
	st := &moeEPShapeState{sh: sh, seeds: moeEPSeeds{o.seed}, place: kernels.MoEBlockPlacement(E, R)}
	w := &moeEPBufs{}
	defer w.free()
	var err error
	if st.table, err = st.place.Table(); err != nil {
		return nil, err
	}
	st.slots = st.place.SlotExperts()[me]
	S := int64(len(st.slots))
	if st.gate, err = w.alloc(d, int64(E*H)*2); err != nil {
		return nil, err
	}
	if err := d.FillRandomBF16(nil, st.gate, int64(E*H), st.seeds.gate(), float32(1/math.Sqrt(float64(H)))); err != nil {
		return nil, err
	}
	if sh.routing == "grouped" {
		st.hbias = o.scoreBiases(E)
		if st.sbias, err = w.alloc(d, int64(E)*4); err != nil {
			return nil, err
		}
		if err := kernels.Upload(d, st.sbias, st.hbias); err != nil {
			return nil, err
		}
	}
	guN, dnN := int64(2*I)*int64(H), int64(H)*int64(I)
	if st.gu, err = w.alloc(d, S*guN*2); err != nil {
		return nil, fmt.Errorf("%d experts' weights: %w", S, err)
	}
	if st.dn, err = w.alloc(d, S*dnN*2); err != nil {
		return nil, fmt.Errorf("%d experts' weights: %w", S, err)
	}
	for s, e := range st.slots {
		if err := fillExpert(d, st, e, st.gu, st.dn, int64(s)); err != nil {
			return nil, err
		}
	}
	var out []moeEPRank
	for _, T := range o.tokens {
		start := time.Now()
		res, err := runMoEEPCase(ctx, wd, d, o, st, T, ctas)
		if err != nil {
			return nil, fmt.Errorf("tokens %d: %w", T, err)
		}
		fmt.Fprintf(moeEPStdout, "rank %d: %s tokens %d: %.4f ms (local %.4f), rel err %.2e, %d rows received (%v)\n", me, sh.name, T,
			res.MS, res.LocalMS, res.RelErr, res.RowsReceived, time.Since(start).Round(time.Millisecond))
		out = append(out, res)
	}
	return out, nil
}

// fillExpert writes expert e's weights from its own seeds into slot s of
// gu [·, 2I, H] and dn [·, H, I].
func fillExpert(d *kernels.Device, st *moeEPShapeState, e int, gu, dn *kernels.Buffer, s int64) error {
	H, I := int64(st.sh.hidden), int64(st.sh.inter)
	gv, err := gu.View(s*2*I*H*2, 2*I*H*2)
	if err != nil {
		return err
	}
	dv, err := dn.View(s*H*I*2, H*I*2)
	if err != nil {
		return err
	}
	if err := d.FillRandomBF16(nil, gv, 2*I*H, st.seeds.gateUp(e), float32(1/math.Sqrt(float64(H)))); err != nil {
		return err
	}
	return d.FillRandomBF16(nil, dv, H*I, st.seeds.down(e), float32(1/math.Sqrt(float64(I))))
}

// runMoEEPCase is one token count on this rank: workspaces and handle
// exchange, the check, the timed calls, the local layer, the shutdown
// handshake.
func runMoEEPCase(ctx context.Context, wd *world, d *kernels.Device, o *moeBenchOpts, st *moeEPShapeState, T, ctas int) (res moeEPRank, err error) {
	sh := st.sh
	E, K, H, I, R, me := sh.experts, sh.topk, sh.hidden, sh.inter, wd.size, wd.rank
	S := len(st.slots)
	res = moeEPRank{Rank: me, CTAs: ctas}
	b := &moeEPBufs{}
	defer b.free()
	tokens := make([]int, R)
	for r := range tokens {
		tokens[r] = T
	}
	args := kernels.MoEFusedArgs{Tokens: tokens, Slots: st.place.Slots, Experts: E, TopK: K, H: H, I: I,
		CTAs: ctas, DispatchCTAs: o.dispatchCTAs, Timeout: o.kernelTimeout, Tile: o.tile}
	ctlBytes, rankBytes, _, err := d.MoEFusedWorkspace(args, false)
	if err != nil {
		return res, err
	}
	res.WorkspaceBytes = rankBytes[me]
	alloc := b.allocer(d, &err)
	args.Table = alloc(int64(len(st.table)) * 4)
	ws := alloc(rankBytes[me])
	x, logits := alloc(int64(T*H)*2), alloc(int64(T*E)*4)
	ids, wts, out := alloc(int64(T*K)*4), alloc(int64(T*K)*4), alloc(int64(T*H)*4)
	counts := alloc(int64(S) * 8)
	if err != nil {
		return res, fmt.Errorf("buffers (workspace %d MB): %w", rankBytes[me]>>20, err)
	}
	ctl, err := d.NewMoEFusedControl(ctlBytes)
	if err != nil {
		return res, err
	}
	b.all = append(b.all, ctl)
	if err := kernels.Upload(d, args.Table, st.table); err != nil {
		return res, err
	}
	if err := zeroBuffer(d, ws); err != nil {
		return res, err
	}
	if err := kernels.Upload(d, counts, make([]int64, S)); err != nil {
		return res, err
	}
	if err := d.FillRandomBF16(nil, x, int64(T*H), st.seeds.x(me, T), 1); err != nil {
		return res, err
	}
	nan := func(buf *kernels.Buffer, n int) error {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(math.NaN())
		}
		return kernels.Upload(d, buf, v)
	}
	if err := d.Sync(); err != nil {
		return res, err
	}

	// The handles: every rank's workspace, mapped here.
	h, err := d.IPCHandle(ws)
	if err != nil {
		return res, err
	}
	hs, err := wd.gather(ctx, h[:])
	if err != nil {
		return res, fmt.Errorf("exchanging IPC handles: %w", err)
	}
	wss := make([]*kernels.Buffer, R)
	var peers []*kernels.Buffer
	defer func() { // on an error path: unmap (the world is failing anyway)
		for _, p := range peers {
			_ = p.Free()
		}
	}()
	for r := range R {
		if r == me {
			wss[r] = ws
			continue
		}
		var ph kernels.IPCHandle
		if len(hs[r]) != len(ph) {
			return res, fmt.Errorf("rank %d sent a %d-byte handle", r, len(hs[r]))
		}
		copy(ph[:], hs[r])
		if wss[r], err = d.OpenIPC(ph, rankBytes[r]); err != nil {
			return res, fmt.Errorf("opening rank %d's workspace: %w", r, err)
		}
		peers = append(peers, wss[r])
	}
	rk := kernels.MoEFusedRank{X: x, IDs: ids, Weights: wts, Out: out, GateUp: st.gu, Down: st.dn, WS: ws}
	router := moeRouterKernels(sh.router())
	front := func() error { // router GEMM and routing of this rank's tokens
		if err := benchRouter(d, logits, x, st.gate, T, E, H); err != nil {
			return err
		}
		return d.MoERoute(nil, ids, wts, logits, st.sbias, T, router)
	}
	epoch := 0
	layer := func(withCounts bool) error {
		if err := front(); err != nil {
			return err
		}
		epoch++
		r := rk
		if withCounts {
			r.Counts = counts
		}
		return d.MoEFusedRankLocal(nil, me, r, wss, ctl, args, epoch)
	}

	// The check: one layer, its sampled rows against the reference.
	if err := nan(out, T*H); err != nil {
		return res, err
	}
	if err := wd.barrier(ctx, fmt.Sprintf("%s %d check", sh.name, T)); err != nil {
		return res, err
	}
	if err := layer(true); err != nil {
		return res, err
	}
	if err := d.MoEFusedCheck(ctl); err != nil {
		return res, fmt.Errorf("the checked layer: %w", err)
	}
	ref, err := moeEPReference(d, o, st, T, x, logits, ids, wts)
	if err != nil {
		return res, err
	}
	res.RouteMismatch = ref.mismatch
	if res.RelErr, err = ref.compare(d, out); err != nil {
		return res, err
	}
	hc := make([]int64, S)
	if err := kernels.Download(d, hc, counts); err != nil {
		return res, err
	}
	for _, c := range hc {
		res.RowsReceived += c
	}

	// The timed layers: consecutive, each between two events.
	if err := nan(out, T*H); err != nil {
		return res, err
	}
	evs := make([]*kernels.Event, o.iters+1)
	for i := range evs {
		if evs[i], err = d.NewEvent(); err != nil {
			return res, err
		}
		defer evs[i].Destroy()
	}
	if err := wd.barrier(ctx, fmt.Sprintf("%s %d timed", sh.name, T)); err != nil {
		return res, err
	}
	for range 2 { // warm-up
		if err := layer(false); err != nil {
			return res, err
		}
	}
	for i := range o.iters {
		if err := evs[i].Record(nil); err != nil {
			return res, err
		}
		if err := layer(false); err != nil {
			return res, err
		}
	}
	if err := evs[o.iters].Record(nil); err != nil {
		return res, err
	}
	if err := evs[o.iters].Sync(); err != nil {
		return res, err
	}
	if err := d.MoEFusedCheck(ctl); err != nil {
		return res, fmt.Errorf("the timed layers: %w", err)
	}
	times := make([]float64, o.iters)
	for i := range times {
		ms, err := kernels.Elapsed(evs[i], evs[i+1])
		if err != nil {
			return res, err
		}
		times[i] = float64(ms)
	}
	e2, err := ref.compare(d, out) // the last timed layer's output
	if err != nil {
		return res, err
	}
	if !(e2 <= res.RelErr) {
		res.RelErr = e2
	}
	sort.Float64s(times)
	res.MS, res.MinMS = times[len(times)/2], times[0]

	// Done with the peers: nobody unmaps or frees a workspace a peer may
	// still write (the handshake of kernels' TestMoEFusedIPC).
	if err := d.Sync(); err != nil {
		return res, err
	}
	if err := wd.barrier(ctx, fmt.Sprintf("%s %d done", sh.name, T)); err != nil {
		return res, err
	}
	for _, p := range peers {
		if err := p.Free(); err != nil {
			return res, err
		}
	}
	peers = nil
	if err := wd.barrier(ctx, fmt.Sprintf("%s %d closed", sh.name, T)); err != nil {
		return res, err
	}

	// The same rank's layer without communication.
	if res.LocalMS, err = moeEPLocal(d, o, st, T, hc, ctas, front); err != nil {
		return res, fmt.Errorf("local layer: %w", err)
	}
	// The ranks run their local layers at once (one GPU each); wait for all
	// before the next case.
	if err := wd.barrier(ctx, fmt.Sprintf("%s %d local", sh.name, T)); err != nil {
		return res, err
	}
	return res, nil
}

// moeEPLocal times front plus the fused launch at R = 1 over this rank's
// experts on the rows they received (hc[s] rows for slot s, random, top-1,
// weight 1): the expert work of the rank without communication.
func moeEPLocal(d *kernels.Device, o *moeBenchOpts, st *moeEPShapeState, T int, hc []int64, ctas int, front func() error) (float64, error) {
	H, I := st.sh.hidden, st.sh.inter
	S := len(hc)
	N := 0
	for _, c := range hc {
		N += int(c)
	}
	b := &moeEPBufs{}
	defer b.free()
	var call func() error
	var ctl *kernels.Buffer
	if N == 0 {
		call = front
	} else {
		// Row i's slot: round-robin over the slots' remaining rows.
		left := slices.Clone(hc)
		lids := make([]int32, 0, N)
		for len(lids) < N {
			for s := range S {
				if left[s] > 0 {
					lids = append(lids, int32(s))
					left[s]--
				}
			}
		}
		ones := make([]float32, N)
		for i := range ones {
			ones[i] = 1
		}
		pl := kernels.MoEBlockPlacement(S, 1)
		table, err := pl.Table()
		if err != nil {
			return 0, err
		}
		args := kernels.MoEFusedArgs{Tokens: []int{N}, Slots: pl.Slots, Experts: S, TopK: 1, H: H, I: I,
			CTAs: ctas, DispatchCTAs: o.dispatchCTAs, Timeout: o.kernelTimeout, Tile: o.tile}
		ctlBytes, rankBytes, _, err := d.MoEFusedWorkspace(args, false)
		if err != nil {
			return 0, err
		}
		var rk kernels.MoEFusedRank
		alloc := b.allocer(d, &err)
		args.Table = alloc(int64(len(table)) * 4)
		rk.X, rk.IDs, rk.Weights, rk.Out = alloc(int64(N*H)*2), alloc(int64(N)*4), alloc(int64(N)*4), alloc(int64(N*H)*4)
		rk.WS = alloc(rankBytes[0])
		rk.GateUp, rk.Down = st.gu, st.dn
		if err != nil {
			return 0, fmt.Errorf("buffers for %d rows: %w", N, err)
		}
		if ctl, err = d.NewMoEFusedControl(ctlBytes); err != nil {
			return 0, err
		}
		b.all = append(b.all, ctl)
		for _, e := range []error{kernels.Upload(d, args.Table, table), kernels.Upload(d, rk.IDs, lids),
			kernels.Upload(d, rk.Weights, ones), d.FillRandomBF16(nil, rk.X, int64(N*H), st.seeds.x(1000, T), 1)} {
			if e != nil {
				return 0, e
			}
		}
		call = func() error {
			if err := front(); err != nil {
				return err
			}
			return d.MoEFused(nil, []kernels.MoEFusedRank{rk}, ctl, args)
		}
	}
	evs := make([]*kernels.Event, o.iters+1)
	var err error
	for i := range evs {
		if evs[i], err = d.NewEvent(); err != nil {
			return 0, err
		}
		defer evs[i].Destroy()
	}
	for range 2 {
		if err := call(); err != nil {
			return 0, err
		}
	}
	for i := range o.iters {
		if err := evs[i].Record(nil); err != nil {
			return 0, err
		}
		if err := call(); err != nil {
			return 0, err
		}
	}
	if err := evs[o.iters].Record(nil); err != nil {
		return 0, err
	}
	if err := evs[o.iters].Sync(); err != nil {
		return 0, err
	}
	if ctl != nil {
		if err := d.MoEFusedCheck(ctl); err != nil {
			return 0, err
		}
	}
	times := make([]float64, o.iters)
	for i := range times {
		ms, err := kernels.Elapsed(evs[i], evs[i+1])
		if err != nil {
			return 0, err
		}
		times[i] = float64(ms)
	}
	sort.Float64s(times)
	return times[len(times)/2], nil
}

// moeEPRef is the float64 CPU reference of sampled rows of one rank.
type moeEPRef struct {
	rows     []int       // sampled tokens
	want     [][]float64 // [len(rows)][H]
	h        int
	mismatch int
}

// moeEPReference computes the reference rows from the GPU's inputs and
// routing (compared with moe.Route on the GPU's logits); each expert's
// weights are made again from its seeds, wherever it lives.
func moeEPReference(d *kernels.Device, o *moeBenchOpts, st *moeEPShapeState, T int, x, logits, ids, wts *kernels.Buffer) (*moeEPRef, error) {
	sh := st.sh
	E, K, H, I := sh.experts, sh.topk, sh.hidden, sh.inter
	if err := d.Sync(); err != nil {
		return nil, err
	}
	n := min(max(o.checkRows, 1), T)
	ref := &moeEPRef{h: H}
	for i := range n {
		t := 0
		if n > 1 {
			t = (T - 1) * i / (n - 1)
		}
		ref.rows = append(ref.rows, t)
	}
	b := &moeEPBufs{}
	defer b.free()
	gu, err := b.alloc(d, int64(2*I*H)*2)
	if err != nil {
		return nil, err
	}
	dn, err := b.alloc(d, int64(H*I)*2)
	if err != nil {
		return nil, err
	}
	cfg := sh.router()
	for _, t := range ref.rows {
		xb, err := downloadRow[uint16](d, x, int64(t*H), int64(H), 2)
		if err != nil {
			return nil, err
		}
		xr := bf16s(xb)
		lg, err := downloadRow[float32](d, logits, int64(t*E), int64(E), 4)
		if err != nil {
			return nil, err
		}
		id, err := downloadRow[int32](d, ids, int64(t*K), int64(K), 4)
		if err != nil {
			return nil, err
		}
		wt, err := downloadRow[float32](d, wts, int64(t*K), int64(K), 4)
		if err != nil {
			return nil, err
		}
		wantIDs, _ := moe.Route(&cfg, lg, st.hbias, 1)
		if !slices.Equal(wantIDs[:K], id) {
			ref.mismatch++
		}
		want := make([]float64, H)
		for k := range K {
			e := int(id[k])
			if e < 0 || e >= E {
				return nil, fmt.Errorf("token %d: expert id %d out of range", t, e)
			}
			if err := fillExpert(d, st, e, gu, dn, 0); err != nil {
				return nil, err
			}
			g, err := downloadRow[uint16](d, gu, 0, int64(2*I*H), 2)
			if err != nil {
				return nil, err
			}
			dd, err := downloadRow[uint16](d, dn, 0, int64(H*I), 2)
			if err != nil {
				return nil, err
			}
			y := mlpRef(xr, bf16s(g), bf16s(dd), H, I)
			for c := range H {
				want[c] += float64(wt[k]) * y[c]
			}
		}
		ref.want = append(ref.want, want)
	}
	return ref, nil
}

// compare is the relative L2 error of out's sampled rows (+Inf on a NaN).
func (ref *moeEPRef) compare(d *kernels.Device, out *kernels.Buffer) (float64, error) {
	if err := d.Sync(); err != nil {
		return 0, err
	}
	H := ref.h
	var num, den float64
	for i, t := range ref.rows {
		got, err := downloadRow[float32](d, out, int64(t*H), int64(H), 4)
		if err != nil {
			return 0, err
		}
		for c := range H {
			g := float64(got[c])
			if math.IsNaN(g) || math.IsInf(g, 0) {
				return math.Inf(1), nil
			}
			w := ref.want[i][c]
			num += (g - w) * (g - w)
			den += w * w
		}
	}
	return math.Sqrt(num / math.Max(den, 1e-300)), nil
}

// moeEPStdout is where ranks print progress (rank 0's stdout carries the
// results, so progress goes to stderr there; the children's both reach
// rank 0's log).
var moeEPStdout io.Writer = os.Stderr
