package cuda

import (
	"testing"

	"github.com/mkserve/mkserve/kernels"
)

// TestWorldExpertBlocks (CPU): a world rank's block of experts is the
// ranks' share of kernels.MoEBlockPlacement (expert e on rank e·R/E), the
// blocks cover every expert once, and their sizes differ by at most one.
func TestWorldExpertBlocks(t *testing.T) {
	for _, c := range []struct{ E, R int }{{8, 2}, {16, 3}, {128, 8}, {256, 8}, {60, 7}, {3, 3}, {5, 4}} {
		pl := kernels.MoEBlockPlacement(c.E, c.R)
		next, minN, maxN := 0, c.E, 0
		for r := range c.R {
			lo, hi := (&world{R: c.R, me: r}).experts(c.E)
			if lo != next {
				t.Errorf("E %d R %d: rank %d starts at %d, want %d", c.E, c.R, r, lo, next)
			}
			for e := lo; e < hi; e++ {
				if got := pl.Replicas[e][0].Rank; got != r {
					t.Errorf("E %d R %d: expert %d in rank %d's block, placed on rank %d", c.E, c.R, e, r, got)
				}
			}
			next = hi
			minN, maxN = min(minN, hi-lo), max(maxN, hi-lo)
		}
		if next != c.E || maxN-minN > 1 {
			t.Errorf("E %d R %d: blocks end at %d, sizes %d..%d", c.E, c.R, next, minN, maxN)
		}
	}
}
