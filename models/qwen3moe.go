package models

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
)

// Qwen3-MoE: attention with per-head RMSNorm of q and k (no biases), an
// explicit head_dim, and Qwen's sparse-layer rules; no shared expert.
func init() { Register(buildQwen3MoE, "Qwen3MoeForCausalLM") }

func buildQwen3MoE(cfg *Config, w *Weights, be backend.Backend) (Model, error) {
	return loadDecoder(cfg, w, be, func(i int) (block, block, error) {
		attn, err := loadGQA(cfg, w, be, i, gqaOptions{qkvBias: cfg.AttentionBias, oBias: cfg.AttentionBias, norm: perHeadQK})
		if err != nil {
			return nil, nil, err
		}
		prefix := fmt.Sprintf("model.layers.%d.mlp.", i)
		if !qwenSparse(cfg, i) {
			ffn, err := loadDense(cfg, w, be, prefix)
			return attn, ffn, err
		}
		f, err := loadSoftmaxMoE(cfg, w, be, prefix, cfg.NormTopKProb)
		return attn, f, err
	})
}
