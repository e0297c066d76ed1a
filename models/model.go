// Package models loads Hugging Face MoE checkpoints and runs them on a
// backend. Each family (mixtral.go, qwen2moe.go, qwen3moe.go, olmoe.go,
// deepseekv3.go, gptoss.go) registers itself in init() with the
// architecture names it serves, and is written once against
// backend.Backend out of the shared blocks in blocks.go.
package models

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/mkserve/mkserve/backend"
)

// Model is a loaded checkpoint ready to run forward steps.
type Model interface {
	// Config is the parsed config.json.
	Config() *Config
	// Forward runs one step and returns logits [rows, vocab] for the batch's
	// LogitRows (every row when nil). KV caches live in the backend.
	Forward(b *backend.Batch) (backend.Tensor, error)
	// KVFloatsPerToken is the number of cached key and value elements one
	// token occupies across all layers (for sizing the KV cache).
	KVFloatsPerToken() int
	// KVWidths lists the attention layers' cached key and value widths.
	KVWidths() []backend.KVWidth
}

// Builder binds a family's weights for cfg.
type Builder func(cfg *Config, w *Weights, be backend.Backend) (Model, error)

var families = map[string]Builder{}

// Register makes a family available under its HF architecture names.
func Register(b Builder, architectures ...string) {
	for _, a := range architectures {
		if _, dup := families[a]; dup {
			panic("models: architecture registered twice: " + a)
		}
		families[a] = b
	}
}

// Architectures lists the supported architecture names, sorted.
func Architectures() []string {
	out := make([]string, 0, len(families))
	for a := range families {
		out = append(out, a)
	}
	sort.Strings(out)
	return out
}

// Build constructs the model for cfg from w, failing for an unknown
// architecture with the list of supported ones, and for checkpoint tensors
// the architecture does not use.
func Build(cfg *Config, w *Weights, be backend.Backend) (Model, error) {
	b, ok := families[cfg.Architecture]
	if !ok {
		return nil, fmt.Errorf("architecture %q is not supported (supported: %s)", cfg.Architecture, strings.Join(Architectures(), ", "))
	}
	if p, ok := be.(backend.ExpertPlanner); ok {
		p.PlanExperts(expertPlan(cfg))
	}
	m, err := b(cfg, w, be)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Architecture, err)
	}
	if err := w.CheckAllUsed(); err != nil {
		return nil, err
	}
	return m, nil
}

// expertPlan is cfg's routed experts as backend.ExpertPlan: bf16 bytes of
// every MoE layer's E experts (gate, up and down: 3·H·I values each). The
// MoE layers are counted as the families lay them out: all but the first
// FirstKDense, every DecoderSparseStep-th, none of MLPOnlyLayers.
func expertPlan(cfg *Config) backend.ExpertPlan {
	q, _ := parseQuant(cfg.Raw)
	p := backend.ExpertPlan{Quant: q.method, E: cfg.NumExperts}
	if cfg.NumExperts == 0 {
		return p
	}
	I := cfg.MoEIntermediateSize
	if I == 0 {
		I = cfg.IntermediateSize
	}
	step := max(cfg.DecoderSparseStep, 1)
	for l := 0; l < cfg.NumLayers; l++ {
		if l < cfg.FirstKDense || (l+1)%step != 0 || slices.Contains(cfg.MLPOnlyLayers, l) {
			continue
		}
		p.BF16Bytes += int64(cfg.NumExperts) * 3 * int64(cfg.HiddenSize) * int64(I) * 2
	}
	return p
}
