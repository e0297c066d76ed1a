package cpu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend"
)

func newRand(t testing.TB) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(len(t.Name())), 0x5eed))
}

// randVec is n values uniform in [-s, s).
func randVec(r *rand.Rand, n int, s float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * s
	}
	return v
}

// randT is a random [rows, cols] tensor with values in [-1, 1).
func randT(r *rand.Rand, rows, cols int) *Tensor {
	return FromFloat32([]int{rows, cols}, randVec(r, rows*cols, 1))
}

// data unwraps a backend tensor returned by an op.
func data(t testing.TB, x backend.Tensor) []float32 {
	t.Helper()
	ct, ok := x.(*Tensor)
	if !ok {
		t.Fatalf("op returned %T, want *cpu.Tensor", x)
	}
	return ct.Data()
}

// checkShape fails unless x has the given shape.
func checkShape(t testing.TB, name string, x backend.Tensor, want ...int) {
	t.Helper()
	got := x.Shape()
	if len(got) != len(want) {
		t.Fatalf("%s: shape %v, want %v", name, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: shape %v, want %v", name, got, want)
		}
	}
}

// checkClose fails when some |got-want| > tol·(1+|want|).
func checkClose(t testing.TB, name string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol*(1+math.Abs(want[i]))) {
			t.Fatalf("%s: [%d] = %g, want %g (diff %g)", name, i, got[i], want[i], d)
		}
	}
}

// checkScaled fails when some |got-want| > tol·scale.
func checkScaled(t testing.TB, name string, got []float32, want, scale []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol*scale[i]) {
			t.Fatalf("%s: [%d] = %g, want %g (diff %g, scale %g)", name, i, got[i], want[i], d, scale[i])
		}
	}
}

// maxRelDiff is max|a-b| / max|b|.
func maxRelDiff(a, b []float32) float64 {
	var d, m float64
	for i := range a {
		d = max(d, math.Abs(float64(a[i])-float64(b[i])))
		m = max(m, math.Abs(float64(b[i])))
	}
	return d / m
}

// refLinear is x [T, K] · w [N, K]ᵀ + b in float64.
func refLinear(x, w, b []float32, T, N, K int) []float64 {
	out := make([]float64, T*N)
	for t := 0; t < T; t++ {
		for n := 0; n < N; n++ {
			s := 0.0
			if b != nil {
				s = float64(b[n])
			}
			for k := 0; k < K; k++ {
				s += float64(x[t*K+k]) * float64(w[n*K+k])
			}
			out[t*N+n] = s
		}
	}
	return out
}

func silu(g float64) float64 { return g / (1 + math.Exp(-g)) }

// refMLP is down(silu(gate(x))·up(x)) in float64 for x [T, H], with the
// scale Σ_i |a_i·down_hi| of every output, against which float32 rounding
// in the last GEMM is measured.
func refMLP(x, gateUp, down []float32, T, H, I int) (out, scale []float64) {
	out, scale = make([]float64, T*H), make([]float64, T*H)
	a := make([]float64, I)
	for t := 0; t < T; t++ {
		xr := x[t*H : (t+1)*H]
		for i := 0; i < I; i++ {
			var g, u float64
			for h, v := range xr {
				g += float64(v) * float64(gateUp[i*H+h])
				u += float64(v) * float64(gateUp[(I+i)*H+h])
			}
			a[i] = silu(g) * u
		}
		for h := 0; h < H; h++ {
			s, abs := 0.0, 0.0
			for i := 0; i < I; i++ {
				s += a[i] * float64(down[h*I+i])
				abs += math.Abs(a[i] * float64(down[h*I+i]))
			}
			out[t*H+h], scale[t*H+h] = s, abs
		}
	}
	return out, scale
}

// mustPanic fails unless f panics with a message containing want.
func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic, want one mentioning %q", want)
		}
		if msg, _ := r.(string); !strings.Contains(msg, want) {
			t.Fatalf("panic %v, want one mentioning %q", r, want)
		}
	}()
	f()
}

func f64(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}
