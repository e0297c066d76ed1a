//go:build !unix

package linalg

import "time"

// cpuTime is unavailable here; the per-CPU-second metric is then omitted.
func cpuTime() time.Duration { return 0 }
