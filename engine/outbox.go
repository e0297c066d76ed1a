package engine

import (
	"context"
	"sync"
)

// outbox decouples the step loop from a slow reader: the loop pushes events
// without ever blocking, and a per-request goroutine forwards them to the
// caller's channel. When the caller's context ends, the goroutine reports
// the abort, closes the channel and drops whatever comes later.
type outbox struct {
	ch     chan Event
	mu     sync.Mutex
	q      []Event
	closed bool // no more events will be pushed
	signal chan struct{}
}

func newOutbox(ch chan Event) *outbox {
	return &outbox{ch: ch, signal: make(chan struct{}, 1)}
}

// push queues an event (never blocks; ignored after close).
func (o *outbox) push(ev Event) {
	o.mu.Lock()
	if !o.closed {
		o.q = append(o.q, ev)
	}
	o.mu.Unlock()
	o.notify()
}

// close marks the end of the stream.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.notify()
}

func (o *outbox) notify() {
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// pump forwards events until the stream ends or ctx is done; on ctx done it
// calls abort once.
func (o *outbox) pump(ctx context.Context, abort func()) {
	defer close(o.ch)
	for {
		o.mu.Lock()
		q, closed := o.q, o.closed
		o.q = nil
		o.mu.Unlock()
		for _, ev := range q {
			select {
			case o.ch <- ev:
			case <-ctx.Done():
				o.abandon(abort)
				return
			}
		}
		if closed && len(q) == 0 {
			return
		}
		if closed {
			continue
		}
		select {
		case <-o.signal:
		case <-ctx.Done():
			o.abandon(abort)
			return
		}
	}
}

// abandon stops accepting events and asks the engine to abort.
func (o *outbox) abandon(abort func()) {
	o.mu.Lock()
	wasClosed := o.closed
	o.closed = true
	o.q = nil
	o.mu.Unlock()
	if !wasClosed {
		abort()
	}
}
