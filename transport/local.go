package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// NewLocalWorld returns R connected in-process ranks (R >= 1; smaller R gives
// nil). Each rank is meant to be driven by its own goroutine.
//
// Messages travel on one buffered channel per ordered pair of ranks. A rank
// can be at most one exchange ahead of any other (it cannot finish exchange n
// before every rank has sent its part of exchange n), so a channel never holds
// more than two messages and a send never blocks: with capacity two the
// exchange is deadlock-free. Payloads are copied on send, so the sender may
// reuse its buffers at once and no memory is shared between ranks.
func NewLocalWorld(R int) []Comm {
	if R < 1 {
		return nil
	}
	w := &localWorld{size: R, done: make(chan struct{})}
	w.ch = make([][]chan localMsg, R)
	for s := range R {
		w.ch[s] = make([]chan localMsg, R)
		for d := range R {
			w.ch[s][d] = make(chan localMsg, 2)
		}
	}
	comms := make([]Comm, R)
	for r := range R {
		comms[r] = &localComm{w: w, rank: r}
	}
	return comms
}

type localWorld struct {
	size int
	ch   [][]chan localMsg // ch[src][dst]
	done chan struct{}     // closed on abort
	once sync.Once
	err  error // why the world was aborted; set before done is closed
}

type localMsg struct {
	seq  uint64 // exchange number, checked on receipt
	data []float32
}

func (w *localWorld) abort(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.done)
	})
}

func (w *localWorld) aborted() error {
	select {
	case <-w.done:
		return fmt.Errorf("%w: %w", ErrAborted, w.err)
	default:
		return nil
	}
}

type localComm struct {
	w    *localWorld
	rank int
	seq  uint64      // exchanges this rank has started
	busy atomic.Bool // guards against concurrent calls on one rank
}

func (c *localComm) Rank() int { return c.rank }
func (c *localComm) Size() int { return c.w.size }

func (c *localComm) AllToAllV(ctx context.Context, send [][]float32) ([][]float32, error) {
	w := c.w
	if !c.busy.CompareAndSwap(false, true) {
		err := fmt.Errorf("transport: rank %d: AllToAllV called concurrently on one rank", c.rank)
		w.abort(err)
		return nil, err
	}
	defer c.busy.Store(false)
	if err := w.aborted(); err != nil {
		return nil, err
	}
	if len(send) != w.size {
		err := fmt.Errorf("transport: rank %d: AllToAllV got %d send buffers, want world size %d", c.rank, len(send), w.size)
		w.abort(err)
		return nil, err
	}
	c.seq++
	seq := c.seq
	for d, buf := range send {
		var data []float32
		if len(buf) > 0 {
			data = append([]float32(nil), buf...)
		}
		// Never blocks (see NewLocalWorld), but stay abortable regardless.
		select {
		case w.ch[c.rank][d] <- localMsg{seq: seq, data: data}:
		case <-w.done:
			return nil, w.aborted()
		case <-ctx.Done():
			err := fmt.Errorf("transport: rank %d: sending exchange %d to rank %d: %w", c.rank, seq, d, ctx.Err())
			w.abort(err)
			return nil, err
		}
	}
	recv := make([][]float32, w.size)
	for s := range w.size {
		select {
		case m := <-w.ch[s][c.rank]:
			if m.seq != seq {
				err := fmt.Errorf("transport: rank %d: exchange %d got message of exchange %d from rank %d (ranks out of step)", c.rank, seq, m.seq, s)
				w.abort(err)
				return nil, err
			}
			recv[s] = m.data
		case <-w.done:
			return nil, w.aborted()
		case <-ctx.Done():
			err := fmt.Errorf("transport: rank %d: waiting for rank %d in exchange %d: %w", c.rank, s, seq, ctx.Err())
			w.abort(err)
			return nil, err
		}
	}
	return recv, nil
}
