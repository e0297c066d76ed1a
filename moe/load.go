package moe

import "sync/atomic"

// Load counts routed tokens per expert, cumulatively, for metrics. Safe for
// concurrent use.
type Load struct {
	n []atomic.Uint64 // [E]
}

// NewLoad returns zeroed counters for numExperts experts.
func NewLoad(numExperts int) *Load {
	return &Load{n: make([]atomic.Uint64, max(numExperts, 0))}
}

// Add counts each id once (one token-slot each); ids out of range are skipped.
func (l *Load) Add(ids []int32) {
	if len(ids) == 0 || len(l.n) == 0 {
		return
	}
	local := make([]uint64, len(l.n))
	for _, e := range ids {
		if e >= 0 && int(e) < len(local) {
			local[e]++
		}
	}
	for e, c := range local {
		if c != 0 {
			l.n[e].Add(c)
		}
	}
}

// Snapshot returns the counts so far, [E].
func (l *Load) Snapshot() []uint64 {
	out := make([]uint64, len(l.n))
	for e := range l.n {
		out[e] = l.n[e].Load()
	}
	return out
}

// Reset zeroes the counters.
func (l *Load) Reset() {
	for e := range l.n {
		l.n[e].Store(0)
	}
}
