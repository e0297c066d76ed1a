package par

import (
	"sync/atomic"
	"testing"
)

func TestForCoversEveryIndexOnce(t *testing.T) {
	for _, tc := range []struct{ n, grain int }{{0, 1}, {1, 1}, {7, 3}, {1000, 1}, {1000, 64}, {5, 100}} {
		seen := make([]atomic.Int32, tc.n)
		workers := atomic.Int32{}
		For(tc.n, tc.grain, func() func(lo, hi int) {
			workers.Add(1)
			return func(lo, hi int) {
				if hi-lo > max(tc.grain, 1) {
					t.Errorf("task [%d,%d) larger than grain %d", lo, hi, tc.grain)
				}
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
			}
		})
		for i := range seen {
			if c := seen[i].Load(); c != 1 {
				t.Fatalf("n=%d grain=%d: index %d run %d times", tc.n, tc.grain, i, c)
			}
		}
	}
	var sum atomic.Int64
	Each(100, func(i int) { sum.Add(int64(i)) })
	if sum.Load() != 4950 {
		t.Errorf("Each summed %d", sum.Load())
	}
}
