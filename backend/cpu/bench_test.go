package cpu

import (
	"fmt"
	"testing"
)

// BenchmarkLinear times Linear (MatMulT plus bias) at decode and prefill shapes.
func BenchmarkLinear(b *testing.B) {
	for _, s := range []struct{ T, N, K int }{
		{1, 2048, 2048},   // decode
		{1, 5632, 2048},   // decode, MLP up
		{16, 2048, 2048},  // batched decode
		{128, 2048, 2048}, // prefill chunk
		{512, 2048, 2048}, // prefill
	} {
		b.Run(fmt.Sprintf("T%d_N%d_K%d", s.T, s.N, s.K), func(b *testing.B) {
			r := newRand(b)
			be := New(Options{})
			x, w, bias := randT(r, s.T, s.K), randT(r, s.N, s.K), FromFloat32([]int{s.N}, randVec(r, s.N, 1))
			for b.Loop() {
				be.Linear(x, w, bias)
			}
			b.ReportMetric(2*float64(s.T*s.N*s.K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
