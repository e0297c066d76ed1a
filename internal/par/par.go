// Package par runs loops on all cores with dynamic scheduling, for the CPU
// code paths (attention rows, sequences of a batch, samplers).
package par

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// For runs [0, n) in tasks of grain items handed out dynamically to up to
// GOMAXPROCS workers, so uneven tasks balance: the caller's goroutine and
// one started goroutine per further worker (a decode step calls For for
// every attention layer: the caller working instead of waiting saves a
// goroutine's start and a wake-up each time). newWorker is called once per
// worker and returns the task body, so each worker can own scratch
// buffers. With one worker (or one task) everything runs on the caller's
// goroutine.
func For(n, grain int, newWorker func() func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	tasks := (n + grain - 1) / grain
	w := min(runtime.GOMAXPROCS(0), tasks)
	if w <= 1 {
		newWorker()(0, n)
		return
	}
	var next atomic.Int64
	work := func() {
		body := newWorker()
		for {
			lo := int(next.Add(int64(grain))) - grain
			if lo >= n {
				return
			}
			body(lo, min(lo+grain, n))
		}
	}
	var wg sync.WaitGroup
	for range w - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

// Each calls f(i) for every i in [0, n), one index per task.
func Each(n int, f func(i int)) {
	For(n, 1, func() func(lo, hi int) {
		return func(lo, hi int) {
			for i := lo; i < hi; i++ {
				f(i)
			}
		}
	})
}
