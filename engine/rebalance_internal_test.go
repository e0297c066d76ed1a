package engine

import (
	"errors"
	"fmt"
	"testing"

	"go.uber.org/zap"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/metrics"
	"github.com/mkserve/mkserve/moe"
)

// fakePlacer is a backend.ExpertPlacer that fails every placement with err.
type fakePlacer struct {
	err   error
	calls map[int]int // per layer
}

func (f *fakePlacer) ExpertRanks() int { return 2 }
func (f *fakePlacer) PlaceExperts(layer int, _ *moe.Placement) error {
	f.calls[layer]++
	return f.err
}

// TestRebalancerStopsOnNotPlaceable: a layer the backend can never place
// (backend.ErrNotPlaceable) is asked once and then left alone, while a layer
// whose placement failed for another reason is asked again every window.
func TestRebalancerStopsOnNotPlaceable(t *testing.T) {
	for _, tc := range []struct {
		name      string
		err       error
		wantCalls int
	}{
		{"not placeable", fmt.Errorf("cuda: layer 3: %w", backend.ErrNotPlaceable), 1},
		{"transient", errors.New("out of device memory"), 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &fakePlacer{err: tc.err, calls: map[int]int{}}
			r := &rebalancer{placer: fp, every: 1, spare: 1, layers: map[int]*moe.Rebalancer{}, log: zap.NewNop(),
				met: metrics.New(metrics.NewRegistry(), "t")}
			counts := []int64{9, 1, 1, 1, 0, 0, 0, 12} // skewed: a new placement every window
			for range 4 {
				r.observe(3, counts)
			}
			if fp.calls[3] != tc.wantCalls {
				t.Errorf("PlaceExperts called %d times, want %d", fp.calls[3], tc.wantCalls)
			}
			if r.moves != 0 {
				t.Errorf("%d placements counted as installed, want 0", r.moves)
			}
		})
	}
}
