package linalg

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestDotRow: DotRow against float64 dot products on both kernel paths,
// rows ldb apart, K on and off multiples of 8; each row's result is the
// same bit for bit whether it comes alone or with others, and nothing past
// dst[N) is written.
func TestDotRow(t *testing.T) {
	for _, p := range paths() {
		for _, c := range []struct{ N, K, ldb int }{{1, 1, 1}, {1, 8, 8}, {3, 7, 9}, {5, 32, 64}, {13, 64, 128}, {17, 100, 100}, {9, 576, 600}} {
			t.Run(fmt.Sprintf("%s/N%d_K%d_ld%d", p.name, c.N, c.K, c.ldb), func(t *testing.T) {
				withPath(t, p.asm, func() {
					r := rand.New(rand.NewPCG(uint64(c.N*1000+c.K), 7))
					a, b := randSlice(r, c.K), randSlice(r, (c.N-1)*c.ldb+c.K)
					dst := randSlice(r, c.N+3)
					guard := slices.Clone(dst[c.N:])
					DotRow(dst, a, b, c.ldb, c.N, c.K)
					for j := range c.N {
						var s, abs float64
						for k := range c.K {
							x := float64(a[k]) * float64(b[j*c.ldb+k])
							s += x
							abs += math.Abs(x)
						}
						if d := math.Abs(float64(dst[j]) - s); d > 1e-5*(abs+1e-30) {
							t.Fatalf("dst[%d] = %g, want %g", j, dst[j], s)
						}
						one := make([]float32, 1)
						DotRow(one, a, b[j*c.ldb:], c.ldb, 1, c.K)
						if one[0] != dst[j] {
							t.Fatalf("row %d alone = %g, with %d rows %g", j, one[0], c.N, dst[j])
						}
					}
					if !slices.Equal(dst[c.N:], guard) {
						t.Fatal("DotRow wrote past dst[N)")
					}
				})
			})
		}
	}
}

// TestAccumRows: AccumRows adds the weighted rows to y on both kernel paths
// (widths covering every kernel and a Go tail), against float64.
func TestAccumRows(t *testing.T) {
	for _, p := range paths() {
		for _, c := range []struct{ M, n, ldx int }{{1, 1, 1}, {1, 8, 8}, {3, 12, 20}, {7, 32, 64}, {40, 120, 128}, {100, 512, 576}, {2, 200, 200}} {
			t.Run(fmt.Sprintf("%s/M%d_n%d_ld%d", p.name, c.M, c.n, c.ldx), func(t *testing.T) {
				withPath(t, p.asm, func() {
					r := rand.New(rand.NewPCG(uint64(c.M*1000+c.n), 9))
					y, pw, x := randSlice(r, c.n+2), randSlice(r, c.M), randSlice(r, (c.M-1)*c.ldx+c.n)
					y0 := slices.Clone(y)
					AccumRows(y, pw, x, c.ldx, c.M, c.n)
					for col := range c.n {
						s, abs := float64(y0[col]), math.Abs(float64(y0[col]))
						for j := range c.M {
							v := float64(pw[j]) * float64(x[j*c.ldx+col])
							s += v
							abs += math.Abs(v)
						}
						if d := math.Abs(float64(y[col]) - s); d > 1e-5*(abs+1e-30) {
							t.Fatalf("y[%d] = %g, want %g", col, y[col], s)
						}
					}
					if !slices.Equal(y[c.n:], y0[c.n:]) {
						t.Fatal("AccumRows wrote past y[n)")
					}
				})
			})
		}
	}
	mustPanicLinalg(t, func() { AccumRows(make([]float32, 4), make([]float32, 2), make([]float32, 7), 4, 2, 4) })
	mustPanicLinalg(t, func() { DotRow(make([]float32, 2), make([]float32, 4), make([]float32, 7), 4, 2, 4) })
}

func mustPanicLinalg(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on a short slice")
		}
	}()
	f()
}

func BenchmarkDotRow(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const N, K, ld = 512, 32, 64
	a, x, dst := randSlice(r, K), randSlice(r, N*ld), make([]float32, N)
	b.SetBytes(N * K * 4)
	for b.Loop() {
		DotRow(dst, a, x, ld, N, K)
	}
}

func BenchmarkAccumRows(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const M, n, ld = 512, 32, 64
	p, x, y := randSlice(r, M), randSlice(r, M*ld), make([]float32, n)
	b.SetBytes(M * n * 4)
	for b.Loop() {
		AccumRows(y, p, x, ld, M, n)
	}
}

// TestRowsBF16SameBits: DotRowBF16 and AccumRowsBF16 give DotRow's and
// AccumRows' results on the widened rows bit for bit, on both kernel
// paths, with tails past every kernel width.
func TestRowsBF16SameBits(t *testing.T) {
	for _, p := range paths() {
		withPath(t, p.asm, func() {
			r := rand.New(rand.NewPCG(41, 42))
			for _, c := range []struct{ N, K, ld int }{{1, 8, 8}, {5, 128, 512}, {17, 100, 130}, {3, 7, 9}, {33, 64, 64}} {
				a := randSlice(r, c.K)
				b16, b := randBF16(r, (c.N-1)*c.ld+c.K)
				want, got := make([]float32, c.N), make([]float32, c.N)
				DotRow(want, a, b, c.ld, c.N, c.K)
				DotRowBF16(got, a, b16, c.ld, c.N, c.K)
				for j := range want {
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
						t.Fatalf("%s: DotRowBF16 N=%d K=%d: [%d] = %g, DotRow %g", p.name, c.N, c.K, j, got[j], want[j])
					}
				}
			}
			for _, c := range []struct{ M, n, ld int }{{1, 8, 8}, {40, 128, 512}, {7, 100, 130}, {3, 5, 9}, {200, 64, 64}} {
				w := randSlice(r, c.M)
				x16, x := randBF16(r, (c.M-1)*c.ld+c.n)
				want, got := randSlice(r, c.n), make([]float32, c.n)
				copy(got, want)
				AccumRows(want, w, x, c.ld, c.M, c.n)
				AccumRowsBF16(got, w, x16, c.ld, c.M, c.n)
				for j := range want {
					if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
						t.Fatalf("%s: AccumRowsBF16 M=%d n=%d: [%d] = %g, AccumRows %g", p.name, c.M, c.n, j, got[j], want[j])
					}
				}
			}
		})
	}
}
