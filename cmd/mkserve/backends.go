package main

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/backend/cuda"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/transport"
	"github.com/mkserve/mkserve/tuning"
)

// newBackend makes the compute backend a command asked for. "cuda" opens
// the first GPU through libmkernel.so in the given precision profile
// ("exact" or "fast", see cuda.Options); without a GPU or the library the
// error says what is missing (it wraps kernels.ErrUnavailable). moePath is
// cuda's MoE path ("" reads MKSERVE_MOE_PATH, else grouped); moeTuning, a
// table of `mkserve bench moe --tune` ("" for none).
//
// world, when set, makes the backend one rank of an expert-parallel world
// of processes: on cuda it opens GPU rank % (GPUs on the host) and sums the
// ranks' MoE outputs over worldTransport ("ipc", the default, or "nccl").
func newBackend(name string, epRanks int, precision, moePath, moeTuning string, world transport.Comm, worldTransport string) (backend.Backend, error) {
	switch name {
	case "cpu":
		return cpu.New(cpu.Options{EPRanks: epRanks, EPComm: world}), nil
	case "cuda":
		var split bool
		switch precision {
		case "exact", "":
			split = true
		case "fast":
		default:
			return nil, fmt.Errorf("precision %q is not known (exact or fast)", precision)
		}
		var tune *tuning.MoETable
		if moeTuning != "" {
			var err error
			if tune, err = tuning.LoadMoE(moeTuning); err != nil {
				return nil, fmt.Errorf("moe_tuning: %w", err)
			}
		}
		dev := 0
		if world != nil {
			n, err := kernels.DeviceCount()
			if err != nil {
				return nil, fmt.Errorf("backend cuda cannot start: %w", err)
			}
			dev = world.Rank() % max(n, 1)
		}
		be, err := cuda.New(cuda.Options{Device: dev, EPRanks: epRanks, SplitActivations: &split, MoEPath: moePath,
			MoETuning: tune, World: world, WorldTransport: worldTransport})
		if err != nil {
			return nil, fmt.Errorf("backend cuda cannot start: %w", err)
		}
		return be, nil
	}
	return nil, fmt.Errorf("backend %q is not available (available: cpu, cuda)", name)
}
