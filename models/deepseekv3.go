package models

import (
	"fmt"
	"math"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/moe"
)

// DeepSeek-V3: multi-head latent attention (q and kv low-rank projections,
// a decoupled RoPE part shared by all heads, interleaved rotation, YaRN) and
// sigmoid-scored, group-limited routing with a score-correction bias,
// routed_scaling_factor and shared experts; the first first_k_dense_replace
// layers are dense.
func init() { Register(buildDeepSeekV3, "DeepseekV3ForCausalLM") }

// loraNormEps is the epsilon of q_a_layernorm and kv_a_layernorm, which
// transformers builds with its RMSNorm default rather than rms_norm_eps.
const loraNormEps = 1e-6

type mlaAttention struct {
	be                backend.Backend
	qProj             backend.Tensor // [H*(nope+rope), hidden] when q_lora_rank is unset
	qA, qANorm, qB    backend.Tensor // [qLora, hidden], [qLora], [H*(nope+rope), qLora]
	kvA, kvANorm, kvB backend.Tensor // [kvLora+rope, hidden], [kvLora], [H*(nope+v), kvLora]
	o                 backend.Tensor // [hidden, H*v]
	// On a backend.LatentAttender (kvB is then nil): the KV cache holds
	// [latent ‖ rope key] per token.
	latent              *backend.MLAWeights
	la                  backend.LatentAttender
	nope, ropeDim, vDim int
	kvLora              int
	rope                *attention.RoPE
	p                   backend.AttnParams
}

func buildDeepSeekV3(cfg *Config, w *Weights, be backend.Backend) (Model, error) {
	if cfg.KVLoraRank <= 0 || cfg.QKRopeHeadDim <= 0 || cfg.QKNopeHeadDim <= 0 || cfg.VHeadDim <= 0 {
		return nil, fmt.Errorf("fields kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim and v_head_dim must be positive")
	}
	return loadDecoder(cfg, w, be, func(i int) (block, block, error) {
		attn, err := loadMLA(cfg, w, be, i)
		if err != nil {
			return nil, nil, err
		}
		prefix := fmt.Sprintf("model.layers.%d.mlp.", i)
		if i < cfg.FirstKDense {
			ffn, err := loadDense(cfg, w, be, prefix)
			return attn, ffn, err
		}
		f := &moeFFN{be: be}
		f.l.Router = moe.RouterConfig{
			NumExperts: cfg.NumExperts, TopK: cfg.NumExpertsPerTok, Scoring: moe.Sigmoid,
			NormTopK: cfg.NormTopKProb, NumGroups: cfg.NumGroups, TopKGroups: cfg.TopKGroups,
			ScalingFactor: float32(cfg.RoutedScaling),
		}
		if f.l.Gate, err = w.Get(prefix+"gate.weight", cfg.NumExperts, cfg.HiddenSize); err != nil {
			return nil, nil, err
		}
		if f.l.ScoreBias, err = w.Optional(prefix+"gate.e_score_correction_bias", cfg.NumExperts); err != nil {
			return nil, nil, err
		}
		if err := loadExperts(w, prefix, cfg.NumExperts, cfg.HiddenSize, cfg.MoEIntermediateSize, &f.l); err != nil {
			return nil, nil, err
		}
		if cfg.NumSharedExperts > 0 {
			if f.l.Shared, err = loadMLP(w, prefix+"shared_experts.", cfg.HiddenSize, cfg.MoEIntermediateSize*cfg.NumSharedExperts); err != nil {
				return nil, nil, err
			}
		}
		return attn, f, nil
	})
}

func loadMLA(cfg *Config, w *Weights, be backend.Backend, i int) (*mlaAttention, error) {
	p := fmt.Sprintf("model.layers.%d.self_attn.", i)
	H, hid := cfg.NumHeads, cfg.HiddenSize
	a := &mlaAttention{be: be, nope: cfg.QKNopeHeadDim, ropeDim: cfg.QKRopeHeadDim, vDim: cfg.VHeadDim, kvLora: cfg.KVLoraRank}
	qk := a.nope + a.ropeDim
	style := attention.NeoX
	if cfg.RopeInterleave {
		style = attention.Interleaved
	}
	a.rope = ropeFor(cfg, a.ropeDim, style)
	scale := 1 / math.Sqrt(float64(qk))
	if s := cfg.RopeScaling; s.Type != "" && s.Type != "default" && s.MScaleAllDim != 0 {
		m := attention.YaRNMScale(s.Factor, s.MScaleAllDim)
		scale *= m * m
	}
	a.p = backend.AttnParams{Layer: i, NumHeads: H, NumKVHeads: H, HeadDim: qk, VHeadDim: a.vDim, Scale: float32(scale)}
	la, latent := be.(backend.LatentAttender)
	latent = latent && la.LatentMLA()
	var err error
	get := func(dst *backend.Tensor, name string, shape ...int) {
		if err == nil {
			*dst, err = w.Get(p+name, shape...)
		}
	}
	if cfg.QLoraRank > 0 {
		get(&a.qA, "q_a_proj.weight", cfg.QLoraRank, hid)
		get(&a.qANorm, "q_a_layernorm.weight", cfg.QLoraRank)
		get(&a.qB, "q_b_proj.weight", H*qk, cfg.QLoraRank)
	} else {
		get(&a.qProj, "q_proj.weight", H*qk, hid)
	}
	get(&a.kvA, "kv_a_proj_with_mqa.weight", a.kvLora+a.ropeDim, hid)
	get(&a.kvANorm, "kv_a_layernorm.weight", a.kvLora)
	if latent {
		if err == nil {
			a.la = la
			if a.latent, err = w.mlaWeights(p+"kv_b_proj.weight", H, a.nope, a.ropeDim, a.vDim, a.kvLora); err == nil {
				// q·k is the same sum either way, (q_nope·W_UK)·c + q_rope·k_rope: the scale stays.
				// The latent once a token where the backend keeps values inside keys.
				a.p = backend.MLAParams(i, H, a.latent, a.p.Scale, backend.ValuesInKeysOn(be))
			}
		}
	} else {
		get(&a.kvB, "kv_b_proj.weight", H*(a.nope+a.vDim), a.kvLora)
	}
	get(&a.o, "o_proj.weight", hid, H*a.vDim)
	if err == nil && cfg.AttentionBias {
		return nil, fmt.Errorf("field %q: attention biases are not supported for DeepSeek-V3 yet", "attention_bias")
	}
	return a, err
}

func (a *mlaAttention) params() *backend.AttnParams { return &a.p }

func (a *mlaAttention) forward(h backend.Tensor, b *backend.Batch) backend.Tensor {
	be, H := a.be, a.p.NumHeads
	// The two projections of h (q's or its low-rank first half, and kv's
	// compression) in one launch where the backend fuses them.
	qFirst := a.qProj
	if qFirst == nil {
		qFirst = a.qA
	}
	proj := backend.LinearMulti(be, h, []backend.Tensor{qFirst, a.kvA}, nil)
	q, ckv := proj[0], proj[1] // [T, H*(nope+rope)] or [T, qLora]; [T, kvLora+rope]
	if a.qProj == nil {
		qa := q
		qn := be.RMSNorm(qa, a.qANorm, loraNormEps)
		q = be.Linear(qn, a.qB, nil) // [T, H*(nope+rope)]
		backend.Release(be, []backend.Tensor{q}, qa, qn)
	}
	// dead releases the branch's intermediates once out exists.
	dead := func(out backend.Tensor, ts ...backend.Tensor) backend.Tensor {
		backend.Release(be, []backend.Tensor{out}, ts...)
		return out
	}
	qParts := be.SplitCols(q, H, a.nope, a.ropeDim) // [T, H*nope], [T, H*rope]
	kvParts := be.SplitCols(ckv, 1, a.kvLora, a.ropeDim)
	if a.latent != nil {
		c := be.RMSNorm(kvParts[0], a.kvANorm, loraNormEps)                  // [T, kvLora]
		qPe := be.RoPE(qParts[1], H, a.ropeDim, a.rope, b.Positions)         // [T, H*rope]
		kPe := be.RoPE(kvParts[1], 1, a.ropeDim, a.rope, b.Positions)        // [T, rope]
		o := a.la.LatentAttention(qParts[0], qPe, c, kPe, b, &a.p, a.latent) // [T, H*v]
		return dead(be.Linear(o, a.o, nil), q, ckv, qParts[0], qParts[1], kvParts[0], kvParts[1], c, qPe, kPe, o)
	}
	kvn := be.RMSNorm(kvParts[0], a.kvANorm, loraNormEps) // [T, kvLora]
	kv := be.Linear(kvn, a.kvB, nil)                      // [T, H*(nope+v)]
	kvSplit := be.SplitCols(kv, H, a.nope, a.vDim)        // [T, H*nope], [T, H*v]
	qPe := be.RoPE(qParts[1], H, a.ropeDim, a.rope, b.Positions)
	kPe := be.RoPE(kvParts[1], 1, a.ropeDim, a.rope, b.Positions) // [T, rope], shared by all heads
	sizes := []int{a.nope, a.ropeDim}
	qFull := be.ConcatCols(H, []backend.Tensor{qParts[0], qPe}, sizes)  // [T, H*(nope+rope)]
	kFull := be.ConcatCols(H, []backend.Tensor{kvSplit[0], kPe}, sizes) // [T, H*(nope+rope)]
	o := be.Attention(qFull, kFull, kvSplit[1], b, &a.p)                // [T, H*v]
	return dead(be.Linear(o, a.o, nil), q, ckv, qParts[0], qParts[1], kvParts[0], kvParts[1], kvn, kv,
		kvSplit[0], kvSplit[1], qPe, kPe, qFull, kFull, o)
}
