package moe

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/linalg"
)

func TestExpertsForwardAgainstNaive(t *testing.T) {
	acts := []Activation{
		{Kind: SwiGLU},
		// A small limit so the clamps really bite on these activations.
		{Kind: ClampedSwiGLU, Alpha: 1.702, Limit: 0.7},
	}
	shapes := []struct{ T, K, E, H, I int }{
		{1, 1, 4, 16, 8},   // one token, one expert
		{1, 8, 64, 24, 12}, // decode: many experts, one row each (concurrent experts)
		{5, 2, 8, 32, 16},
		{64, 4, 8, 20, 10},  // several rows per expert (sequential experts)
		{600, 1, 2, 8, 4},   // more than mTile rows for one expert
		{3, 2, 64, 16, 8},   // most experts get nothing
		{33, 3, 3, 17, 5},   // odd sizes
		{200, 8, 16, 16, 6}, // K = 8
	}
	for _, act := range acts {
		for _, bias := range []bool{false, true} {
			for _, sh := range shapes {
				name := fmt.Sprintf("act%d/bias=%v/T%d_K%d_E%d_H%d_I%d", act.Kind, bias, sh.T, sh.K, sh.E, sh.H, sh.I)
				t.Run(name, func(t *testing.T) {
					r := newRand(t)
					ex := randExperts(r, sh.E, sh.H, sh.I, act, bias)
					x := randn(r, sh.T*sh.H, 1)
					ids, w := randRouting(r, sh.T, sh.K, sh.E)
					want := naiveExperts(ex, x, sh.T, sh.K, ids, w)
					out := randn(r, sh.T*sh.H, 5) // garbage: Forward overwrites
					ex.Forward(out, x, sh.T, sh.K, ids, w)
					if e := relL2(out, want); e > 1e-5 {
						t.Fatalf("relative L2 error %.3g > 1e-5", e)
					}
				})
			}
		}
	}
}

// The clamp must be active in the ClampedSwiGLU test above; check that the
// chosen scales do push gate and up past the limit.
func TestClampedSwiGLUClamps(t *testing.T) {
	act := Activation{Kind: ClampedSwiGLU, Alpha: 1.702, Limit: 0.7}
	gate := []float32{-3, -0.5, 0.3, 0.7, 2.5}
	up := []float32{-2, 0.1, 0.9, -0.7, 5}
	dst := make([]float32, len(gate))
	activate(act, dst, gate, up)
	// (clamp(up)+1) · min(g, L)·σ(α·min(g, L)), by hand.
	want := []float64{
		(-0.7 + 1) * -3 * sigm(1.702*-3),
		(0.1 + 1) * -0.5 * sigm(1.702*-0.5),
		(0.7 + 1) * 0.3 * sigm(1.702*0.3),
		(-0.7 + 1) * 0.7 * sigm(1.702*0.7),
		(0.7 + 1) * 0.7 * sigm(1.702*0.7),
	}
	for i := range dst {
		if d := float64(dst[i]) - want[i]; d > 1e-6 || d < -1e-6 {
			t.Fatalf("activate[%d] = %g, want %g", i, dst[i], want[i])
		}
	}
}

func sigm(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// Forward in token chunks (a small slot budget) must give the same result.
func TestExpertsForwardChunks(t *testing.T) {
	r := newRand(t)
	const T, K, E, H, I = 50, 3, 8, 16, 8
	ex := randExperts(r, E, H, I, Activation{Kind: SwiGLU}, true)
	x := randn(r, T*H, 1)
	ids, w := randRouting(r, T, K, E)
	want := naiveExperts(ex, x, T, K, ids, w)
	old := slotBudget
	slotBudget = 7 * K * H // 7 tokens per chunk
	defer func() { slotBudget = old }()
	out := make([]float32, T*H)
	ex.Forward(out, x, T, K, ids, w)
	if e := relL2(out, want); e > 1e-5 {
		t.Fatalf("relative L2 error %.3g > 1e-5", e)
	}
}

func TestExpertsValidate(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	cases := []struct {
		name string
		mod  func(*Experts)
		want string
	}{
		{"sizes", func(ex *Experts) { ex.I = 0 }, "E, H, I"},
		{"gate_up", func(ex *Experts) { ex.GateUp = ex.GateUp[1:] }, "GateUp has"},
		{"gate_up_bias", func(ex *Experts) { ex.GateUpBias = ex.GateUpBias[1:] }, "GateUpBias"},
		{"down", func(ex *Experts) { ex.Down = ex.Down[1:] }, "Down has"},
		{"down_bias", func(ex *Experts) { ex.DownBias = ex.DownBias[1:] }, "DownBias"},
		{"activation", func(ex *Experts) { ex.Act = Activation{Kind: ClampedSwiGLU} }, "Limit"},
		{"activation kind", func(ex *Experts) { ex.Act = Activation{Kind: 9} }, "kind"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ex := randExperts(r, 4, 8, 4, Activation{Kind: SwiGLU}, true)
			if err := ex.Validate(); err != nil {
				t.Fatalf("good experts: %v", err)
			}
			tc.mod(ex)
			if err := ex.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want error naming %q", err, tc.want)
			}
		})
	}
}

func TestExpertsForwardPanicsOnBadIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	ex := randExperts(r, 4, 8, 4, Activation{Kind: SwiGLU}, false)
	x := randn(r, 2*8, 1)
	defer func() {
		p := recover()
		if p == nil || !strings.Contains(fmt.Sprint(p), "ids[3]") {
			t.Fatalf("panic %v, want one naming ids[3]", p)
		}
	}()
	ex.Forward(make([]float32, 16), x, 2, 2, []int32{0, 1, 2, 4}, []float32{1, 1, 1, 1})
}

// qwen3Like is a scaled-down Qwen3-30B-A3B layer (H 2048→512, I 768→192,
// 128→64 experts, top-8).
func qwen3Like(r *rand.Rand) *Experts {
	return randExperts(r, 64, 512, 192, Activation{Kind: SwiGLU}, false)
}

func BenchmarkExpertsForward(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	qwen := qwen3Like(r)
	// Mixtral-like: few large experts, top-2 (H, I scaled down 8x).
	mixtral := randExperts(r, 8, 512, 1792, Activation{Kind: SwiGLU}, false)
	cases := []struct {
		name  string
		ex    *Experts
		T, K  int
		sched string
	}{
		{"qwen3", qwen, 1, 8, "concurrent"}, {"qwen3", qwen, 1, 8, "serial"},
		{"qwen3", qwen, 16, 8, "concurrent"}, {"qwen3", qwen, 16, 8, "serial"},
		{"qwen3", qwen, 256, 8, "concurrent"}, {"qwen3", qwen, 256, 8, "serial"},
		{"mixtral", mixtral, 1, 2, "concurrent"},
		{"mixtral", mixtral, 512, 2, "concurrent"}, {"mixtral", mixtral, 512, 2, "serial"},
	}
	for _, tc := range cases {
		ex, T, K := tc.ex, tc.T, tc.K
		b.Run(fmt.Sprintf("%s_E%d_H%d_I%d_K%d_T%d_%s", tc.name, ex.E, ex.H, ex.I, K, T, tc.sched), func(b *testing.B) {
			if tc.sched == "serial" { // experts one after another, parallel GEMMs
				serialExperts = true
				defer func() { serialExperts = false }()
			}
			x := randn(r, T*ex.H, 1)
			ids, w := randRouting(r, T, K, ex.E)
			out := make([]float32, T*ex.H)
			for b.Loop() {
				ex.Forward(out, x, T, K, ids, w)
			}
			flops := float64(T*K) * 2 * 3 * float64(ex.H*ex.I)
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// toBF16 rounds v to bf16 (nearest even) in place and returns the bf16 bits.
func toBF16(v []float32) []uint16 {
	b := make([]uint16, len(v))
	for i, x := range v {
		u := math.Float32bits(x)
		u += 0x7fff + (u>>16)&1
		b[i] = uint16(u >> 16)
		v[i] = math.Float32frombits(uint32(b[i]) << 16)
	}
	return b
}

// TestExpertsFormsSameBits: experts held in bf16 or as Q8 give the
// float32 experts' output on the same (bf16-exact, or dequantized) values
// bit for bit, alone and over an expert-parallel world, at decode and
// prefill token counts (H and I ≤ 1024); a matrix given twice, or Q8 rows
// that are not whole groups, are refused.
func TestExpertsFormsSameBits(t *testing.T) {
	r := rand.New(rand.NewPCG(31, 7))
	for _, f := range []struct {
		name string
		H, I int
		form func(v []float32, N, K int) linalg.Weights // sets v to the values it holds
	}{
		{"bf16", 72, 40, func(v []float32, _, _ int) linalg.Weights { return linalg.Weights{BF16: toBF16(v)} }},
		{"q8", 96, 64, func(v []float32, N, K int) linalg.Weights { return linalg.Weights{Q8: toQ8(v, N, K)} }},
	} {
		for _, T := range []int{1, 3, 40, 300} {
			ex := randExperts(r, 8, f.H, f.I, Activation{Kind: SwiGLU}, true)
			held := *ex
			held.GateUpW, held.DownW = f.form(ex.GateUp, 8*2*f.I, f.H), f.form(ex.Down, 8*f.H, f.I)
			held.GateUp, held.Down = nil, nil
			if err := held.Validate(); err != nil {
				t.Fatal(err)
			}
			x := randn(r, T*ex.H, 1)
			ids, w := randRouting(r, T, 2, ex.E)
			want, got := make([]float32, T*ex.H), make([]float32, T*ex.H)
			ex.Forward(want, x, T, 2, ids, w)
			held.Forward(got, x, T, 2, ids, w)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s, T=%d: out[%d] = %g, float32 experts %g", f.name, T, i, got[i], want[i])
				}
			}
			ep, err := NewEP(NewTable(ex.E, 3), &held)
			if err != nil {
				t.Fatal(err)
			}
			clear(got)
			if err := ep.Forward(got, x, T, 2, ids, w); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("%s, T=%d, 3 ranks: out[%d] = %g, float32 experts %g", f.name, T, i, got[i], want[i])
				}
			}
		}
	}
	ex := randExperts(r, 4, 8, 4, Activation{Kind: SwiGLU}, false)
	ex.GateUpW = linalg.Weights{BF16: toBF16(append([]float32(nil), ex.GateUp...))}
	if err := ex.Validate(); err == nil || !strings.Contains(err.Error(), "once") {
		t.Fatalf("GateUp given twice: Validate() = %v", err)
	}
	ex = randExperts(r, 2, 40, 32, Activation{Kind: SwiGLU}, false) // H = 40: not whole groups
	ex.GateUpW, ex.GateUp = linalg.Weights{Q8: make([]byte, 2*64*linalg.Q8RowBytes(32))}, nil
	if err := ex.Validate(); err == nil || !strings.Contains(err.Error(), "multiple of 32") {
		t.Fatalf("Q8 rows of 40 values: Validate() = %v", err)
	}
}

// toQ8 quantizes v [N, K] to a linalg.Q8 matrix and sets v to its
// dequantized values.
func toQ8(v []float32, N, K int) []byte {
	q := make([]byte, N*linalg.Q8RowBytes(K))
	linalg.QuantizeQ8(q, v, N, K)
	linalg.DequantQ8(v, q, N, K)
	return q
}

// BenchmarkExpertsForms times a decode step's experts (top-8 of 16 with
// Qwen3-30B-A3B's H and I, 75 MB of weights in bf16, past the caches)
// held in bf16 and as Q8.
func BenchmarkExpertsForms(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	const E, H, I = 16, 2048, 768
	ex := randExperts(r, E, H, I, Activation{Kind: SwiGLU}, false)
	bf, q := *ex, *ex
	bf.GateUpW, bf.DownW, bf.GateUp, bf.Down = linalg.Weights{BF16: toBF16(slices.Clone(ex.GateUp))}, linalg.Weights{BF16: toBF16(slices.Clone(ex.Down))}, nil, nil
	q.GateUpW, q.DownW, q.GateUp, q.Down = linalg.Weights{Q8: toQ8(slices.Clone(ex.GateUp), E*2*I, H)}, linalg.Weights{Q8: toQ8(slices.Clone(ex.Down), E*H, I)}, nil, nil
	for _, T := range []int{1, 4} {
		x := randn(r, T*H, 1)
		ids, w := randRouting(r, T, 8, E)
		out := make([]float32, T*H)
		for _, c := range []struct {
			name  string
			ex    *Experts
			bytes float64 // per expert
		}{{"bf16", &bf, 2 * 3 * H * I}, {"q8", &q, 3 * float64(H*I) * 9 / 8}} {
			b.Run(fmt.Sprintf("T%d/%s", T, c.name), func(b *testing.B) {
				touched := map[int32]bool{}
				for _, e := range ids {
					touched[e] = true
				}
				for b.Loop() {
					c.ex.Forward(out, x, T, 8, ids, w)
				}
				b.ReportMetric(float64(len(touched))*c.bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}

// TestExpertsFP4: experts held as FP4 (MXFP4's values) give the float32
// experts' output on the same values to float32 rounding, alone and over
// an expert-parallel world, at decode and prefill token counts.
func TestExpertsFP4(t *testing.T) {
	r := rand.New(rand.NewPCG(33, 9))
	e2m1 := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}
	mxfp4 := func(n int) ([]float32, []uint16) { // values an MXFP4 checkpoint holds, and their bf16 bits
		v, b := make([]float32, n), make([]uint16, n)
		for g := 0; g < n; g += 32 {
			s := float32(math.Ldexp(1, r.IntN(6)-8))
			for i := g; i < g+32; i++ {
				v[i] = e2m1[r.IntN(len(e2m1))] * s * float32(1-2*r.IntN(2))
				b[i] = uint16(math.Float32bits(v[i]) >> 16)
			}
		}
		return v, b
	}
	const E, H, I = 8, 96, 64
	for _, T := range []int{1, 3, 40, 300} {
		gu, gub := mxfp4(E * 2 * I * H)
		dn, dnb := mxfp4(E * H * I)
		ex := &Experts{E: E, H: H, I: I, GateUp: gu, Down: dn, Act: Activation{Kind: SwiGLU}}
		f4 := *ex
		f4.GateUp, f4.Down = nil, nil
		f4.GateUpW.FP4, f4.DownW.FP4 = make([]byte, E*2*I*linalg.FP4RowBytes(H)), make([]byte, E*H*linalg.FP4RowBytes(I))
		if !linalg.QuantizeFP4BF16(f4.GateUpW.FP4, gub, E*2*I, H) || !linalg.QuantizeFP4BF16(f4.DownW.FP4, dnb, E*H, I) {
			t.Fatal("MXFP4 values refused")
		}
		if err := f4.Validate(); err != nil {
			t.Fatal(err)
		}
		x := randn(r, T*H, 1)
		ids, w := randRouting(r, T, 2, E)
		want, got := make([]float32, T*H), make([]float32, T*H)
		ex.Forward(want, x, T, 2, ids, w)
		check := func(what string) {
			t.Helper()
			var num, den float64
			for i := range want {
				d := float64(got[i] - want[i])
				num, den = num+d*d, den+float64(want[i])*float64(want[i])
			}
			if e := math.Sqrt(num / den); e > 1e-6 || got[0] != got[0] {
				t.Fatalf("T=%d %s: relative L2 %.3g from the float32 experts", T, what, e)
			}
		}
		f4.Forward(got, x, T, 2, ids, w)
		check("direct")
		ep, err := NewEP(NewTable(E, 3), &f4)
		if err != nil {
			t.Fatal(err)
		}
		clear(got)
		if err := ep.Forward(got, x, T, 2, ids, w); err != nil {
			t.Fatal(err)
		}
		check("3 ranks")
	}
}
