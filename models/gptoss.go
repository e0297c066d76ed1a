package models

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

// gpt-oss: attention with biases and per-head sinks, alternating sliding and
// full layers (layer_types), YaRN RoPE; a biased router whose top-k logits
// are softmaxed; experts with biases and gpt-oss's clamped SwiGLU, stored
// transposed with gate and up interleaved ([E, H, 2I]).
func init() { Register(buildGptOss, "GptOssForCausalLM") }

// gpt-oss activation constants (transformers: GptOssExperts.alpha, swiglu_limit).
const gptOssAlpha = 1.702

func buildGptOss(cfg *Config, w *Weights, be backend.Backend) (Model, error) {
	limit := cfg.SwigluLimit
	if limit == 0 {
		limit = 7
	}
	return loadDecoder(cfg, w, be, func(i int) (block, block, error) {
		attn, err := loadGQA(cfg, w, be, i, gqaOptions{qkvBias: cfg.AttentionBias, oBias: cfg.AttentionBias, sinks: true})
		if err != nil {
			return nil, nil, err
		}
		p := fmt.Sprintf("model.layers.%d.mlp.", i)
		E, H, I := cfg.NumExperts, cfg.HiddenSize, cfg.IntermediateSize
		f := &moeFFN{be: be}
		f.l.Router = moe.RouterConfig{NumExperts: E, TopK: cfg.NumExpertsPerTok, Scoring: moe.Softmax, SoftmaxTopK: true}
		f.l.Act = moe.Activation{Kind: moe.ClampedSwiGLU, Alpha: gptOssAlpha, Limit: float32(limit)}
		if f.l.Gate, err = w.Get(p+"router.weight", E, H); err != nil {
			return nil, nil, err
		}
		if f.l.GateBias, err = w.Get(p+"router.bias", E); err != nil {
			return nil, nil, err
		}
		if err := loadGptOssExperts(w, p+"experts.", E, H, I, &f.l); err != nil {
			return nil, nil, err
		}
		return attn, f, nil
	})
}

// loadGptOssExperts converts gate_up_proj [E, H, 2I] (gate and up
// interleaved along the last dim) and down_proj [E, I, H] into the stacked
// backend layout: GateUp [E, 2I, H] (gate rows then up rows), Down [E, H, I].
func loadGptOssExperts(w *Weights, p string, E, H, I int, l *backend.MoELayer) error {
	hosts := map[string][]int{
		"gate_up_proj": {E, H, 2 * I}, "gate_up_proj_bias": {E, 2 * I},
		"down_proj": {E, I, H}, "down_proj_bias": {E, H},
	}
	v := map[string][]float32{}
	dtype := map[string]tensor.DType{}
	for name, shape := range hosts {
		h, err := w.host(p+name, shape...)
		if err != nil {
			return err
		}
		if v[name], err = h.Float32(); err != nil {
			return err
		}
		dtype[name] = h.DType
	}
	gu, gub, down := v["gate_up_proj"], v["gate_up_proj_bias"], v["down_proj"]
	gateUp := make([]float32, E*2*I*H) // [E, 2I, H]
	gateUpBias := make([]float32, E*2*I)
	downT := make([]float32, E*H*I) // [E, H, I]
	for e := 0; e < E; e++ {
		src := gu[e*H*2*I:]
		dst := gateUp[e*2*I*H:]
		for j := 0; j < I; j++ {
			for h := 0; h < H; h++ {
				dst[j*H+h] = src[h*2*I+2*j]       // gate j
				dst[(I+j)*H+h] = src[h*2*I+2*j+1] // up j
			}
			gateUpBias[e*2*I+j] = gub[e*2*I+2*j]
			gateUpBias[e*2*I+I+j] = gub[e*2*I+2*j+1]
		}
		for i := 0; i < I; i++ {
			for h := 0; h < H; h++ {
				downT[e*H*I+h*I+i] = down[e*I*H+i*H+h]
			}
		}
	}
	var err error
	up := func(name string, shape []int, data []float32) backend.Tensor {
		if err != nil {
			return nil
		}
		var t backend.Tensor
		h := tensor.FromFloat32(p+name, shape, data)
		if dtype[name] == tensor.BF16 { // rearranged bf16 values: exact in bf16, half the memory
			h = tensor.ToBF16(h)
		}
		t, err = w.upload(h)
		return t
	}
	// A backend.ExpertSharder keeps only its block [lo, hi) of the experts.
	lo, hi := 0, E
	if s, ok := w.be.(backend.ExpertSharder); ok {
		if lo, hi = s.ExpertShard(E); lo < 0 || hi > E || hi <= lo {
			return fmt.Errorf("%s: the backend's shard [%d, %d) of %d experts", p, lo, hi, E)
		}
		if hi-lo < E {
			l.ExpertLo, l.LocalExperts = lo, hi-lo
		}
	}
	n := hi - lo
	db := v["down_proj_bias"]
	l.GateUp = up("gate_up_proj", []int{n * 2 * I, H}, gateUp[lo*2*I*H:hi*2*I*H])
	l.GateUpBias = up("gate_up_proj_bias", []int{n, 2 * I}, gateUpBias[lo*2*I:hi*2*I])
	l.Down = up("down_proj", []int{n * H, I}, downT[lo*H*I:hi*H*I])
	l.DownBias = up("down_proj_bias", []int{n, H}, db[lo*H:hi*H])
	return err
}
