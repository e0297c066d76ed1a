package main

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/backend/cuda"
)

// newBackend makes the compute backend a command asked for. "cuda" opens
// the first GPU through libmkernel.so in the given precision profile
// ("exact" or "fast", see cuda.Options); without a GPU or the library the
// error says what is missing (it wraps kernels.ErrUnavailable). moePath is
// cuda's MoE path ("" reads MKSERVE_MOE_PATH, else grouped).
func newBackend(name string, epRanks int, precision, moePath string) (backend.Backend, error) {
	switch name {
	case "cpu":
		return cpu.New(cpu.Options{EPRanks: epRanks}), nil
	case "cuda":
		var split bool
		switch precision {
		case "exact", "":
			split = true
		case "fast":
		default:
			return nil, fmt.Errorf("precision %q is not known (exact or fast)", precision)
		}
		be, err := cuda.New(cuda.Options{EPRanks: epRanks, SplitActivations: &split, MoEPath: moePath})
		if err != nil {
			return nil, fmt.Errorf("backend cuda cannot start: %w", err)
		}
		return be, nil
	}
	return nil, fmt.Errorf("backend %q is not available (available: cpu, cuda)", name)
}
