package cuda

import (
	"fmt"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/moe"
)

// fusedBackend is a fast-profile backend on the fused MoE path over ranks
// emulated expert-parallel ranks.
func fusedBackend(t *testing.T, ranks int) *Backend {
	t.Helper()
	gpuBackend(t)
	off := false
	be, err := New(Options{SplitActivations: &off, MoEPath: "fused", EPRanks: ranks})
	if err != nil {
		t.Fatal(err)
	}
	return be
}

// TestMoEFusedMatchesCPU: MoE layers on the fused path (one persistent
// kernel per layer, R = 1, 2, 4 emulated ranks) against the CPU backend on
// bf16-exact inputs: relative L2 ≤ 1e-2, expert loads equal; token counts
// that do not divide by R, shared experts added after the kernel.
func TestMoEFusedMatchesCPU(t *testing.T) {
	cases := []struct {
		name    string
		E, H, I int
		T       []int
		r       moe.RouterConfig
		shared  bool
	}{
		{"softmax_shared", 8, 32, 24, []int{1, 13, 70}, moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, NormTopK: true}, true},
		{"deepseek_groups", 32, 48, 16, []int{3, 40}, moe.RouterConfig{NumExperts: 32, TopK: 4, Scoring: moe.Sigmoid, NormTopK: true, ScalingFactor: 2.5, NumGroups: 4, TopKGroups: 2}, true},
		{"many_tokens", 16, 64, 32, []int{600}, moe.RouterConfig{NumExperts: 16, TopK: 4, Scoring: moe.Softmax, NormTopK: true}, false},
	}
	for _, R := range []int{1, 2, 4} {
		gb := fusedBackend(t, R)
		for i, c := range cases {
			t.Run(fmt.Sprintf("r%d_%s", R, c.name), func(t *testing.T) {
				seed := uint64(i*7919) + 0x55
				run := func(be backend.Backend) []backend.Tensor {
					g := newGen(seed, true)
					l := moeLayer(t, be, g, c.E, c.H, c.I, c.r, moe.Activation{Kind: moe.SwiGLU}, false, c.shared)
					var out []backend.Tensor
					for _, T := range c.T {
						out = append(out, be.MoE(W(t, be, g.f32(1, T, c.H)), l))
					}
					return out
				}
				before := moeFusedCalls.Load()
				cb := cpu.New(cpu.Options{})
				want, got := run(cb), run(gb)
				worst := 0.0
				for j := range want {
					e := relL2(gb.ToHost(got[j]), cb.ToHost(want[j]))
					worst = max(worst, e)
					if !(e <= 1e-2) {
						t.Errorf("T=%d: relative L2 %.3g > 1e-2", c.T[j], e)
					}
				}
				// One rank's decode-sized calls take the GEMV kernels (moeGemv).
				fused := 0
				for _, T := range c.T {
					if !gb.moeGemv(T, c.r.TopK, c.I) {
						fused++
					}
				}
				if n := moeFusedCalls.Load() - before; n != int64(fused) {
					t.Errorf("%d of %d MoE calls took the fused path, want %d", n, len(c.T), fused)
				}
				if gl, cl := gb.TakeExpertLoad(), cb.TakeExpertLoad(); fmt.Sprint(gl) != fmt.Sprint(cl) {
					t.Errorf("expert load %v, CPU %v", gl, cl)
				}
				t.Logf("MOE fused R=%d %s: worst relative L2 %.3g over %d calls", R, c.name, worst, len(want))
			})
		}
	}
}

// TestGoldenFusedMatchesGrouped: whole golden models on the fused MoE path
// (R = 1 and 2 emulated ranks) give the logits of the grouped path (the
// same bf16 rounding points, so nearly equal).
func TestGoldenFusedMatchesGrouped(t *testing.T) {
	for _, fam := range []string{"qwen3_moe", "mixtral", "deepseek_v3"} {
		t.Run(fam, func(t *testing.T) {
			g := readGolden(t, fam)
			base := fastBackend(t, false)
			bl := loadModel(t, fam, base)
			ids := g.IDs
			want, err := bl.Model.Forward(backend.SingleSequence(1, ids, 0, true))
			if err != nil {
				t.Fatal(err)
			}
			wv := base.ToHost(want)
			for _, R := range []int{1, 2} {
				fb := fusedBackend(t, R)
				fl := loadModel(t, fam, fb)
				before := moeFusedCalls.Load()
				got, err := fl.Model.Forward(backend.SingleSequence(1, ids, 0, true))
				if err != nil {
					t.Fatal(err)
				}
				e := relL2(fb.ToHost(got), wv)
				t.Logf("GOLDEN %s fused R=%d: logits relative L2 to the grouped path %.3g (%d fused layers)", fam, R, e, moeFusedCalls.Load()-before)
				if !(e <= 1e-3) {
					t.Errorf("R=%d: relative L2 %.3g > 1e-3", R, e)
				}
				if moeFusedCalls.Load() == before {
					t.Errorf("R=%d: no layer took the fused path", R)
				}
			}
		})
	}
}
