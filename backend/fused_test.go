package backend_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
)

func randT(r *rand.Rand, shape ...int) backend.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return cpu.FromFloat32(shape, v)
}

// TestFusedFallbacks: on a backend that fuses nothing (cpu), LinearMulti
// and NormRoPE give exactly the ops they stand for, op by op.
func TestFusedFallbacks(t *testing.T) {
	be := cpu.New(cpu.Options{})
	r := rand.New(rand.NewPCG(1, 2))
	x := randT(r, 3, 16)
	ws := []backend.Tensor{randT(r, 8, 16), randT(r, 4, 16), randT(r, 4, 16)}
	for _, bs := range [][]backend.Tensor{nil, {randT(r, 8), nil, randT(r, 4)}} {
		got := backend.LinearMulti(be, x, ws, bs)
		for i, w := range ws {
			var b backend.Tensor
			if bs != nil {
				b = bs[i]
			}
			if want := be.Linear(x, w, b); !slices.Equal(be.ToHost(got[i]), be.ToHost(want)) {
				t.Errorf("LinearMulti output %d (biases %v) differs from Linear", i, bs != nil)
			}
		}
	}
	q, k := randT(r, 3, 4*8), randT(r, 3, 2*8)
	qw, kw := randT(r, 8), randT(r, 8)
	rope := &attention.RoPE{Dim: 8, Theta: 10000}
	pos := []int32{0, 5, 999}
	for _, w := range [][2]backend.Tensor{{qw, kw}, {nil, nil}} {
		qo, ko := backend.NormRoPE(be, q, k, w[0], w[1], 1e-6, 4, 2, 8, rope, pos)
		for i, c := range []struct {
			got, x, w backend.Tensor
			heads     int
		}{{qo, q, w[0], 4}, {ko, k, w[1], 2}} {
			want := c.x
			if c.w != nil {
				want = be.RMSNorm(want, c.w, 1e-6)
			}
			want = be.RoPE(want, c.heads, 8, rope, pos)
			if !slices.Equal(be.ToHost(c.got), be.ToHost(want)) {
				t.Errorf("NormRoPE output %d (norm %v) differs from RMSNorm + RoPE", i, c.w != nil)
			}
		}
	}
}
