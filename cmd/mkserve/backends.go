package main

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/kernels"
)

// newBackend makes the compute backend a command asked for. The CUDA model
// backend does not exist yet: asking for it probes the GPU and the kernel
// library and says what was found, so the message tells a user with a GPU
// what is missing and one without it why it cannot work.
func newBackend(name string, epRanks int) (backend.Backend, error) {
	switch name {
	case "cpu":
		return cpu.New(cpu.Options{EPRanks: epRanks}), nil
	case "cuda":
		g, err := kernels.Open(0)
		if err != nil {
			return nil, fmt.Errorf("backend cuda cannot start: %w", err)
		}
		info := g.Info()
		g.Close()
		return nil, fmt.Errorf("backend cuda: libmkernel runs on %s (%d SMs), but the CUDA model backend is not implemented yet; use --backend cpu", info.Name, info.SMs)
	}
	return nil, fmt.Errorf("backend %q is not available (available: cpu, cuda)", name)
}
