package attention

import (
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/mkserve/mkserve/linalg"
)

func boolp(b bool) *bool { return &b }

// Configs of the supported families.
var (
	deepseekV3 = RoPE{Dim: 64, Theta: 10000, Style: Interleaved, Scaling: RoPEScaling{
		Type: "yarn", Factor: 40, OriginalMaxPos: 4096, BetaFast: 32, BetaSlow: 1, MScale: 1, MScaleAllDim: 1}}
	gptOSS = RoPE{Dim: 64, Theta: 150000, Style: NeoX, Scaling: RoPEScaling{
		Type: "yarn", Factor: 32, OriginalMaxPos: 4096, BetaFast: 32, BetaSlow: 1, Truncate: boolp(false)}}
	llama31 = RoPE{Dim: 128, Theta: 500000, Style: NeoX, Scaling: RoPEScaling{
		Type: "llama3", Factor: 8, OriginalMaxPos: 8192, LowFreqFactor: 1, HighFreqFactor: 4}}
	qwen3 = RoPE{Dim: 128, Theta: 1e6, Style: NeoX}
)

// refFreqs is transformers' inverse-frequency formulas in plain float64.
func refFreqs(r *RoPE) ([]float64, float64) {
	s := r.Scaling
	d := float64(r.Dim)
	inv := make([]float64, r.Dim/2)
	for i := range inv {
		inv[i] = 1 / math.Pow(r.Theta, float64(2*i)/d)
	}
	switch s.Type {
	case "linear":
		for i := range inv {
			inv[i] /= s.Factor
		}
	case "llama3":
		lowWave := float64(s.OriginalMaxPos) / s.LowFreqFactor
		highWave := float64(s.OriginalMaxPos) / s.HighFreqFactor
		for i, f := range inv {
			wave := 2 * math.Pi / f
			switch {
			case wave < highWave:
			case wave > lowWave:
				inv[i] = f / s.Factor
			default:
				sm := (float64(s.OriginalMaxPos)/wave - s.LowFreqFactor) / (s.HighFreqFactor - s.LowFreqFactor)
				inv[i] = (1-sm)*f/s.Factor + sm*f
			}
		}
	case "yarn":
		bf, bs := s.BetaFast, s.BetaSlow
		if bf == 0 {
			bf = 32
		}
		if bs == 0 {
			bs = 1
		}
		cd := func(rot float64) float64 {
			return d * math.Log(float64(s.OriginalMaxPos)/(rot*2*math.Pi)) / (2 * math.Log(r.Theta))
		}
		lo, hi := cd(bf), cd(bs)
		if s.Truncate == nil || *s.Truncate {
			lo, hi = math.Floor(lo), math.Ceil(hi)
		}
		lo, hi = math.Max(lo, 0), math.Min(hi, d-1)
		if lo == hi {
			hi += 0.001
		}
		for i, f := range inv {
			ramp := math.Min(math.Max((float64(i)-lo)/(hi-lo), 0), 1)
			inv[i] = f/s.Factor*ramp + f*(1-ramp)
		}
		mscale := func(sc, m float64) float64 {
			if sc <= 1 {
				return 1
			}
			return 0.1*m*math.Log(sc) + 1
		}
		switch {
		case s.AttentionFactor != 0:
			return inv, s.AttentionFactor
		case s.MScale != 0 && s.MScaleAllDim != 0:
			return inv, mscale(s.Factor, s.MScale) / mscale(s.Factor, s.MScaleAllDim)
		default:
			return inv, mscale(s.Factor, 1)
		}
	}
	return inv, 1
}

func TestFreqsMatchFormulas(t *testing.T) {
	cases := []struct {
		name string
		r    RoPE
	}{
		{"default theta 1e4 dim 64", RoPE{Dim: 64, Theta: 10000}},
		{"qwen3 default theta 1e6", qwen3},
		{"default small dim", RoPE{Dim: 6, Theta: 500}},
		{"linear factor 4", RoPE{Dim: 96, Theta: 10000, Scaling: RoPEScaling{Type: "linear", Factor: 4}}},
		{"llama3.1", llama31},
		{"deepseek-v3 yarn", deepseekV3},
		{"gpt-oss yarn untruncated", gptOSS},
		{"qwen yarn factor 4", RoPE{Dim: 128, Theta: 1e6, Scaling: RoPEScaling{Type: "yarn", Factor: 4, OriginalMaxPos: 32768}}},
		{"yarn explicit attention factor", RoPE{Dim: 32, Theta: 10000, Scaling: RoPEScaling{
			Type: "yarn", Factor: 8, OriginalMaxPos: 2048, AttentionFactor: 0.7, BetaFast: 16, BetaSlow: 2}}},
		{"yarn mscale only (ignored without mscale_all_dim)", RoPE{Dim: 64, Theta: 10000, Scaling: RoPEScaling{
			Type: "yarn", Factor: 16, OriginalMaxPos: 4096, MScale: 0.707}}},
		{"yarn mscale ratio", RoPE{Dim: 64, Theta: 10000, Scaling: RoPEScaling{
			Type: "yarn", Factor: 16, OriginalMaxPos: 4096, MScale: 1, MScaleAllDim: 0.5}}},
		{"yarn empty ramp (low == high)", RoPE{Dim: 8, Theta: 10000, Scaling: RoPEScaling{
			Type: "yarn", Factor: 2, OriginalMaxPos: 8, BetaFast: 1, BetaSlow: 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inv, attn := c.r.Freqs()
			want, wantAttn := refFreqs(&c.r)
			if len(inv) != c.r.Dim/2 {
				t.Fatalf("len(inv) = %d, want %d", len(inv), c.r.Dim/2)
			}
			if math.Abs(attn-wantAttn) > 1e-12*wantAttn {
				t.Errorf("attention factor %v, want %v", attn, wantAttn)
			}
			for i := range inv {
				if float64(float32(inv[i])) != inv[i] {
					t.Errorf("inv[%d] = %v is not a float32 value", i, inv[i])
				}
				// pow of a float32-rounded exponent: relative error ≈ ln θ · 2^-24.
				tol := 4e-7 * (1 + math.Log(c.r.Theta))
				if rel := math.Abs(inv[i]-want[i]) / want[i]; rel > tol {
					t.Errorf("inv[%d] = %v, want %v (rel err %.2g > %.2g)", i, inv[i], want[i], rel, tol)
				}
			}
		})
	}
}

// TestFreqsKnownValues checks numbers worked out by hand.
func TestFreqsKnownValues(t *testing.T) {
	near := func(t *testing.T, what string, got, want, rel float64) {
		t.Helper()
		if math.Abs(got-want) > rel*math.Abs(want) {
			t.Errorf("%s = %.10g, want %.10g", what, got, want)
		}
	}
	// Default: inv[i] = θ^(-2i/Dim); inv[0] = 1 exactly.
	inv, attn := (&RoPE{Dim: 64, Theta: 10000}).Freqs()
	near(t, "default inv[1]", inv[1], math.Pow(10000, -2.0/64), 1e-6)
	near(t, "default inv[16]", inv[16], 0.01, 1e-6) // 10000^(-1/2)
	if inv[0] != 1 || attn != 1 {
		t.Errorf("default inv[0], attn = %v, %v; want 1, 1", inv[0], attn)
	}
	// Linear: every frequency divided by the factor.
	lin, _ := (&RoPE{Dim: 64, Theta: 10000, Scaling: RoPEScaling{Type: "linear", Factor: 4}}).Freqs()
	near(t, "linear inv[0]", lin[0], 0.25, 0)
	near(t, "linear inv[16]", lin[16], 0.0025, 1e-6)

	// DeepSeek-V3: correction dims 64·ln(4096/(2π·32))/(2 ln 1e4) = 10.47 → 10
	// and 64·ln(4096/2π)/(2 ln 1e4) = 22.51 → 23; mscale = mscale_all_dim so
	// the attention factor is 1.
	ds, dsAttn := deepseekV3.Freqs()
	def, _ := (&RoPE{Dim: 64, Theta: 10000}).Freqs()
	if dsAttn != 1 {
		t.Errorf("deepseek attention factor %v, want 1", dsAttn)
	}
	for i := range ds {
		switch {
		case i <= 10:
			if ds[i] != def[i] {
				t.Errorf("deepseek inv[%d] = %v, want unscaled %v", i, ds[i], def[i])
			}
		case i >= 23:
			near(t, "deepseek inv (interpolated)", ds[i], def[i]/40, 1e-6)
		default:
			if !(ds[i] < def[i] && ds[i] > def[i]/40) {
				t.Errorf("deepseek inv[%d] = %v not strictly between %v and %v", i, ds[i], def[i]/40, def[i])
			}
		}
	}
	// Inside the ramp: i = 16 has ramp (16-10)/13.
	r := 6.0 / 13
	near(t, "deepseek inv[16]", ds[16], def[16]*(1-r)+def[16]/40*r, 1e-6)
	// Softmax scale multiplier of DeepSeek-V3: (1 + 0.1 ln 40)².
	near(t, "YaRNMScale(40,1)", YaRNMScale(40, 1), 1.368887945411394, 1e-12)
	near(t, "mscale²", YaRNMScale(40, 1)*YaRNMScale(40, 1), 1.8738542070926265, 1e-12)
	if YaRNMScale(1, 1) != 1 || YaRNMScale(0.5, 3) != 1 {
		t.Error("YaRNMScale(scale ≤ 1) must be 1")
	}

	// gpt-oss: attention factor 1 + 0.1 ln 32; untruncated ramp from
	// 64·ln(4096/(2π·32))/(2 ln 150000) = 8.09278 to 64·ln(4096/2π)/(2 ln 150000) = 17.39802.
	g, gAttn := gptOSS.Freqs()
	near(t, "gpt-oss attention factor", gAttn, 1.3465735902799727, 1e-12)
	gdef, _ := (&RoPE{Dim: 64, Theta: 150000}).Freqs()
	lo, hi := 8.092779115512402, 17.39802450158856
	for _, i := range []int{0, 8, 9, 12, 17, 18, 31} {
		ramp := math.Min(math.Max((float64(i)-lo)/(hi-lo), 0), 1)
		near(t, "gpt-oss inv", g[i], gdef[i]*(1-ramp)+gdef[i]/32*ramp, 2e-5)
	}
	if g[8] != gdef[8] || g[9] == gdef[9] {
		t.Errorf("gpt-oss ramp should start between dims 8 and 9: %v %v / %v %v", g[8], gdef[8], g[9], gdef[9])
	}

	// Llama 3.1: wavelengths below 8192/4 = 2048 untouched, above 8192 divided by 8.
	l, _ := llama31.Freqs()
	ldef, _ := (&RoPE{Dim: 128, Theta: 500000}).Freqs()
	if l[0] != 1 || l[10] != ldef[10] { // 2π/inv[10] = 2π·500000^(20/128) ≈ 49
		t.Errorf("llama3 high frequencies changed: %v %v", l[0], l[10])
	}
	near(t, "llama3 inv[63]", l[63], math.Pow(500000, -126.0/128)/8, 1e-6)
}

// refApply rotates x in float64. With hfAngles it starts from Freqs (tested
// on its own) and rounds the angle to float32 as transformers computes it
// (float32(inv)·float32(pos)); without, everything is exact float64.
func refApply(r *RoPE, x []float32, rows, heads, headDim int, pos []int32, hfAngles bool) []float64 {
	inv, attn := refFreqs(r)
	if hfAngles {
		inv, attn = r.Freqs()
	}
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	half := r.Dim / 2
	for row := range rows {
		for h := range heads {
			base := (row*heads + h) * headDim
			for i := range half {
				a := inv[i] * float64(pos[row])
				if hfAngles {
					a = float64(float32(inv[i]) * float32(pos[row]))
				}
				c, s := math.Cos(a)*attn, math.Sin(a)*attn
				i1, i2 := base+i, base+i+half
				if r.Style == Interleaved {
					i1, i2 = base+2*i, base+2*i+1
				}
				x1, x2 := float64(x[i1]), float64(x[i2])
				out[i1] = x1*c - x2*s
				out[i2] = x2*c + x1*s
			}
		}
	}
	return out
}

func randVec(rng *rand.Rand, n int, scale float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64()) * scale
	}
	return x
}

func TestApplyMatchesReference(t *testing.T) {
	cases := []struct {
		name                 string
		r                    RoPE
		rows, heads, headDim int
		maxPos               int32
	}{
		{"neox full", RoPE{Dim: 64, Theta: 10000}, 5, 3, 64, 50},
		{"interleaved full", RoPE{Dim: 32, Theta: 10000, Style: Interleaved}, 4, 2, 32, 300},
		{"neox partial 16 of 48", RoPE{Dim: 16, Theta: 10000}, 3, 4, 48, 1000},
		{"interleaved partial 8 of 20", RoPE{Dim: 8, Theta: 500, Style: Interleaved}, 6, 2, 20, 70},
		{"linear", RoPE{Dim: 32, Theta: 10000, Scaling: RoPEScaling{Type: "linear", Factor: 2}}, 3, 2, 32, 5000},
		{"llama3", llama31, 4, 2, 128, 20000},
		{"deepseek-v3 yarn interleaved rope part", deepseekV3, 5, 3, 192, 100000},
		{"gpt-oss yarn", gptOSS, 5, 4, 64, 131000},
		{"uncached positions", RoPE{Dim: 16, Theta: 10000}, 4, 2, 16, 1 << 20},
		{"many rows (parallel)", RoPE{Dim: 64, Theta: 1e6}, 300, 8, 64, 3000},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x := randVec(rng, c.rows*c.heads*c.headDim, 1)
			pos := make([]int32, c.rows)
			for i := range pos {
				pos[i] = rng.Int32N(c.maxPos + 1)
			}
			pos[0] = c.maxPos
			got := append([]float32(nil), x...)
			c.r.Apply(got, c.rows, c.heads, c.headDim, pos)
			want := refApply(&c.r, x, c.rows, c.heads, c.headDim, pos, true)
			exact := refApply(&c.r, x, c.rows, c.heads, c.headDim, pos, false)
			for i := range got {
				if i%c.headDim >= c.r.Dim {
					if got[i] != x[i] {
						t.Fatalf("x[%d] beyond the rotary dims changed: %v → %v", i, x[i], got[i])
					}
					continue
				}
				if d := math.Abs(float64(got[i]) - want[i]); d > 1e-5*(1+math.Abs(want[i])) {
					t.Fatalf("x[%d] (pos %d) = %v, want %v (float32 angles)", i, pos[i/(c.heads*c.headDim)], got[i], want[i])
				}
				// Against exact float64 angles, float32 inv_freq and angles
				// cost up to about pos·1e-6 radians.
				p := float64(pos[i/(c.heads*c.headDim)])
				if d := math.Abs(float64(got[i]) - exact[i]); d > 1e-5*(1+math.Abs(exact[i]))+1e-6*p*5 {
					t.Fatalf("x[%d] (pos %v) = %v, want %v (float64 angles)", i, p, got[i], exact[i])
				}
			}
		})
	}
}

// TestApplyNormPreserved: with attention factor 1 a rotation keeps each pair's norm.
func TestApplyNormPreserved(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	r := RoPE{Dim: 16, Theta: 10000}
	x := randVec(rng, 16, 1)
	y := append([]float32(nil), x...)
	r.Apply(y, 1, 1, 16, []int32{777})
	for i := range 8 {
		n0 := math.Hypot(float64(x[i]), float64(x[i+8]))
		n1 := math.Hypot(float64(y[i]), float64(y[i+8]))
		if math.Abs(n0-n1) > 1e-5*n0 {
			t.Errorf("pair %d norm %v → %v", i, n0, n1)
		}
	}
	// Position 0 is the identity.
	z := append([]float32(nil), x...)
	r.Apply(z, 1, 1, 16, []int32{0})
	for i := range z {
		if z[i] != x[i] {
			t.Fatalf("position 0 changed x[%d]: %v → %v", i, x[i], z[i])
		}
	}
}

// TestInterleavedMatchesPermutedNeoX: transformers' DeepSeek-V3 permutes the
// rotary dims into [evens | odds] and rotates NeoX-style; the q·k products
// equal those of the pairwise interleaved rotation.
func TestInterleavedMatchesPermutedNeoX(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const d = 64
	il := deepseekV3
	nx := deepseekV3
	nx.Style = NeoX
	perm := func(x []float32) []float32 {
		y := make([]float32, d)
		for i := range d / 2 {
			y[i], y[i+d/2] = x[2*i], x[2*i+1]
		}
		return y
	}
	for range 20 {
		q, k := randVec(rng, d, 1), randVec(rng, d, 1)
		pq, pk := rng.Int32N(5000), rng.Int32N(5000)
		q1, k1 := append([]float32(nil), q...), append([]float32(nil), k...)
		il.Apply(q1, 1, 1, d, []int32{pq})
		il.Apply(k1, 1, 1, d, []int32{pk})
		q2, k2 := perm(q), perm(k)
		nx.Apply(q2, 1, 1, d, []int32{pq})
		nx.Apply(k2, 1, 1, d, []int32{pk})
		// The rotated vectors are the same up to the permutation...
		for i, v := range perm(q1) {
			if v != q2[i] {
				t.Fatalf("permuted interleaved q[%d] = %v, NeoX on permuted q = %v", i, v, q2[i])
			}
		}
		// ...so the scores agree.
		if a, b := linalg.Dot(q1, k1), linalg.Dot(q2, k2); math.Abs(float64(a-b)) > 1e-4*(1+math.Abs(float64(a))) {
			t.Fatalf("q·k interleaved %v, permuted NeoX %v", a, b)
		}
	}
}

func TestApplyConcurrent(t *testing.T) {
	r := RoPE{Dim: 32, Theta: 12345} // a fresh table
	rng := rand.New(rand.NewPCG(7, 8))
	x := randVec(rng, 32, 1)
	var wg sync.WaitGroup
	res := make([][]float32, 16)
	for g := range res {
		wg.Add(1)
		go func() {
			defer wg.Done()
			y := append([]float32(nil), x...)
			r.Apply(y, 1, 1, 32, []int32{int32(500 * (g + 1))})
			res[g] = y
		}()
	}
	wg.Wait()
	for g, y := range res {
		want := append([]float32(nil), x...)
		r.Apply(want, 1, 1, 32, []int32{int32(500 * (g + 1))})
		for i := range y {
			if y[i] != want[i] {
				t.Fatalf("goroutine %d: x[%d] = %v, sequential %v", g, i, y[i], want[i])
			}
		}
	}
}

func TestRoPEValidate(t *testing.T) {
	cases := []struct {
		name string
		r    RoPE
		want string // "" = valid
	}{
		{"ok default", RoPE{Dim: 64, Theta: 1e4}, ""},
		{"ok deepseek", deepseekV3, ""},
		{"ok gpt-oss", gptOSS, ""},
		{"ok llama3", llama31, ""},
		{"odd dim", RoPE{Dim: 7, Theta: 1e4}, "Dim 7"},
		{"zero theta", RoPE{Dim: 8}, "rope_theta"},
		{"bad style", RoPE{Dim: 8, Theta: 1e4, Style: 9}, "style"},
		{"unknown type", RoPE{Dim: 8, Theta: 1e4, Scaling: RoPEScaling{Type: "dynamic", Factor: 2}}, `"dynamic"`},
		{"linear no factor", RoPE{Dim: 8, Theta: 1e4, Scaling: RoPEScaling{Type: "linear"}}, "factor"},
		{"yarn no original", RoPE{Dim: 8, Theta: 1e4, Scaling: RoPEScaling{Type: "yarn", Factor: 4}}, "original_max_position_embeddings"},
		{"llama3 bad bands", RoPE{Dim: 8, Theta: 1e4, Scaling: RoPEScaling{
			Type: "llama3", Factor: 8, OriginalMaxPos: 8192, LowFreqFactor: 4, HighFreqFactor: 1}}, "low_freq_factor"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.r.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

func TestApplyPanicsOnBadShapes(t *testing.T) {
	r := RoPE{Dim: 8, Theta: 1e4}
	for _, c := range []struct {
		name string
		f    func()
	}{
		{"short x", func() { r.Apply(make([]float32, 15), 1, 2, 8, []int32{0}) }},
		{"dim > headDim", func() { r.Apply(make([]float32, 4), 1, 1, 4, []int32{0}) }},
		{"pos count", func() { r.Apply(make([]float32, 16), 2, 1, 8, []int32{0}) }},
		{"negative pos", func() { r.Apply(make([]float32, 8), 1, 1, 8, []int32{-1}) }},
		{"invalid rope", func() { (&RoPE{Dim: 3, Theta: 1}).Apply(make([]float32, 8), 1, 1, 8, []int32{0}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			c.f()
		})
	}
}

func BenchmarkRoPEApply(b *testing.B) {
	// Qwen3-30B-A3B q: 32 heads × 128 at 512 prefill positions.
	r := qwen3
	const rows, heads, hd = 512, 32, 128
	x := randVec(rand.New(rand.NewPCG(1, 1)), rows*heads*hd, 1)
	pos := make([]int32, rows)
	for i := range pos {
		pos[i] = int32(i + 1000)
	}
	b.SetBytes(int64(len(x) * 4))
	for b.Loop() {
		r.Apply(x, rows, heads, hd, pos)
	}
}
