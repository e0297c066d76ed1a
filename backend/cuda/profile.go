package cuda

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
)

// OpStat is the host-side cost of one kind of backend op: how many calls,
// and the wall time from the call to its return (argument checks, the
// hand-off to the GPU goroutine, the launches from Go through purego; the
// GPU work itself runs asynchronously and is not counted unless the op
// waits for it).
type OpStat struct {
	Op    string
	Calls int64
	Total time.Duration
}

// opProfile accumulates OpStats when profiling is on.
type opProfile struct {
	mu sync.Mutex
	on bool
	m  map[string]*OpStat
}

// ProfileOps turns the per-op host timing on or off (off by default: it
// costs a clock read per op) and clears what was gathered.
func (be *Backend) ProfileOps(on bool) {
	p := &be.prof
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on, p.m = on, map[string]*OpStat{}
}

// OpProfile returns the gathered stats, the costliest first.
func (be *Backend) OpProfile() []OpStat {
	p := &be.prof
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]OpStat, 0, len(p.m))
	for _, s := range p.m {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b OpStat) int {
		return cmp.Or(cmp.Compare(b.Total, a.Total), strings.Compare(a.Op, b.Op))
	})
	return out
}

// record adds one call of op that took d; a no-op while profiling is off.
func (p *opProfile) record(op string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.on {
		return
	}
	s := p.m[op]
	if s == nil {
		s = &OpStat{Op: op}
		p.m[op] = s
	}
	s.Calls++
	s.Total += d
}

// enabled reports whether profiling is on.
func (p *opProfile) enabled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.on
}
