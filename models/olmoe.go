package models

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
)

// OLMoE: RMSNorm of q and k over the whole projection, then optional
// clipping of q, k and v to ±clip_qkv; every layer sparse.
func init() { Register(buildOLMoE, "OlmoeForCausalLM") }

func buildOLMoE(cfg *Config, w *Weights, be backend.Backend) (Model, error) {
	return loadDecoder(cfg, w, be, func(i int) (block, block, error) {
		attn, err := loadGQA(cfg, w, be, i, gqaOptions{qkvBias: cfg.AttentionBias, oBias: cfg.AttentionBias, norm: wholeQK, clip: float32(cfg.ClipQKV)})
		if err != nil {
			return nil, nil, err
		}
		f, err := loadSoftmaxMoE(cfg, w, be, fmt.Sprintf("model.layers.%d.mlp.", i), cfg.NormTopKProb)
		return attn, f, err
	})
}
