package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// TestMoERouterF32: the router GEMV against a float64 CPU product on fresh
// random inputs (logits to 1e-5 of the row's Σ|x·w|, NaN-poisoned output),
// and its bf16 copy of x equal to tensor.F32ToBF16 bit for bit.
func TestMoERouterF32(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		T, E, H int
		bias    bool
		xb      bool
	}{
		{1, 128, 2048, false, true}, // Qwen3-30B-A3B, one token
		{8, 128, 2048, false, true}, // the most rows
		{7, 60, 2048, true, false},  // Qwen2-MoE's 60 experts: a partial CTA
		{5, 256, 7168, false, true}, // DeepSeek-V3: K not a multiple of the 2048-column batch
		{3, 8, 4096, true, true},    // Mixtral
		{2, 32, 2880, true, false},  // gpt-oss-20b (router bias)
		{2, 5, 8, false, true},      // tiny
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("T%d_E%d_H%d_bias%v_xb%v", c.T, c.E, c.H, c.bias, c.xb), func(t *testing.T) {
			r := newRNG(t)
			x := randF32(r, c.T*c.H, 1)
			wBits, w := randBF16(r, c.E*c.H, 0.05)
			var bias []float32
			if c.bias {
				bias = randF32(r, c.E, 0.5)
			}
			want := make([]float64, c.T*c.E)
			scale := make([]float64, c.T*c.E)
			for tk := range c.T {
				for e := range c.E {
					s, a := refDot(x[tk*c.H:(tk+1)*c.H], w[e*c.H:(e+1)*c.H])
					if bias != nil {
						s += float64(bias[e])
					}
					want[tk*c.E+e], scale[tk*c.E+e] = s, a+1e-30
				}
			}
			var got []float32
			var gotXB []uint16
			onGPU(t, g, func(a *arena) {
				lb := put(a, f32Fill(c.T*c.E, float32(math.NaN())))
				xbuf, wbuf := put(a, x), put(a, wBits)
				var bb, xbb *Buffer
				if bias != nil {
					bb = put(a, bias)
				}
				if c.xb {
					xbb = put(a, bf16Fill(c.T*c.H, bf16NaN))
				}
				if a.err != nil {
					return
				}
				a.check(a.d.MoERouterF32(nil, lb, xbuf, wbuf, bb, xbb, c.T, c.E, c.H))
				got = get[float32](a, lb, c.T*c.E)
				if c.xb {
					gotXB = get[uint16](a, xbb, c.T*c.H)
				}
			})
			worst := 0.0
			for i := range want {
				d := math.Abs(float64(got[i])-want[i]) / scale[i]
				if got[i] != got[i] || d > 1e-5 {
					t.Fatalf("logit %d (token %d, expert %d) = %v, want %v (|Σ| scale %.3g)", i, i/c.E, i%c.E, got[i], want[i], scale[i])
				}
				worst = max(worst, d)
			}
			for i := range gotXB {
				if w := tensor.F32ToBF16(x[i]); gotXB[i] != w {
					t.Fatalf("xb[%d] = %#04x, want %#04x (bf16 of %v)", i, gotXB[i], w, x[i])
				}
			}
			t.Logf("worst |error| / Σ|x·w| = %.3g", worst)
		})
	}
}

// TestGemvBF16: the skinny GEMM against a float64 CPU product of the same
// bf16 operands (1e-5 of Σ|a·b| per output, NaN-poisoned output), at the
// dense projections' decode shapes.
func TestGemvBF16(t *testing.T) {
	g := testGPU(t)
	for _, c := range []struct{ M, N, K int }{
		{1, 512, 2048}, {1, 2048, 4096}, {8, 4096, 2048}, {3, 1000, 7168}, {5, 7, 8}, {2, 151936 / 16, 2048}, {6, 33, 2056},
		// On 132 SMs the weight-resident kernel gives these 3 and 2 rows a
		// CTA (the first's last CTA 1), each row's columns split over 4
		// warps (8 for the lone row; 512 rows above: 4 a CTA, 2 warps).
		{1, 301, 1024}, {2, 264, 7168},
	} {
		t.Run(fmt.Sprintf("M%d_N%d_K%d", c.M, c.N, c.K), func(t *testing.T) {
			r := newRNG(t)
			aBits, a := randBF16(r, c.M*c.K, 1)
			bBits, b := randBF16(r, c.N*c.K, 0.05)
			var got []float32
			onGPU(t, g, func(ar *arena) {
				cb := put(ar, f32Fill(c.M*c.N, float32(math.NaN())))
				ab, bb := put(ar, aBits), put(ar, bBits)
				if ar.err != nil {
					return
				}
				ar.check(ar.d.GemvBF16(nil, cb, ab, bb, c.M, c.N, c.K))
				got = get[float32](ar, cb, c.M*c.N)
			})
			worst := 0.0
			for m := range c.M {
				for n := range c.N {
					s, sa := refDot(a[m*c.K:(m+1)*c.K], b[n*c.K:(n+1)*c.K])
					gv := got[m*c.N+n]
					d := math.Abs(float64(gv)-s) / (sa + 1e-30)
					if gv != gv || d > 1e-5 {
						t.Fatalf("C[%d,%d] = %v, want %v", m, n, gv, s)
					}
					worst = max(worst, d)
				}
			}
			t.Logf("worst |error| / Σ|a·b| = %.3g", worst)
		})
	}
	onGPU(t, g, func(ar *arena) {
		buf := ar.alloc(1 << 16)
		if ar.err != nil {
			return
		}
		for _, c := range []struct{ M, N, K int }{{GemvMaxRows + 1, 8, 64}, {1, 8, 12}, {0, 8, 64}} {
			if err := ar.d.GemvBF16(nil, buf, buf, buf, c.M, c.N, c.K); err == nil {
				t.Errorf("GemvBF16 M=%d N=%d K=%d gave no error", c.M, c.N, c.K)
			}
		}
	})
}

// TestMoERouterF32Args: shapes the kernel does not take are errors.
func TestMoERouterF32Args(t *testing.T) {
	g := testGPU(t)
	onGPU(t, g, func(a *arena) {
		b := a.alloc(1 << 20)
		if a.err != nil {
			return
		}
		for _, c := range []struct{ T, E, H int }{{0, 8, 64}, {1, 0, 64}, {1, 8, 60}, {GemvMaxRows + 1, 8, 64}} {
			if err := a.d.MoERouterF32(nil, b, b, b, nil, nil, c.T, c.E, c.H); err == nil {
				t.Errorf("MoERouterF32 T=%d E=%d H=%d gave no error", c.T, c.E, c.H)
			}
		}
	})
}

// refDot is Σ a[i]·b[i] over len(a) in float64, and Σ |a[i]·b[i]| (the
// scale the skinny GEMMs' tests bound their error by).
func refDot(a, b []float32) (sum, abs float64) {
	for i, x := range a {
		p := float64(x) * float64(b[i])
		sum += p
		abs += math.Abs(p)
	}
	return sum, abs
}

// TestGemvBF16Multi: q, k and v of one activation in one launch (three
// projections of different widths, with and without biases) against the
// float64 CPU products, NaN-poisoned outputs; and bad calls are errors.
func TestGemvBF16Multi(t *testing.T) {
	g := testGPU(t)
	for _, c := range []struct {
		M, K int
		N    []int
		bias []bool
	}{
		{1, 2048, []int{4096, 512, 512}, []bool{false, false, false}},
		{2, 4096, []int{4096, 1024, 1024}, []bool{true, true, true}},
		{1, 7168, []int{1536, 576}, []bool{false, true}},
		{3, 2056, []int{33}, []bool{true}},
	} {
		t.Run(fmt.Sprintf("M%d_K%d_N%v", c.M, c.K, c.N), func(t *testing.T) {
			r := newRNG(t)
			aBits, a := randBF16(r, c.M*c.K, 1)
			type proj struct {
				bits []uint16
				b    []float32
				bias []float32
			}
			ps := make([]proj, len(c.N))
			for i, n := range c.N {
				ps[i].bits, ps[i].b = randBF16(r, n*c.K, 0.05)
				if c.bias[i] {
					ps[i].bias = randF32(r, n, 1)
				}
			}
			got := make([][]float32, len(c.N))
			onGPU(t, g, func(ar *arena) {
				ab := put(ar, aBits)
				outs := make([]GemvOut, len(c.N))
				for i, n := range c.N {
					outs[i] = GemvOut{C: put(ar, f32Fill(c.M*n, float32(math.NaN()))), B: put(ar, ps[i].bits), N: n}
					if ps[i].bias != nil {
						outs[i].Bias = put(ar, ps[i].bias)
					}
				}
				if ar.err != nil {
					return
				}
				ar.check(ar.d.GemvBF16Multi(nil, ab, c.M, c.K, outs))
				for i, n := range c.N {
					got[i] = get[float32](ar, outs[i].C, c.M*n)
				}
			})
			for i, N := range c.N {
				for m := range c.M {
					for n := range N {
						s, sa := refDot(a[m*c.K:(m+1)*c.K], ps[i].b[n*c.K:(n+1)*c.K])
						if ps[i].bias != nil {
							s += float64(ps[i].bias[n])
							sa += math.Abs(float64(ps[i].bias[n]))
						}
						gv := got[i][m*N+n]
						if d := math.Abs(float64(gv)-s) / (sa + 1e-30); gv != gv || d > 1e-5 {
							t.Fatalf("projection %d: C[%d,%d] = %v, want %v", i, m, n, gv, s)
						}
					}
				}
			}
		})
	}
	onGPU(t, g, func(ar *arena) {
		buf := ar.alloc(1 << 20)
		if ar.err != nil {
			return
		}
		one := []GemvOut{{C: buf, B: buf, N: 8}}
		for _, c := range []struct {
			M, K int
			outs []GemvOut
		}{{1, 64, nil}, {1, 64, append(one, one[0], one[0], one[0])}, {GemvMaxRows + 1, 64, one}, {1, 60, one},
			{1, 64, []GemvOut{{C: buf, B: buf, N: 0}}}} {
			if err := ar.d.GemvBF16Multi(nil, buf, c.M, c.K, c.outs); err == nil {
				t.Errorf("GemvBF16Multi M=%d K=%d %d projections gave no error", c.M, c.K, len(c.outs))
			}
		}
	})
}

// TestRMSNormF32: RMSNormF32 and AddRMSNormF32 against float64 on the CPU,
// on the register kernel's shapes (whole rows of 8 to 8192 values, heads of
// 128) and the loop kernel's (groups not a multiple of 4, rows past 8192):
// the sum output bit for bit (float32 adds), the normed output to 1e-6, and
// AddRMSNormF32's bf16 output bit for bit the rounding of its float32 one.
func TestRMSNormF32(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		rows, cols, group int
		add               bool
	}{
		{1, 2048, 2048, true}, {32, 2048, 2048, false}, {3, 7168, 7168, true}, {4, 32 * 128, 128, false},
		{5, 8, 8, true}, {2, 8192, 8192, false}, // register kernel
		{2, 3 * 97, 97, false}, {2, 9000, 9000, true}, {3, 2 * 2, 2, false}, // loop kernel
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("r%d_c%d_g%d_add%v", c.rows, c.cols, c.group, c.add), func(t *testing.T) {
			r := newRNG(t)
			const eps = 1e-6
			n := c.rows * c.cols
			x, res := randF32(r, n, 1.5), randF32(r, n, 1)
			w := randF32(r, c.group, 0.3)
			sum := make([]float32, n)
			for i := range sum {
				sum[i] = x[i]
				if c.add {
					sum[i] = x[i] + res[i]
				}
			}
			want := make([]float64, n)
			for s := 0; s < n/c.group; s++ {
				seg := sum[s*c.group : (s+1)*c.group]
				ss := 0.0
				for _, v := range seg {
					ss += float64(v) * float64(v)
				}
				inv := 1 / math.Sqrt(ss/float64(c.group)+eps)
				for j, v := range seg {
					want[s*c.group+j] = float64(w[j%c.group]) * float64(v) * inv
				}
			}
			var got, gotSum []float32
			var gotB []uint16
			onGPU(t, g, func(a *arena) {
				xb, rb, wb := put(a, x), put(a, res), put(a, w)
				out, sb := put(a, f32Fill(n, float32(math.NaN()))), put(a, f32Fill(n, float32(math.NaN())))
				if a.err != nil {
					return
				}
				if c.add {
					ob := put(a, bf16Fill(n, 0x7fc0)) // NaN
					a.check(a.d.AddRMSNormF32(nil, sb, out, xb, rb, wb, ob, c.rows, c.cols, eps))
					gotSum = get[float32](a, sb, n)
					gotB = get[uint16](a, ob, n)
				} else {
					a.check(a.d.RMSNormF32(nil, out, xb, wb, c.rows, c.cols, c.group, eps))
				}
				got = get[float32](a, out, n)
			})
			for i := range gotSum {
				if math.Float32bits(gotSum[i]) != math.Float32bits(sum[i]) {
					t.Fatalf("sum[%d] = %v, want %v", i, gotSum[i], sum[i])
				}
			}
			for i := range gotB { // the bf16 output is out rounded to nearest even, bit for bit
				if want := tensor.F32ToBF16(got[i]); gotB[i] != want {
					t.Fatalf("outb[%d] = %#04x, want %#04x (RN of %v)", i, gotB[i], want, got[i])
				}
			}
			checkClose(t, "out", got, want, 1e-6)
		})
	}
}

// TestGemmSkinnyBF16: the dense GEMM on the expert GEMM's tiles against the
// float64 CPU products (bf16 operands, NaN-poisoned outputs) at the row
// counts around its tile edges (16-row tiles to 16 rows, 32-row tiles
// above, two of them past 32), widths not a multiple of its 64 columns,
// with and without a bias; one row's outputs do not depend on how many
// rows the call has (the bits of row 0 at M = 1, 7, 40); bad calls are
// errors.
func TestGemmSkinnyBF16(t *testing.T) {
	g := testGPU(t)
	rows0 := map[int][]float32{}
	for _, c := range []struct {
		M, N, K int
		bias    bool
	}{
		{1, 200, 136, false}, {3, 4096, 2048, true}, {7, 200, 136, false}, {8, 512, 2048, false}, {16, 2048, 4096, true},
		{17, 136, 72, false}, {32, 4096, 2048, false}, {33, 72, 2048, true}, {40, 200, 136, false}, {64, 1024, 1024, true},
		{32, 512, 2048, true}, {24, 2048, 4096, false}, {9, 8, 4104, true},
	} {
		t.Run(fmt.Sprintf("M%d_N%d_K%d", c.M, c.N, c.K), func(t *testing.T) {
			r := newRNG(t)
			aBits, a := randBF16(r, c.M*c.K, 1)
			bBits, b := randBF16(r, c.N*c.K, 0.05)
			if c.N == 200 && c.K == 136 { // one A row 0 for the row-independence check
				r0 := rand.New(rand.NewPCG(7, 7))
				aBits0, a0 := randBF16(r0, c.K, 1)
				copy(aBits, aBits0)
				copy(a, a0)
				r1 := rand.New(rand.NewPCG(8, 8))
				bBits, b = randBF16(r1, c.N*c.K, 0.05)
			}
			var bias []float32
			if c.bias {
				bias = randF32(r, c.N, 1)
			}
			var got []float32
			onGPU(t, g, func(ar *arena) {
				cb := put(ar, f32Fill(c.M*c.N, float32(math.NaN())))
				ab, bb := put(ar, aBits), put(ar, bBits)
				var biasB, work *Buffer
				if bias != nil {
					biasB = put(ar, bias)
				}
				ws, err := ar.d.SkinnyWorkspace(c.M, c.N, c.K)
				ar.check(err)
				t.Logf("workspace %d bytes (%d splits over K)", ws, ws/int64(4*c.M*c.N))
				if ws > 0 {
					work = put(ar, f32Fill(int(ws/4), float32(math.NaN())))
				}
				if ar.err != nil {
					return
				}
				ar.check(ar.d.GemmSkinnyBF16(nil, cb, ab, bb, biasB, work, c.M, c.N, c.K))
				if ws > 0 && ar.err == nil { // a workspace one split short is refused
					short, _ := work.View(0, ws-int64(4*c.M*c.N))
					if err := ar.d.GemmSkinnyBF16(nil, cb, ab, bb, biasB, short, c.M, c.N, c.K); err == nil {
						t.Error("a short workspace gave no error")
					}
				}
				got = get[float32](ar, cb, c.M*c.N)
			})
			worst := 0.0
			for m := range c.M {
				for n := range c.N {
					s, sa := refDot(a[m*c.K:(m+1)*c.K], b[n*c.K:(n+1)*c.K])
					if bias != nil {
						s += float64(bias[n])
						sa += math.Abs(float64(bias[n]))
					}
					gv := got[m*c.N+n]
					d := math.Abs(float64(gv)-s) / (sa + 1e-30)
					if gv != gv || d > 1e-5 {
						t.Fatalf("C[%d,%d] = %v, want %v", m, n, gv, s)
					}
					worst = max(worst, d)
				}
			}
			if c.N == 200 && c.K == 136 {
				rows0[c.M] = got[:c.N]
			}
			t.Logf("worst |error| / Σ|a·b| = %.3g", worst)
		})
	}
	for m, row := range rows0 {
		for n, v := range row {
			if math.Float32bits(v) != math.Float32bits(rows0[1][n]) {
				t.Fatalf("row 0 at M=%d: C[0,%d] = %v, at M=1 %v", m, n, v, rows0[1][n])
			}
		}
	}
	onGPU(t, g, func(ar *arena) {
		buf := ar.alloc(1 << 16)
		if ar.err != nil {
			return
		}
		for _, c := range []struct{ M, N, K int }{{SkinnyMaxRows + 1, 8, 64}, {1, 8, 12}, {1, 12, 64}, {0, 8, 64}} {
			if err := ar.d.GemmSkinnyBF16(nil, buf, buf, buf, nil, nil, c.M, c.N, c.K); err == nil {
				t.Errorf("GemmSkinnyBF16 M=%d N=%d K=%d gave no error", c.M, c.N, c.K)
			}
		}
	})
}
