package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/moe"
)

// fusedCase is one fused-MoE test: R ranks with tokens[r] tokens each,
// experts placed in blocks (plus replicas of the hot expert on every rank
// when replicate), softmax top-K routing on random logits.
type fusedCase struct {
	name      string
	E, K      int
	tokens    []int // per rank
	H, I      int
	shared    bool // a dense output per rank added in the combine
	hot       int  // ≥ 0: +30 on this expert's logits (every token picks it)
	cold      int  // > 0: −30 on experts ≥ cold (they get no tokens)
	replicate bool // the hot expert gets a copy on every other rank
	drop      bool // the table places the hot expert nowhere (-1): its rows are dropped, contribute 0
	clamped   bool
	// local > 0: + local on the logits of the experts a rank serves itself
	// (30: every row local when K ≤ its experts; ~2: mostly local, some remote).
	local float32
	tile  int // MoEFusedArgs.Tile (0: picked); the name says which tile to expect (tile64, tile128; else 16)
	// split: the case is meant to split a GEMM's reduction: the launch's
	// trace must show the splits of moe_fused.cu's rule (wantKSplit, from
	// the launch's CTAs), at least one of them > 1 (not checked when
	// MK_MOE_FUSED_KSPLIT forces them).
	split bool
}

// wantKSplit is moe_fused.cu's ksplit rule for the 16-row tiles, restated
// as the test's oracle: each GEMM's reduction is halved again while its
// tasks (min(rows, slots) row tiles × column blocks × splits), doubled,
// fit the launch's CTAs and every split keeps ≥ 4 k steps of 64, at most
// 8 splits.
func wantKSplit(ctas, rows, slots, H, I int) [2]int {
	tiles := min(rows, slots)
	pick := func(blocks, kt int) int {
		sp := 1
		for sp < 8 && tiles*blocks*sp*2 <= ctas && kt >= 8*sp {
			sp *= 2
		}
		return sp
	}
	return [2]int{pick((I+31)/32, (H+63)/64), pick((H+63)/64, (I+63)/64)}
}

// TestMoEFusedLayer runs the persistent fused MoE layer (and its separate
// baseline) over emulated ranks on fresh random inputs against moe.Route
// plus the float64 CPU loop of the MoE test: relative L2 ≤ 1e-2 per rank,
// outputs and workspaces NaN-poisoned before each run, two fused runs
// bit-identical (deterministic combine), expert-load counters exact.
func TestMoEFusedLayer(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	cases := []fusedCase{
		{name: "R1_E8_K2_T37", E: 8, K: 2, tokens: []int{37}, H: 256, I: 128, hot: -1},
		{name: "R1_E64_K1_T1_shared", E: 64, K: 1, tokens: []int{1}, H: 256, I: 128, hot: -1, shared: true},
		{name: "R1_E256_K8_T1_clamped", E: 256, K: 8, tokens: []int{1}, H: 256, I: 128, hot: -1, clamped: true},
		{name: "R1_E128_K8_T300", E: 128, K: 8, tokens: []int{300}, H: 256, I: 128, hot: -1, shared: true},
		{name: "R2_E64_K4_T130_shared", E: 64, K: 4, tokens: []int{130, 77}, H: 256, I: 128, hot: -1, shared: true},
		{name: "R2_E64_K4_T64_cold", E: 64, K: 4, tokens: []int{64, 64}, H: 256, I: 128, hot: -1, cold: 8},
		{name: "R4_E128_K8_T33", E: 128, K: 8, tokens: []int{33, 1, 16, 50}, H: 256, I: 128, hot: -1},
		{name: "R4_E64_K2_T200_hot_tile64", tile: 64, E: 64, K: 2, tokens: []int{200, 200, 200, 200}, H: 256, I: 128, hot: 3},
		{name: "R4_E128_K8_T100_hot_replicated", E: 128, K: 8, tokens: []int{100, 90, 80, 70}, H: 256, I: 128, hot: 5,
			replicate: true, shared: true},
		{name: "R8_E8_K2_T5", E: 8, K: 2, tokens: []int{5, 5, 5, 5, 5, 5, 5, 5}, H: 256, I: 128, hot: -1},
		{name: "R8_E256_K8_T130_shared", E: 256, K: 8, tokens: []int{130, 129, 131, 64, 1, 100, 17, 130}, H: 256,
			I: 128, hot: -1, shared: true},
		// Above 24 rows per active expert (and 16 tokens) the 64-row tile runs.
		{name: "R1_E8_K2_T300_tile64", tile: 64, E: 8, K: 2, tokens: []int{300}, H: 256, I: 128, hot: -1},
		{name: "R2_E8_K2_T500_tile64_shared_clamped", tile: 64, E: 8, K: 2, tokens: []int{500, 333}, H: 256, I: 128, hot: -1,
			shared: true, clamped: true},
		{name: "R8_E8_K2_T100_tile64", tile: 64, E: 8, K: 2, tokens: []int{100, 100, 37, 100, 100, 100, 100, 100}, H: 256, I: 128, hot: -1},
		{name: "R8_E128_K4_uneven_empty", E: 128, K: 4, tokens: []int{0, 1, 17, 64, 3, 100, 0, 9}, H: 256, I: 128, hot: -1},
		{name: "R8_E64_K1_hot_replicated_clamped", E: 64, K: 1, tokens: []int{40, 40, 40, 40, 40, 40, 40, 40}, H: 128,
			I: 64, hot: 9, replicate: true, clamped: true},
		// Local rows (read from x, never dispatched) only, and mixed with remote ones.
		{name: "R1_E16_K4_T701_tile64_shared", tile: 64, E: 16, K: 4, tokens: []int{701}, H: 256, I: 128, hot: -1, shared: true},
		{name: "R2_E8_K1_T41_all_local", E: 8, K: 1, tokens: []int{41, 40}, H: 256, I: 128, hot: -1, local: 30},
		{name: "R4_E64_K4_T97_all_local", E: 64, K: 4, tokens: []int{97, 1, 0, 50}, H: 256, I: 128, hot: -1, local: 30},
		{name: "R8_E64_K8_T100_all_local_tile64", tile: 64, E: 64, K: 8, tokens: []int{100, 100, 100, 100, 100, 100, 100, 99},
			H: 256, I: 128, hot: -1, local: 30, shared: true},
		{name: "R2_E32_K4_T150_mixed_local_tile64", tile: 64, E: 32, K: 4, tokens: []int{77, 150}, H: 256, I: 128, hot: -1,
			local: 1.5},
		{name: "R8_E128_K8_mixed_local_shared", E: 128, K: 8, tokens: []int{33, 7, 64, 1, 0, 50, 99, 20}, H: 256,
			I: 128, hot: -1, local: 2, shared: true, clamped: true},
		// The sm_90a wgmma tiles (128 × 256, TMA): picked from ~96 rows a slot, or forced.
		{name: "R1_E8_K2_T700_tile128", E: 8, K: 2, tokens: []int{700}, H: 256, I: 128, hot: -1},
		{name: "R2_E16_K4_T400_tile128_shared_clamped_edges", E: 16, K: 4, tokens: []int{400, 333}, H: 384, I: 192,
			hot: -1, shared: true, clamped: true, tile: 128},
		{name: "R4_E8_K2_T300_tile128_hot", E: 8, K: 2, tokens: []int{300, 250, 1, 299}, H: 256, I: 128, hot: 3,
			tile: 128},
		{name: "R8_E64_K8_tile128_mixed_local_uneven", E: 64, K: 8, tokens: []int{100, 100, 3, 100, 0, 100, 100, 77},
			H: 256, I: 128, hot: -1, local: 2, tile: 128},
		{name: "R1_E64_K8_T5_tile128_sparse", E: 64, K: 8, tokens: []int{5}, H: 256, I: 128, hot: -1, tile: 128},
		{name: "R2_E8_K2_T150_tile128_odd_dims", E: 8, K: 2, tokens: []int{150, 97}, H: 200, I: 136, hot: -1,
			tile: 128},
		// More k than the combine stages at once (32): the sums go on in chunks.
		{name: "R2_E64_K40_T9_shared", E: 64, K: 40, tokens: []int{9, 4}, H: 256, I: 128, hot: -1, shared: true},
		{name: "R1_E48_K36_T130_tile128", E: 48, K: 36, tokens: []int{130}, H: 256, I: 128, hot: -1, tile: 128},
		// The plan over many blocks (from 4096 assignments in all: moe_fused.cu's
		// plan_blocks): one rank's 16000 over 4 CTAs, and four ranks of uneven
		// counts whose tokens all pick one expert (every CTA's rows land in the
		// same slots, after the CTAs' before it).
		{name: "R1_E64_K8_T2000_tile128_plan_multi", E: 64, K: 8, tokens: []int{2000}, H: 256, I: 128, hot: -1, tile: 128},
		{name: "R4_E32_K4_hot_tile128_plan_multi", E: 32, K: 4, tokens: []int{1500, 1, 1500, 1024}, H: 256, I: 128, hot: 3, tile: 128},
		// Split reductions (one token's few tasks; the trace says which
		// splits ran; on the H200's 396 CTAs): Qwen3-30B-A3B's widths,
		// GEMM1 in two; a Mixtral-like GEMM2 in eight of 63 k steps
		// (uneven splits); the same at two ranks (dispatched rows; GEMM2
		// in four).
		{name: "R1_E16_K8_T1_ksplit_qwen3", E: 16, K: 8, tokens: []int{1}, H: 2048, I: 768, hot: -1, shared: true,
			split: true},
		{name: "R1_E8_K2_T1_ksplit_odd", E: 8, K: 2, tokens: []int{1}, H: 1024, I: 4000, hot: -1, split: true},
		{name: "R2_E8_K2_T1_ksplit_remote_clamped", E: 8, K: 2, tokens: []int{1, 1}, H: 1024, I: 4000, hot: -1,
			clamped: true, split: true},
		// Decode-sized tiles in odd shapes: widths that are not a multiple
		// of a 64-column block, a full 16-row tile (every token on one
		// expert), several rows a tile with the narrow combine (≤ 4 tokens:
		// 128 columns a combine task).
		{name: "R1_E8_K2_T3_odd_dims", E: 8, K: 2, tokens: []int{3}, H: 200, I: 136, hot: -1},
		{name: "R1_E8_K4_T16_hot_shared_clamped", E: 8, K: 4, tokens: []int{16}, H: 256, I: 128, hot: 5,
			shared: true, clamped: true},
		{name: "R1_E64_K8_T16_cold_odd_inter", E: 64, K: 8, tokens: []int{16}, H: 384, I: 96, hot: -1, cold: 12},
		// Dropped rows (the table places the hot expert nowhere): every
		// token's only row dropped (its output the shared one: from the
		// plan where the combine is folded into GEMM2, ≤ 4 tokens, else
		// from the combine task), and one of two rows dropped.
		{name: "R1_E8_K1_T3_hot_dropped_shared", E: 8, K: 1, tokens: []int{3}, H: 256, I: 128, hot: 5, drop: true,
			shared: true},
		{name: "R1_E8_K1_T40_hot_dropped_shared", E: 8, K: 1, tokens: []int{40}, H: 256, I: 128, hot: 5, drop: true,
			shared: true},
		{name: "R2_E16_K2_T4_3_hot_dropped", E: 16, K: 2, tokens: []int{4, 3}, H: 256, I: 128, hot: 5, drop: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runFusedCase(t, g, r, c) })
	}
}

// randExperts draws E experts' random weights: GateUp [E, 2I, H] and Down
// [E, H, I], as bf16 bits and their float32 values.
func randExperts(r *rand.Rand, E, H, I int) (gub16 []uint16, gu []float32, dnb16 []uint16, dn []float32) {
	gub16, gu = randBF16(r, E*2*I*H, 1/math.Sqrt(float64(H)))
	dnb16, dn = randBF16(r, E*H*I, 1/math.Sqrt(float64(I)))
	return gub16, gu, dnb16, dn
}

// slotWeights stacks the bf16 weights of the experts a rank's slots hold
// (MoEPlacement.SlotExperts) out of randExperts' gub16 and dnb16.
func slotWeights(gub16, dnb16 []uint16, experts []int, H, I int) (gu16, dn16 []uint16) {
	for _, e := range experts {
		gu16 = append(gu16, gub16[e*2*I*H:(e+1)*2*I*H]...)
		dn16 = append(dn16, dnb16[e*H*I:(e+1)*H*I]...)
	}
	return gu16, dn16
}

// fusedRankData is one rank's host inputs and reference.
type fusedRankData struct {
	T          int
	xb         []uint16
	x          []float32
	ids        []int32
	w          []float32
	shared     []float32
	gu16, dn16 []uint16 // local slots' weights
	want       []float64
}

func runFusedCase(t *testing.T, g *GPU, r *rand.Rand, c fusedCase) {
	R, E, K, H, I := len(c.tokens), c.E, c.K, c.H, c.I
	act := moe.Activation{Kind: moe.SwiGLU}
	if c.clamped {
		act = moe.Activation{Kind: moe.ClampedSwiGLU, Alpha: 1.702, Limit: 0.7}
	}
	pl := MoEBlockPlacement(E, R)
	if c.replicate {
		home := pl.Replicas[c.hot][0].Rank
		for q := range R {
			if q != home {
				pl.Replicate(c.hot, q)
			}
		}
	}
	table, err := pl.Table()
	if err != nil {
		t.Fatal(err)
	}
	if c.drop {
		for q := range R {
			table[q*E+c.hot] = -1
		}
	}
	slotExp := pl.SlotExperts()
	gub16, gu, dnb16, dn := randExperts(r, E, H, I)
	cfg := moe.RouterConfig{NumExperts: E, TopK: K, Scoring: moe.Softmax, NormTopK: true}
	rd := make([]fusedRankData, R)
	nLocal, nRemote := 0, 0 // assignments served by their own rank, by another
	hist := make([][]int64, R)
	for q := range R {
		hist[q] = make([]int64, pl.Slots[q])
	}
	for q := range R {
		d := &rd[q]
		d.T = c.tokens[q]
		T := d.T
		logits := randF32(r, T*E, 1)
		for tk := range T {
			for e := range E {
				if e == c.hot {
					logits[tk*E+e] += 30
				}
				if c.cold > 0 && e >= c.cold {
					logits[tk*E+e] -= 30
				}
				if c.local > 0 && int(table[q*E+e]>>16) == q {
					logits[tk*E+e] += c.local
				}
			}
		}
		if T > 0 {
			d.ids, d.w = moe.Route(&cfg, logits, nil, T)
		}
		d.xb, d.x = randBF16(r, T*H, 1)
		if c.shared {
			d.shared = randF32(r, T*H, 0.5)
		}
		for _, e := range d.ids {
			p := table[q*E+int(e)]
			if p < 0 {
				continue // dropped
			}
			hist[p>>16][p&0xffff]++
			if int(p>>16) == q {
				nLocal++
			} else {
				nRemote++
			}
		}
		d.gu16, d.dn16 = slotWeights(gub16, dnb16, slotExp[q], H, I)
	}
	t.Logf("%d local and %d remote rows", nLocal, nRemote)
	if strings.Contains(c.name, "all_local") && nRemote != 0 {
		t.Fatalf("%d remote rows in an all-local case", nRemote)
	}
	if strings.Contains(c.name, "mixed_local") && (nLocal == 0 || nRemote == 0 || nLocal < nRemote) {
		t.Fatalf("%d local and %d remote rows in a mixed case (want both, mostly local)", nLocal, nRemote)
	}
	if c.hot >= 0 {
		n := 0
		for q := range R {
			for _, e := range rd[q].ids {
				if int(e) == c.hot {
					n++
				}
			}
		}
		if tot := sumInts(c.tokens); n != tot {
			t.Fatalf("hot expert %d got %d of %d tokens", c.hot, n, tot)
		}
	}
	var wg sync.WaitGroup
	for q := range R {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := &rd[q]
			w := d.w
			if c.drop { // a dropped assignment contributes nothing
				w = append([]float32(nil), d.w...)
				for i, e := range d.ids {
					if table[q*E+int(e)] < 0 {
						w[i] = 0
					}
				}
			}
			d.want = moeRef(d.x, gu, nil, dn, nil, d.ids, w, d.T, K, H, I, act)
			for i := range d.shared {
				d.want[i] += float64(d.shared[i])
			}
		}()
	}
	wg.Wait()

	args := MoEFusedArgs{Tokens: c.tokens, Slots: pl.Slots, Experts: E, TopK: K, H: H, I: I, Clamped: c.clamped,
		Alpha: act.Alpha, Limit: act.Limit, Tile: c.tile}
	countsIn := make([][]int64, R)
	var outs, outs2, seps [][]float32
	var counts [][]int64
	onGPU(t, g, func(a *arena) {
		ctlBytes, rankBytes, tileM, err := a.d.MoEFusedWorkspace(args, true)
		a.check(err)
		if a.err != nil {
			return
		}
		t.Logf("row tile %d, rank workspaces %v bytes", tileM, rankBytes)
		wantTile := 16
		if strings.Contains(c.name, "tile64") {
			wantTile = 64
		} else if strings.Contains(c.name, "tile128") {
			wantTile = 128
		}
		if tileM != wantTile {
			t.Errorf("row tile %d for case %s, want %d", tileM, c.name, wantTile)
		}
		args.Table = put(a, table)
		var ctl *Buffer
		if c.split {
			var err error
			if ctl, err = a.d.NewMoEFusedTracedControl(ctlBytes, 1<<14); err == nil {
				a.bufs = append(a.bufs, ctl)
			}
			a.check(err)
		} else if ctl = a.alloc(ctlBytes); ctl != nil {
			a.check(Upload(a.d, ctl, make([]int32, ctlBytes/4)))
		}
		ranks := make([]MoEFusedRank, R)
		for q := range R {
			d := &rd[q]
			rk := &ranks[q]
			if d.T > 0 {
				rk.X, rk.IDs, rk.Weights = put(a, d.xb), put(a, d.ids), put(a, d.w)
				rk.Out = put(a, f32Fill(d.T*H, float32(math.NaN())))
				if c.shared {
					rk.Shared = put(a, d.shared)
				}
			}
			if pl.Slots[q] > 0 {
				rk.GateUp, rk.Down = put(a, d.gu16), put(a, d.dn16)
				countsIn[q] = make([]int64, pl.Slots[q])
				for s := range countsIn[q] {
					countsIn[q][s] = int64(3 * s)
				}
				rk.Counts = put(a, countsIn[q])
			}
			rk.WS = put(a, bf16Fill(int(rankBytes[q]/2), 0xffff)) // NaN everywhere, -1 as int32
		}
		if a.err != nil {
			return
		}
		download := func() [][]float32 {
			o := make([][]float32, R)
			for q := range R {
				if rd[q].T > 0 {
					o[q] = get[float32](a, ranks[q].Out, rd[q].T*H)
				}
			}
			return o
		}
		poison := func() {
			for q := range R {
				if rd[q].T > 0 {
					a.check(Upload(a.d, ranks[q].Out, f32Fill(rd[q].T*H, float32(math.NaN()))))
				}
			}
		}
		// The separate baseline first, so that its result is checked even
		// when the fused kernel fails; a watchdog report is an error of the
		// test, not of the arena (the device stays usable).
		a.check(a.d.MoEFusedSeparate(nil, ranks, ctl, args))
		seps = download()
		for run := range 2 {
			poison()
			a.check(a.d.MoEFused(nil, ranks, ctl, args))
			if a.err == nil {
				if err := a.d.MoEFusedCheck(ctl); err != nil {
					t.Errorf("fused run %d: %v", run, err)
				}
			}
			if run == 0 {
				outs = download()
			} else {
				outs2 = download()
			}
		}
		if c.split && a.err == nil {
			slots := 0
			for _, n := range pl.Slots {
				slots += n
			}
			checkSplits(t, a.d, ctl, func(ctas int) [2]int { return wantKSplit(ctas, sumInts(c.tokens)*K, slots, H, I) })
		}
		counts = make([][]int64, R)
		for q := range R {
			if pl.Slots[q] > 0 {
				counts[q] = get[int64](a, ranks[q].Counts, pl.Slots[q])
			}
		}
	})
	for q := range R {
		for s := range pl.Slots[q] {
			if want := countsIn[q][s] + 2*hist[q][s]; counts[q][s] != want {
				t.Errorf("rank %d slot %d (expert %d): counter %d, want %d + 2×%d", q, s, slotExp[q][s], counts[q][s],
					countsIn[q][s], hist[q][s])
			}
		}
		if rd[q].T == 0 {
			continue
		}
		name := fmt.Sprintf("rank %d T=%d", q, rd[q].T)
		checkClose(t, "fused "+name, outs[q], rd[q].want, 1e-2)
		checkClose(t, "separate "+name, seps[q], rd[q].want, 1e-2)
		for i := range outs[q] {
			if math.Float32bits(outs[q][i]) != math.Float32bits(outs2[q][i]) {
				t.Errorf("%s: element %d differs between two fused runs: %v, %v", name, i, outs[q][i], outs2[q][i])
				break
			}
		}
	}
}

// checkSplits reads the trace of the last launch on ctl and checks the
// splits its GEMM tasks ran with against want(the launch's CTAs), one of
// which must split.
func checkSplits(t *testing.T, d *Device, ctl *Buffer, want func(ctas int) [2]int) {
	t.Helper()
	recs, wanted, err := d.MoEFusedTrace(ctl)
	if err != nil {
		t.Errorf("trace: %v", err)
		return
	}
	sum, err := SummarizeMoETrace(recs, wanted)
	if err != nil {
		t.Errorf("trace: %v", err)
		return
	}
	t.Logf("k splits %v (%d records); %s", sum.Splits, len(recs), sum)
	if v := os.Getenv("MK_MOE_FUSED_KSPLIT"); v != "" {
		t.Logf("MK_MOE_FUSED_KSPLIT=%s forces the splits: not checked against the rule", v)
		return
	}
	w := want(sum.CTAs)
	if sum.Splits != w {
		t.Errorf("k splits %v with %d CTAs, want %v", sum.Splits, sum.CTAs, w)
	}
	if w[0] < 2 && w[1] < 2 {
		t.Errorf("the case splits nothing with %d CTAs (its shapes no longer exercise split reductions)", sum.CTAs)
	}
}

func sumInts(v []int) int {
	s := 0
	for _, x := range v {
		s += x
	}
	return s
}

// TestMoEFusedWatchdog: with one source rank's dispatch disabled, the
// kernel ends with a watchdog record (no hang), MoEFusedCheck names the
// waiting role, rank and tile, clears the record, and the next run is good.
func TestMoEFusedWatchdog(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	for _, tile := range []int{0, 128} { // picked (16-row mma.sync tiles here) and the wgmma tiles
		t.Run(fmt.Sprintf("tile%d", tile), func(t *testing.T) { fusedWatchdog(t, g, r, tile, false) })
	}
	// The wgmma CTA's own rings: CTA 0's first stage never fills.
	t.Run("tile128_stage", func(t *testing.T) { fusedWatchdog(t, g, r, 128, true) })
}

// fusedWatchdog runs a layer with a fault (rank 1 never dispatches, or with
// stage a stage of the wgmma kernel never fills), wants the error record
// instead of a hang, and then a good run on the same workspaces.
func fusedWatchdog(t *testing.T, g *GPU, r *rand.Rand, tile int, stage bool) {
	const R, E, K, H, I, T = 2, 8, 2, 64, 32, 20
	pl := MoEBlockPlacement(E, R)
	table, err := pl.Table()
	if err != nil {
		t.Fatal(err)
	}
	onGPU(t, g, func(a *arena) {
		args := MoEFusedArgs{Tokens: []int{T, T}, Slots: pl.Slots, Experts: E, TopK: K, H: H, I: I,
			Timeout: 20 * time.Millisecond, Tile: tile}
		ctlBytes, rankBytes, _, err := a.d.MoEFusedWorkspace(args, false)
		a.check(err)
		if a.err != nil {
			return
		}
		args.Table = put(a, table)
		ctl, err := a.d.NewMoEFusedControl(ctlBytes)
		a.check(err)
		if a.err != nil {
			return
		}
		defer ctl.Free()
		ranks := make([]MoEFusedRank, R)
		cfg := moe.RouterConfig{NumExperts: E, TopK: K, Scoring: moe.Softmax, NormTopK: true}
		for q := range R {
			xb, _ := randBF16(r, T*H, 1)
			ids, w := moe.Route(&cfg, randF32(r, T*E, 1), nil, T)
			gu, _ := randBF16(r, pl.Slots[q]*2*I*H, 0.1)
			dn, _ := randBF16(r, pl.Slots[q]*H*I, 0.1)
			ranks[q] = MoEFusedRank{X: put(a, xb), IDs: put(a, ids), Weights: put(a, w),
				Out: put(a, f32Fill(T*H, float32(math.NaN()))), GateUp: put(a, gu), Down: put(a, dn),
				WS: a.alloc(rankBytes[q])}
		}
		if a.err != nil {
			return
		}
		bad := args
		bad.faultRank = 2 // rank 1 never dispatches
		if stage {
			bad.faultRank = R + 1 // CTA 0's first stage never fills
		}
		start := time.Now()
		a.check(a.d.MoEFused(nil, ranks, ctl, bad))
		err = a.d.MoEFusedCheck(ctl)
		took := time.Since(start)
		var te *MoEFusedTimeoutError
		if !errors.As(err, &te) {
			t.Errorf("with the fault (stage %v): MoEFusedCheck = %v, want a *MoEFusedTimeoutError", stage, err)
			return
		}
		t.Logf("watchdog after %v: %v", took, te)
		// A stage that never fills: its CTA's consumers give up (role 7), or
		// first another CTA waiting for that task's outputs (roles 2, 3);
		// either way the launch ends instead of hanging.
		switch {
		case stage && te.Role != "compute (wgmma CTA)" && te.Role != "compute (gemm2)" && te.Role != "combine":
			t.Errorf("a stage that never fills: role %q", te.Role)
		case !stage && (te.Rank < 0 || te.Rank >= R || te.Seen >= te.Want || te.Tile < 0):
			t.Errorf("implausible record %+v", *te)
		}
		if took > 5*time.Second {
			t.Errorf("the watchdog took %v with a 20 ms timeout", took)
		}
		a.check(a.d.MoEFused(nil, ranks, ctl, args))
		if err := a.d.MoEFusedCheck(ctl); err != nil {
			t.Errorf("the run after the fault: %v", err)
		}
		for q := range R {
			out := get[float32](a, ranks[q].Out, T*H)
			for i, v := range out {
				if v != v {
					t.Errorf("rank %d: output %d unwritten after the good run", q, i)
					break
				}
			}
		}
	})
}

// TestMoEFusedArgs: bad arguments are errors, not crashes.
func TestMoEFusedArgs(t *testing.T) {
	g := testGPU(t)
	onGPU(t, g, func(a *arena) {
		b := a.alloc(1 << 16)
		if a.err != nil {
			return
		}
		good := MoEFusedArgs{Tokens: []int{4}, Slots: []int{8}, Table: b, Experts: 8, TopK: 2, H: 64, I: 32}
		rk := []MoEFusedRank{{X: b, IDs: b, Weights: b, Out: b, GateUp: b, Down: b, WS: b}}
		for _, c := range []struct {
			name string
			edit func(*MoEFusedArgs)
		}{
			{"nine ranks", func(x *MoEFusedArgs) { x.Tokens, x.Slots = make([]int, 9), make([]int, 9) }},
			{"slots length", func(x *MoEFusedArgs) { x.Slots = []int{4, 4} }},
			{"H not multiple of 8", func(x *MoEFusedArgs) { x.H = 60 }},
			{"K > E", func(x *MoEFusedArgs) { x.TopK = 9 }},
			{"negative tokens", func(x *MoEFusedArgs) { x.Tokens = []int{-1} }},
			{"too many slots", func(x *MoEFusedArgs) { x.Slots = []int{MoEFusedMaxSlots + 1} }},
			{"nil table", func(x *MoEFusedArgs) { x.Table = nil }},
			{"large H for the buffers", func(x *MoEFusedArgs) { x.H = 4096 }},
			{"tile 32", func(x *MoEFusedArgs) { x.Tile = 32 }},
			{"tile 128 with too many CTAs", func(x *MoEFusedArgs) { x.Tile, x.CTAs = 128, 2*g.Info().SMs }},
		} {
			x := good
			c.edit(&x)
			if err := a.d.MoEFused(nil, rk, b, x); err == nil {
				t.Errorf("%s: no error", c.name)
			} else {
				t.Logf("%s: %v", c.name, err)
			}
		}
		if err := a.d.MoEFused(nil, rk[:0], b, good); err == nil {
			t.Error("no ranks of buffers: no error")
		}
		small, err := b.View(0, 256)
		a.check(err)
		rk2 := []MoEFusedRank{rk[0]}
		rk2[0].WS = small
		if err := a.d.MoEFused(nil, rk2, b, good); err == nil {
			t.Error("a too small workspace: no error")
		} else {
			t.Logf("small workspace: %v", err)
		}
		p := MoEBlockPlacement(8, 2)
		p.Replicas[3] = nil
		if _, err := p.Table(); err == nil {
			t.Error("a placement with an expert without a copy: no error")
		}
	})
}

// TestMoEFusedCapacity: with MaxRows, a rank's workspace holds only its
// share of rows. Balanced routing within that share computes the layer
// (against the CPU reference); a hot expert that sends every row to one
// rank is a *MoEFusedCapacityError naming it, from the fused launch and
// from the separate path alike, with the outputs left untouched and the
// workspaces no larger than the cap asks; the next balanced run is good.
func TestMoEFusedCapacity(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	for _, tile := range []int{16, 128} {
		t.Run(fmt.Sprintf("tile%d", tile), func(t *testing.T) { fusedCapacity(t, g, r, tile) })
	}
}

func fusedCapacity(t *testing.T, g *GPU, r *rand.Rand, tile int) {
	const R, E, K, H, I, T = 4, 32, 2, 128, 64, 512
	pl := MoEBlockPlacement(E, R)
	table, err := pl.Table()
	if err != nil {
		t.Fatal(err)
	}
	slotExp := pl.SlotExperts()
	gub16, gu, dnb16, dn := randExperts(r, E, H, I)
	cfg := moe.RouterConfig{NumExperts: E, TopK: K, Scoring: moe.Softmax, NormTopK: true}
	act := moe.Activation{Kind: moe.SwiGLU}
	// route: each rank's ids and weights; hot ≥ 0 sends every token to
	// experts hot and hot+1 (both picks).
	route := func(hot int) (ids [][]int32, w [][]float32, perRank []int) {
		perRank = make([]int, R)
		for range R {
			logits := randF32(r, T*E, 1)
			if hot >= 0 {
				for tk := range T {
					logits[tk*E+hot] += 30
					logits[tk*E+hot+1] += 30
				}
			}
			i, ww := moe.Route(&cfg, logits, nil, T)
			ids, w = append(ids, i), append(w, ww)
			for _, e := range i {
				perRank[table[e]>>16]++ // the block placement is the same for every source
			}
		}
		return ids, w, perRank
	}
	// 1.5× the balanced share (R·T·K / R rows a rank): padding included, a
	// balanced routing fits with either tile, all rows on one rank do not.
	maxRows := 3 * T * K / 2
	args := MoEFusedArgs{Tokens: []int{T, T, T, T}, Slots: pl.Slots, Experts: E, TopK: K, H: H, I: I, Tile: tile,
		MaxRows: maxRows, Timeout: time.Second}
	full := args
	full.MaxRows = 0
	xs := make([][]uint16, R)
	xf := make([][]float32, R)
	for q := range R {
		xs[q], xf[q] = randBF16(r, T*H, 1)
	}
	onGPU(t, g, func(a *arena) {
		ctlBytes, rankBytes, tileM, err := a.d.MoEFusedWorkspace(args, true)
		a.check(err)
		_, fullBytes, _, err := a.d.MoEFusedWorkspace(full, true)
		a.check(err)
		if a.err != nil {
			return
		}
		t.Logf("row tile %d: workspaces %v bytes with MaxRows %d, %v without", tileM, rankBytes, maxRows, fullBytes)
		if rankBytes[0]*4 > fullBytes[0]*3 {
			t.Errorf("MaxRows %d (3/8 of all rows): workspace %d bytes, %d without", maxRows, rankBytes[0], fullBytes[0])
		}
		args.Table = put(a, table)
		ctl, err := a.d.NewMoEFusedControl(ctlBytes)
		a.check(err)
		if a.err != nil {
			return
		}
		defer ctl.Free()
		ranks := make([]MoEFusedRank, R)
		for q := range R {
			g16, d16 := slotWeights(gub16, dnb16, slotExp[q], H, I)
			ranks[q] = MoEFusedRank{X: put(a, xs[q]), IDs: a.alloc(T * K * 4), Weights: a.alloc(T * K * 4),
				Out: a.alloc(T * H * 4), GateUp: put(a, g16), Down: put(a, d16), WS: put(a, bf16Fill(int(rankBytes[q]/2), 0xffff))}
		}
		if a.err != nil {
			return
		}
		// run uploads a routing, poisons the outputs, runs fused or separate and returns the check's error.
		run := func(ids [][]int32, w [][]float32, sep bool) error {
			for q := range R {
				a.check(Upload(a.d, ranks[q].IDs, ids[q]))
				a.check(Upload(a.d, ranks[q].Weights, w[q]))
				a.check(Upload(a.d, ranks[q].Out, f32Fill(T*H, float32(math.NaN()))))
			}
			if sep {
				a.check(a.d.MoEFusedSeparate(nil, ranks, ctl, args))
			} else {
				a.check(a.d.MoEFused(nil, ranks, ctl, args))
			}
			return a.d.MoEFusedCheck(ctl)
		}
		good := func(name string, sep bool) {
			ids, w, per := route(-1)
			t.Logf("%s: rows per rank %v", name, per)
			if err := run(ids, w, sep); err != nil {
				t.Errorf("%s: %v", name, err)
				return
			}
			for q := range R {
				want := moeRef(xf[q], gu, nil, dn, nil, ids[q], w[q], T, K, H, I, act)
				checkClose(t, fmt.Sprintf("%s rank %d", name, q), get[float32](a, ranks[q].Out, T*H), want, 1e-2)
			}
		}
		good("balanced", false)
		good("balanced separate", true)
		for _, sep := range []bool{false, true} {
			ids, w, per := route(5) // experts 5 and 6 live on rank 0: every row there
			err := run(ids, w, sep)
			var ce *MoEFusedCapacityError
			if !errors.As(err, &ce) || ce.Rank != 0 || ce.Rows < per[0] || ce.Cap >= ce.Rows {
				t.Errorf("hot expert, separate=%v (%v rows per rank): %v, want a capacity error for rank 0", sep, per, err)
			} else {
				t.Logf("hot expert, separate=%v: %v", sep, err)
			}
			for q := range R {
				for i, v := range get[float32](a, ranks[q].Out, T*H) {
					if v == v {
						t.Errorf("hot expert, separate=%v: rank %d output %d written (%v) by a layer over capacity", sep, q, i, v)
						break
					}
				}
			}
		}
		good("balanced after the error", false)
	})
}
