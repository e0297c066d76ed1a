//go:build unix

package linalg

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time (user + system) the process has used: throughput
// per CPU-second stays meaningful when other jobs share the cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
