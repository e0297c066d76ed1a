package kernels

import (
	"runtime"
	"testing"
)

// BenchmarkHandOff models GPU.Do's cost without a GPU: a closure handed to
// a goroutine and its completion handed back, with the serving goroutine
// locked to its OS thread (as GPU's owner is) or not. A locked goroutine
// can run only on its own thread, so each hand-off wakes that thread
// through the OS. Compare with direct mode, which has no hand-off.
func BenchmarkHandOff(b *testing.B) {
	for _, locked := range []bool{true, false} {
		name := "unlocked"
		if locked {
			name = "locked"
		}
		b.Run(name, func(b *testing.B) {
			work := make(chan func())
			go func() {
				if locked {
					runtime.LockOSThread()
				}
				for f := range work {
					f()
				}
			}()
			defer close(work)
			done := make(chan struct{}, 1)
			x := 0
			for range b.N {
				work <- func() { x++; done <- struct{}{} }
				<-done
			}
		})
	}
}
