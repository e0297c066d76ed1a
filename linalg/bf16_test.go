package linalg

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// randBF16 is n random bf16 values in (-1, 1) (upper halves of float32s,
// rounded to nearest even) with a few exact zeros and subnormal-free
// extremes, and their float32 values.
func randBF16(r *rand.Rand, n int) ([]uint16, []float32) {
	b, f := make([]uint16, n), make([]float32, n)
	for i := range b {
		x := math.Float32bits(r.Float32()*2 - 1)
		x += 0x7fff + (x>>16)&1 // round to nearest even
		b[i] = uint16(x >> 16)
		f[i] = math.Float32frombits(uint32(b[i]) << 16)
	}
	return b, f
}

// TestMatMulTBF16SameBits: MatMulTBF16 equals MatMulT on the widened b bit
// for bit, on both kernel paths, at GEMV, small-M (dot) and packed shapes,
// with edges in every dimension, one and several goroutines.
func TestMatMulTBF16SameBits(t *testing.T) {
	shapes := []struct{ M, N, K int }{
		{1, 1, 8}, {1, 7, 3}, {1, 301, 1100}, {1, 2048, 520}, {1, 97, 4100},
		{2, 257, 1030}, {3, 50, 17}, {5, 130, 1037}, {9, 768, 520}, {15, 61, 64},
		{16, 29, 101}, {37, 200, 1200}, {64, 20, 264}, {100, 3, 33}, {130, 515, 260},
		{256, 20, 128}, // narrow output, many rows: the rows split over goroutines, b widened once
	}
	for _, p := range paths() {
		for _, procs := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/procs=%d", p.name, procs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				withPath(t, p.asm, func() {
					r := rand.New(rand.NewPCG(21, uint64(procs)))
					for _, s := range shapes {
						a := randSlice(r, s.M*s.K)
						bb, bf := randBF16(r, s.N*s.K)
						want := make([]float32, s.M*s.N)
						MatMulT(want, a, bf, s.M, s.N, s.K)
						got := randSlice(r, s.M*s.N+3) // overwritten, plus a guard tail
						guard := append([]float32(nil), got[s.M*s.N:]...)
						MatMulTBF16(got, a, bb, s.M, s.N, s.K)
						for i, w := range want {
							if math.Float32bits(got[i]) != math.Float32bits(w) {
								t.Fatalf("M=%d N=%d K=%d: dst[%d,%d] = %g, MatMulT on the widened b %g", s.M, s.N, s.K, i/s.N, i%s.N, got[i], w)
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

// TestMatMulTBF16SmallBlocks: the same with the blocking shrunk, so that
// the widened blocks meet many k and n block edges.
func TestMatMulTBF16SmallBlocks(t *testing.T) {
	defer func(k, n, kp, np int) { blockK, blockN, blockKP, blockNP = k, n, kp, np }(blockK, blockN, blockKP, blockNP)
	blockK, blockN, blockKP, blockNP = 40, 12, 24, 12
	for _, p := range paths() {
		t.Run(p.name, func(t *testing.T) {
			withPath(t, p.asm, func() {
				r := rand.New(rand.NewPCG(5, 9))
				for _, s := range []struct{ M, N, K int }{{1, 50, 100}, {7, 131, 90}, {16, 129, 101}, {35, 100, 120}} {
					a := randSlice(r, s.M*s.K)
					bb, bf := randBF16(r, s.N*s.K)
					want, got := make([]float32, s.M*s.N), make([]float32, s.M*s.N)
					MatMulT(want, a, bf, s.M, s.N, s.K)
					MatMulTBF16(got, a, bb, s.M, s.N, s.K)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("M=%d N=%d K=%d: dst[%d] = %g, want %g", s.M, s.N, s.K, i, got[i], want[i])
						}
					}
				}
			})
		})
	}
}

func TestMatMulTBF16PanicsOnShortSlice(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for a short b")
		}
	}()
	MatMulTBF16(make([]float32, 4), make([]float32, 4), make([]uint16, 3), 2, 2, 2)
}

func TestWidenBF16(t *testing.T) {
	for _, c := range []struct {
		in   uint16
		want float32
	}{{0x0000, 0}, {0x3f80, 1}, {0xbf80, -1}, {0x4049, 3.140625}, {0x7f80, float32(math.Inf(1))}, {0x0001, math.Float32frombits(0x00010000)}} {
		dst := []float32{42}
		WidenBF16(dst, []uint16{c.in})
		if math.Float32bits(dst[0]) != math.Float32bits(c.want) || tensor.BF16ToF32(c.in) != dst[0] {
			t.Errorf("WidenBF16(%#04x) = %g, want %g", c.in, dst[0], c.want)
		}
	}
}

// BenchmarkMatMulTBF16 is BenchmarkMatMulT's shapes with bf16 weights.
func BenchmarkMatMulTBF16(b *testing.B) {
	for _, s := range benchShapes {
		r := rand.New(rand.NewPCG(1, 2))
		a, dst := randSlice(r, s.M*s.K), make([]float32, s.M*s.N)
		w, _ := randBF16(r, s.N*s.K)
		b.Run(fmt.Sprintf("M%d_N%d_K%d", s.M, s.N, s.K), func(b *testing.B) {
			c0 := cpuTime()
			for b.Loop() {
				MatMulTBF16(dst, a, w, s.M, s.N, s.K)
			}
			reportFlops(b, 2*float64(s.M)*float64(s.N)*float64(s.K), c0)
		})
	}
}
