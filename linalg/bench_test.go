package linalg

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/gonum"
)

// benchShapes are the model shapes the CPU backend multiplies (M rows of
// activations, N output features, K input features).
var benchShapes = []struct{ M, N, K int }{
	{1, 2048, 2048},   // decode, hidden 2048
	{1, 7168, 2048},   // decode, 14336x4096 scaled down 4x (58 MB of weights)
	{4, 2048, 2048},   // decode, 4 sequences
	{8, 768, 2048},    // expert, few tokens
	{64, 768, 2048},   // expert, many tokens
	{32, 1024, 1024},  // small prefill
	{128, 2048, 2048}, // prefill
	{512, 2048, 2048}, // prefill
	{256, 4096, 4096}, // prefill, large hidden
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = r.Float32()*2 - 1
	}
	return s
}

// benchGEMM times f at every shape, reporting GFLOP/s of wall time and, when
// the platform can tell, GFLOP per CPU-second (per-core throughput, robust
// against other load on the machine).
func benchGEMM(b *testing.B, f func(dst, a, w []float32, M, N, K int)) {
	for _, s := range benchShapes {
		r := rand.New(rand.NewPCG(1, 2))
		a, w, dst := randSlice(r, s.M*s.K), randSlice(r, s.N*s.K), make([]float32, s.M*s.N)
		b.Run(fmt.Sprintf("M%d_N%d_K%d", s.M, s.N, s.K), func(b *testing.B) {
			c0 := cpuTime()
			for b.Loop() {
				f(dst, a, w, s.M, s.N, s.K)
			}
			reportFlops(b, 2*float64(s.M)*float64(s.N)*float64(s.K), c0)
		})
	}
}

// reportFlops reports GFLOP/s of wall time for flop per iteration and, when
// the platform can tell, GFLOP per CPU-second used since c0.
func reportFlops(b *testing.B, flop float64, c0 time.Duration) {
	flop *= float64(b.N)
	b.ReportMetric(flop/b.Elapsed().Seconds()/1e9, "GFLOP/s")
	if c := cpuTime() - c0; c > time.Millisecond {
		b.ReportMetric(flop/c.Seconds()/1e9, "GFLOP/cpu-s")
	}
}

func BenchmarkMatMulT(b *testing.B) {
	benchGEMM(b, MatMulT)
}

// BenchmarkMatMulTGo is the portable path, as non-AVX2 machines run it.
func BenchmarkMatMulTGo(b *testing.B) {
	withPath(b, false, func() { benchGEMM(b, MatMulT) })
}

// BenchmarkGonum is the baseline: gonum's Sgemm with b transposed.
func BenchmarkGonum(b *testing.B) {
	impl := gonum.Implementation{}
	benchGEMM(b, func(dst, a, w []float32, M, N, K int) {
		impl.Sgemm(blas.NoTrans, blas.Trans, M, N, K, 1, a, K, w, K, 0, dst, N)
	})
}

// BenchmarkKernel times the full-tile micro-kernel alone on data in L1: the
// ceiling of one core.
func BenchmarkKernel(b *testing.B) {
	if !hasAVX2 {
		b.Skip("no AVX2/FMA")
	}
	const n = 512
	r := rand.New(rand.NewPCG(1, 2))
	ks := avx2Kernels
	a, w, c := randSlice(r, ks.mr*n), randSlice(r, ks.nr*n), make([]float32, ks.mr*ks.nr)
	c0 := cpuTime()
	for b.Loop() {
		ks.k[ks.mr-1][ks.nr-1](&a[0], n, &w[0], n, n, &c[0], ks.nr, 1)
	}
	reportFlops(b, 2*float64(ks.mr*ks.nr*n), c0)
}

// BenchmarkPanelKernel times the 16×6 packed-panel kernel alone: the panel
// (16×512) and six rows of b in L1, the ceiling of one core on the packed path.
func BenchmarkPanelKernel(b *testing.B) {
	if !hasAVX2 {
		b.Skip("no AVX2/FMA")
	}
	const n = 512
	r := rand.New(rand.NewPCG(1, 2))
	nr := len(avx2Kernels.panel)
	p, w, c := randSlice(r, panelM*n), randSlice(r, nr*n), make([]float32, panelM*nr)
	c0 := cpuTime()
	for b.Loop() {
		avx2Kernels.panel[nr-1](&p[0], &w[0], n, n, &c[0], nr, 1)
	}
	reportFlops(b, 2*float64(panelM*nr*n), c0)
}
