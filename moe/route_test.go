package moe

import (
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
)

// The naive routers below follow the Hugging Face modeling code of each
// family line by line (softmax/sigmoid, torch.topk, gather, normalise), with
// a full stable sort standing in for torch.topk and lower index on ties.

// argsortDesc returns all indices of v, largest value first, stable
// (lower index first on ties), NaN first.
func argsortDesc(v []float32) []int {
	idx := make([]int, len(v))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := v[idx[a]], v[idx[b]]
		if math.IsNaN(float64(x)) || math.IsNaN(float64(y)) {
			return math.IsNaN(float64(x)) && !math.IsNaN(float64(y))
		}
		return x > y
	})
	return idx
}

func naiveSoftmax(x []float32) []float32 {
	m := math.Inf(-1)
	for _, v := range x {
		m = math.Max(m, float64(v))
	}
	var sum float64
	for _, v := range x {
		sum += math.Exp(float64(v) - m)
	}
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(math.Exp(float64(v)-m) / sum)
	}
	return out
}

// naiveSoftmaxTopK: Mixtral (norm always), Qwen2/3-MoE and OLMoE (norm by flag).
func naiveSoftmaxTopK(logits []float32, K int, norm bool) ([]int32, []float32) {
	probs := naiveSoftmax(logits)
	order := argsortDesc(probs)[:K]
	ids := make([]int32, K)
	w := make([]float32, K)
	var sum float32
	for k, e := range order {
		ids[k] = int32(e)
		w[k] = probs[e]
		sum += w[k]
	}
	if norm {
		for k := range w {
			w[k] /= sum
		}
	}
	return ids, w
}

// naiveGptOss: top-k over the (bias-added) logits, softmax over the k values.
func naiveGptOss(logits []float32, K int) ([]int32, []float32) {
	order := argsortDesc(logits)[:K]
	ids := make([]int32, K)
	vals := make([]float32, K)
	for k, e := range order {
		ids[k] = int32(e)
		vals[k] = logits[e]
	}
	return ids, naiveSoftmax(vals)
}

// naiveDeepSeekV3 follows DeepseekV3TopkRouter / route_tokens_to_experts.
func naiveDeepSeekV3(logits, bias []float32, K, nGroup, topkGroup int, norm bool, rsf float32) ([]int32, []float32) {
	E := len(logits)
	scores := make([]float32, E)
	choice := make([]float32, E)
	for e, v := range logits {
		scores[e] = float32(1 / (1 + math.Exp(-float64(v))))
		choice[e] = scores[e] + bias[e]
	}
	gs := E / nGroup
	groupScores := make([]float32, nGroup)
	for g := range nGroup {
		grp := choice[g*gs : (g+1)*gs]
		o := argsortDesc(grp)
		groupScores[g] = grp[o[0]] + grp[o[1]]
	}
	keep := map[int]bool{}
	for _, g := range argsortDesc(groupScores)[:topkGroup] {
		keep[g] = true
	}
	for e := range choice {
		if !keep[e/gs] {
			choice[e] = float32(math.Inf(-1)) // masked_fill(~score_mask, -inf) as transformers 5.17
		}
	}
	order := argsortDesc(choice)[:K]
	ids := make([]int32, K)
	w := make([]float32, K)
	var sum float32
	for k, e := range order {
		ids[k] = int32(e)
		w[k] = scores[e]
		sum += w[k]
	}
	for k := range w {
		if norm {
			w[k] /= sum + 1e-20
		}
		w[k] *= rsf
	}
	return ids, w
}

// byWeight sorts (ids, w) by descending weight, ties to lower id: the
// documented output order of Route.
func byWeight(ids []int32, w []float32) {
	type p struct {
		id int32
		w  float32
	}
	ps := make([]p, len(ids))
	for i := range ids {
		ps[i] = p{ids[i], w[i]}
	}
	sort.Slice(ps, func(a, b int) bool {
		if ps[a].w != ps[b].w {
			return ps[a].w > ps[b].w
		}
		return ps[a].id < ps[b].id
	})
	for i := range ps {
		ids[i], w[i] = ps[i].id, ps[i].w
	}
}

func TestRouteAgainstNaive(t *testing.T) {
	type naive func(row, bias []float32) ([]int32, []float32)
	cases := []struct {
		name     string
		cfg      RouterConfig
		bias     bool
		logitStd float64
		ref      naive
	}{
		{"mixtral", RouterConfig{NumExperts: 8, TopK: 2, NormTopK: true}, false, 2,
			func(x, _ []float32) ([]int32, []float32) { return naiveSoftmaxTopK(x, 2, true) }},
		{"qwen2_moe", RouterConfig{NumExperts: 60, TopK: 4}, false, 2,
			func(x, _ []float32) ([]int32, []float32) { return naiveSoftmaxTopK(x, 4, false) }},
		{"qwen3_moe", RouterConfig{NumExperts: 128, TopK: 8, NormTopK: true}, false, 2,
			func(x, _ []float32) ([]int32, []float32) { return naiveSoftmaxTopK(x, 8, true) }},
		{"olmoe", RouterConfig{NumExperts: 64, TopK: 8}, false, 2,
			func(x, _ []float32) ([]int32, []float32) { return naiveSoftmaxTopK(x, 8, false) }},
		{"gpt_oss", RouterConfig{NumExperts: 32, TopK: 4, SoftmaxTopK: true}, false, 3,
			func(x, _ []float32) ([]int32, []float32) { return naiveGptOss(x, 4) }},
		{"deepseek_v3", RouterConfig{NumExperts: 256, TopK: 8, Scoring: Sigmoid, NumGroups: 8, TopKGroups: 4, NormTopK: true, ScalingFactor: 2.5}, true, 2,
			func(x, b []float32) ([]int32, []float32) { return naiveDeepSeekV3(x, b, 8, 8, 4, true, 2.5) }},
		{"deepseek_v3_nonorm", RouterConfig{NumExperts: 64, TopK: 6, Scoring: Sigmoid, NumGroups: 8, TopKGroups: 3, ScalingFactor: 16}, true, 2,
			func(x, b []float32) ([]int32, []float32) { return naiveDeepSeekV3(x, b, 6, 8, 3, false, 16) }},
		// K equal to the eligible experts, with strongly negative choice
		// scores: a masked group (−inf) must never win over them.
		{"deepseek_v3_negative_scores", RouterConfig{NumExperts: 16, TopK: 4, Scoring: Sigmoid, NumGroups: 8, TopKGroups: 2, NormTopK: true, ScalingFactor: 1}, true, 2,
			func(x, b []float32) ([]int32, []float32) { return naiveDeepSeekV3(x, b, 4, 8, 2, true, 1) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRand(t)
			E, K := tc.cfg.NumExperts, tc.cfg.TopK
			// T large enough to take Route's parallel path for the big cases.
			for _, T := range []int{1, 7, 300} {
				logits := randn(r, T*E, tc.logitStd)
				var bias []float32
				if tc.bias {
					bias = randn(r, E, 0.6)
				}
				ids, w := Route(&tc.cfg, logits, bias, T)
				if len(ids) != T*K || len(w) != T*K {
					t.Fatalf("T=%d: got %d ids, %d weights, want %d", T, len(ids), len(w), T*K)
				}
				for tok := range T {
					wantIDs, wantW := tc.ref(logits[tok*E:(tok+1)*E], bias)
					byWeight(wantIDs, wantW)
					gotIDs, gotW := ids[tok*K:(tok+1)*K], w[tok*K:(tok+1)*K]
					for k := range K {
						if gotIDs[k] != wantIDs[k] {
							t.Fatalf("T=%d token %d: ids %v, want %v", T, tok, gotIDs, wantIDs)
						}
						if d := math.Abs(float64(gotW[k] - wantW[k])); d > 1e-6*math.Abs(float64(wantW[k]))+1e-9 {
							t.Fatalf("T=%d token %d slot %d: weight %g, want %g", T, tok, k, gotW[k], wantW[k])
						}
					}
				}
			}
		})
	}
}

// Mixtral's softmax→top-k→renormalise and gpt-oss's top-k→softmax are the
// same function; the two config spellings must agree.
func TestRouteMixtralEqualsSoftmaxTopK(t *testing.T) {
	r := newRand(t)
	const T, E, K = 50, 8, 2
	logits := randn(r, T*E, 3)
	a, wa := Route(&RouterConfig{NumExperts: E, TopK: K, NormTopK: true}, logits, nil, T)
	b, wb := Route(&RouterConfig{NumExperts: E, TopK: K, SoftmaxTopK: true}, logits, nil, T)
	for i := range a {
		if a[i] != b[i] || math.Abs(float64(wa[i]-wb[i])) > 1e-6 {
			t.Fatalf("slot %d: (%d, %g) vs (%d, %g)", i, a[i], wa[i], b[i], wb[i])
		}
	}
}

func TestRouteTies(t *testing.T) {
	nan := float32(math.NaN())
	cases := []struct {
		name    string
		cfg     RouterConfig
		logits  []float32
		bias    []float32
		wantIDs []int32
		wantW   []float32 // NaN: want NaN
	}{
		{"all equal, renormalised", RouterConfig{NumExperts: 6, TopK: 3, NormTopK: true},
			[]float32{0.5, 0.5, 0.5, 0.5, 0.5, 0.5}, nil, []int32{0, 1, 2}, []float32{1. / 3, 1. / 3, 1. / 3}},
		{"all equal, raw probabilities", RouterConfig{NumExperts: 4, TopK: 2},
			[]float32{-1, -1, -1, -1}, nil, []int32{0, 1}, []float32{0.25, 0.25}},
		{"tie at the cut goes to the lower index", RouterConfig{NumExperts: 5, TopK: 2, SoftmaxTopK: true},
			[]float32{1, 3, 0, 3, 3}, nil, []int32{1, 3}, []float32{0.5, 0.5}},
		{"tie in weight orders by id", RouterConfig{NumExperts: 4, TopK: 3, SoftmaxTopK: true},
			[]float32{2, 5, 2, 1}, nil, []int32{1, 0, 2}, nil},
		// Groups {0,1},{2,3},{4,5},{6,7}: groups 1 and 2 tie; group 1 wins.
		{"group tie goes to the lower group", RouterConfig{NumExperts: 8, TopK: 2, Scoring: Sigmoid, NumGroups: 4, TopKGroups: 1},
			[]float32{-5, -5, 1, 2, 2, 1, -5, -5}, make([]float32, 8), []int32{3, 2}, nil},
		{"NaN ranks first, as in torch.topk", RouterConfig{NumExperts: 4, TopK: 2, Scoring: Sigmoid},
			[]float32{1, 2, nan, 0}, nil, []int32{2, 1}, []float32{nan, float32(1 / (1 + math.Exp(-2)))}},
		{"NaN spreads through softmax without a panic", RouterConfig{NumExperts: 4, TopK: 2, SoftmaxTopK: true},
			[]float32{1, 2, nan, 0}, nil, []int32{1, 2}, []float32{nan, nan}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ids, w := Route(&tc.cfg, tc.logits, tc.bias, 1)
			for k := range tc.wantIDs {
				if ids[k] != tc.wantIDs[k] {
					t.Fatalf("ids %v, want %v (weights %v)", ids, tc.wantIDs, w)
				}
			}
			for k, want := range tc.wantW {
				got := w[k]
				if math.IsNaN(float64(want)) != math.IsNaN(float64(got)) || math.Abs(float64(got-want)) > 1e-6 {
					t.Fatalf("weights %v, want %v", w, tc.wantW)
				}
			}
			for k := 1; k < len(w); k++ {
				if w[k] > w[k-1] && !math.IsNaN(float64(w[k-1])) {
					t.Fatalf("weights %v not descending", w)
				}
			}
		})
	}
}

func TestRouterConfigValidate(t *testing.T) {
	good := RouterConfig{NumExperts: 16, TopK: 4, Scoring: Sigmoid, NumGroups: 4, TopKGroups: 2}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	cases := []struct {
		name string
		mod  func(*RouterConfig)
		want string
	}{
		{"no experts", func(c *RouterConfig) { c.NumExperts = 0 }, "NumExperts"},
		{"topk too big", func(c *RouterConfig) { c.TopK = 17 }, "TopK"},
		{"topk zero", func(c *RouterConfig) { c.TopK = 0 }, "TopK"},
		{"scoring", func(c *RouterConfig) { c.Scoring = 7 }, "Scoring"},
		{"softmax-topk with sigmoid", func(c *RouterConfig) { c.SoftmaxTopK = true }, "SoftmaxTopK"},
		{"groups do not divide", func(c *RouterConfig) { c.NumGroups = 3 }, "divisible"},
		{"group of one", func(c *RouterConfig) { c.NumGroups = 16; c.TopKGroups = 1 }, ">= 2"},
		{"topk groups too big", func(c *RouterConfig) { c.TopKGroups = 5 }, "TopKGroups"},
		{"topk groups without groups", func(c *RouterConfig) { c.NumGroups = 0 }, "TopKGroups"},
		{"scaling NaN", func(c *RouterConfig) { c.ScalingFactor = float32(math.NaN()) }, "ScalingFactor"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.mod(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want error naming %q", err, tc.want)
			}
		})
	}
}

func TestRoutePanicsOnBadShapes(t *testing.T) {
	cfg := &RouterConfig{NumExperts: 8, TopK: 2}
	cases := []struct {
		name string
		f    func()
		want string
	}{
		{"bad config", func() { Route(&RouterConfig{NumExperts: 8, TopK: 9}, make([]float32, 8), nil, 1) }, "TopK"},
		{"short logits", func() { Route(cfg, make([]float32, 15), nil, 2) }, "logits"},
		{"bias size", func() { Route(cfg, make([]float32, 8), make([]float32, 7), 1) }, "scoreBias"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), tc.want) {
					t.Fatalf("panic %v, want one naming %q", r, tc.want)
				}
			}()
			tc.f()
		})
	}
}

func BenchmarkRoute(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name string
		cfg  RouterConfig
		T    int
	}{
		{"qwen3_E128_K8_T1", RouterConfig{NumExperts: 128, TopK: 8, NormTopK: true}, 1},
		{"qwen3_E128_K8_T512", RouterConfig{NumExperts: 128, TopK: 8, NormTopK: true}, 512},
		{"gptoss_E32_K4_T512", RouterConfig{NumExperts: 32, TopK: 4, SoftmaxTopK: true}, 512},
		{"dsv3_E256_K8_T512", RouterConfig{NumExperts: 256, TopK: 8, Scoring: Sigmoid, NumGroups: 8, TopKGroups: 4, NormTopK: true, ScalingFactor: 2.5}, 512},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			E := tc.cfg.NumExperts
			logits := randn(r, tc.T*E, 2)
			var bias []float32
			if tc.cfg.Scoring == Sigmoid {
				bias = randn(r, E, 0.5)
			}
			b.SetBytes(int64(4 * len(logits)))
			for b.Loop() {
				Route(&tc.cfg, logits, bias, tc.T)
			}
		})
	}
}

// FuzzRoute feeds arbitrary logits (NaN and ±Inf included) and small configs:
// Route must not panic on a valid config, and must return K distinct
// in-range experts per token.
func FuzzRoute(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 192, 127, 0, 0, 128, 255, 1, 2, 3, 4}, uint8(4), uint8(2), uint8(0), uint8(0))
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32}, uint8(8), uint8(3), uint8(2), uint8(4))
	f.Fuzz(func(t *testing.T, raw []byte, e, k, style, groups uint8) {
		E := int(e%16) + 1
		cfg := RouterConfig{NumExperts: E, TopK: int(k)%E + 1}
		switch style % 4 {
		case 1:
			cfg.NormTopK = true
		case 2:
			cfg.SoftmaxTopK = true
		case 3:
			cfg.Scoring, cfg.NormTopK, cfg.ScalingFactor = Sigmoid, true, 2.5
			if g := int(groups%4) + 1; E%g == 0 && E/g >= 2 {
				cfg.NumGroups, cfg.TopKGroups = g, int(groups/4)%g+1
			}
		}
		if cfg.Validate() != nil {
			return
		}
		T := len(raw) / (4 * E)
		logits := make([]float32, T*E)
		for i := range logits {
			logits[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		}
		var bias []float32
		if cfg.Scoring == Sigmoid {
			bias = make([]float32, E)
			for i := range bias {
				bias[i] = float32(i%3) - 1
			}
		}
		ids, w := Route(&cfg, logits, bias, T)
		if len(ids) != T*cfg.TopK || len(w) != T*cfg.TopK {
			t.Fatalf("got %d ids, %d weights for T=%d K=%d", len(ids), len(w), T, cfg.TopK)
		}
		for tok := range T {
			seen := map[int32]bool{}
			for _, id := range ids[tok*cfg.TopK : (tok+1)*cfg.TopK] {
				if id < 0 || int(id) >= E || seen[id] {
					t.Fatalf("token %d: ids %v", tok, ids[tok*cfg.TopK:(tok+1)*cfg.TopK])
				}
				seen[id] = true
			}
		}
	})
}
