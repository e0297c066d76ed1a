package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/moe"
)

// moeCase is one random MoE layer.
type moeCase struct {
	name       string
	T, E, H, I int
	router     moe.RouterConfig
	scoreBias  bool // e_score_correction_bias
	expBias    bool // GateUpBias and DownBias
	shared     bool
	sharedGate bool
}

var moeCases = []moeCase{
	{name: "softmax_shared_gated", T: 9, E: 8, H: 16, I: 12,
		router: moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, NormTopK: true}, shared: true, sharedGate: true},
	{name: "softmax_unnormalised_shared", T: 1, E: 6, H: 8, I: 4,
		router: moe.RouterConfig{NumExperts: 6, TopK: 3, Scoring: moe.Softmax}, shared: true},
	{name: "sigmoid_bias_scaled", T: 13, E: 10, H: 12, I: 8,
		router:    moe.RouterConfig{NumExperts: 10, TopK: 4, Scoring: moe.Sigmoid, NormTopK: true, ScalingFactor: 2.5},
		scoreBias: true, expBias: true},
	{name: "many_tokens", T: 70, E: 4, H: 24, I: 16,
		router: moe.RouterConfig{NumExperts: 4, TopK: 2, Scoring: moe.Softmax, NormTopK: true}, shared: true, sharedGate: true},
}

// build makes random weights and input for c.
func (c *moeCase) build(r *rand.Rand) (*Tensor, *backend.MoELayer) {
	l := &backend.MoELayer{
		Router: c.router,
		Gate:   randT(r, c.E, c.H),
		GateUp: FromFloat32([]int{c.E * 2 * c.I, c.H}, randVec(r, c.E*2*c.I*c.H, 0.5)),
		Down:   FromFloat32([]int{c.E * c.H, c.I}, randVec(r, c.E*c.H*c.I, 0.5)),
		Act:    moe.Activation{Kind: moe.SwiGLU},
	}
	if c.scoreBias {
		l.ScoreBias = FromFloat32([]int{c.E}, randVec(r, c.E, 0.3))
	}
	if c.expBias {
		l.GateUpBias = FromFloat32([]int{c.E, 2 * c.I}, randVec(r, c.E*2*c.I, 0.5))
		l.DownBias = FromFloat32([]int{c.E, c.H}, randVec(r, c.E*c.H, 0.5))
	}
	if c.shared {
		l.Shared = &backend.MLP{GateUp: randT(r, 2*c.I, c.H), Down: randT(r, c.H, c.I)}
	}
	if c.sharedGate {
		l.SharedGate = randT(r, 1, c.H)
	}
	return randT(r, c.T, c.H), l
}

// refMoE is the layer computed naively in float64: router (softmax or
// sigmoid, bias for the choice only, top-k, renormalise, scale), experts and
// the gated shared expert.
func (c *moeCase) ref(x *Tensor, l *backend.MoELayer) []float64 {
	T, E, H, I, K := c.T, c.E, c.H, c.I, c.router.TopK
	logits := refLinear(x.Data(), l.Gate.(*Tensor).Data(), nil, T, E, H)
	gu, down := l.GateUp.(*Tensor).Data(), l.Down.(*Tensor).Data()
	var gub, db, sb []float32
	if c.expBias {
		gub, db = l.GateUpBias.(*Tensor).Data(), l.DownBias.(*Tensor).Data()
	}
	if c.scoreBias {
		sb = l.ScoreBias.(*Tensor).Data()
	}
	out := make([]float64, T*H)
	for t := 0; t < T; t++ {
		lg := logits[t*E : (t+1)*E]
		scores := make([]float64, E)
		if c.router.Scoring == moe.Sigmoid {
			for e, v := range lg {
				scores[e] = 1 / (1 + math.Exp(-v))
			}
		} else {
			m, sum := math.Inf(-1), 0.0
			for _, v := range lg {
				m = math.Max(m, v)
			}
			for e, v := range lg {
				scores[e] = math.Exp(v - m)
				sum += scores[e]
			}
			for e := range scores {
				scores[e] /= sum
			}
		}
		order := make([]int, E)
		for e := range order {
			order[e] = e
		}
		choice := func(e int) float64 {
			if sb != nil {
				return scores[e] + float64(sb[e])
			}
			return scores[e]
		}
		sort.SliceStable(order, func(i, j int) bool { return choice(order[i]) > choice(order[j]) })
		top := order[:K]
		w := make([]float64, K)
		sum := 0.0
		for k, e := range top {
			w[k] = scores[e]
			sum += w[k]
		}
		for k := range w {
			if c.router.NormTopK {
				w[k] /= sum
			}
			if f := c.router.ScalingFactor; f != 0 {
				w[k] *= float64(f)
			}
		}
		xr := x.Data()[t*H : (t+1)*H]
		for k, e := range top {
			a := make([]float64, I)
			for i := 0; i < I; i++ {
				var g, u float64
				if gub != nil {
					g, u = float64(gub[e*2*I+i]), float64(gub[e*2*I+I+i])
				}
				for h, v := range xr {
					g += float64(v) * float64(gu[(e*2*I+i)*H+h])
					u += float64(v) * float64(gu[(e*2*I+I+i)*H+h])
				}
				a[i] = silu(g) * u
			}
			for h := 0; h < H; h++ {
				s := 0.0
				if db != nil {
					s = float64(db[e*H+h])
				}
				for i := 0; i < I; i++ {
					s += a[i] * float64(down[(e*H+h)*I+i])
				}
				out[t*H+h] += w[k] * s
			}
		}
	}
	if l.Shared != nil {
		sh, _ := refMLP(x.Data(), l.Shared.GateUp.(*Tensor).Data(), l.Shared.Down.(*Tensor).Data(), T, H, I)
		for t := 0; t < T; t++ {
			g := 1.0
			if l.SharedGate != nil {
				g = 1 / (1 + math.Exp(-refLinear(x.Data()[t*H:(t+1)*H], l.SharedGate.(*Tensor).Data(), nil, 1, 1, H)[0]))
			}
			for h := 0; h < H; h++ {
				out[t*H+h] += g * sh[t*H+h]
			}
		}
	}
	return out
}

func TestMoE(t *testing.T) {
	for _, c := range moeCases {
		t.Run(c.name, func(t *testing.T) {
			r := newRand(t)
			x, l := c.build(r)
			got := New(Options{}).MoE(x, l)
			checkShape(t, "moe", got, c.T, c.H)
			checkClose(t, "moe", data(t, got), c.ref(x, l), 2e-5)
		})
	}
}

// TestMoEExpertParallel compares 4 emulated expert-parallel ranks with the
// direct path, over repeated calls (the EP world is cached per layer).
func TestMoEExpertParallel(t *testing.T) {
	for _, c := range moeCases {
		t.Run(c.name, func(t *testing.T) {
			r := newRand(t)
			_, l := c.build(r)
			one, four := New(Options{EPRanks: 1}), New(Options{EPRanks: 4})
			for call := 0; call < 3; call++ {
				x := randT(r, c.T+call, c.H)
				a, b := data(t, one.MoE(x, l)), data(t, four.MoE(x, l))
				if d := maxRelDiff(b, a); !(d <= 1e-5) {
					t.Fatalf("call %d: EP 4 ranks differs from 1 by %g relative", call, d)
				}
			}
			if n := len(four.eps); n != 1 {
				t.Fatalf("%d EP worlds cached for one layer, want 1", n)
			}
			// New expert weights in the same layer must not reuse the old world.
			old := four.eps[l].ep
			l.Down = FromFloat32([]int{c.E * c.H, c.I}, randVec(r, c.E*c.H*c.I, 0.5))
			x := randT(r, c.T, c.H)
			a, b := data(t, one.MoE(x, l)), data(t, four.MoE(x, l))
			if d := maxRelDiff(b, a); !(d <= 1e-5) || four.eps[l].ep == old {
				t.Fatalf("after replacing Down: EP differs by %g relative (world rebuilt: %v)", d, four.eps[l].ep != old)
			}
		})
	}
}

func TestMoEShapePanics(t *testing.T) {
	r := newRand(t)
	c := moeCases[0]
	x, l := c.build(r)
	be := New(Options{})
	for _, p := range []struct {
		want string
		edit func(l *backend.MoELayer)
	}{
		{"Gate [8 16] has 8 experts, Router.NumExperts = 7", func(l *backend.MoELayer) { l.Router.NumExperts = 7 }},
		{"GateUp [8 16] is not [E*2I, H]", func(l *backend.MoELayer) { l.GateUp = randT(r, 8, c.H) }},
		{fmt.Sprintf("Down [%d %d] is not [E*H, I]", c.E*c.H-1, c.I), func(l *backend.MoELayer) { l.Down = randT(r, c.E*c.H-1, c.I) }},
		{"SharedGate has shape [1 3]", func(l *backend.MoELayer) { l.SharedGate = randT(r, 1, 3) }},
	} {
		bad := *l
		p.edit(&bad)
		mustPanic(t, "cpu.MoE: "+p.want, func() { be.MoE(x, &bad) })
	}
}

// TestExpertLoad: the counters see every routed (token, slot) once, per
// layer, and are reset by TakeExpertLoad.
func TestExpertLoad(t *testing.T) {
	r := newRand(t)
	c := moeCases[0]
	be := New(Options{})
	x, l := c.build(r)
	l.Layer = 3
	be.MoE(x, l)
	l2 := *l
	l2.Layer = 5
	be.MoE(randT(r, 4, c.H), &l2)
	got := be.TakeExpertLoad()
	for layer, want := range map[int]int64{3: int64(c.T * c.router.TopK), 5: int64(4 * c.router.TopK)} {
		var sum int64
		for _, n := range got[layer] {
			sum += n
		}
		if sum != want || len(got[layer]) != c.E {
			t.Errorf("layer %d: %d routed over %d experts, want %d over %d", layer, sum, len(got[layer]), want, c.E)
		}
	}
	if again := be.TakeExpertLoad(); len(again) != 0 {
		t.Errorf("counters not reset: %v", again)
	}
}

// TestPlaceExperts: a placement installed with PlaceExperts takes effect at
// the layer's next step: with every token routed to expert 0 (a large gate
// bias), the contiguous table puts all rows on rank 0, and a placement that
// replicates expert 0 on every rank spreads them; the output stays equal to
// one rank's. Bad placements are errors.
func TestPlaceExperts(t *testing.T) {
	c := moeCase{T: 64, E: 8, H: 16, I: 12, router: moe.RouterConfig{NumExperts: 8, TopK: 1, Scoring: moe.Softmax}}
	r := newRand(t)
	_, l := c.build(r)
	bias := make([]float32, c.E)
	bias[0] = 100
	l.GateBias = FromFloat32([]int{c.E}, bias)
	one, four := New(Options{EPRanks: 1}), New(Options{EPRanks: 4})
	x := randT(r, c.T, c.H)
	want := data(t, one.MoE(x, l))
	if d := maxRelDiff(data(t, four.MoE(x, l)), want); !(d <= 1e-5) {
		t.Fatalf("contiguous: EP differs by %g relative", d)
	}
	if rl := four.eps[l].ep.RankLoad(); rl[0] != uint64(c.T) || rl[1]+rl[2]+rl[3] != 0 {
		t.Fatalf("contiguous table: rows per rank %v, want all %d on rank 0", rl, c.T)
	}
	load := make([]int64, c.E)
	load[0] = 1000
	p, err := moe.Rebalance(load, 4, 3)
	if err != nil {
		t.Fatal(err)
	}
	if reps := p.Replicas(); reps[0] != 4 {
		t.Fatalf("rebalance gave expert 0 %d replicas, want 4", reps[0])
	}
	if err := four.PlaceExperts(0, p); err != nil {
		t.Fatal(err)
	}
	if d := maxRelDiff(data(t, four.MoE(x, l)), want); !(d <= 1e-5) {
		t.Fatalf("replicated: EP differs by %g relative", d)
	}
	for rank, n := range four.eps[l].ep.RankLoad() {
		if n == 0 {
			t.Errorf("replicated expert 0: rank %d computed no rows", rank)
		}
	}
	bad, _ := moe.Rebalance(load, 2, 4)
	for _, tc := range []struct {
		be   *Backend
		p    *moe.Placement
		want string
	}{
		{one, p, "no in-process expert parallelism"},
		{four, bad, "2 ranks"},
		{four, &moe.Placement{Experts: 8, SlotsPerRank: 1, Slots: [][]int{{0}, {1}, {2}, {3}}}, "placement"},
	} {
		if err := tc.be.PlaceExperts(0, tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PlaceExperts: %v, want an error containing %q", err, tc.want)
		}
	}
}
