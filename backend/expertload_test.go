package backend

import (
	"maps"
	"slices"
	"sync"
	"testing"
)

func TestExpertLoad(t *testing.T) {
	type add struct {
		layer, E int
		ids      []int32 // AddIDs when counts is nil
		counts   []int64 // AddCounts
	}
	cases := []struct {
		name string
		adds []add
		want map[int][]int64
	}{
		{name: "empty", want: nil},
		{name: "ids", adds: []add{{layer: 3, E: 4, ids: []int32{0, 2, 2, 3}}, {layer: 3, E: 4, ids: []int32{2}}},
			want: map[int][]int64{3: {1, 0, 3, 1}}},
		{name: "two layers", adds: []add{{layer: 0, E: 2, ids: []int32{1}}, {layer: 5, E: 3, ids: []int32{0, 0}}},
			want: map[int][]int64{0: {0, 1}, 5: {2, 0, 0}}},
		{name: "ids then counts", adds: []add{{layer: 1, E: 3, ids: []int32{2}}, {layer: 1, counts: []int64{4, 0, 1}}},
			want: map[int][]int64{1: {4, 0, 2}}},
		{name: "another width restarts", adds: []add{{layer: 1, E: 3, ids: []int32{2}}, {layer: 1, counts: []int64{7, 1}}},
			want: map[int][]int64{1: {7, 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var l ExpertLoad
			for _, a := range c.adds {
				if a.counts != nil {
					l.AddCounts(a.layer, a.counts)
				} else {
					l.AddIDs(a.layer, a.E, a.ids)
				}
			}
			got := l.Take()
			if !maps.EqualFunc(got, c.want, slices.Equal) || (got == nil) != (c.want == nil) {
				t.Fatalf("Take = %v, want %v", got, c.want)
			}
			if again := l.Take(); again != nil {
				t.Fatalf("second Take = %v, want nil", again)
			}
		})
	}
}

// TestExpertLoadConcurrent: adds from many goroutines, takes between them,
// lose nothing (run under -race).
func TestExpertLoadConcurrent(t *testing.T) {
	var l ExpertLoad
	const workers, steps, E = 8, 200, 16
	var wg sync.WaitGroup
	var taken [E]int64
	var mu sync.Mutex
	take := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range l.Take() {
			for e, n := range c {
				taken[e] += n
			}
		}
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := range steps {
				l.AddIDs(0, E, []int32{int32((w + s) % E)})
				if s%50 == 0 {
					take()
				}
			}
		}()
	}
	wg.Wait()
	take()
	var sum int64
	for _, n := range taken {
		sum += n
	}
	if sum != workers*steps {
		t.Fatalf("counted %d tokens, want %d", sum, workers*steps)
	}
}
