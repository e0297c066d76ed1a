package backend

import "sync"

// ExpertLoad accumulates tokens per expert per MoE layer between takes: the
// counts behind ExpertCounter. Safe for concurrent use; the zero value is
// empty.
type ExpertLoad struct {
	mu sync.Mutex
	m  map[int][]int64 // layer → [E] tokens per expert since the last Take
}

// AddIDs counts one step's routing of layer: each id in ids is an expert of
// [0, E). A layer last counted with another E starts again from zero.
func (l *ExpertLoad) AddIDs(layer, E int, ids []int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.row(layer, E)
	for _, e := range ids {
		c[e]++
	}
}

// AddCounts adds counts [E] (tokens per expert) to layer's; a layer last
// counted with another E starts again from counts.
func (l *ExpertLoad) AddCounts(layer int, counts []int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.row(layer, len(counts))
	for e, n := range counts {
		c[e] += n
	}
}

// row is layer's counts, made (zero) when absent or of another length.
func (l *ExpertLoad) row(layer, E int) []int64 {
	if l.m == nil {
		l.m = map[int][]int64{}
	}
	c := l.m[layer]
	if len(c) != E {
		c = make([]int64, E)
		l.m[layer] = c
	}
	return c
}

// Take returns the counts since the previous Take, by layer (nil when
// nothing was counted), and starts again.
func (l *ExpertLoad) Take() map[int][]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.m
	l.m = nil
	return out
}
