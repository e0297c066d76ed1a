package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

// moeRouter converts a moe.RouterConfig to the kernels' form.
func moeRouter(c moe.RouterConfig) MoERouter {
	return MoERouter{Experts: c.NumExperts, TopK: c.TopK, Sigmoid: c.Scoring == moe.Sigmoid,
		SoftmaxTopK: c.SoftmaxTopK, NormTopK: c.NormTopK, Groups: c.NumGroups, TopKGroups: c.TopKGroups,
		Scaling: c.ScalingFactor}
}

// deepSeekV3Router is DeepSeek-V3's routing: 256 experts in 8 groups, top-4
// groups, top-8 experts, sigmoid scores renormalised and scaled by 2.5.
var deepSeekV3Router = moe.RouterConfig{NumExperts: 256, TopK: 8, Scoring: moe.Sigmoid, NormTopK: true,
	NumGroups: 8, TopKGroups: 4, ScalingFactor: 2.5}

// runRoute routes logits [T, E] on the GPU.
func runRoute(t *testing.T, g *GPU, cfg moe.RouterConfig, logits, bias []float32, T int) ([]int32, []float32) {
	t.Helper()
	K := cfg.TopK
	var ids []int32
	var w []float32
	onGPU(t, g, func(a *arena) {
		ib := put(a, make([]int32, T*K))
		wb := put(a, f32Fill(T*K, float32(math.NaN())))
		a.check(Upload(a.d, ib, func() []int32 {
			s := make([]int32, T*K)
			for i := range s {
				s[i] = -7
			}
			return s
		}()))
		lb := put(a, logits)
		var bb *Buffer
		if bias != nil {
			bb = put(a, bias)
		}
		if a.err == nil {
			a.check(a.d.MoERoute(nil, ib, wb, lb, bb, T, moeRouter(cfg)))
		}
		ids, w = get[int32](a, ib, T*K), get[float32](a, wb, T*K)
	})
	return ids, w
}

// TestMoERoute: device routing equals moe.Route on fresh random logits:
// ids exactly, weights to 1e-6 (relative to max(1, |w|)).
func TestMoERoute(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	cases := []struct {
		name string
		cfg  moe.RouterConfig
		bias bool
		T    int
		gen  string // "": normal logits; "ties": few distinct values (ties everywhere); "special": NaN, ±Inf, ±0 sprinkled in
	}{
		{"softmax_norm", moe.RouterConfig{NumExperts: 64, TopK: 8, Scoring: moe.Softmax, NormTopK: true}, false, 300, ""},
		{"softmax_nonorm", moe.RouterConfig{NumExperts: 128, TopK: 8, Scoring: moe.Softmax}, false, 77, ""},
		{"softmax_topk", moe.RouterConfig{NumExperts: 32, TopK: 4, Scoring: moe.Softmax, SoftmaxTopK: true}, false, 129, ""},
		{"softmax_topk_norm", moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, SoftmaxTopK: true, NormTopK: true}, false, 50, ""},
		{"deepseek_v3", deepSeekV3Router, true, 257, ""},
		{"sigmoid_groups_nonorm", moe.RouterConfig{NumExperts: 64, TopK: 6, Scoring: moe.Sigmoid, NumGroups: 8, TopKGroups: 3}, true, 100, ""},
		{"sigmoid_plain", moe.RouterConfig{NumExperts: 16, TopK: 1, Scoring: moe.Sigmoid, NormTopK: true}, false, 33, ""},
		{"topk_all", moe.RouterConfig{NumExperts: 40, TopK: 40, Scoring: moe.Softmax, NormTopK: true, ScalingFactor: 1.5}, false, 9, ""},
		{"mixtral", moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, NormTopK: true}, false, 1, ""},
		// The register kernel (E ≤ 256, K ≤ 32) at its widest, with experts
		// not a multiple of 32, and groups of 24; then the shared-memory
		// kernel past 256 experts.
		{"softmax_e256", moe.RouterConfig{NumExperts: 256, TopK: 8, Scoring: moe.Softmax, NormTopK: true}, false, 70, ""},
		{"sigmoid_e200_bias", moe.RouterConfig{NumExperts: 200, TopK: 6, Scoring: moe.Sigmoid, NormTopK: true, ScalingFactor: 2}, true, 41, ""},
		{"groups_of_24", moe.RouterConfig{NumExperts: 96, TopK: 8, Scoring: moe.Sigmoid, NormTopK: true, NumGroups: 4, TopKGroups: 2}, true, 33, ""},
		{"topk_32", moe.RouterConfig{NumExperts: 60, TopK: 32, Scoring: moe.Softmax, SoftmaxTopK: true, NormTopK: true}, false, 12, ""},
		{"softmax_e512", moe.RouterConfig{NumExperts: 512, TopK: 8, Scoring: moe.Softmax, NormTopK: true}, false, 20, ""},
		// The order of equal scores (lower expert first, +0 = -0) and of
		// NaN (above every number) in the register kernel's rank keys and
		// the shared-memory kernel's comparisons.
		{"ties_softmax_e128", moe.RouterConfig{NumExperts: 128, TopK: 8, Scoring: moe.Softmax, NormTopK: true}, false, 64, "ties"},
		{"ties_deepseek_v3", deepSeekV3Router, true, 64, "ties"},
		{"ties_softmax_topk_e8", moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, SoftmaxTopK: true, NormTopK: true}, false, 40, "ties"},
		{"ties_e512", moe.RouterConfig{NumExperts: 512, TopK: 8, Scoring: moe.Softmax, NormTopK: true}, false, 16, "ties"},
		{"special_sigmoid_e200", moe.RouterConfig{NumExperts: 200, TopK: 6, Scoring: moe.Sigmoid, NormTopK: true, ScalingFactor: 2}, true, 64, "special"},
		{"special_softmax_topk_e32", moe.RouterConfig{NumExperts: 32, TopK: 4, Scoring: moe.Softmax, SoftmaxTopK: true}, false, 64, "special"},
		{"special_deepseek_v3", deepSeekV3Router, true, 64, "special"},
		{"special_mixtral", moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, NormTopK: true}, false, 64, "special"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			E, K, T := c.cfg.NumExperts, c.cfg.TopK, c.T
			logits := randF32(r, T*E, 2)
			var bias []float32
			if c.bias {
				bias = randF32(r, E, 0.5)
			}
			switch c.gen {
			case "ties":
				for i := range logits {
					logits[i] = float32(r.IntN(5)-2) * 0.5
				}
				for i := range bias {
					bias[i] = float32(r.IntN(3)-1) * 0.25
				}
			case "special":
				sp := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 0, float32(math.Copysign(0, -1))}
				for i := range logits {
					if r.IntN(40) == 0 {
						logits[i] = sp[r.IntN(len(sp))]
					}
				}
			}
			ids, w := runRoute(t, g, c.cfg, logits, bias, T)
			wantIDs, wantW := moe.Route(&c.cfg, logits, bias, T)
			bad := 0
			worst := 0.0
			for i := range wantIDs {
				if ids[i] != wantIDs[i] {
					if bad < 5 {
						t.Errorf("token %d slot %d: expert %d, moe.Route %d", i/K, i%K, ids[i], wantIDs[i])
					}
					bad++
					continue
				}
				if w[i] != w[i] && wantW[i] != wantW[i] {
					continue // NaN on both sides (the special logits)
				}
				d := math.Abs(float64(w[i]) - float64(wantW[i]))
				if w[i] != w[i] || !(d <= 1e-6*math.Max(1, math.Abs(float64(wantW[i])))) {
					if bad < 5 {
						t.Errorf("token %d slot %d: weight %v, moe.Route %v", i/K, i%K, w[i], wantW[i])
					}
					bad++
				}
				worst = max(worst, d)
			}
			if bad > 0 {
				t.Fatalf("%d of %d routing outputs differ", bad, len(wantIDs))
			}
			t.Logf("T=%d E=%d K=%d: ids equal, worst weight difference %.3g", T, E, K, worst)
		})
	}
}

// softmaxRouter is softmax top-K routing over E experts with the chosen
// weights renormalised (Qwen3-MoE's, Mixtral's).
func softmaxRouter(E, K int) moe.RouterConfig {
	return moe.RouterConfig{NumExperts: E, TopK: K, Scoring: moe.Softmax, NormTopK: true}
}

// moeCase is one whole-MoE test: routing on random logits, then the experts.
type moeCase struct {
	name    string
	cfg     moe.RouterConfig
	T, H, I int
	clamped bool
	biases  bool
	hot     int         // ≥ 0: add 30 to this expert's logits (every token picks it)
	cold    int         // > 0: subtract 30 from the logits of experts ≥ cold (they get no tokens)
	gemv    MoEGemvMode // the decode-sized GEMV kernels' mode for the run (SetMoEGemvMode; zero: the grouped GEMMs)
	// lo < hi: one rank's block of experts [lo, hi) (a world's): the routed
	// ids are localized (MoELocalize: the others become −1), the weights are
	// views of the block, and the counters are not checked.
	lo, hi int
	// oneCall: route and run the experts through MoERouteExpertsRun (one
	// launch for routing and align at T ≤ 32, E ≤ 256, K ≤ 32 when
	// MK_MOE_ROUTE_ALIGN=1) instead of MoERoute then MoEExpertsRun.
	oneCall bool
}

// moeRef is the float64 reference of the routed experts: bf16 x and
// weights, the activation rounded to bf16 as the GPU's GEMM2 input.
func moeRef(x, gu, gub, dn, db []float32, ids []int32, w []float32, T, K, H, I int, act moe.Activation) []float64 {
	out := make([]float64, T*H)
	h := make([]float64, 2*I)
	a := make([]float64, I)
	for t := range T {
		xr := x[t*H : t*H+H]
		for k := range K {
			e := int(ids[t*K+k])
			if e < 0 {
				continue // another rank's expert
			}
			for j := range 2 * I {
				row := gu[(e*2*I+j)*H:]
				s := 0.0
				for c := range H {
					s += float64(xr[c]) * float64(row[c])
				}
				if gub != nil {
					s += float64(gub[e*2*I+j])
				}
				h[j] = s
			}
			for j := range I {
				gv, uv := float32(h[j]), float32(h[I+j])
				var v float64
				if act.Kind == moe.SwiGLU {
					v = float64(gv) / (1 + math.Exp(-float64(gv))) * float64(uv)
				} else {
					gv = min(gv, act.Limit)
					uv = max(min(uv, act.Limit), -act.Limit)
					v = (float64(uv) + 1) * float64(gv) / (1 + math.Exp(-float64(act.Alpha)*float64(gv)))
				}
				a[j] = float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(v))))
			}
			for c := range H {
				row := dn[(e*H+c)*I:]
				s := 0.0
				for j := range I {
					s += a[j] * float64(row[j])
				}
				if db != nil {
					s += float64(db[e*H+c])
				}
				out[t*H+c] += float64(w[t*K+k]) * s
			}
		}
	}
	return out
}

// TestMoEExperts runs the whole MoE (route → align → grouped GEMM1 with the
// activation → grouped GEMM2 → combine) on fresh random inputs against
// moe.Route plus a float64 CPU loop: relative L2 ≤ 1e-2, output, workspace
// and weights poisoned with NaN, expert counters checked exactly.
func TestMoEExperts(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	oss := moe.Activation{Kind: moe.ClampedSwiGLU, Alpha: 1.702, Limit: 0.7}
	cases := []moeCase{
		{name: "E8_K2_T1", cfg: softmaxRouter(8, 2), T: 1, H: 64, I: 48, hot: -1},
		{name: "E8_K1_T7", cfg: softmaxRouter(8, 1), T: 7, H: 128, I: 64, hot: -1},
		{name: "E8_K2_T130_hot", cfg: softmaxRouter(8, 2), T: 130, H: 64, I: 40, hot: 3},
		{name: "E8_K2_T1024_tile128", cfg: softmaxRouter(8, 2), T: 1024, H: 136, I: 96, hot: -1, biases: true},
		{name: "E8_K2_T1024_hot_clamped", cfg: softmaxRouter(8, 2), T: 1024, H: 64, I: 72, hot: 5, clamped: true},
		// More 128-row work items than the H200 has SMs in both GEMMs
		// (≈160 row tiles): with MK_MOE_PERSIST=1 each CTA of the
		// warp-specialised kernel walks several items.
		{name: "E16_K8_T2500_tile128_many_items", cfg: softmaxRouter(16, 8), T: 2500, H: 136, I: 136, hot: -1, biases: true},
		{name: "E64_K4_T130_groups_clamped_bias", cfg: moe.RouterConfig{NumExperts: 64, TopK: 4, Scoring: moe.Sigmoid, NormTopK: true, NumGroups: 8, TopKGroups: 4, ScalingFactor: 2.5},
			T: 130, H: 72, I: 56, clamped: true, biases: true, hot: -1},
		{name: "E64_K2_T7_cold", cfg: softmaxRouter(64, 2), T: 7, H: 64, I: 32, cold: 32, hot: -1},
		{name: "E64_K4_T300_cold", cfg: softmaxRouter(64, 4), T: 300, H: 64, I: 32, cold: 8, hot: -1},
		{name: "E128_K8_T130", cfg: softmaxRouter(128, 8), T: 130, H: 128, I: 64, hot: -1},
		// More experts than the align kernel's threads: each thread scans two.
		{name: "E2048_K4_T64", cfg: softmaxRouter(2048, 4), T: 64, H: 64, I: 32, hot: -1},
		{name: "E128_K8_T1_softmaxtopk", cfg: moe.RouterConfig{NumExperts: 128, TopK: 8, Scoring: moe.Softmax, SoftmaxTopK: true}, T: 1, H: 96, I: 64, hot: -1, biases: true},
		{name: "E256_K8_T1_deepseek", cfg: deepSeekV3Router, T: 1, H: 128, I: 64, hot: -1, biases: true},
		{name: "E256_K8_T130_deepseek", cfg: deepSeekV3Router, T: 130, H: 64, I: 48, hot: -1},
		{name: "E256_K8_T7_deepseek_clamped", cfg: deepSeekV3Router, T: 7, H: 64, I: 32, hot: -1, clamped: true},
		// The 32-row tiles (8–24 rows per expert) with a hot expert of many
		// tiles, reductions that end inside a 64-wide chunk, odd column
		// counts; below, the 16-row tiles with the same.
		{name: "E128_K8_T200_hot_stream", cfg: softmaxRouter(128, 8), T: 200, H: 136, I: 40, hot: 7, biases: true},
		{name: "E256_K4_T200_hot_tile16", cfg: softmaxRouter(256, 4), T: 200, H: 136, I: 40, hot: 7, biases: true},
		// 32 tokens: the most that route and align in one launch (_one_call).
		{name: "E128_K8_T32", cfg: softmaxRouter(128, 8), T: 32, H: 128, I: 64, hot: -1},
		{name: "E256_K8_T32_deepseek", cfg: deepSeekV3Router, T: 32, H: 64, I: 32, hot: -1, biases: true},
		{name: "E64_K4_T16_stream_clamped", cfg: softmaxRouter(64, 4), T: 16, H: 72, I: 24, hot: -1, clamped: true, biases: true},
		{name: "E32_K8_T80_stream_nt4", cfg: softmaxRouter(32, 8), T: 80, H: 200, I: 56, hot: -1},
		{name: "E16_K4_T40_stream_nt2", cfg: softmaxRouter(16, 4), T: 40, H: 104, I: 48, hot: -1},
		// One token over wide layers: the 16-row tiles' grids of 2–4 waves at
		// their default ring depth take a shallower one (dec_fit; on an H200
		// GEMM2 here 896 CTAs, 3 stages, and GEMM1 below 512 CTAs, 4 stages).
		{name: "E8_K8_T1_fit_down", cfg: softmaxRouter(8, 8), T: 1, H: 7168, I: 200, hot: -1, biases: true},
		{name: "E8_K8_T1_fit_up", cfg: softmaxRouter(8, 8), T: 1, H: 1000, I: 2048, hot: -1},
		// The decode-sized GEMV kernels (T ≤ 4): every token count, biases,
		// the clamped activation, one expert for every token, a rank's block.
		{name: "gemv_E8_K1_T2", cfg: softmaxRouter(8, 1), T: 2, H: 64, I: 48, hot: -1, gemv: MoEGemvTwo},
		{name: "gemv_E8_K2_T3_clamped_bias", cfg: softmaxRouter(8, 2), T: 3, H: 136, I: 40, hot: -1, clamped: true, biases: true, gemv: MoEGemvTwo},
		{name: "gemv_E32_K8_T4_qwen3_rows", cfg: softmaxRouter(32, 8), T: 4, H: 2048, I: 768, hot: -1, gemv: MoEGemvTwo},
		{name: "gemv_E64_K4_T4_hot", cfg: softmaxRouter(64, 4), T: 4, H: 200, I: 56, hot: 9, biases: true, gemv: MoEGemvTwo},
		{name: "gemv_E256_K8_T2_deepseek_bias", cfg: deepSeekV3Router, T: 2, H: 7168, I: 32, hot: -1, biases: true, gemv: MoEGemvTwo},
		{name: "gemv_E64_K8_T4_shared_experts", cfg: softmaxRouter(64, 8), T: 4, H: 256, I: 96, hot: -1, cold: 8, biases: true, gemv: MoEGemvTwo},
		{name: "gemv_E64_K8_T3_rank_block", cfg: softmaxRouter(64, 8), T: 3, H: 128, I: 72, hot: -1, biases: true, lo: 16, hi: 40, gemv: MoEGemvTwo},
		// Down rows longer than one batch of a lane's loads (kDownB · 32 · 8 = 2048 values), ending mid-batch.
		{name: "gemv_E8_K2_T1_long_rows", cfg: softmaxRouter(8, 2), T: 1, H: 96, I: 2088, hot: -1, gemv: MoEGemvTwo},
		{name: "gemv_E16_K4_T4_long_rows_hot", cfg: softmaxRouter(16, 4), T: 4, H: 64, I: 4104, hot: 3, biases: true, gemv: MoEGemvTwo},
		// The default (auto): the GEMV kernels for one token over experts of
		// intermediate size ≥ MoEGemvAutoInter, the grouped GEMMs at two.
		{name: "auto_E8_K2_T1_long_rows", cfg: softmaxRouter(8, 2), T: 1, H: 64, I: 8200, hot: -1, biases: true, gemv: MoEGemvAuto},
		{name: "auto_E8_K2_T2_long_rows", cfg: softmaxRouter(8, 2), T: 2, H: 64, I: 8200, hot: -1, gemv: MoEGemvAuto},
		// One launch (routing inside when oneCall): the same cases.
		// The resident down kernel: its rows fit at these shapes on an H200
		// (Qwen3's one token: 16 columns × 8 experts × 768 a CTA), not at
		// the T = 4, K = 8 ones (MoEGemvTwo's down kernel then).
		{name: "gemvres_E128_K8_T1_qwen3", cfg: softmaxRouter(128, 8), T: 1, H: 2048, I: 768, hot: -1, gemv: MoEGemvResident},
		{name: "gemvres_E8_K2_T3_clamped_bias", cfg: softmaxRouter(8, 2), T: 3, H: 136, I: 40, hot: -1, clamped: true, biases: true, gemv: MoEGemvResident},
		{name: "gemvres_E64_K4_T4_hot", cfg: softmaxRouter(64, 4), T: 4, H: 200, I: 56, hot: 9, biases: true, gemv: MoEGemvResident},
		{name: "gemvres_E64_K8_T3_rank_block", cfg: softmaxRouter(64, 8), T: 3, H: 128, I: 72, hot: -1, biases: true, lo: 16, hi: 40, gemv: MoEGemvResident},
		{name: "gemvres_E32_K8_T4_qwen3_rows", cfg: softmaxRouter(32, 8), T: 4, H: 2048, I: 768, hot: -1, gemv: MoEGemvResident},
		{name: "gemv1_E8_K1_T2", cfg: softmaxRouter(8, 1), T: 2, H: 64, I: 48, hot: -1, gemv: MoEGemvOneLaunch},
		{name: "gemv1_E8_K2_T3_clamped_bias", cfg: softmaxRouter(8, 2), T: 3, H: 136, I: 40, hot: -1, clamped: true, biases: true, gemv: MoEGemvOneLaunch},
		{name: "gemv1_E32_K8_T4_qwen3_rows", cfg: softmaxRouter(32, 8), T: 4, H: 2048, I: 768, hot: -1, gemv: MoEGemvOneLaunch},
		{name: "gemv1_E64_K4_T4_hot", cfg: softmaxRouter(64, 4), T: 4, H: 200, I: 56, hot: 9, biases: true, gemv: MoEGemvOneLaunch},
		{name: "gemv1_E256_K8_T2_deepseek_bias", cfg: deepSeekV3Router, T: 2, H: 7168, I: 32, hot: -1, biases: true, gemv: MoEGemvOneLaunch},
		{name: "gemv1_E128_K8_T1_qwen3", cfg: softmaxRouter(128, 8), T: 1, H: 2048, I: 768, hot: -1, gemv: MoEGemvOneLaunch},
		{name: "gemv1_E64_K8_T4_shared_experts", cfg: softmaxRouter(64, 8), T: 4, H: 256, I: 96, hot: -1, cold: 8, biases: true, gemv: MoEGemvOneLaunch},
		{name: "gemv1_E64_K8_T3_rank_block", cfg: softmaxRouter(64, 8), T: 3, H: 128, I: 72, hot: -1, biases: true, lo: 16, hi: 40, gemv: MoEGemvOneLaunch},
		{name: "grouped_E64_K8_T9_rank_block", cfg: softmaxRouter(64, 8), T: 9, H: 128, I: 72, hot: -1, biases: true, lo: 16, hi: 40},
		// Decode-sized tokens on the 16-row tiles: several rows of one
		// expert in a tile (hot, cold: up to 16, the tile's height), sigmoid
		// scores with a score bias, up to 256 experts.
		{name: "E128_K8_T4_decode", cfg: softmaxRouter(128, 8), T: 4, H: 256, I: 96, hot: -1, biases: true},
		{name: "E16_K2_T16_hot_decode", cfg: softmaxRouter(16, 2), T: 16, H: 72, I: 40, hot: 5, clamped: true},
		{name: "E64_K4_T8_cold_decode", cfg: softmaxRouter(64, 4), T: 8, H: 64, I: 32, cold: 4, hot: -1},
		{name: "E64_K6_T5_sigmoid_decode", cfg: moe.RouterConfig{NumExperts: 64, TopK: 6, Scoring: moe.Sigmoid, NormTopK: true, ScalingFactor: 2.5},
			T: 5, H: 64, I: 48, hot: -1, biases: true},
		{name: "E256_K8_T3_decode", cfg: softmaxRouter(256, 8), T: 3, H: 64, I: 32, hot: -1},
		// Decode batches whose tokens share experts: a hot expert (one
		// 4-row tile), and every expert picked by every token (3 rows each).
		{name: "E16_K4_T4_hot_decode", cfg: softmaxRouter(16, 4), T: 4, H: 72, I: 40, hot: 5, biases: true},
		{name: "E8_K8_T3_all_shared_decode", cfg: softmaxRouter(8, 8), T: 3, H: 64, I: 32, hot: -1},
		// The wide decode tiles (128 columns a CTA: 6–8 rows per expert over
		// ≥ 64 experts, dec_wide): column tiles that end inside GEMM1's 64
		// gate + 64 up columns and GEMM2's 128, biases, the clamped
		// activation; a hot expert of many 16-row tiles.
		{name: "E64_K8_T56_wide_decode_clamped", cfg: softmaxRouter(64, 8), T: 56, H: 136, I: 200, hot: -1, clamped: true, biases: true},
		{name: "E256_K8_T200_wide_decode_hot", cfg: softmaxRouter(256, 8), T: 200, H: 72, I: 40, hot: 7},
		// The 64-row wgmma tiles (24 < rows per expert ≤ 48): column tiles
		// that end inside the 128 output columns of GEMM1 and the 256 of
		// GEMM2, reductions that end inside a 64-wide chunk, a hot expert
		// of three tiles, GEMM1's rows copied into tile order first
		// (I ≥ 4096).
		{name: "E64_K4_T500_tile64", cfg: softmaxRouter(64, 4), T: 500, H: 136, I: 200, hot: -1, biases: true},
		{name: "E32_K8_T160_tile64_hot_clamped", cfg: softmaxRouter(32, 8), T: 160, H: 64, I: 72, hot: 3, clamped: true},
		{name: "E8_K2_T160_tile64_g1copy", cfg: softmaxRouter(8, 2), T: 160, H: 64, I: 4104, hot: -1, biases: true},
		// More 64-row work items than SMs in both GEMMs (~40 row tiles × 4
		// column tiles, reductions of 1024 and 512: the persistent grid
		// walks several items a CTA; GEMM1's rows by the producers'
		// cp.async, GEMM2's by TMA).
		{name: "E40_K4_T400_tile64_many_items", cfg: softmaxRouter(40, 4), T: 400, H: 1024, I: 512, hot: -1},
		// GEMM2's reduction split (I ≥ 4096 on the mma.sync tiles, g2_splits):
		// 16-, 32- and 64-row tiles, splits of unequal length (I not a
		// multiple of 64), biases added once after the sum, a hot expert.
		{name: "E8_K2_T1_g2split", cfg: softmaxRouter(8, 2), T: 1, H: 72, I: 4104, hot: -1, biases: true},
		{name: "E8_K2_T64_tile32_g2split", cfg: softmaxRouter(8, 2), T: 64, H: 136, I: 8200, hot: -1, biases: true},
		{name: "E8_K2_T160_tile64_g2split_hot_clamped", cfg: softmaxRouter(8, 2), T: 160, H: 64, I: 4104, hot: 3, clamped: true},
		// The align over many blocks (≥ 4096 assignments, moe.cu's
		// align_multi): every token on one expert (the others empty), a
		// chunk that is not a multiple of the block (5600 over 6 blocks),
		// cold experts, and more chunks than blocks (264000 assignments
		// over 256 blocks of 1032).
		{name: "E8_K1_T5000_one_expert_align_multi", cfg: softmaxRouter(8, 1), T: 5000, H: 64, I: 32, hot: 2},
		{name: "E128_K8_T700_cold_align_multi", cfg: softmaxRouter(128, 8), T: 700, H: 64, I: 40, cold: 40, hot: -1, biases: true},
		{name: "E64_K8_T33000_align_max_blocks", cfg: softmaxRouter(64, 8), T: 33000, H: 64, I: 32, hot: -1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			act := moe.Activation{Kind: moe.SwiGLU}
			if c.clamped {
				act = oss
			}
			runMoECase(t, g, r, c, act)
		})
		if c.lo < c.hi {
			continue // a world's rank localizes the ids between the two calls
		}
		c.oneCall = true
		t.Run(c.name+"_one_call", func(t *testing.T) {
			act := moe.Activation{Kind: moe.SwiGLU}
			if c.clamped {
				act = oss
			}
			runMoECase(t, g, r, c, act)
		})
	}
}

// moeLogits draws c's router logits [T, E] (a hot expert every token
// picks, cold experts none picks) and, for sigmoid routing, a score bias.
func moeLogits(r *rand.Rand, c moeCase) (logits, sbias []float32) {
	E, T := c.cfg.NumExperts, c.T
	logits = randF32(r, T*E, 1)
	for tk := range T {
		for e := range E {
			if e == c.hot {
				logits[tk*E+e] += 30
			}
			if c.cold > 0 && e >= c.cold {
				logits[tk*E+e] -= 30
			}
		}
	}
	if c.cfg.Scoring == moe.Sigmoid {
		sbias = randF32(r, E, 0.3)
	}
	return logits, sbias
}

// moeBits draws c's routing inputs (moeLogits) and, as bf16 bits, its x
// [T, H], gate/up weights [E, 2I, H] and down weights [E, H, I].
func moeBits(r *rand.Rand, c moeCase) (logits, sbias []float32, x, gu, dn []uint16) {
	E, T, H, I := c.cfg.NumExperts, c.T, c.H, c.I
	logits, sbias = moeLogits(r, c)
	x, _ = randBF16(r, T*H, 1)
	gu, _ = randBF16(r, E*2*I*H, 1/math.Sqrt(float64(H)))
	dn, _ = randBF16(r, E*H*I, 1/math.Sqrt(float64(I)))
	return logits, sbias, x, gu, dn
}

func runMoECase(t *testing.T, g *GPU, r *rand.Rand, c moeCase, act moe.Activation) {
	E, K, T, H, I := c.cfg.NumExperts, c.cfg.TopK, c.T, c.H, c.I
	logits, sbias := moeLogits(r, c)
	xb, x := randBF16(r, T*H, 1)
	gub16, gu := randBF16(r, E*2*I*H, 1/math.Sqrt(float64(H)))
	db16, dn := randBF16(r, E*H*I, 1/math.Sqrt(float64(I)))
	var gub, db []float32
	if c.biases {
		gub, db = randF32(r, E*2*I, 0.3), randF32(r, E*H, 0.3)
	}
	ex := &MoEExperts{E: E, H: H, I: I, Clamped: c.clamped, Alpha: act.Alpha, Limit: act.Limit}
	local := c.lo < c.hi
	countsIn := make([]int64, E)
	for e := range countsIn {
		countsIn[e] = int64(e * 3)
	}
	var out []float32
	var ids []int32
	var w []float32
	var counts []int64
	onGPU(t, g, func(a *arena) {
		lb, xbuf := put(a, logits), put(a, xb)
		ex.GateUp, ex.Down = put(a, gub16), put(a, db16)
		if c.biases {
			ex.GateUpBias, ex.DownBias = put(a, gub), put(a, db)
		}
		var sb *Buffer
		if sbias != nil {
			sb = put(a, sbias)
		}
		ib, wb := put(a, make([]int32, T*K)), put(a, f32Fill(T*K, float32(math.NaN())))
		ob := put(a, f32Fill(T*H, float32(math.NaN())))
		cb := put(a, countsIn)
		if a.err != nil {
			return
		}
		wsBytes, tileM, err := a.d.MoEWorkspace(T, K, ex)
		a.check(err)
		if a.err != nil {
			return
		}
		t.Logf("workspace %d bytes, row tile %d", wsBytes, tileM)
		ws := put(a, bf16Fill(int(wsBytes/2), 0xffff)) // NaN everywhere, -1 as int32
		if a.err != nil {
			return
		}
		if !c.oneCall {
			a.check(a.d.MoERoute(nil, ib, wb, lb, sb, T, moeRouter(c.cfg)))
		}
		run, runCounts := ex, cb
		if local {
			ids = get[int32](a, ib, T*K) // the global ids, for the checks
			a.check(a.d.MoELocalize(nil, ib, T*K, c.lo, c.hi, nil, 0))
			l, err := ex.Block(c.lo, c.hi)
			a.check(err)
			run, runCounts = l, nil
		}
		if a.err != nil {
			return
		}
		// Every case sets its mode (the zero value: the grouped GEMMs, whatever
		// the default would pick) and leaves the default (auto) behind.
		a.check(a.d.SetMoEGemvMode(c.gemv))
		if c.oneCall {
			a.check(a.d.MoERouteExpertsRun(nil, ob, xbuf, ib, wb, lb, sb, T, moeRouter(c.cfg), run, runCounts, ws))
		} else {
			a.check(a.d.MoEExpertsRun(nil, ob, xbuf, ib, wb, T, K, run, runCounts, ws))
		}
		a.check(a.d.SetMoEGemvMode(MoEGemvAuto))
		if c.gemv == MoEGemvOneLaunch {
			a.check(a.d.MoEDecodeCheck()) // the barrier's watchdog stayed quiet
		}
		out = get[float32](a, ob, T*H)
		w = get[float32](a, wb, T*K)
		if !local {
			ids = get[int32](a, ib, T*K)
		}
		counts = get[int64](a, cb, E)
	})
	checkMoERun(t, "MoE", c, moeRun{logits: logits, sbias: sbias, ids: ids, w: w, counts: counts, countsIn: countsIn,
		out: out, x: x, gu: gu, gub: gub, dn: dn, db: db}, act)
}

// moeRun is what a MoE test's run read back, and its inputs.
type moeRun struct {
	logits, sbias      []float32
	ids                []int32 // the global ids (before a rank's localisation)
	w                  []float32
	counts, countsIn   []int64
	out                []float32
	x, gu, gub, dn, db []float32
}

// checkMoERun checks a run of case c: the routing against moe.Route, the
// expert counters (one process), the hot and cold experts, and out against
// the float64 loop on the same values (relative L2 ≤ 1e-2).
func checkMoERun(t *testing.T, what string, c moeCase, r moeRun, act moe.Activation) {
	t.Helper()
	E, K, T, H, I := c.cfg.NumExperts, c.cfg.TopK, c.T, c.H, c.I
	local := c.lo < c.hi
	ids, w, counts, countsIn := r.ids, r.w, r.counts, r.countsIn
	wantIDs, _ := moe.Route(&c.cfg, r.logits, r.sbias, T)
	for i := range wantIDs {
		if ids[i] != wantIDs[i] {
			t.Fatalf("routing: token %d slot %d expert %d, moe.Route %d", i/K, i%K, ids[i], wantIDs[i])
		}
	}
	hist := make([]int64, E)
	for _, e := range ids {
		hist[e]++
	}
	for e := range E {
		if local {
			break // a rank's run counts only its block (the backend's concern)
		}
		if counts[e] != countsIn[e]+hist[e] {
			t.Fatalf("expert %d counter %d, want %d + %d", e, counts[e], countsIn[e], hist[e])
		}
	}
	if c.hot >= 0 && hist[c.hot] != int64(T) {
		t.Fatalf("hot expert %d got %d of %d tokens", c.hot, hist[c.hot], T)
	}
	if c.cold > 0 {
		for e := c.cold; e < E; e++ {
			if hist[e] != 0 {
				t.Fatalf("cold expert %d got %d tokens", e, hist[e])
			}
		}
	}
	refIDs := ids
	if local {
		refIDs = slices.Clone(ids)
		for i, e := range refIDs {
			if int(e) < c.lo || int(e) >= c.hi {
				refIDs[i] = -1
			}
		}
	}
	want := moeRef(r.x, r.gu, r.gub, r.dn, r.db, refIDs, w, T, K, H, I, act)
	checkClose(t, fmt.Sprintf("%s T=%d E=%d K=%d H=%d I=%d", what, T, E, K, H, I), r.out, want, 1e-2)
}

// TestMoEWorkspaceReuse runs routing and the experts (MoERouteExpertsRun,
// with the combine) at 4 tokens and then at 1 token in the same workspace,
// as a decode step's layers reuse theirs, and checks the 1-token layer
// against moe.Route plus the float64 loop: whatever the 1-token call
// reads of its row layout it must have written (the 4-token call leaves
// other, valid-looking layout words where the 1-token layout lies). By
// default both calls lay out their rows in the routing kernel; with
// MK_MOE_ROUTE_DIRECT=0 the align kernel does (scripts/device.sh runs this
// test so too).
func TestMoEWorkspaceReuse(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	for _, cfg := range []moe.RouterConfig{softmaxRouter(32, 4), softmaxRouter(128, 8), deepSeekV3Router} {
		t.Run(fmt.Sprintf("E%d_K%d", cfg.NumExperts, cfg.TopK), func(t *testing.T) {
			E, K, H, I := cfg.NumExperts, cfg.TopK, 136, 72
			act := moe.Activation{Kind: moe.SwiGLU}
			gub16, gu := randBF16(r, E*2*I*H, 1/math.Sqrt(float64(H)))
			db16, dn := randBF16(r, E*H*I, 1/math.Sqrt(float64(I)))
			var sbias []float32
			if cfg.Scoring == moe.Sigmoid {
				sbias = randF32(r, E, 0.3)
			}
			ex := &MoEExperts{E: E, H: H, I: I}
			logits4, logits1 := randF32(r, 4*E, 1), randF32(r, E, 1)
			xb4, _ := randBF16(r, 4*H, 1)
			xb1, x1 := randBF16(r, H, 1)
			var out, w []float32
			var ids []int32
			var counts []int64
			onGPU(t, g, func(a *arena) {
				ex.GateUp, ex.Down = put(a, gub16), put(a, db16)
				var sb *Buffer
				if sbias != nil {
					sb = put(a, sbias)
				}
				l4, l1, x4b, x1b := put(a, logits4), put(a, logits1), put(a, xb4), put(a, xb1)
				ib, wb := put(a, make([]int32, 4*K)), put(a, f32Fill(4*K, float32(math.NaN())))
				ob := put(a, f32Fill(4*H, float32(math.NaN())))
				cb := put(a, make([]int64, E))
				if a.err != nil {
					return
				}
				b4, _, err := a.d.MoEWorkspace(4, K, ex)
				a.check(err)
				b1, _, err := a.d.MoEWorkspace(1, K, ex)
				a.check(err)
				if a.err != nil {
					return
				}
				ws := put(a, bf16Fill(int(max(b4, b1)/2), 0xffff))
				a.check(a.d.MoERouteExpertsRun(nil, ob, x4b, ib, wb, l4, sb, 4, moeRouter(cfg), ex, cb, ws))
				a.check(Upload(a.d, ob, f32Fill(4*H, float32(math.NaN()))))
				a.check(Upload(a.d, cb, make([]int64, E)))
				a.check(a.d.MoERouteExpertsRun(nil, ob, x1b, ib, wb, l1, sb, 1, moeRouter(cfg), ex, cb, ws))
				out = get[float32](a, ob, H)
				ids = get[int32](a, ib, K)
				w = get[float32](a, wb, K)
				counts = get[int64](a, cb, E)
			})
			wantIDs, _ := moe.Route(&cfg, logits1, sbias, 1)
			if !slices.Equal(ids, wantIDs) {
				t.Fatalf("routing: %v, moe.Route %v", ids, wantIDs)
			}
			for e := range E {
				want := int64(0)
				if slices.Contains(ids, int32(e)) {
					want = 1
				}
				if counts[e] != want {
					t.Fatalf("expert %d counter %d, want %d", e, counts[e], want)
				}
			}
			want := moeRef(x1, gu, nil, dn, nil, ids, w, 1, K, H, I, act)
			checkClose(t, fmt.Sprintf("MoE after a 4-token call, E=%d K=%d", E, K), out, want, 1e-2)
		})
	}
}

// TestMoEArgs: bad arguments are errors, not crashes.
func TestMoEArgs(t *testing.T) {
	g := testGPU(t)
	onGPU(t, g, func(a *arena) {
		b := a.alloc(1 << 16)
		if a.err != nil {
			return
		}
		if err := a.d.MoERoute(nil, b, b, b, nil, 4, MoERouter{Experts: 8, TopK: 9}); err == nil {
			t.Error("MoERoute with K > E gave no error")
		}
		if err := a.d.MoERoute(nil, b, b, b, nil, 4, MoERouter{Experts: 8, TopK: 2, Sigmoid: true, SoftmaxTopK: true}); err == nil {
			t.Error("MoERoute with sigmoid + SoftmaxTopK gave no error")
		}
		if err := a.d.MoERoute(nil, b, b, b, nil, 4, MoERouter{Experts: 8, TopK: 2, Groups: 3, TopKGroups: 1}); err == nil {
			t.Error("MoERoute with 8 experts in 3 groups gave no error")
		}
		ex := &MoEExperts{E: 2, H: 12, I: 8, GateUp: b, Down: b}
		if err := a.d.MoEExpertsRun(nil, b, b, b, b, 2, 1, ex, nil, b); err == nil {
			t.Error("MoEExpertsRun with H = 12 gave no error")
		}
		ex.H = 16
		small, err := b.View(0, 256)
		a.check(err)
		if err := a.d.MoEExpertsRun(nil, b, b, b, b, 2, 1, ex, nil, small); err == nil {
			t.Error("MoEExpertsRun with a too small workspace gave no error")
		} else {
			t.Logf("small workspace: %v", err)
		}
	})
}

// TestMoELocalize: ids in a rank's block [lo, hi) become id − lo, the others −1.
func TestMoELocalize(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	for _, c := range []struct {
		n, E, lo, hi int
		count        bool
	}{{1, 8, 0, 4, true}, {1000, 64, 16, 32, false}, {70001, 256, 255, 256, true}, {33, 16, 0, 16, true}} {
		ids := make([]int32, c.n)
		for i := range ids {
			ids[i] = int32(r.IntN(c.E))
		}
		countsIn := make([]int64, c.E)
		for e := range countsIn {
			countsIn[e] = int64(7 * e)
		}
		var counts []int64
		onGPU(t, g, func(a *arena) {
			b := put(a, ids)
			var cb *Buffer
			if c.count {
				cb = put(a, countsIn)
			}
			a.check(a.d.MoELocalize(nil, b, c.n, c.lo, c.hi, cb, c.E))
			if a.err != nil {
				return
			}
			got := get[int32](a, b, c.n)
			for i, e := range ids {
				want := int32(-1)
				if int(e) >= c.lo && int(e) < c.hi {
					want = e - int32(c.lo)
				}
				if got[i] != want {
					t.Fatalf("%+v: ids[%d] = %d became %d, want %d", c, i, e, got[i], want)
				}
			}
			if c.count {
				counts = get[int64](a, cb, c.E)
			}
		})
		if !c.count {
			continue
		}
		// Every rank's experts are counted, not only [lo, hi).
		want := slices.Clone(countsIn)
		for _, e := range ids {
			want[e]++
		}
		if !slices.Equal(counts, want) {
			t.Errorf("%+v: counts %v, want %v", c, counts[:min(8, len(counts))], want[:min(8, len(want))])
		}
	}
}

// TestMoECombineAddRMSNorm: a MoE layer run with no combine (a nil out)
// and then MoECombineAddRMSNormF32 gives the bits of the layer with its
// combine followed by AddRMSNormF32: the sum, the normed rows and their
// bf16 rounding, for decode and prefill token counts, a hot expert, experts
// with no tokens and DeepSeek-V3's grouped routing with biases. Poisoned
// outputs catch rows left unwritten.
func TestMoECombineAddRMSNorm(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	for _, c := range []moeCase{
		{name: "qwen3_T1", cfg: softmaxRouter(128, 8), T: 1, H: 2048, I: 96, hot: -1},
		{name: "E128_K8_T32", cfg: softmaxRouter(128, 8), T: 32, H: 256, I: 64, hot: -1},
		{name: "E8_K2_T130_hot", cfg: softmaxRouter(8, 2), T: 130, H: 136, I: 40, hot: 3},
		{name: "E64_K4_T300_cold", cfg: softmaxRouter(64, 4), T: 300, H: 64, I: 32, cold: 8, hot: -1},
		{name: "deepseek_T7_bias", cfg: deepSeekV3Router, T: 7, H: 7168, I: 32, hot: -1, biases: true},
		// top-k past the kernel's 32 staged slots: two chunks of k.
		{name: "E64_K36_T5", cfg: softmaxRouter(64, 36), T: 5, H: 256, I: 32, hot: -1},
		{name: "E40_K36_T3_H4096", cfg: softmaxRouter(40, 36), T: 3, H: 4096, I: 32, hot: -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			E, K, T, H, I := c.cfg.NumExperts, c.cfg.TopK, c.T, c.H, c.I
			logits, sbias, xb, gu, dn := moeBits(r, c)
			resid, normW := randF32(r, T*H, 1), randF32(r, H, 1)
			const eps = 1e-6
			var sums, outs [2][]float32
			var outbs [2][]uint16
			onGPU(t, g, func(a *arena) {
				ex := &MoEExperts{E: E, H: H, I: I, GateUp: put(a, gu), Down: put(a, dn)}
				if c.biases {
					ex.GateUpBias, ex.DownBias = put(a, randF32(r, E*2*I, 0.3)), put(a, randF32(r, E*H, 0.3))
				}
				lb, xbuf, rb, nw := put(a, logits), put(a, xb), put(a, resid), put(a, normW)
				var sb *Buffer
				if sbias != nil {
					sb = put(a, sbias)
				}
				if a.err != nil {
					return
				}
				wsBytes, _, err := a.d.MoEWorkspace(T, K, ex)
				a.check(err)
				for way := range 2 {
					ib, wb := put(a, make([]int32, T*K)), put(a, f32Fill(T*K, float32(math.NaN())))
					sum, out := put(a, f32Fill(T*H, float32(math.NaN()))), put(a, f32Fill(T*H, float32(math.NaN())))
					outb := put(a, bf16Fill(T*H, 0x7fc1))
					ws := put(a, bf16Fill(int(wsBytes/2), 0xffff))
					if a.err != nil {
						return
					}
					if way == 0 { // the layer's combine, then the add and norm
						y := put(a, f32Fill(T*H, float32(math.NaN())))
						a.check(a.d.MoERouteExpertsRun(nil, y, xbuf, ib, wb, lb, sb, T, moeRouter(c.cfg), ex, nil, ws))
						a.check(a.d.AddRMSNormF32(nil, sum, out, rb, y, nw, outb, T, H, eps))
					} else { // no combine; folded into the norm
						a.check(a.d.MoERouteExpertsRun(nil, nil, xbuf, ib, wb, lb, sb, T, moeRouter(c.cfg), ex, nil, ws))
						a.check(a.d.MoECombineAddRMSNormF32(nil, sum, out, outb, rb, wb, ws, T, K, ex, nw, eps))
					}
					sums[way], outs[way] = get[float32](a, sum, T*H), get[float32](a, out, T*H)
					outbs[way] = get[uint16](a, outb, T*H)
				}
			})
			for i := range sums[0] {
				if math.Float32bits(sums[1][i]) != math.Float32bits(sums[0][i]) ||
					math.Float32bits(outs[1][i]) != math.Float32bits(outs[0][i]) || outbs[1][i] != outbs[0][i] {
					t.Fatalf("element %d (row %d): folded sum %g out %g bf16 %#04x, separate %g %g %#04x", i, i/H,
						sums[1][i], outs[1][i], outbs[1][i], sums[0][i], outs[0][i], outbs[0][i])
				}
				if v := sums[0][i]; v != v {
					t.Fatalf("element %d: NaN sum", i)
				}
			}
		})
	}
}

// TestMoEGemvOneLaunchSameBits: the one-launch GEMV kernel (routing inside)
// gives the two-launch GEMV path's routing and output bit for bit: the same
// routing code and the same sums in the same order. Output and weights
// poisoned with NaN before each run; the expert counters must match too.
func TestMoEGemvOneLaunchSameBits(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	for _, c := range []moeCase{
		{name: "qwen3_T1", cfg: softmaxRouter(128, 8), T: 1, H: 2048, I: 768, hot: -1},
		{name: "qwen3_T4_hot", cfg: softmaxRouter(128, 8), T: 4, H: 2048, I: 768, hot: 5},
		{name: "deepseek_T4_bias", cfg: deepSeekV3Router, T: 4, H: 7168, I: 64, hot: -1, biases: true},
		{name: "E8_K2_T3_clamped", cfg: softmaxRouter(8, 2), T: 3, H: 136, I: 40, hot: -1, clamped: true, biases: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			E, K, T, H, I := c.cfg.NumExperts, c.cfg.TopK, c.T, c.H, c.I
			logits, sbias, xb, gub16, db16 := moeBits(r, c)
			ex := &MoEExperts{E: E, H: H, I: I, Clamped: c.clamped, Alpha: 1.702, Limit: 0.7}
			type result struct {
				out, w []float32
				ids    []int32
				counts []int64
			}
			var res [2]result
			onGPU(t, g, func(a *arena) {
				lb, xbuf := put(a, logits), put(a, xb)
				ex.GateUp, ex.Down = put(a, gub16), put(a, db16)
				if c.biases {
					ex.GateUpBias, ex.DownBias = put(a, randF32(r, E*2*I, 0.3)), put(a, randF32(r, E*H, 0.3))
				}
				var sb *Buffer
				if sbias != nil {
					sb = put(a, sbias)
				}
				wsBytes, _, err := a.d.MoEWorkspace(T, K, ex)
				a.check(err)
				if a.err != nil {
					return
				}
				for i, mode := range []MoEGemvMode{MoEGemvTwo, MoEGemvOneLaunch} {
					ib, wb := put(a, make([]int32, T*K)), put(a, f32Fill(T*K, float32(math.NaN())))
					ob, cb := put(a, f32Fill(T*H, float32(math.NaN()))), put(a, make([]int64, E))
					ws := put(a, bf16Fill(int(wsBytes/2), 0xffff)) // NaN everywhere, -1 as int32 (the barrier word too)
					if a.err != nil {
						return
					}
					a.check(a.d.SetMoEGemvMode(mode))
					a.check(a.d.MoERouteExpertsRun(nil, ob, xbuf, ib, wb, lb, sb, T, moeRouter(c.cfg), ex, cb, ws))
					a.check(a.d.SetMoEGemvMode(MoEGemvAuto))
					a.check(a.d.MoEDecodeCheck())
					res[i] = result{get[float32](a, ob, T*H), get[float32](a, wb, T*K), get[int32](a, ib, T*K),
						get[int64](a, cb, E)}
				}
			})
			if t.Failed() {
				return
			}
			if !slices.Equal(res[0].ids, res[1].ids) || !slices.Equal(res[0].counts, res[1].counts) {
				t.Fatalf("routing differs: ids %v / %v", res[0].ids, res[1].ids)
			}
			checkSameBits(t, "weights", res[1].w, res[0].w)
			checkSameBits(t, "output", res[1].out, res[0].out)
		})
	}
}
