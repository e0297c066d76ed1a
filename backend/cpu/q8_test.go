package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

// mxfp4BF16 is an [N, K] BF16 host tensor named name whose values an MXFP4
// checkpoint could hold: E2M1 values times a power of two per group of 32.
func mxfp4BF16(r *rand.Rand, name string, N, K int) *tensor.Host {
	e2m1 := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	raw := make([]byte, 2*N*K)
	for g := 0; g < N*K; g += 32 {
		s := float32(math.Ldexp(1, r.IntN(8)-6))
		for i := g; i < g+32; i++ {
			v := e2m1[r.IntN(len(e2m1))] * s
			if r.IntN(2) == 0 {
				v = -v
			}
			b := math.Float32bits(v) >> 16
			raw[2*i], raw[2*i+1] = byte(b), byte(b>>8)
		}
	}
	return &tensor.Host{Name: name, DType: tensor.BF16, Shape: []int{N, K}, Data: raw}
}

// randBF16Host is an [N, K] BF16 host tensor of random values in (-1, 1).
func randBF16Host(r *rand.Rand, name string, N, K int) *tensor.Host {
	raw := make([]byte, 2*N*K)
	for i := range N * K {
		b := math.Float32bits(r.Float32()*2-1) >> 16
		raw[2*i], raw[2*i+1] = byte(b), byte(b>>8)
	}
	return &tensor.Host{Name: name, DType: tensor.BF16, Shape: []int{N, K}, Data: raw}
}

// form is how a backend tensor holds its values.
func form(x backend.Tensor) string {
	t := x.(*Tensor)
	switch {
	case t.fp4 != nil:
		return "fp4"
	case t.q8 != nil:
		return "q8"
	case t.bf != nil:
		return "bf16"
	}
	return "f32"
}

// TestWeightFormats: which matrices each Options.Weights holds as FP4 or
// Q8 — auto only those they hold exactly (FP4 first), q8 every matrix with
// rows a multiple of 32 long but the routers, stored none — and that every
// such weight reads back as its values (exactly, or within 1/254 of its
// group's largest).
func TestWeightFormats(t *testing.T) {
	r := newRand(t)
	f32 := &tensor.Host{Name: "f", DType: tensor.F32, Shape: []int{2, 32}, Data: make([]byte, 4*64)}
	for i := range 64 {
		b := math.Float32bits(r.Float32())
		f32.Data[4*i], f32.Data[4*i+1], f32.Data[4*i+2], f32.Data[4*i+3] = byte(b), byte(b>>8), byte(b>>16), byte(b>>24)
	}
	vec := randBF16Host(r, "norm.weight", 1, 64)
	vec.Shape = []int{64}
	ints := randBF16Host(r, "int8s", 6, 64) // small integers times 2^-10: Q8-exact, not FP4
	for i := 0; i < len(ints.Data); i += 2 {
		b := math.Float32bits(float32(r.IntN(255)-127)*0x1p-10) >> 16
		ints.Data[i], ints.Data[i+1] = byte(b), byte(b>>8)
	}
	hosts := map[string]*tensor.Host{
		"mxfp4":     mxfp4BF16(r, "model.layers.0.mlp.experts.down_proj", 6, 64),
		"int8s":     ints,
		"random":    randBF16Host(r, "model.layers.0.self_attn.q_proj.weight", 6, 64),
		"router":    randBF16Host(r, "model.layers.0.mlp.gate.weight", 4, 64),
		"gptrouter": randBF16Host(r, "model.layers.0.mlp.router.weight", 4, 64),
		"shared":    randBF16Host(r, "model.layers.0.mlp.shared_expert_gate.weight", 1, 64),
		"gate_proj": randBF16Host(r, "model.layers.0.mlp.gate_proj.weight", 4, 64),
		"K40":       randBF16Host(r, "w", 3, 40),
		"vector":    vec,
		"f32":       f32,
	}
	for _, c := range []struct {
		format WeightFormat
		want   map[string]string
	}{
		{WeightsAuto, map[string]string{"mxfp4": "fp4", "int8s": "q8", "random": "bf16", "router": "bf16", "gptrouter": "bf16", "shared": "bf16",
			"gate_proj": "bf16", "K40": "bf16", "vector": "f32", "f32": "f32"}},
		{WeightsQ8, map[string]string{"mxfp4": "q8", "int8s": "q8", "random": "q8", "router": "bf16", "gptrouter": "bf16", "shared": "bf16",
			"gate_proj": "q8", "K40": "bf16", "vector": "f32", "f32": "q8"}},
		{WeightsStored, map[string]string{"mxfp4": "bf16", "int8s": "bf16", "random": "bf16", "router": "bf16", "gptrouter": "bf16", "shared": "bf16",
			"gate_proj": "bf16", "K40": "bf16", "vector": "f32", "f32": "f32"}},
	} {
		t.Run(c.format.String(), func(t *testing.T) {
			be, ref := New(Options{Weights: c.format}), New(Options{Weights: WeightsStored})
			for name, h := range hosts {
				w, err := be.Weight(h)
				if err != nil {
					t.Fatal(err)
				}
				if got := form(w); got != c.want[name] {
					t.Errorf("%s: held as %s, want %s", name, got, c.want[name])
				}
				wr, _ := ref.Weight(h)
				got, want := be.ToHost(w), ref.ToHost(wr)
				for i := range want {
					g := want[(i/32)*32 : min(len(want), (i/32+1)*32)]
					amax := slices.Max(g)
					amax = max(amax, -slices.Min(g))
					if d := math.Abs(float64(got[i] - want[i])); d > float64(amax)/254*(1+1e-5) ||
						((name == "mxfp4" || name == "int8s") && got[i] != want[i]) {
						t.Fatalf("%s: value %d reads back %g, stored %g", name, i, got[i], want[i])
					}
				}
			}
		})
	}
	for _, s := range []string{"auto", "stored", "q8"} {
		if f, err := ParseWeightFormat(s); err != nil || f.String() != s {
			t.Errorf("ParseWeightFormat(%q) = %v, %v", s, f, err)
		}
	}
	if _, err := ParseWeightFormat("int4"); err == nil {
		t.Error("ParseWeightFormat(int4): no error")
	}
}

// TestQ8ExactSameResults: weights FP4 and Q8 hold exactly (MXFP4's
// values) give the stored bf16 weights' results — bit for bit as Q8
// (cpu_weights q8: the Q8 kernels sum as the float32 ones do), to float32
// rounding as FP4 (auto) — for Linear, Embed, and a MoE layer directly and
// over emulated expert-parallel ranks; lossy Q8 weights stay close.
func TestQ8ExactSameResults(t *testing.T) {
	r := newRand(t)
	const E, H, I, T = 4, 64, 32, 5
	hosts := map[string]*tensor.Host{
		"gateup": mxfp4BF16(r, "experts.gate_up_proj", E*2*I, H),
		"down":   mxfp4BF16(r, "experts.down_proj", E*H, I),
		"gate":   randBF16Host(r, "mlp.gate.weight", E, H),
		"embed":  mxfp4BF16(r, "embed_tokens.weight", 10, H),
	}
	layer := func(be *Backend) *backend.MoELayer {
		w := map[string]backend.Tensor{}
		for name, h := range hosts {
			x, err := be.Weight(h)
			if err != nil {
				t.Fatal(err)
			}
			w[name] = x
		}
		return &backend.MoELayer{
			Router: moe.RouterConfig{NumExperts: E, TopK: 2, Scoring: moe.Softmax, NormTopK: true},
			Gate:   w["gate"], GateUp: w["gateup"], Down: w["down"], Act: moe.Activation{Kind: moe.SwiGLU},
		}
	}
	x := randT(r, T, H)
	run := func(opts Options) (outs [3][]float32, forms string) {
		be := New(opts)
		l := layer(be)
		forms = form(l.GateUp) + "," + form(l.Down)
		return [3][]float32{be.ToHost(be.MoE(x, l)), be.ToHost(be.Linear(x, l.GateUp, nil)),
			be.ToHost(be.Embed(layerEmbed(t, be, hosts["embed"]), []int32{3, 9, 0}))}, forms
	}
	want, forms := run(Options{Weights: WeightsStored})
	if forms != "bf16,bf16" {
		t.Fatalf("stored: experts held as %s", forms)
	}
	for _, c := range []struct {
		opts  Options
		forms string
		exact bool
	}{
		{Options{Weights: WeightsQ8}, "q8,q8", true},
		{Options{Weights: WeightsQ8, EPRanks: 2}, "q8,q8", true},
		{Options{}, "fp4,fp4", false},
		{Options{EPRanks: 2}, "fp4,fp4", false},
	} {
		got, forms := run(c.opts)
		if forms != c.forms {
			t.Fatalf("%+v: experts held as %s, want %s", c.opts, forms, c.forms)
		}
		for i, name := range []string{"MoE", "Linear", "Embed"} {
			if d := maxRelDiff(got[i], want[i]); (c.exact && !slices.Equal(got[i], want[i])) || d > 1e-5 {
				t.Errorf("%+v: %s differs from bf16's (max relative difference %g)", c.opts, name, d)
			}
		}
	}
	// Lossy: random weights rounded to Q8 stay within a few per mille.
	hosts["gateup"] = randBF16Host(r, "experts.gate_up_proj", E*2*I, H)
	hosts["down"] = randBF16Host(r, "experts.down_proj", E*H, I)
	want, _ = run(Options{Weights: WeightsStored})
	got, forms := run(Options{Weights: WeightsQ8})
	if forms != "q8,q8" {
		t.Fatalf("q8: experts held as %s", forms)
	}
	if d := maxRelDiff(got[0], want[0]); d > 2e-2 || d == 0 {
		t.Errorf("q8 MoE against bf16: max relative difference %g, want (0, 2e-2]", d)
	}
}

// layerEmbed uploads h as an embedding table on be.
func layerEmbed(t *testing.T, be *Backend, h *tensor.Host) backend.Tensor {
	t.Helper()
	w, err := be.Weight(h)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
