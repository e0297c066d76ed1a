package moe

import (
	"math"
	"math/rand/v2"
	"testing"
)

// newRand returns a generator seeded from the run (logged, so a failure can
// be replayed by pinning the seed).
func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// randn fills a new slice of n normal values times scale.
func randn(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// relL2 is ‖a−b‖/‖b‖ in float64.
func relL2(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}

// randExperts builds random experts; biases when bias is true.
func randExperts(r *rand.Rand, E, H, I int, act Activation, bias bool) *Experts {
	ex := &Experts{
		E: E, H: H, I: I, Act: act,
		GateUp: randn(r, E*2*I*H, 1/math.Sqrt(float64(H))),
		Down:   randn(r, E*H*I, 1/math.Sqrt(float64(I))),
	}
	if bias {
		ex.GateUpBias = randn(r, E*2*I, 0.5)
		ex.DownBias = randn(r, E*H, 0.5)
	}
	return ex
}

// randRouting gives each token K distinct random experts and random weights.
func randRouting(r *rand.Rand, T, K, E int) ([]int32, []float32) {
	ids := make([]int32, T*K)
	w := make([]float32, T*K)
	for t := range T {
		perm := r.Perm(E)
		for k := range K {
			ids[t*K+k] = int32(perm[k])
			w[t*K+k] = float32(r.Float64() + 0.05)
		}
	}
	return ids, w
}

// naiveExperts is the per-token loop written straight from the formulas,
// in float64: out[t] = Σ_k w·(Down_e·act(GateUp_e·x + b1) + b2).
func naiveExperts(ex *Experts, x []float32, T, K int, ids []int32, w []float32) []float32 {
	H, I := ex.H, ex.I
	out := make([]float32, T*H)
	for t := range T {
		acc := make([]float64, H)
		for k := range K {
			e := int(ids[t*K+k])
			gate := make([]float64, I)
			up := make([]float64, I)
			for i := range 2 * I {
				var s float64
				for h := range H {
					s += float64(ex.GateUp[(e*2*I+i)*H+h]) * float64(x[t*H+h])
				}
				if ex.GateUpBias != nil {
					s += float64(ex.GateUpBias[e*2*I+i])
				}
				if i < I {
					gate[i] = s
				} else {
					up[i-I] = s
				}
			}
			a := make([]float64, I)
			for i := range I {
				g, u := gate[i], up[i]
				switch ex.Act.Kind {
				case SwiGLU:
					a[i] = g * (1 / (1 + math.Exp(-g))) * u
				case ClampedSwiGLU:
					lim := float64(ex.Act.Limit)
					g = math.Min(g, lim)
					u = math.Max(-lim, math.Min(u, lim))
					glu := g * (1 / (1 + math.Exp(-float64(ex.Act.Alpha)*g)))
					a[i] = (u + 1) * glu
				}
			}
			for h := range H {
				var s float64
				for i := range I {
					s += float64(ex.Down[(e*H+h)*I+i]) * a[i]
				}
				if ex.DownBias != nil {
					s += float64(ex.DownBias[e*H+h])
				}
				acc[h] += float64(w[t*K+k]) * s
			}
		}
		for h := range H {
			out[t*H+h] = float32(acc[h])
		}
	}
	return out
}
