package models

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
)

// Qwen2-MoE: attention with q/k/v biases; sparse layers chosen by
// decoder_sparse_step and mlp_only_layers; each sparse layer adds a shared
// expert scaled by sigmoid(shared_expert_gate(x)).
func init() { Register(buildQwen2MoE, "Qwen2MoeForCausalLM") }

func buildQwen2MoE(cfg *Config, w *Weights, be backend.Backend) (Model, error) {
	if cfg.NumExpertsPerTok <= 0 {
		return nil, fmt.Errorf("field %q: must be positive", "num_experts_per_tok")
	}
	return loadDecoder(cfg, w, be, func(i int) (block, block, error) {
		attn, err := loadGQA(cfg, w, be, i, gqaOptions{qkvBias: true})
		if err != nil {
			return nil, nil, err
		}
		prefix := fmt.Sprintf("model.layers.%d.mlp.", i)
		if !qwenSparse(cfg, i) {
			ffn, err := loadDense(cfg, w, be, prefix)
			return attn, ffn, err
		}
		f, err := loadSoftmaxMoE(cfg, w, be, prefix, cfg.NormTopKProb)
		if err != nil {
			return nil, nil, err
		}
		if cfg.SharedExpertSize > 0 {
			if f.l.Shared, err = loadMLP(w, prefix+"shared_expert.", cfg.HiddenSize, cfg.SharedExpertSize); err != nil {
				return nil, nil, err
			}
			if f.l.SharedGate, err = w.Get(prefix+"shared_expert_gate.weight", 1, cfg.HiddenSize); err != nil {
				return nil, nil, err
			}
		}
		return attn, f, nil
	})
}
