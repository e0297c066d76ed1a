package cuda

import (
	"testing"

	"github.com/mkserve/mkserve/kernels"
)

// TestGemvRowBoundsSurvivePadding: a graph step of T rows runs padded to
// padRows(T), an eager step of the same batch with T rows. The skinny
// kernels' results per row do not depend on the row count, but they differ
// from cuBLASLt's in the last bits, so a row bound that splits a padding
// bucket (T ≤ bound < padRows(T)) would make graph and eager steps of one
// batch disagree (as a per-shape timed pick once did for 3 and 4 rows).
func TestGemvRowBoundsSurvivePadding(t *testing.T) {
	for _, b := range []struct {
		name  string
		bound int
	}{{"dense projections (gemvMaxRows)", gemvMaxRows}, {"router (kernels.GemvMaxRows)", kernels.GemvMaxRows},
		{"MoE experts (kernels.MoEGemvMaxTokens)", kernels.MoEGemvMaxTokens}} {
		for T := 1; T <= graphMaxRows; T++ {
			if (T <= b.bound) != (padRows(T) <= b.bound) {
				t.Errorf("%s: bound %d puts %d rows and their padded %d on different kernels", b.name, b.bound, T, padRows(T))
			}
		}
	}
}
