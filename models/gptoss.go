package models

import (
	"fmt"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/internal/par"
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
// The elements move in their own dtype (a permutation: bf16 stays bf16),
// and only the backend's shard of the experts (backend.ExpertSharder) is
// built, so loading holds one more copy of the shard's bytes, not a
// float32 one of every expert.
func loadGptOssExperts(w *Weights, p string, E, H, I int, l *backend.MoELayer) error {
	hosts := map[string]*tensor.Host{}
	for name, shape := range map[string][]int{
		"gate_up_proj": {E, H, 2 * I}, "gate_up_proj_bias": {E, 2 * I},
		"down_proj": {E, I, H}, "down_proj_bias": {E, H},
	} {
		h, err := w.host(p+name, shape...)
		if err != nil {
			return err
		}
		hosts[name] = h
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
	// permuted is h's experts [lo, hi) with element (e, i) of the result
	// taken from element from(e, i) of h's expert e: n experts of size
	// elements each, in h's dtype.
	permuted := func(h *tensor.Host, shape []int, size int, from func(i int) int) *tensor.Host {
		sz := h.DType.Size()
		out := make([]byte, n*size*sz)
		par.For(n*size, 1<<16, func() func(a, b int) {
			return func(a, b int) {
				for k := a; k < b; k++ {
					e, i := k/size, k%size
					src := (lo+e)*size + from(i)
					copy(out[k*sz:(k+1)*sz], h.Data[src*sz:(src+1)*sz])
				}
			}
		})
		return &tensor.Host{Name: h.Name, DType: h.DType, Shape: shape, Data: out}
	}
	// GateUp row j < I is gate j (source column 2j), row I+j up j (2j+1);
	// source [H, 2I] of an expert, destination [2I, H].
	deinterleave := func(j int) int {
		if j < I {
			return 2 * j
		}
		return 2*(j-I) + 1
	}
	gateUp := permuted(hosts["gate_up_proj"], []int{n * 2 * I, H}, 2*I*H, func(i int) int {
		j, h := i/H, i%H
		return h*2*I + deinterleave(j)
	})
	gateUpBias := permuted(hosts["gate_up_proj_bias"], []int{n, 2 * I}, 2*I, deinterleave)
	down := permuted(hosts["down_proj"], []int{n * H, I}, H*I, func(i int) int { // [I, H] → [H, I]
		h, j := i/I, i%I
		return j*H + h
	})
	downBias := permuted(hosts["down_proj_bias"], []int{n, H}, H, func(i int) int { return i })
	var err error
	up := func(h *tensor.Host) backend.Tensor {
		if err != nil {
			return nil
		}
		var t backend.Tensor
		t, err = w.upload(h)
		return t
	}
	l.GateUp, l.GateUpBias, l.Down, l.DownBias = up(gateUp), up(gateUpBias), up(down), up(downBias)
	return err
}
