package kernels

import (
	"math"
	"testing"

	"github.com/mkserve/mkserve/moe"
)

// TestMoEWalk: the decode tiles' expert GEMMs on the persistent walking grid
// (SetMoEWalk(1)) give the same output, bit for bit, as one CTA per work
// item (SetMoEWalk(0), which TestMoEExperts checks against the CPU), at
// shapes with more items than the GPU holds CTAs at once (so the walk runs:
// 6- and 8-stage rings, column tiles and reductions that end inside a tile,
// biases, the clamped activation, a hot expert). Outputs start as NaN, so
// an item the walk skipped shows. Weights and x are device-random.
func TestMoEWalk(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	cases := []struct {
		name            string
		cfg             moe.RouterConfig
		T, H, I, hot    int
		biases, clamped bool
	}{
		// One token, DeepSeek-V3-like rows: GEMM1's reduction of 4104
		// (8 stages) over 65 column tiles × 8 experts, GEMM2's of 2056 (6).
		{name: "E8_K8_T1_long", cfg: softmaxRouter(8, 8), T: 1, H: 4104, I: 2056, hot: -1, biases: true},
		{name: "E64_K4_T16_clamped", cfg: softmaxRouter(64, 4), T: 16, H: 1024, I: 520, hot: -1, clamped: true, biases: true},
		{name: "E128_K8_T12_hot_qwen3_rows", cfg: softmaxRouter(128, 8), T: 12, H: 2048, I: 768, hot: 17},
		{name: "E256_K8_T3_deepseek", cfg: deepSeekV3Router, T: 3, H: 1536, I: 256, hot: -1, biases: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			E, K, T, H, I := c.cfg.NumExperts, c.cfg.TopK, c.T, c.H, c.I
			mc := moeCase{cfg: c.cfg, T: T, H: H, I: I, hot: c.hot}
			logits, sbias := moeLogits(r, mc)
			ex := &MoEExperts{E: E, H: H, I: I}
			if c.clamped {
				ex.Clamped, ex.Alpha, ex.Limit = true, 1.702, 0.7
			}
			var outs [2][]float32
			onGPU(t, g, func(a *arena) {
				defer func() { a.check(a.d.SetMoEWalk(-1)) }()
				ex.GateUp, ex.Down = a.alloc(int64(E*2*I*H)*2), a.alloc(int64(E*H*I)*2)
				xb := a.alloc(int64(T*H) * 2)
				if a.err != nil {
					return
				}
				a.check(a.d.FillRandomBF16(nil, ex.GateUp, int64(E*2*I*H), r.Uint64(), float32(1/math.Sqrt(float64(H)))))
				a.check(a.d.FillRandomBF16(nil, ex.Down, int64(E*H*I), r.Uint64(), float32(1/math.Sqrt(float64(I)))))
				a.check(a.d.FillRandomBF16(nil, xb, int64(T*H), r.Uint64(), 1))
				if c.biases {
					ex.GateUpBias, ex.DownBias = put(a, randF32(r, E*2*I, 0.3)), put(a, randF32(r, E*H, 0.3))
				}
				var sb *Buffer
				if sbias != nil {
					sb = put(a, sbias)
				}
				lb := put(a, logits)
				ib, wb := put(a, make([]int32, T*K)), put(a, f32Fill(T*K, float32(math.NaN())))
				if a.err != nil {
					return
				}
				a.check(a.d.MoERoute(nil, ib, wb, lb, sb, T, moeRouter(c.cfg)))
				wsBytes, _, err := a.d.MoEWorkspace(T, K, ex)
				a.check(err)
				if a.err != nil {
					return
				}
				for walk := range 2 {
					ws := put(a, bf16Fill(int(wsBytes/2), 0xffff)) // NaN everywhere, -1 as int32
					ob := put(a, f32Fill(T*H, float32(math.NaN())))
					if a.err != nil {
						return
					}
					a.check(a.d.SetMoEWalk(walk))
					a.check(a.d.MoEExpertsRun(nil, ob, xb, ib, wb, T, K, ex, nil, ws))
					outs[walk] = get[float32](a, ob, T*H)
				}
			})
			bad, diff := 0, 0
			for i, v := range outs[1] {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					bad++
				}
				if math.Float32bits(v) != math.Float32bits(outs[0][i]) {
					diff++
				}
			}
			if bad > 0 || diff > 0 {
				t.Fatalf("walk: %d of %d outputs not finite, %d differ from one CTA per item", bad, len(outs[1]), diff)
			}
			t.Logf("%d outputs identical", len(outs[1]))
		})
	}
}
