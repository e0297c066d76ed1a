package cuda

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBlockRuns: copying by runs gives what copying block by block gives,
// on random and adversarial (overlapping, chained) copy lists; contiguous
// lists become one run.
func TestBlockRuns(t *testing.T) {
	apply := func(mem []int, src, dst []int32) {
		for i := range src {
			mem[dst[i]] = mem[src[i]]
		}
	}
	applyRuns := func(mem []int, runs []blockRun) {
		for _, r := range runs {
			tmp := slices.Clone(mem[r.src : r.src+r.n]) // a run's ranges never overlap, so this equals a memcpy
			for j := range r.n {
				if r.dst+j >= r.src && r.dst+j < r.src+r.n {
					t.Fatalf("run %+v: source and destination overlap", r)
				}
			}
			copy(mem[r.dst:r.dst+r.n], tmp)
		}
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	cases := [][2][]int32{
		{{0, 1, 2, 3}, {10, 11, 12, 13}},
		{{0, 1, 2}, {1, 2, 3}}, // a chain: block 0 spreads
		{{5, 6, 7}, {4, 5, 6}},
		{{}, {}},
	}
	for range 300 {
		n := rng.IntN(12)
		var s, d []int32
		for range n {
			if len(s) > 0 && rng.IntN(3) > 0 {
				s = append(s, s[len(s)-1]+1)
				d = append(d, d[len(d)-1]+1)
			} else {
				s = append(s, int32(rng.IntN(20)))
				d = append(d, int32(rng.IntN(20)))
			}
		}
		cases = append(cases, [2][]int32{s, d})
	}
	for _, c := range cases {
		a, b := make([]int, 40), make([]int, 40)
		for i := range a {
			a[i], b[i] = i, i
		}
		apply(a, c[0], c[1])
		applyRuns(b, blockRuns(c[0], c[1]))
		if !slices.Equal(a, b) {
			t.Fatalf("copies %v → %v: by block %v, by runs %v (runs %+v)", c[0], c[1], a[:22], b[:22], blockRuns(c[0], c[1]))
		}
	}
	if r := blockRuns([]int32{0, 1, 2, 3}, []int32{10, 11, 12, 13}); len(r) != 1 || r[0].n != 4 {
		t.Errorf("contiguous copies became %+v", r)
	}
}
