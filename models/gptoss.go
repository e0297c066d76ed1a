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
	// GateUp row j < I is gate j (source column 2j), row I+j up j (2j+1);
	// source [H, 2I] of an expert, destination [2I, H].
	deinterleave := func(j int) int {
		if j < I {
			return 2 * j
		}
		return 2*(j-I) + 1
	}
	asFP4, err := loadGptOssMXFP4(w, p, E, H, I, lo, hi, deinterleave, l)
	if err != nil {
		return err
	}
	shapes := map[string][]int{"gate_up_proj_bias": {E, 2 * I}, "down_proj_bias": {E, H}}
	if !asFP4 {
		shapes["gate_up_proj"], shapes["down_proj"] = []int{E, H, 2 * I}, []int{E, I, H}
	}
	hosts := map[string]*tensor.Host{}
	for name, shape := range shapes {
		h, err := w.host(p+name, shape...)
		if err != nil {
			return err
		}
		hosts[name] = h
	}
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
	up := func(h *tensor.Host) backend.Tensor {
		if err != nil {
			return nil
		}
		var t backend.Tensor
		t, err = w.upload(h)
		return t
	}
	if !asFP4 {
		l.GateUp = up(permuted(hosts["gate_up_proj"], []int{n * 2 * I, H}, 2*I*H, func(i int) int {
			j, h := i/H, i%H
			return h*2*I + deinterleave(j)
		}))
		l.Down = up(permuted(hosts["down_proj"], []int{n * H, I}, H*I, func(i int) int { // [I, H] → [H, I]
			h, j := i/I, i%I
			return j*H + h
		}))
	}
	l.GateUpBias = up(permuted(hosts["gate_up_proj_bias"], []int{n, 2 * I}, 2*I, deinterleave))
	l.DownBias = up(permuted(hosts["down_proj_bias"], []int{n, H}, H, func(i int) int { return i }))
	return err
}

// loadGptOssMXFP4 hands an MXFP4 checkpoint's expert matrices (experts
// [lo, hi)) to a backend.FP4Loader that wants them as FP4, as they are
// stored, with no bf16 copy: gate_up_proj's blocks [E, 2I, H/32, 16] hold
// each expert's 2I outputs (gate and up interleaved) along H — GateUp's
// rows once de-interleaved — and down_proj's [E, H, I/32, 16] Down's rows
// as they are. It reports false, having loaded nothing, for any other
// backend or checkpoint.
func loadGptOssMXFP4(w *Weights, p string, E, H, I, lo, hi int, deinterleave func(int) int, l *backend.MoELayer) (bool, error) {
	fl, ok := w.be.(backend.FP4Loader)
	if !ok || !fl.WantFP4() || H%32 != 0 || I%32 != 0 {
		return false, nil
	}
	gb, gs, ok, err := w.mxfp4(p+"gate_up_proj", E, 2*I, H/32)
	if err != nil || !ok {
		return false, err
	}
	db, ds, ok, err := w.mxfp4(p+"down_proj", E, H, I/32)
	if err != nil || !ok {
		return false, err
	}
	n := hi - lo
	rb, rs := H/2, H/32 // a GateUp row's block and scale bytes
	blocks, scales := make([]byte, n*2*I*rb), make([]byte, n*2*I*rs)
	par.For(n*2*I, 64, func() func(a, b int) {
		return func(a, b int) {
			for r := a; r < b; r++ {
				src := (lo+r/(2*I))*2*I + deinterleave(r%(2*I))
				copy(blocks[r*rb:(r+1)*rb], gb.Data[src*rb:(src+1)*rb])
				copy(scales[r*rs:(r+1)*rs], gs.Data[src*rs:(src+1)*rs])
			}
		}
	})
	if l.GateUp, err = fl.WeightMXFP4(p+"gate_up_proj", blocks, scales, n*2*I, H); err != nil {
		return false, fmt.Errorf("tensor %q: %w", p+"gate_up_proj", err)
	}
	db1, ds1 := I/2*H, I/32*H // an expert's Down bytes
	if l.Down, err = fl.WeightMXFP4(p+"down_proj", db.Data[lo*db1:hi*db1], ds.Data[lo*ds1:hi*ds1], n*H, I); err != nil {
		return false, fmt.Errorf("tensor %q: %w", p+"down_proj", err)
	}
	if w.progress != nil {
		w.progress(p+"gate_up_proj", int64(len(blocks)+len(scales)))
		w.progress(p+"down_proj", int64(n*(db1+ds1)))
	}
	return true, nil
}
