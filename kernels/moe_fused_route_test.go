package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/mkserve/mkserve/moe"
)

// TestMoEFusedRouterLayout pins moeFusedRouter to mk_moe_fused_router's C
// layout (moe_fused.cu asserts its size, 88 bytes), without the library.
func TestMoEFusedRouterLayout(t *testing.T) {
	var r moeFusedRouter
	for _, c := range []struct {
		name     string
		got, off uintptr
	}{
		{"logits", unsafe.Offsetof(r.logits), 0},
		{"score_bias", unsafe.Offsetof(r.scoreBias), 64},
		{"flags", unsafe.Offsetof(r.flags), 72},
		{"num_groups", unsafe.Offsetof(r.groups), 76},
		{"topk_groups", unsafe.Offsetof(r.topKGroups), 80},
		{"scaling_bits", unsafe.Offsetof(r.scaling), 84},
		{"sizeof", unsafe.Sizeof(r), 88},
	} {
		if c.got != c.off {
			t.Errorf("%s at %d, the header's layout says %d", c.name, c.got, c.off)
		}
	}
}

// routedCase is one fused call that routes its own tokens (MoEFusedArgs.Router).
type routedCase struct {
	name   string
	tokens []int // per rank
	cfg    moe.RouterConfig
	bias   bool // a score bias (DeepSeek-V3's correction)
	H, I   int
	shared bool
}

// TestMoEFusedRouted runs fused layers that route inside the call against
// the same layers given MoERoute's ids and weights, on fresh random
// logits: the ids and weight bits the call writes must equal MoERoute's
// and match moe.Route's, the outputs must equal, bit for bit, those of the
// layer given MoERoute's routing, and lie within 1e-2 (relative L2) of the
// float64 CPU loop on moe.Route's routing; the separate baseline with the
// router too. Softmax, softmax-top-k and group-limited sigmoid routing
// with a score bias; one and several emulated ranks, a rank without tokens.
func TestMoEFusedRouted(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	softmax := func(E, K int) moe.RouterConfig {
		return moe.RouterConfig{NumExperts: E, TopK: K, Scoring: moe.Softmax, NormTopK: true}
	}
	cases := []routedCase{
		{name: "R1_T1_E128_K8_qwen3", tokens: []int{1}, cfg: softmax(128, 8), H: 256, I: 128},
		{name: "R1_T1_E8_K2_mixtral_shared", tokens: []int{1}, cfg: softmax(8, 2), H: 256, I: 128, shared: true},
		{name: "R1_T5_E256_K8_grouped_bias", tokens: []int{5}, cfg: deepSeekV3Router, bias: true, H: 256, I: 128},
		{name: "R1_T8_E64_K4_softmax_topk", tokens: []int{8},
			cfg: moe.RouterConfig{NumExperts: 64, TopK: 4, Scoring: moe.Softmax, SoftmaxTopK: true}, H: 256, I: 128},
		{name: "R1_T7_E40_K8_no_norm", tokens: []int{7},
			cfg: moe.RouterConfig{NumExperts: 40, TopK: 8, Scoring: moe.Softmax, ScalingFactor: 1.5}, H: 200, I: 136},
		{name: "R1_T9_E128_K8", tokens: []int{9}, cfg: softmax(128, 8), H: 256, I: 128},
		{name: "R1_T64_E40_K8_no_norm", tokens: []int{64},
			cfg: moe.RouterConfig{NumExperts: 40, TopK: 8, Scoring: moe.Softmax, ScalingFactor: 1.5}, H: 200, I: 136},
		{name: "R1_T300_E256_K8_grouped_bias_shared", tokens: []int{300}, cfg: deepSeekV3Router, bias: true,
			H: 256, I: 128, shared: true},
		{name: "R1_T3_E320_K4", tokens: []int{3}, cfg: softmax(320, 4), H: 256, I: 128},
		{name: "R2_T1_E64_K4", tokens: []int{1, 1}, cfg: softmax(64, 4), H: 256, I: 128},
		{name: "R4_uneven_E128_K8", tokens: []int{7, 0, 1, 40}, cfg: softmax(128, 8), H: 256, I: 128},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runRoutedCase(t, g, r, c) })
	}
}

func runRoutedCase(t *testing.T, g *GPU, rng *rand.Rand, c routedCase) {
	R, E, K, H, I := len(c.tokens), c.cfg.NumExperts, c.cfg.TopK, c.H, c.I
	act := moe.Activation{Kind: moe.SwiGLU}
	pl := MoEBlockPlacement(E, R)
	table, err := pl.Table()
	if err != nil {
		t.Fatal(err)
	}
	slotExp := pl.SlotExperts()
	gub16, gu, dnb16, dn := randExperts(rng, E, H, I)
	var bias []float32
	if c.bias {
		bias = randF32(rng, E, 0.1)
	}
	type rankData struct {
		logits, x, shared []float32
		xb                []uint16
		ids               []int32
		w                 []float32
		gu16, dn16        []uint16
		want              []float64
	}
	rd := make([]rankData, R)
	for q := range R {
		d := &rd[q]
		T := c.tokens[q]
		d.logits = randF32(rng, T*E, 2)
		d.xb, d.x = randBF16(rng, T*H, 1)
		if c.shared {
			d.shared = randF32(rng, T*H, 0.5)
		}
		if T > 0 {
			d.ids, d.w = moe.Route(&c.cfg, d.logits, bias, T)
			d.want = moeRef(d.x, gu, nil, dn, nil, d.ids, d.w, T, K, H, I, act)
			for i := range d.shared {
				d.want[i] += float64(d.shared[i])
			}
		}
		d.gu16, d.dn16 = slotWeights(gub16, dnb16, slotExp[q], H, I)
	}
	router := moeRouter(c.cfg)
	args := MoEFusedArgs{Tokens: c.tokens, Slots: pl.Slots, Experts: E, TopK: K, H: H, I: I}
	type result struct {
		ids  [][]int32
		w    [][]float32
		outs [][]float32
	}
	var given, routed, sep result
	var refIDs [][]int32
	var refW [][]float32
	onGPU(t, g, func(a *arena) {
		ctlBytes, rankBytes, _, err := a.d.MoEFusedWorkspace(args, true)
		a.check(err)
		if a.err != nil {
			return
		}
		args.Table = put(a, table)
		ctl := a.alloc(ctlBytes)
		if ctl != nil {
			a.check(Upload(a.d, ctl, make([]int32, ctlBytes/4)))
		}
		var sb *Buffer
		if c.bias {
			sb = put(a, bias)
		}
		ranks := make([]MoEFusedRank, R)
		refs := make([][2]*Buffer, R) // MoERoute's ids and weights
		for q := range R {
			d, rk := &rd[q], &ranks[q]
			if T := c.tokens[q]; T > 0 {
				rk.X, rk.Logits = put(a, d.xb), put(a, d.logits)
				rk.IDs, rk.Weights = a.alloc(int64(T*K)*4), a.alloc(int64(T*K)*4)
				rk.Out = put(a, f32Fill(T*H, float32(math.NaN())))
				if c.shared {
					rk.Shared = put(a, d.shared)
				}
				refs[q] = [2]*Buffer{a.alloc(int64(T*K) * 4), a.alloc(int64(T*K) * 4)}
				if a.err == nil {
					a.check(a.d.MoERoute(nil, refs[q][0], refs[q][1], rk.Logits, sb, T, router))
				}
			}
			rk.GateUp, rk.Down = put(a, d.gu16), put(a, d.dn16)
			rk.WS = put(a, bf16Fill(int(rankBytes[q]/2), 0xffff))
		}
		if a.err != nil {
			return
		}
		// poison sets every rank's ids to -1, weights and outputs to NaN.
		poison := func() {
			for q := range R {
				if T := c.tokens[q]; T > 0 {
					a.check(Upload(a.d, ranks[q].IDs, f32Fill(T*K, math.Float32frombits(0xffffffff))))
					a.check(Upload(a.d, ranks[q].Weights, f32Fill(T*K, float32(math.NaN()))))
					a.check(Upload(a.d, ranks[q].Out, f32Fill(T*H, float32(math.NaN()))))
				}
			}
		}
		read := func() (res result) {
			res.ids, res.w, res.outs = make([][]int32, R), make([][]float32, R), make([][]float32, R)
			for q := range R {
				if T := c.tokens[q]; T > 0 {
					res.ids[q] = get[int32](a, ranks[q].IDs, T*K)
					res.w[q] = get[float32](a, ranks[q].Weights, T*K)
					res.outs[q] = get[float32](a, ranks[q].Out, T*H)
				}
			}
			return res
		}
		refIDs, refW = make([][]int32, R), make([][]float32, R)
		for q := range R {
			if T := c.tokens[q]; T > 0 {
				refIDs[q] = get[int32](a, refs[q][0], T*K)
				refW[q] = get[float32](a, refs[q][1], T*K)
			}
		}
		// run poisons the outputs, lets given (when true) copy MoERoute's ids
		// and weights in, runs f with ar and reads every rank's results.
		run := func(what string, f func(*Stream, []MoEFusedRank, *Buffer, MoEFusedArgs) error, ar MoEFusedArgs,
			given bool) result {
			poison()
			for q := range R {
				if T := c.tokens[q]; T > 0 && given {
					a.check(Upload(a.d, ranks[q].IDs, refIDs[q]))
					a.check(Upload(a.d, ranks[q].Weights, refW[q]))
				}
			}
			if a.err != nil {
				return result{}
			}
			a.check(f(nil, ranks, ctl, ar))
			if a.err == nil {
				if err := a.d.MoEFusedCheck(ctl); err != nil {
					t.Errorf("%s: %v", what, err)
				}
			}
			return read()
		}
		given = run("given routing", a.d.MoEFused, args, true)
		ra := args
		ra.Router, ra.ScoreBias = &router, sb
		routed = run("fused", a.d.MoEFused, ra, false)
		sep = run("separate", a.d.MoEFusedSeparate, ra, false)
	})
	for q := range R {
		T := c.tokens[q]
		if T == 0 {
			continue
		}
		name := fmt.Sprintf("rank %d T=%d", q, T)
		for _, v := range []struct {
			what string
			res  result
		}{{"fused", routed}, {"separate", sep}} {
			for i := range refIDs[q] {
				if v.res.ids[q][i] != refIDs[q][i] || math.Float32bits(v.res.w[q][i]) != math.Float32bits(refW[q][i]) {
					t.Errorf("%s %s: assignment %d routed to %d (weight %v), MoERoute says %d (%v)", v.what, name, i,
						v.res.ids[q][i], v.res.w[q][i], refIDs[q][i], refW[q][i])
					break
				}
			}
			checkClose(t, v.what+" routed "+name, v.res.outs[q], rd[q].want, 1e-2)
		}
		for i, id := range refIDs[q] {
			if id != rd[q].ids[i] || math.Abs(float64(refW[q][i]-rd[q].w[i])) > 1e-6 {
				t.Errorf("%s: MoERoute's assignment %d is %d (%v), moe.Route's %d (%v)", name, i, id, refW[q][i],
					rd[q].ids[i], rd[q].w[i])
				break
			}
		}
		checkClose(t, "given routing "+name, given.outs[q], rd[q].want, 1e-2)
		for i := range given.outs[q] {
			if math.Float32bits(given.outs[q][i]) != math.Float32bits(routed.outs[q][i]) {
				t.Errorf("%s: element %d is %v routed in the call, %v with MoERoute's routing given", name, i,
					routed.outs[q][i], given.outs[q][i])
				break
			}
		}
	}
}

// TestMoEFusedRouterArgs: a fused call's router is checked before anything
// runs (no GPU work needed for the errors).
func TestMoEFusedRouterArgs(t *testing.T) {
	g := testGPU(t)
	onGPU(t, g, func(a *arena) {
		const E, K, T, H, I = 16, 2, 3, 64, 32
		args := MoEFusedArgs{Tokens: []int{T}, Slots: []int{E}, Experts: E, TopK: K, H: H, I: I}
		ctlBytes, rankBytes, _, err := a.d.MoEFusedWorkspace(args, false)
		a.check(err)
		if a.err != nil {
			return
		}
		args.Table = put(a, make([]int32, E))
		ctl := a.alloc(ctlBytes)
		rk := MoEFusedRank{X: a.alloc(T * H * 2), IDs: a.alloc(T * K * 4), Weights: a.alloc(T * K * 4),
			Out: a.alloc(T * H * 4), GateUp: a.alloc(E * 2 * I * H * 2), Down: a.alloc(E * H * I * 2),
			WS: a.alloc(int64(rankBytes[0]))}
		if a.err != nil {
			return
		}
		bad := []struct {
			name string
			rt   MoERouter
			rk   func(MoEFusedRank) MoEFusedRank
			sb   *Buffer
		}{
			{"no logits", MoERouter{Experts: E, TopK: K}, func(r MoEFusedRank) MoEFusedRank { return r }, nil},
			{"short logits", MoERouter{Experts: E, TopK: K},
				func(r MoEFusedRank) MoEFusedRank { r.Logits = a.alloc(T * 4); return r }, nil},
			{"other experts", MoERouter{Experts: E / 2, TopK: K},
				func(r MoEFusedRank) MoEFusedRank { r.Logits = a.alloc(T * E * 4); return r }, nil},
			{"sigmoid softmax-top-k", MoERouter{Experts: E, TopK: K, Sigmoid: true, SoftmaxTopK: true},
				func(r MoEFusedRank) MoEFusedRank { r.Logits = a.alloc(T * E * 4); return r }, nil},
			{"short score bias", MoERouter{Experts: E, TopK: K},
				func(r MoEFusedRank) MoEFusedRank { r.Logits = a.alloc(T * E * 4); return r }, a.alloc(4)},
		}
		for _, b := range bad {
			ar := args
			ar.Router, ar.ScoreBias = &b.rt, b.sb
			if err := a.d.MoEFused(nil, []MoEFusedRank{b.rk(rk)}, ctl, ar); err == nil {
				t.Errorf("%s: no error", b.name)
			} else {
				t.Logf("%s: %v", b.name, err)
			}
		}
		ar := args
		ar.ScoreBias = a.alloc(E * 4)
		if err := a.d.MoEFused(nil, []MoEFusedRank{rk}, ctl, ar); err == nil {
			t.Errorf("score bias without a router: no error")
		}
	})
}
