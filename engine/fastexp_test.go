package engine

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestFastExp(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	worst := 0.0
	edges := []float64{0, -40, -1e-12, -math.Ln2 / 64, -math.Ln2, -10 * math.Ln2, -math.SmallestNonzeroFloat64}
	for i := 0; i < 200000; i++ {
		z := -40 * r.Float64()
		if i < len(edges) {
			z = edges[i] // table boundaries (64·z·log2 e a whole number) and the range's ends
		}
		want := math.Exp(z)
		got := fastExp(z)
		worst = math.Max(worst, math.Abs(got-want)/want)
	}
	t.Logf("worst relative error %.3g", worst)
	if worst > 1e-13 {
		t.Fatalf("worst relative error %.3g", worst)
	}
}

func BenchmarkExp(b *testing.B) {
	zs := make([]float64, 4096)
	for i := range zs {
		zs[i] = -40 * float64(i) / 4096
	}
	var s float64
	b.Run("fast", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s += fastExp(zs[i&4095])
		}
	})
	b.Run("math", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s += math.Exp(zs[i&4095])
		}
	})
	_ = s
}
