package main

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/backend/cuda"
	"github.com/mkserve/mkserve/tuning"
)

// newBackend makes the compute backend a command asked for. "cuda" opens
// the first GPU through libmkernel.so in the given precision profile
// ("exact" or "fast", see cuda.Options); without a GPU or the library the
// error says what is missing (it wraps kernels.ErrUnavailable). moePath is
// cuda's MoE path ("" reads MKSERVE_MOE_PATH, else grouped); moeTuning, a
// table of `mkserve bench moe --tune` ("" for none).
func newBackend(name string, epRanks int, precision, moePath, moeTuning string) (backend.Backend, error) {
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
		var tune *tuning.MoETable
		if moeTuning != "" {
			var err error
			if tune, err = tuning.LoadMoE(moeTuning); err != nil {
				return nil, fmt.Errorf("moe_tuning: %w", err)
			}
		}
		be, err := cuda.New(cuda.Options{EPRanks: epRanks, SplitActivations: &split, MoEPath: moePath, MoETuning: tune})
		if err != nil {
			return nil, fmt.Errorf("backend cuda cannot start: %w", err)
		}
		return be, nil
	}
	return nil, fmt.Errorf("backend %q is not available (available: cpu, cuda)", name)
}
