package attention

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// parallelFor runs [0, n) on all cores in tasks of grain items, handed out
// dynamically so that uneven tasks (causal rows) balance. newWorker is called
// once per goroutine and returns the task body, so each worker can own
// scratch buffers.
func parallelFor(n, grain int, newWorker func() func(lo, hi int)) {
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
	var wg sync.WaitGroup
	for range w {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := newWorker()
			for {
				lo := int(next.Add(int64(grain))) - grain
				if lo >= n {
					return
				}
				body(lo, min(lo+grain, n))
			}
		}()
	}
	wg.Wait()
}

// numWorkers is the number of goroutines parallelFor uses at most.
func numWorkers() int { return runtime.GOMAXPROCS(0) }
