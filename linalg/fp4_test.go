package linalg

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// toBF16Bits is v's bf16 bits (v must be bf16-exact).
func toBF16Bits(v []float32) []uint16 {
	b := make([]uint16, len(v))
	for i, x := range v {
		b[i] = uint16(math.Float32bits(x) >> 16)
	}
	return b
}

// TestQuantizeFP4: MXFP4's values convert and dequantize bit for bit;
// groups FP4 cannot hold (a 5, values too far apart, random values) are
// refused, by the converter and by FP4ExactBF16.
func TestQuantizeFP4(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	const N, K = 4, 96
	v := randMXFP4(r, N, K)
	v[5] = 0 // a zero among them
	bf := toBF16Bits(v)
	q := make([]byte, N*FP4RowBytes(K))
	if !FP4ExactBF16(bf, N, K) || !QuantizeFP4BF16(q, bf, N, K) {
		t.Fatal("MXFP4 values refused")
	}
	got := make([]float32, N*K)
	for _, asm := range []bool{false, true} {
		withPath(t, asm, func() {
			clear(got)
			DequantFP4(got, q, N, K)
			for i := range v {
				if got[i] != v[i] {
					t.Fatalf("asm %v: value %d = %g back as %g", asm, i, v[i], got[i])
				}
			}
		})
	}
	if len(q) != N*K*5/8 {
		t.Errorf("%d bytes for %d values, want 5 bits each", len(q), N*K)
	}
	for _, c := range []struct {
		name string
		set  func(g []float32)
	}{
		{"a 5", func(g []float32) { g[3] = 5 }},
		{"0.25 beside 6: 24 steps apart", func(g []float32) { clear(g); g[0], g[1] = 0.25, 6 }},
		{"random", func(g []float32) {
			for i := range g {
				g[i] = float32(r.IntN(200)-100) / 64
			}
		}},
		{"an infinity", func(g []float32) { g[7] = float32(math.Inf(1)) }},
	} {
		w := randMXFP4(r, N, K)
		c.set(w[K : K+32]) // row 1's first group
		b := toBF16Bits(w)
		if FP4ExactBF16(b, N, K) || QuantizeFP4BF16(make([]byte, N*FP4RowBytes(K)), b, N, K) {
			t.Errorf("%s: taken as FP4", c.name)
		}
	}
}

// TestMatMulTFP4: MatMulTFP4 equals MatMulT on the dequantized b — bit for
// bit on the Go path (which dequantizes into MatMulT's own kernels), to
// float32 rounding on the AVX2 one (its tiles pair the sums differently) —
// at GEMV, small-M and packed shapes, one and several goroutines, without
// writing past dst.
func TestMatMulTFP4(t *testing.T) {
	shapes := []struct{ M, N, K int }{
		{1, 1, 32}, {1, 7, 64}, {1, 301, 1120}, {1, 2048, 512}, {2, 257, 1024}, {3, 50, 32},
		{4, 130, 2880}, {5, 130, 1056}, {9, 768, 512}, {15, 61, 64}, {16, 29, 96}, {37, 200, 1216},
		{130, 515, 256}, {256, 20, 128},
	}
	for _, p := range paths() {
		for _, procs := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/procs=%d", p.name, procs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				withPath(t, p.asm, func() {
					r := rand.New(rand.NewPCG(23, uint64(procs)))
					for _, s := range shapes {
						a := randSlice(r, s.M*s.K)
						v := randMXFP4(r, s.N, s.K)
						q := make([]byte, s.N*FP4RowBytes(s.K))
						if !QuantizeFP4BF16(q, toBF16Bits(v), s.N, s.K) {
							t.Fatal("MXFP4 values refused")
						}
						want := make([]float32, s.M*s.N)
						MatMulT(want, a, v, s.M, s.N, s.K)
						got := randSlice(r, s.M*s.N+3) // overwritten, plus a guard tail
						guard := append([]float32(nil), got[s.M*s.N:]...)
						MatMulTFP4(got, a, q, s.M, s.N, s.K)
						for i, w := range want {
							// Σ|a·b| bounds the rounding of either order of the sum.
							m, n := i/s.N, i%s.N
							var mag float64
							for k := range s.K {
								mag += math.Abs(float64(a[m*s.K+k]) * float64(v[n*s.K+k]))
							}
							d := math.Abs(float64(got[i] - w))
							if got[i] != got[i] || d > 4e-7*mag*math.Sqrt(float64(s.K)) || (!p.asm || s.M >= panelMinM) && got[i] != w {
								t.Fatalf("M=%d N=%d K=%d: dst[%d,%d] = %g, MatMulT on the dequantized b %g", s.M, s.N, s.K, m, n, got[i], w)
							}
						}
						for i, g := range guard {
							if got[s.M*s.N+i] != g {
								t.Fatalf("M=%d N=%d K=%d: wrote past dst[M*N] at +%d", s.M, s.N, s.K, i)
							}
						}
					}
				})
			})
		}
	}
}
