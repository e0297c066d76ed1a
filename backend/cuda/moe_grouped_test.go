package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
)

// TestMoEGroupedMatchesCPU runs MoE layers whose shapes take the grouped
// path (bf16 expert weights, fast mode, H and I multiples of 8) against the
// CPU backend on bf16-exact random inputs: relative L2 ≤ 1e-2, expert
// loads equal (read from the device counters), and checks the path taken.
func TestMoEGroupedMatchesCPU(t *testing.T) {
	gpuBackend(t)
	off := false
	gb, err := New(Options{SplitActivations: &off})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		E, H, I int
		T       []int
		r       moe.RouterConfig
		act     moe.Activation
		biases  bool
		shared  bool
	}{
		{"softmax_shared", 8, 32, 24, []int{1, 13, 70}, moe.RouterConfig{NumExperts: 8, TopK: 2, Scoring: moe.Softmax, NormTopK: true},
			moe.Activation{Kind: moe.SwiGLU}, false, true},
		{"deepseek_groups_bias", 32, 48, 16, []int{3, 40}, moe.RouterConfig{NumExperts: 32, TopK: 4, Scoring: moe.Sigmoid, NormTopK: true, ScalingFactor: 2.5, NumGroups: 4, TopKGroups: 2},
			moe.Activation{Kind: moe.SwiGLU}, true, true},
		{"softmax_topk_clamped_biases", 4, 40, 8, []int{1, 40}, moe.RouterConfig{NumExperts: 4, TopK: 2, Scoring: moe.Softmax, SoftmaxTopK: true},
			moe.Activation{Kind: moe.ClampedSwiGLU, Alpha: 1.702, Limit: 7}, true, false},
		{"many_tokens", 16, 64, 32, []int{600}, moe.RouterConfig{NumExperts: 16, TopK: 4, Scoring: moe.Softmax, NormTopK: true},
			moe.Activation{Kind: moe.SwiGLU}, false, false},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			seed := uint64(i*104729) + 0x77
			t.Logf("seed %#x", seed)
			run := func(be backend.Backend) []backend.Tensor {
				g := newGen(seed, true)
				l := moeLayer(t, be, g, c.E, c.H, c.I, c.r, c.act, c.biases, c.shared)
				var out []backend.Tensor
				for _, T := range c.T {
					out = append(out, be.MoE(W(t, be, g.f32(1, T, c.H)), l))
				}
				return out
			}
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
			if gl, cl := gb.TakeExpertLoad(), cb.TakeExpertLoad(); fmt.Sprint(gl) != fmt.Sprint(cl) {
				t.Errorf("expert load %v, CPU %v", gl, cl)
			}
			if gl := gb.TakeExpertLoad(); len(gl) != 0 {
				t.Errorf("expert load after a take: %v, want none", gl)
			}
			t.Logf("MOE grouped %s: worst relative L2 %.3g over %d calls", c.name, worst, len(want))
		})
	}
	// The path: these layers' weights are bf16 and split mode is off.
	g := newGen(1, true)
	l := moeLayer(t, gb, g, 8, 32, 24, cases[0].r, cases[0].act, false, false)
	if !gb.grouped(l.GateUp.(*Tensor), l.Down.(*Tensor), 32, 24, 8) {
		t.Fatal("a bf16 layer in fast mode does not take the grouped path")
	}
	split := gpuBackend(t)
	if split.grouped(l.GateUp.(*Tensor), l.Down.(*Tensor), 32, 24, 8) {
		t.Fatal("split mode takes the grouped path")
	}
}

// TestMoEAddRMSNorm: MoEAddRMSNorm on the grouped path (the combine folded
// into the add and norm) gives the bits of AddRMSNorm(x, MoE(h, l), w) on
// the same backend — the sum, the normed rows and the bf16 rounding the
// next GEMM reads — at decode and prefill token counts, and a layer with a
// shared expert (not folded) the same values too; both against the CPU
// backend within 1e-2.
func TestMoEAddRMSNorm(t *testing.T) {
	gpuBackend(t)
	off := false
	gb, err := New(Options{SplitActivations: &off})
	if err != nil {
		t.Fatal(err)
	}
	cb := cpu.New(cpu.Options{})
	r := moe.RouterConfig{NumExperts: 16, TopK: 4, Scoring: moe.Softmax, NormTopK: true}
	for _, c := range []struct {
		name   string
		T      int
		shared bool
	}{{"T1", 1, false}, {"T7", 7, false}, {"T40", 40, false}, {"T300", 300, false}, {"T5_shared", 5, true}} {
		t.Run(c.name, func(t *testing.T) {
			const H, I = 64, 32
			var outs [][]float32
			var bits [][]uint16
			for run, be := range []backend.Backend{gb, gb, cb} {
				g := newGen(uint64(c.T)*7919+11, true)
				l := moeLayer(t, be, g, 16, H, I, r, moe.Activation{Kind: moe.SwiGLU}, false, c.shared)
				x, h, w := W(t, be, g.f32(1, c.T, H)), W(t, be, g.f32(1, c.T, H)), W(t, be, g.f32(1, H))
				var sum, normed backend.Tensor
				if run == 1 { // the second GPU run: the plain ops
					sum, normed = backend.AddRMSNorm(be, x, be.MoE(h, l), w, 1e-6)
				} else {
					sum, normed = backend.MoEAddRMSNorm(be, x, h, l, w, 1e-6)
				}
				outs = append(outs, be.ToHost(sum), be.ToHost(normed))
				if gt, ok := normed.(*Tensor); ok {
					if gt.st.bf16 == nil {
						t.Fatal("no bf16 rounding kept with the normed rows")
					}
					v := make([]uint16, gt.st.n)
					if err := gb.g.Do(func(d *kernels.Device) error { return kernels.Download(d, v, gt.st.bf16) }); err != nil {
						t.Fatal(err)
					}
					bits = append(bits, v)
				}
			}
			for j := range bits[0] {
				if bits[0][j] != bits[1][j] {
					t.Fatalf("bf16 rounding element %d: folded %#04x, plain %#04x", j, bits[0][j], bits[1][j])
				}
			}
			for i := range 2 { // folded against plain ops, bit for bit
				a, b := outs[i], outs[2+i]
				for j := range a {
					if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
						t.Fatalf("output %d element %d: folded %g, plain %g", i, j, a[j], b[j])
					}
				}
				if e := relL2(a, outs[4+i]); !(e <= 1e-2) {
					t.Errorf("output %d: relative L2 %.3g to the CPU backend", i, e)
				}
			}
		})
	}
}
