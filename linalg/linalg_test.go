package linalg

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// refMatMulT is the naive reference: float64 dot products, plus the scale
// Σ|a·b| of each one against which the float32 rounding error is measured.
func refMatMulT(a, b []float32, M, N, K int) (want, scale []float64) {
	want, scale = make([]float64, M*N), make([]float64, M*N)
	for m := 0; m < M; m++ {
		for n := 0; n < N; n++ {
			var s, abs float64
			for k := 0; k < K; k++ {
				p := float64(a[m*K+k]) * float64(b[n*K+k])
				s += p
				abs += math.Abs(p)
			}
			want[m*N+n], scale[m*N+n] = s, abs
		}
	}
	return want, scale
}

// paths are the kernel sets MatMulT can run on this machine.
func paths() []struct {
	name string
	asm  bool
} {
	p := []struct {
		name string
		asm  bool
	}{{"go", false}}
	if hasAVX2 {
		p = append(p, struct {
			name string
			asm  bool
		}{"avx2", true})
	}
	return p
}

// withPath runs f with the kernel set chosen and the defaults restored after.
func withPath(t testing.TB, asm bool, f func()) {
	old := useAsm
	useAsm = asm
	defer func() { useAsm = old }()
	f()
}

func checkMatMulT(t *testing.T, M, N, K int, r *rand.Rand) {
	t.Helper()
	a, b := randSlice(r, M*K), randSlice(r, N*K)
	want, scale := refMatMulT(a, b, M, N, K)
	dst := randSlice(r, M*N+5) // garbage to be overwritten, plus a guard tail
	guard := append([]float32(nil), dst[M*N:]...)
	MatMulT(dst, a, b, M, N, K)
	for i := range want {
		if err := math.Abs(float64(dst[i]) - want[i]); err > 1e-5*scale[i] {
			t.Fatalf("M=%d N=%d K=%d: dst[%d,%d]=%g want %g (err %g, scale %g)", M, N, K, i/N, i%N, dst[i], want[i], err, scale[i])
		}
	}
	for i, g := range guard {
		if dst[M*N+i] != g {
			t.Fatalf("M=%d N=%d K=%d: wrote past dst[M*N] at +%d", M, N, K, i)
		}
	}
}

func TestMatMulTOddSizes(t *testing.T) {
	sizes := []int{1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 33, 65, 100}
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) {
			withPath(t, p.asm, func() {
				r := rand.New(rand.NewPCG(7, uint64(len(p.name))))
				for _, M := range sizes {
					for _, N := range sizes {
						for _, K := range []int{1, 3, 7, 8, 17, 33, 65, 100} {
							checkMatMulT(t, M, N, K, r)
						}
					}
				}
			})
		})
	}
}

// TestMatMulTBlocked covers the blocking (K over blockK, N over blockN), the
// parallel split over N and over M, and the GEMV path at model-like shapes.
func TestMatMulTBlocked(t *testing.T) {
	shapes := []struct{ M, N, K int }{
		{1, 301, 1100},  // GEMV with column tail, K over one block
		{2, 257, 1030},  // small M: whole K per kernel call
		{5, 130, 1037},  // tile edge in M, K tail
		{37, 200, 1200}, // several K and N blocks, both edges
		{64, 20, 264},   // small N, large M: split over M
		{9, 768, 520},   // expert-like
	}
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) {
			withPath(t, p.asm, func() {
				r := rand.New(rand.NewPCG(11, 13))
				for _, s := range shapes {
					checkMatMulT(t, s.M, s.N, s.K, r)
				}
			})
		})
	}
}

// TestMatMulTSmallBlocks shrinks the blocking so that moderate shapes cross
// many k and n block edges on both paths.
func TestMatMulTSmallBlocks(t *testing.T) {
	defer func(k, n, kp, np int) { blockK, blockN, blockKP, blockNP = k, n, kp, np }(blockK, blockN, blockKP, blockNP)
	blockK, blockN, blockKP, blockNP = 40, 9, 24, 12
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) {
			withPath(t, p.asm, func() {
				r := rand.New(rand.NewPCG(5, 6))
				for _, s := range []struct{ M, N, K int }{{1, 50, 100}, {7, 31, 90}, {16, 29, 101}, {35, 40, 120}, {64, 13, 64}} {
					checkMatMulT(t, s.M, s.N, s.K, r)
				}
			})
		})
	}
}

func TestMatMulTEmpty(t *testing.T) {
	dst := []float32{1, 2, 3, 4}
	MatMulT(dst, nil, nil, 2, 2, 0)
	for i, v := range dst {
		if v != 0 {
			t.Fatalf("K=0: dst[%d]=%g, want 0", i, v)
		}
	}
	MatMulT(nil, nil, make([]float32, 15), 0, 5, 3)
}

func TestMatMulTPanicsOnShortSlice(t *testing.T) {
	for _, c := range []struct{ da, db, dd int }{{-1, 0, 0}, {0, -1, 0}, {0, 0, -1}} {
		t.Run(fmt.Sprint(c), func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			M, N, K := 3, 4, 5
			MatMulT(make([]float32, M*N+c.dd), make([]float32, M*K+c.da), make([]float32, N*K+c.db), M, N, K)
		})
	}
}

func TestDot(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{0, 1, 3, 4, 5, 31, 100} {
		a, b := randSlice(r, n), randSlice(r, n)
		want, scale := refMatMulT(a, b, 1, 1, n)
		if got := Dot(a, b); math.Abs(float64(got)-want[0]) > 1e-5*scale[0] {
			t.Fatalf("n=%d: Dot=%g want %g", n, got, want[0])
		}
	}
}
