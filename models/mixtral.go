package models

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
)

// Mixtral: Llama attention (GQA, optional sliding window) and a softmax
// top-k router over SwiGLU experts whose weights are always renormalised.
// Checkpoints name the block block_sparse_moe with experts.N.w1/w3/w2
// (transformers ≤ 4) or mlp with fused experts (transformers 5).
func init() { Register(buildMixtral, "MixtralForCausalLM") }

func buildMixtral(cfg *Config, w *Weights, be backend.Backend) (Model, error) {
	return loadDecoder(cfg, w, be, func(i int) (block, block, error) {
		attn, err := loadGQA(cfg, w, be, i, gqaOptions{})
		if err != nil {
			return nil, nil, err
		}
		prefix := fmt.Sprintf("model.layers.%d.block_sparse_moe.", i)
		if !w.Has(prefix + "gate.weight") {
			prefix = fmt.Sprintf("model.layers.%d.mlp.", i)
		}
		ffn, err := loadSoftmaxMoE(cfg, w, be, prefix, true)
		return attn, ffn, err
	})
}

// loadSoftmaxMoE binds prefix.gate.weight and the experts of a
// softmax-routed layer (Mixtral, Qwen2/3-MoE, OLMoE).
func loadSoftmaxMoE(cfg *Config, w *Weights, be backend.Backend, prefix string, normTopK bool) (*moeFFN, error) {
	f := &moeFFN{be: be}
	f.l.Router = routerOf(cfg, normTopK)
	var err error
	if f.l.Gate, err = w.Get(prefix+"gate.weight", cfg.NumExperts, cfg.HiddenSize); err != nil {
		return nil, err
	}
	if err := loadExperts(w, prefix, cfg.NumExperts, cfg.HiddenSize, cfg.MoEIntermediateSize, &f.l); err != nil {
		return nil, err
	}
	return f, nil
}
