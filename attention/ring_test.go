package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func TestZigzagSplit(t *testing.T) {
	for _, tc := range []struct{ n, ranks int }{{0, 1}, {1, 1}, {1, 4}, {7, 2}, {16, 4}, {1000, 8}, {16384, 4}, {65537, 8}} {
		t.Run(fmt.Sprintf("n=%d/R=%d", tc.n, tc.ranks), func(t *testing.T) {
			split := ZigzagSplit(tc.n, tc.ranks)
			seen := make([]int, tc.n)
			minLen, maxLen := tc.n, 0
			work := make([]int, tc.ranks) // causal work: keys each query sees
			for r, spans := range split {
				if len(spans) != 2 {
					t.Fatalf("rank %d has %d chunks", r, len(spans))
				}
				for _, s := range spans {
					minLen, maxLen = min(minLen, s.Len()), max(maxLen, s.Len())
					for i := s.Lo; i < s.Hi; i++ {
						seen[i]++
						work[r] += i + 1
					}
				}
			}
			for i, c := range seen {
				if c != 1 {
					t.Fatalf("position %d held by %d ranks", i, c)
				}
			}
			if maxLen-minLen > 1 {
				t.Errorf("chunk sizes from %d to %d", minLen, maxLen)
			}
			if tc.n >= 64*tc.ranks {
				lo, hi := work[0], work[0]
				for _, w := range work {
					lo, hi = min(lo, w), max(hi, w)
				}
				if float64(hi)/float64(lo) > 1.02 {
					t.Errorf("causal work per rank from %d to %d (ratio %.3f)", lo, hi, float64(hi)/float64(lo))
				}
			}
			// The ring's forward pruning (kernels/ring.cu, hop_rows): a slice's
			// late chunk travels from rank src to src+1, …; under a causal mask
			// no rank past the wrap (d < src) may see any of its keys, and
			// every rank from src on sees all of them.
			for src, ss := range split {
				late := ss[1]
				if late.Len() == 0 {
					continue
				}
				for d, ds := range split {
					last := max(ds[0].Hi, ds[1].Hi) - 1 // rank d's last query position
					if d < src && last >= late.Lo {
						t.Errorf("rank %d (last position %d) sees rank %d's late chunk %v: the ring would stop it too early", d, last, src, late)
					}
					if d >= src && last < late.Hi-1 {
						t.Errorf("rank %d (last position %d) does not see all of rank %d's late chunk %v", d, last, src, late)
					}
				}
			}
		})
	}
}

func ringInputs(rng *rand.Rand, Tq, past int, p *Params) (q, k, v []float32) {
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		return x
	}
	n := past + Tq
	return fill(Tq * p.NumHeads * p.HeadDim), fill(n * p.NumKVHeads * p.HeadDim), fill(n * p.NumKVHeads * p.VHeadDim)
}

func relErr(got, want []float32) float64 {
	var num, den float64
	for i := range got {
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if math.IsNaN(num) {
		return math.Inf(1)
	}
	return math.Sqrt(num / den)
}

// TestRingMatchesCausal: the ring schedule over R emulated ranks gives
// Causal's result for GQA ratios 1/4/8, windows, sinks, head dims that
// differ, lengths not divisible by R or 2R, and cached prefixes.
func TestRingMatchesCausal(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 21))
	sinks := func(h int) []float32 {
		s := make([]float32, h)
		for i := range s {
			s[i] = float32(rng.NormFloat64())
		}
		return s
	}
	params := []Params{
		{NumHeads: 4, NumKVHeads: 4, HeadDim: 16, VHeadDim: 16, Scale: 0.25},
		{NumHeads: 8, NumKVHeads: 2, HeadDim: 16, VHeadDim: 8, Scale: 0.3},
		{NumHeads: 8, NumKVHeads: 1, HeadDim: 8, VHeadDim: 8, Scale: 0.35, Window: 9},
		{NumHeads: 4, NumKVHeads: 1, HeadDim: 8, VHeadDim: 12, Scale: 0.3, Sinks: sinks(4)},
		{NumHeads: 4, NumKVHeads: 2, HeadDim: 8, VHeadDim: 8, Scale: 0.3, Window: 5, Sinks: sinks(4)},
	}
	for pi, p := range params {
		for _, R := range []int{1, 2, 4, 8} {
			for _, sh := range []struct{ Tq, past int }{{1, 0}, {7, 0}, {33, 0}, {100, 0}, {13, 5}, {50, 64}} {
				t.Run(fmt.Sprintf("p%d/R=%d/T=%d/past=%d", pi, R, sh.Tq, sh.past), func(t *testing.T) {
					q, k, v := ringInputs(rng, sh.Tq, sh.past, &p)
					want := make([]float32, sh.Tq*p.NumHeads*p.VHeadDim)
					Causal(want, q, k, v, sh.Tq, sh.past, &p)
					got := make([]float32, len(want))
					for i := range got {
						got[i] = float32(math.NaN())
					}
					RingCausal(got, q, k, v, sh.Tq, sh.past, R, &p, true)
					if e := relErr(got, want); !(e <= 1e-5) {
						t.Errorf("relative L2 %.3g > 1e-5", e)
					}
				})
			}
		}
	}
}

// TestRingNonCausal checks the non-causal ring against a direct float64
// softmax over every key.
func TestRingNonCausal(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 22))
	p := Params{NumHeads: 4, NumKVHeads: 2, HeadDim: 8, VHeadDim: 8, Scale: 0.3}
	for _, R := range []int{1, 3, 4} {
		Tq, past := 29, 3
		q, k, v := ringInputs(rng, Tq, past, &p)
		n := Tq + past
		want := make([]float32, Tq*p.NumHeads*p.VHeadDim)
		for t0 := range Tq {
			for h := range p.NumHeads {
				kh := h / (p.NumHeads / p.NumKVHeads)
				s := make([]float64, n)
				mx := math.Inf(-1)
				for j := range n {
					var d float64
					for c := range p.HeadDim {
						d += float64(q[(t0*p.NumHeads+h)*p.HeadDim+c]) * float64(k[(j*p.NumKVHeads+kh)*p.HeadDim+c])
					}
					s[j] = d * float64(p.Scale)
					mx = max(mx, s[j])
				}
				var sum float64
				for j := range s {
					s[j] = math.Exp(s[j] - mx)
					sum += s[j]
				}
				for c := range p.VHeadDim {
					var o float64
					for j := range n {
						o += s[j] / sum * float64(v[(j*p.NumKVHeads+kh)*p.VHeadDim+c])
					}
					want[(t0*p.NumHeads+h)*p.VHeadDim+c] = float32(o)
				}
			}
		}
		got := make([]float32, len(want))
		RingCausal(got, q, k, v, Tq, past, R, &p, false)
		if e := relErr(got, want); !(e <= 1e-5) {
			t.Errorf("R=%d: relative L2 %.3g > 1e-5", R, e)
		}
	}
}

// TestMergeOrder: merging the same partials in any order gives the same
// result, and an empty (−Inf) partial changes nothing.
func TestMergeOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 23))
	const rows, dv = 6, 5
	type part struct{ out, lse []float32 }
	mk := func(empty bool) part {
		p := part{make([]float32, rows*dv), make([]float32, rows)}
		for i := range p.out {
			p.out[i] = float32(rng.NormFloat64())
		}
		for i := range p.lse {
			p.lse[i] = float32(rng.NormFloat64() * 30)
			if empty {
				p.lse[i] = float32(math.Inf(-1))
			}
		}
		if empty {
			clear(p.out)
		}
		return p
	}
	parts := []part{mk(false), mk(false), mk(true), mk(false)}
	merge := func(order []int) part {
		acc := part{make([]float32, rows*dv), make([]float32, rows)}
		for i := range acc.lse {
			acc.lse[i] = float32(math.Inf(-1))
		}
		for _, i := range order {
			Merge(acc.out, acc.lse, parts[i].out, parts[i].lse, dv)
		}
		return acc
	}
	a, b, c := merge([]int{0, 1, 2, 3}), merge([]int{3, 2, 1, 0}), merge([]int{0, 1, 3})
	for _, x := range []part{b, c} {
		if e := relErr(x.out, a.out); !(e <= 1e-6) {
			t.Errorf("merge order changes out by %.3g", e)
		}
		if e := relErr(x.lse, a.lse); !(e <= 1e-6) {
			t.Errorf("merge order changes lse by %.3g", e)
		}
	}
}
