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

// backendSpec is a command's backend settings (newBackend, worldProfile).
type backendSpec struct {
	name        string // cpu or cuda
	ep          int    // expert-parallel ranks emulated in process (0 or 1: none)
	precision   string // cuda: exact ("" too) or fast (see cuda.Options)
	moePath     string // cuda: grouped or fused ("" reads MKSERVE_MOE_PATH, else grouped)
	moeTuning   string // cuda: a table of `mkserve bench moe --tune` ("" for none)
	cpuWeights  string // cpu: auto ("" too), stored or q8 (cpu.WeightFormat)
	cudaWeights string // cuda: auto ("" too), stored or fp4 (cuda.Options.Weights)
	kvDtype     string // cpu: the KV cache's element type, auto ("" too: float32) or bf16
	// world, when set, makes the backend one rank of an expert-parallel
	// world of processes: on cuda it opens GPU rank % (GPUs on the host)
	// and sums the ranks' MoE outputs over worldTransport ("ipc", the
	// default, or "nccl").
	world          transport.Comm
	worldTransport string
}

// newBackend makes the compute backend s asks for. "cuda" opens the first
// GPU through libmkernel.so; without a GPU or the library the error says
// what is missing (it wraps kernels.ErrUnavailable).
func newBackend(s backendSpec) (backend.Backend, error) {
	switch s.name {
	case "cpu":
		wf := cpu.WeightsAuto
		if s.cpuWeights != "" {
			var err error
			if wf, err = cpu.ParseWeightFormat(s.cpuWeights); err != nil {
				return nil, err
			}
		}
		var kvBF16 bool
		switch s.kvDtype {
		case "", "auto":
		case "bf16":
			kvBF16 = true
		default:
			return nil, fmt.Errorf("kv cache dtype %q is not known (auto or bf16)", s.kvDtype)
		}
		return cpu.New(cpu.Options{EPRanks: s.ep, EPComm: s.world, Weights: wf, KVBF16: kvBF16}), nil
	case "cuda":
		var split bool
		switch s.precision {
		case "exact", "":
			split = true
		case "fast":
		default:
			return nil, fmt.Errorf("precision %q is not known (exact or fast)", s.precision)
		}
		var tune *tuning.MoETable
		if s.moeTuning != "" {
			var err error
			if tune, err = tuning.LoadMoE(s.moeTuning); err != nil {
				return nil, fmt.Errorf("moe_tuning: %w", err)
			}
		}
		dev := 0
		if s.world != nil {
			n, err := kernels.DeviceCount()
			if err != nil {
				return nil, fmt.Errorf("backend cuda cannot start: %w", err)
			}
			dev = s.world.Rank() % max(n, 1)
		}
		be, err := cuda.New(cuda.Options{Device: dev, EPRanks: s.ep, SplitActivations: &split, MoEPath: s.moePath,
			MoETuning: tune, World: s.world, WorldTransport: s.worldTransport, Weights: s.cudaWeights})
		if err != nil {
			return nil, fmt.Errorf("backend cuda cannot start: %w", err)
		}
		return be, nil
	}
	return nil, fmt.Errorf("backend %q is not available (available: cpu, cuda)", s.name)
}
