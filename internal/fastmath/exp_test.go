package fastmath

import (
	"math"
	"math/rand/v2"
	"testing"
)

// ulps is the distance in float32 units in the last place.
func ulps(a, b float32) int64 {
	ia, ib := int64(math.Float32bits(a)), int64(math.Float32bits(b))
	if d := ia - ib; d < 0 {
		return -d
	} else {
		return d
	}
}

func TestExp32(t *testing.T) {
	check := func(x float32) {
		got := Exp32(x)
		want := float32(math.Exp(float64(x)))
		if want != 0 && want < math.SmallestNonzeroFloat32*(1<<23) { // subnormal: flushed to 0
			if got != 0 {
				t.Fatalf("Exp32(%v) = %v, want 0 (no subnormals)", x, got)
			}
			return
		}
		if d := ulps(got, want); d > 2 {
			t.Fatalf("Exp32(%v) = %v, math.Exp %v: %d ulp apart", x, got, want, d)
		}
	}
	// A dense sweep of the finite range and random points.
	for x := float32(-87.3); x <= 88.7; x += 0.00173 {
		check(x)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		check(float32(r.Float64()*176 - 87.3))
	}
	for _, tc := range []struct{ x, want float32 }{
		{0, 1}, {89, float32(math.Inf(1))}, {float32(math.Inf(1)), float32(math.Inf(1))},
		{-100, 0}, {float32(math.Inf(-1)), 0},
	} {
		if got := Exp32(tc.x); got != tc.want {
			t.Errorf("Exp32(%v) = %v, want %v", tc.x, got, tc.want)
		}
	}
	if got := Exp32(float32(math.NaN())); got == got {
		t.Errorf("Exp32(NaN) = %v", got)
	}
}

var sink float32

func BenchmarkExp32(b *testing.B) {
	xs := make([]float32, 1024)
	for i := range xs {
		xs[i] = float32(i)/64 - 10
	}
	b.Run("fastmath", func(b *testing.B) {
		var s float32
		for i := 0; i < b.N; i++ {
			s += Exp32(xs[i&1023])
		}
		sink = s
	})
	b.Run("math.Exp", func(b *testing.B) {
		var s float32
		for i := 0; i < b.N; i++ {
			s += float32(math.Exp(float64(xs[i&1023])))
		}
		sink = s
	})
}

// TestExpSub: ExpSub gives Exp32(src[i]-sub) bit for bit, over a dense sweep
// of the finite range, random values, the range limits, ±Inf and NaN, for
// lengths on and off multiples of 4, in place and not.
func TestExpSub(t *testing.T) {
	var xs []float32
	for x := float32(-100); x <= 100; x += 0.0137 {
		xs = append(xs, x)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 50000 {
		xs = append(xs, float32(r.NormFloat64()*30))
	}
	lim := []float32{88.72283, -87.33654}
	for _, l := range lim {
		xs = append(xs, l, math.Nextafter32(l, 0), math.Nextafter32(l, 1000), math.Nextafter32(l, -1000))
	}
	xs = append(xs, 0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)),
		float32(math.NaN()), 1e-30, -1e-30)
	for _, sub := range []float32{0, 3.5, -12.25, float32(math.Inf(-1))} {
		for _, n := range []int{len(xs), 1, 3, 5, 7} {
			src := xs[:n]
			dst := make([]float32, n)
			ExpSub(dst, src, sub)
			in := append([]float32(nil), src...)
			ExpSub(in, in, sub)
			for i, x := range src {
				want := Exp32(x - sub)
				if math.Float32bits(dst[i]) != math.Float32bits(want) || math.Float32bits(in[i]) != math.Float32bits(want) {
					t.Fatalf("ExpSub(%v - %v) = %v (in place %v), Exp32 %v", x, sub, dst[i], in[i], want)
				}
			}
		}
	}
}

func BenchmarkExpSub(b *testing.B) {
	src := make([]float32, 512)
	for i := range src {
		src[i] = float32(i%97) * -0.25
	}
	dst := make([]float32, len(src))
	b.SetBytes(int64(4 * len(src)))
	for b.Loop() {
		ExpSub(dst, src, 1.5)
	}
}
