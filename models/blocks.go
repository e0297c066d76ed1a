package models

import (
	"fmt"
	"math"
	"runtime"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

// ───────────────────────────── decoder ─────────────────────────────

// block is one residual branch of a decoder layer.
type block interface {
	forward(x backend.Tensor, b *backend.Batch) backend.Tensor // [T, H] → [T, H]
}

// layer is a pre-norm decoder layer: x += attn(norm(x)); x += ffn(norm(x)).
type layer struct {
	inNorm   backend.Tensor // [H]
	postNorm backend.Tensor // [H]
	attn     block
	ffn      block
	// whole is the layer as a backend.LayerDecoder runs it in one launch
	// (wholeLayer), or nil when its form is not one it takes.
	whole *backend.DecodeLayer
}

// decoder is the transformer stack every supported family shares.
type decoder struct {
	cfg    *Config
	be     backend.Backend
	eps    float32
	embed  backend.Tensor // [V, H]
	norm   backend.Tensor // [H]
	lmHead backend.Tensor // [V, H]
	layers []layer
}

func (d *decoder) Config() *Config { return d.cfg }

// KVFloatsPerToken implements Model.
func (d *decoder) KVFloatsPerToken() int {
	n := 0
	for _, w := range d.KVWidths() {
		n += w.K + w.V
	}
	return n
}

// KVWidths implements Model.
func (d *decoder) KVWidths() []backend.KVWidth {
	var out []backend.KVWidth
	for _, l := range d.layers {
		if a, ok := l.attn.(interface{ params() *backend.AttnParams }); ok {
			p := a.params()
			w := backend.KVWidth{Layer: p.Layer, K: p.NumKVHeads * p.HeadDim, V: p.NumKVHeads * p.VHeadDim}
			if p.ValuesInKeys {
				w.V = 0 // the values are inside the keys
			}
			out = append(out, w)
		}
	}
	return out
}

// Forward implements Model.
func (d *decoder) Forward(b *backend.Batch) (backend.Tensor, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	for i, id := range b.Tokens {
		if id < 0 || int(id) >= d.cfg.VocabSize {
			return nil, fmt.Errorf("token %d at row %d is outside the vocabulary [0, %d)", id, i, d.cfg.VocabSize)
		}
	}
	be := d.be
	x := be.Embed(d.embed, b.Tokens) // [T, H]
	// Each residual add is fused with the norm after it (the next branch's,
	// or the final one): backend.AddRMSNorm. RMSNorm works row by row, so
	// picking the logit rows after the final norm gives the same values.
	// A layer the backend runs whole (backend.LayerDecoder: a decode step's
	// layer in one launch) takes the residual alone and norms it itself, so
	// h, x's normed form, is made only where a layer run op by op needs it.
	ld, _ := be.(backend.LayerDecoder)
	whole := ld != nil && ld.DecodesLayers(b)
	var h backend.Tensor // [T, H] or nil: not made yet
	// Each layer's residual, its normed input and its branches' outputs
	// are dead once the next residual exists: released to the backend then
	// (backend.Release), so that a long prefill reuses their memory.
	for i, l := range d.layers {
		if whole && l.whole != nil {
			if x2, ok := ld.DecodeLayer(x, l.whole, b); ok {
				backend.Release(be, []backend.Tensor{x2}, x, h)
				x, h = x2, nil
				continue
			}
		}
		if h == nil {
			h = be.RMSNorm(x, l.inNorm, d.eps)
		}
		a := l.attn.forward(h, b) // [T, H]
		x1, h1 := backend.AddRMSNorm(be, x, a, l.postNorm, d.eps)
		backend.Release(be, []backend.Tensor{x1, h1}, x, h, a)
		next := d.norm
		if i+1 < len(d.layers) {
			next = d.layers[i+1].inNorm
		}
		x, h = ffnAddNorm(be, l.ffn, x1, h1, b, next, d.eps)
		backend.Release(be, []backend.Tensor{x, h}, x1, h1)
	}
	if h == nil {
		h = be.RMSNorm(x, d.norm, d.eps)
	}
	if b.LogitRows != nil {
		r := be.Rows(h, b.LogitRows) // [rows, H]
		backend.Release(be, []backend.Tensor{r}, x, h)
		h = r
	}
	return be.Linear(h, d.lmHead, nil), nil // [rows, V]
}

// ffnAddNorm is AddRMSNorm(x, f(h), w, eps), with a MoE layer's combine
// folded into the add and norm where the backend can
// (backend.MoEAddRMSNorm).
func ffnAddNorm(be backend.Backend, f block, x, h backend.Tensor, b *backend.Batch, w backend.Tensor,
	eps float32) (sum, normed backend.Tensor) {
	if m, ok := f.(*moeFFN); ok {
		return backend.MoEAddRMSNorm(be, x, h, &m.l, w, eps)
	}
	return backend.AddRMSNorm(be, x, f.forward(h, b), w, eps)
}

// layerBlocks builds the attention and feed-forward branch of layer i.
type layerBlocks func(i int) (attn, ffn block, err error)

// loadDecoder binds the parts every family names the same way
// (model.embed_tokens, model.layers.N.{input,post_attention}_layernorm,
// model.norm, lm_head) and asks the family for each layer's branches.
func loadDecoder(cfg *Config, w *Weights, be backend.Backend, blocks layerBlocks) (*decoder, error) {
	H, V := cfg.HiddenSize, cfg.VocabSize
	d := &decoder{cfg: cfg, be: be, eps: float32(cfg.RMSNormEps)}
	var err error
	if d.embed, err = w.Get("model.embed_tokens.weight", V, H); err != nil {
		return nil, err
	}
	if d.norm, err = w.Get("model.norm.weight", H); err != nil {
		return nil, err
	}
	switch {
	case w.Has("lm_head.weight"):
		d.lmHead, err = w.Get("lm_head.weight", V, H)
	case cfg.TieWordEmbeddings:
		d.lmHead = d.embed
	default:
		err = fmt.Errorf("checkpoint has no tensor %q and tie_word_embeddings is false", "lm_head.weight")
	}
	if err != nil {
		return nil, err
	}
	for i := 0; i < cfg.NumLayers; i++ {
		p := fmt.Sprintf("model.layers.%d.", i)
		var l layer
		if l.inNorm, err = w.Get(p+"input_layernorm.weight", H); err != nil {
			return nil, err
		}
		if l.postNorm, err = w.Get(p+"post_attention_layernorm.weight", H); err != nil {
			return nil, err
		}
		if l.attn, l.ffn, err = blocks(i); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		if f, ok := l.ffn.(*moeFFN); ok {
			f.l.Layer = i
		}
		l.whole = wholeLayer(&l, d.eps)
		d.layers = append(d.layers, l)
		// A layer's host copies (converted, permuted, dequantized from
		// FP8 or MXFP4) are garbage now: collect them before the next
		// layer makes its own, or the heap grows to twice the weights.
		runtime.GC()
	}
	return d, nil
}

// wholeLayer is l as a backend.DecodeLayer, or nil when its form is not
// one: grouped-query attention without biases, clipping, sinks or a
// sliding window, its q/k norms per head or none, and routed softmax experts
// with SwiGLU and no biases, shared experts or score bias. The backend
// checks the shapes.
func wholeLayer(l *layer, eps float32) *backend.DecodeLayer {
	a, ok := l.attn.(*gqaAttention)
	f, ok2 := l.ffn.(*moeFFN)
	if !ok || !ok2 || a.bq != nil || a.bk != nil || a.bv != nil || a.bo != nil || a.clip > 0 || a.p.Sinks != nil ||
		a.p.Window > 0 || a.p.HeadDim != a.p.VHeadDim || a.p.ValuesInKeys {
		return nil
	}
	if a.qNorm != nil && (a.kNorm == nil || len(a.qNorm.Shape()) != 1 || a.qNorm.Shape()[0] != a.p.HeadDim) {
		return nil // OLMoE's norms over whole projections
	}
	m := &f.l
	if m.Shared != nil || m.SharedGate != nil || m.GateBias != nil || m.ScoreBias != nil || m.GateUpBias != nil ||
		m.DownBias != nil || m.Act.Kind != moe.SwiGLU || m.Router.Scoring != moe.Softmax || m.Router.NumGroups > 0 ||
		m.LocalExperts > 0 {
		return nil
	}
	return &backend.DecodeLayer{InNorm: l.inNorm, PostNorm: l.postNorm, Eps: eps, Q: a.wq, K: a.wk, V: a.wv, O: a.wo,
		QNorm: a.qNorm, KNorm: a.kNorm, RoPE: a.rope, Attn: &a.p, MoE: m}
}

// ropeFor is the config's rotary embedding over dim dimensions of a head.
func ropeFor(cfg *Config, dim int, style attention.RoPEStyle) *attention.RoPE {
	return &attention.RoPE{Dim: dim, Theta: cfg.RopeTheta, Style: style, Scaling: cfg.RopeScaling}
}

// windowFor is layer i's sliding window (0: full attention).
func windowFor(cfg *Config, i int) int {
	if cfg.SlidingWindow <= 0 {
		return 0
	}
	if len(cfg.LayerTypes) > 0 && cfg.LayerTypes[i] != "sliding_attention" {
		return 0
	}
	return cfg.SlidingWindow
}

// ───────────────────────── grouped-query attention ─────────────────────────

type qkNorm int

const (
	noQKNorm  qkNorm = iota
	perHeadQK        // RMSNorm over each head's head_dim (Qwen3)
	wholeQK          // RMSNorm over the whole projection (OLMoE)
)

// gqaOptions are the per-family differences of multi-head attention.
type gqaOptions struct {
	qkvBias bool   // q/k/v projections have biases (Qwen2-MoE, gpt-oss)
	oBias   bool   // o_proj has a bias (gpt-oss)
	norm    qkNorm // q/k normalisation
	clip    float32
	sinks   bool // per-head attention sinks (gpt-oss)
}

type gqaAttention struct {
	be             backend.Backend
	wq, wk, wv, wo backend.Tensor // [H*D, hidden], [KVH*D, hidden] ×2, [hidden, H*D]
	bq, bk, bv, bo backend.Tensor // biases or nil
	qNorm, kNorm   backend.Tensor // [D] or [H*D] / [KVH*D], or nil
	eps, clip      float32
	rope           *attention.RoPE
	p              backend.AttnParams
}

func loadGQA(cfg *Config, w *Weights, be backend.Backend, i int, o gqaOptions) (*gqaAttention, error) {
	p := fmt.Sprintf("model.layers.%d.self_attn.", i)
	H, KVH, D, hid := cfg.NumHeads, cfg.NumKVHeads, cfg.HeadDim, cfg.HiddenSize
	a := &gqaAttention{be: be, eps: float32(cfg.RMSNormEps), clip: o.clip,
		rope: ropeFor(cfg, int(float64(D)*cfg.PartialRotary), attention.NeoX)}
	a.p = backend.AttnParams{Layer: i, NumHeads: H, NumKVHeads: KVH, HeadDim: D, VHeadDim: D,
		Scale: float32(1 / math.Sqrt(float64(D))), Window: windowFor(cfg, i)}
	type bind struct {
		dst   *backend.Tensor
		name  string
		shape []int
		use   bool
	}
	norms := map[qkNorm][2][]int{perHeadQK: {{D}, {D}}, wholeQK: {{H * D}, {KVH * D}}}
	binds := []bind{
		{&a.wq, "q_proj.weight", []int{H * D, hid}, true},
		{&a.wk, "k_proj.weight", []int{KVH * D, hid}, true},
		{&a.wv, "v_proj.weight", []int{KVH * D, hid}, true},
		{&a.wo, "o_proj.weight", []int{hid, H * D}, true},
		{&a.bq, "q_proj.bias", []int{H * D}, o.qkvBias},
		{&a.bk, "k_proj.bias", []int{KVH * D}, o.qkvBias},
		{&a.bv, "v_proj.bias", []int{KVH * D}, o.qkvBias},
		{&a.bo, "o_proj.bias", []int{hid}, o.oBias},
		{&a.qNorm, "q_norm.weight", norms[o.norm][0], o.norm != noQKNorm},
		{&a.kNorm, "k_norm.weight", norms[o.norm][1], o.norm != noQKNorm},
		{&a.p.Sinks, "sinks", []int{H}, o.sinks},
	}
	for _, b := range binds {
		if !b.use {
			continue
		}
		t, err := w.Get(p+b.name, b.shape...)
		if err != nil {
			return nil, err
		}
		*b.dst = t
	}
	return a, nil
}

func (a *gqaAttention) params() *backend.AttnParams { return &a.p }

func (a *gqaAttention) forward(h backend.Tensor, b *backend.Batch) backend.Tensor {
	be, p := a.be, &a.p
	qkv := backend.LinearMulti(be, h, []backend.Tensor{a.wq, a.wk, a.wv}, []backend.Tensor{a.bq, a.bk, a.bv})
	q, k, v := qkv[0], qkv[1], qkv[2] // [T, H*D], [T, KVH*D], [T, KVH*D]
	if a.clip > 0 {
		if a.qNorm != nil {
			q = be.RMSNorm(q, a.qNorm, a.eps)
			k = be.RMSNorm(k, a.kNorm, a.eps)
		}
		q, k, v = be.Clamp(q, a.clip), be.Clamp(k, a.clip), be.Clamp(v, a.clip)
		q = be.RoPE(q, p.NumHeads, p.HeadDim, a.rope, b.Positions)
		k = be.RoPE(k, p.NumKVHeads, p.HeadDim, a.rope, b.Positions)
		return be.Linear(be.Attention(q, k, v, b, p), a.wo, a.bo)
	}
	// The q/k norms (if any), RoPE and attention, fused where the backend can.
	o := backend.NormRoPEAttention(be, q, k, v, a.qNorm, a.kNorm, a.eps, a.rope, b, p) // [T, H*D]
	backend.Release(be, []backend.Tensor{o}, q, k, v)
	out := be.Linear(o, a.wo, a.bo)
	backend.Release(be, []backend.Tensor{out}, o)
	return out
}

// ───────────────────────────── feed-forward ─────────────────────────────

type denseFFN struct {
	be  backend.Backend
	mlp backend.MLP
}

func (f *denseFFN) forward(x backend.Tensor, _ *backend.Batch) backend.Tensor {
	return f.be.MLP(x, &f.mlp)
}

type moeFFN struct {
	be backend.Backend
	l  backend.MoELayer
}

func (f *moeFFN) forward(x backend.Tensor, _ *backend.Batch) backend.Tensor {
	return f.be.MoE(x, &f.l)
}

// loadMLP binds prefix.{gate,up,down}_proj.weight as one gated MLP of
// intermediate size I.
func loadMLP(w *Weights, prefix string, hidden, I int) (*backend.MLP, error) {
	gate, err := w.host(prefix+"gate_proj.weight", I, hidden)
	if err != nil {
		return nil, err
	}
	up, err := w.host(prefix+"up_proj.weight", I, hidden)
	if err != nil {
		return nil, err
	}
	m := &backend.MLP{}
	if m.GateUp, err = w.stack(prefix+"gate_up_proj", []*tensor.Host{gate, up}); err != nil {
		return nil, err
	}
	if m.Down, err = w.Get(prefix+"down_proj.weight", hidden, I); err != nil {
		return nil, err
	}
	return m, nil
}

// loadDense binds a dense SwiGLU MLP of the config's intermediate_size
// under prefix (Qwen's mlp_only layers, DeepSeek's first dense layers).
func loadDense(cfg *Config, w *Weights, be backend.Backend, prefix string) (block, error) {
	m, err := loadMLP(w, prefix, cfg.HiddenSize, cfg.IntermediateSize)
	if err != nil {
		return nil, err
	}
	return &denseFFN{be: be, mlp: *m}, nil
}

// expertNames are the per-expert tensor names used by HF checkpoints:
// {gate, up, down} as *_proj (Qwen, OLMoE, DeepSeek) or w1/w3/w2 (Mixtral).
var expertNames = [][3]string{
	{"gate_proj.weight", "up_proj.weight", "down_proj.weight"},
	{"w1.weight", "w3.weight", "w2.weight"},
}

// loadExperts binds the routed experts under prefix ("….mlp.") into l,
// accepting per-expert tensors (experts.N.gate_proj.weight / w1.weight …) or
// the fused 3-D layout transformers 5 uses (experts.gate_up_proj [E, 2I, H],
// experts.down_proj [E, H, I]).
//
// A backend that is a backend.ExpertSharder gets only its block of experts
// (the others are read from the checkpoint by no one, and counted as used).
func loadExperts(w *Weights, prefix string, E, hidden, I int, l *backend.MoELayer) error {
	lo, hi := 0, E
	if s, ok := w.be.(backend.ExpertSharder); ok {
		if lo, hi = s.ExpertShard(E); lo < 0 || hi > E || hi <= lo {
			return fmt.Errorf("%sexperts: the backend's shard [%d, %d) of %d experts", prefix, lo, hi, E)
		}
		if hi-lo < E {
			l.ExpertLo, l.LocalExperts = lo, hi-lo
		}
	}
	var err error
	if w.Has(prefix + "experts.gate_up_proj") {
		if l.GateUp, err = w.getRows(prefix+"experts.gate_up_proj", lo, hi, E, 2*I, hidden); err != nil {
			return err
		}
		l.Down, err = w.getRows(prefix+"experts.down_proj", lo, hi, E, hidden, I)
		return err
	}
	style := -1
	for s, n := range expertNames {
		if w.Has(fmt.Sprintf("%sexperts.0.%s", prefix, n[0])) {
			style = s
		}
	}
	if style < 0 {
		return fmt.Errorf("checkpoint has no expert weights under %q (looked for experts.gate_up_proj, experts.0.gate_proj.weight, experts.0.w1.weight)", prefix)
	}
	n := expertNames[style]
	var gateUp, down []*tensor.Host
	for e := 0; e < E; e++ {
		ep := fmt.Sprintf("%sexperts.%d.", prefix, e)
		if e < lo || e >= hi { // another rank's expert
			for _, t := range n {
				w.used[ep+t] = true
			}
			continue
		}
		g, err := w.host(ep+n[0], I, hidden)
		if err != nil {
			return err
		}
		u, err := w.host(ep+n[1], I, hidden)
		if err != nil {
			return err
		}
		d, err := w.host(ep+n[2], hidden, I)
		if err != nil {
			return err
		}
		gateUp = append(gateUp, g, u)
		down = append(down, d)
	}
	if l.GateUp, err = w.stack(prefix+"experts.gate_up_proj", gateUp); err != nil {
		return err
	}
	l.Down, err = w.stack(prefix+"experts.down_proj", down)
	return err
}

// routerOf is the softmax router the Mixtral-like families share.
func routerOf(cfg *Config, normTopK bool) moe.RouterConfig {
	return moe.RouterConfig{NumExperts: cfg.NumExperts, TopK: cfg.NumExpertsPerTok, Scoring: moe.Softmax, NormTopK: normTopK}
}

// qwenSparse reports whether layer i is an MoE layer under Qwen's rules
// (mlp_only_layers, decoder_sparse_step); OLMoE and Mixtral use them too
// with their defaults (every layer sparse).
func qwenSparse(cfg *Config, i int) bool {
	for _, d := range cfg.MLPOnlyLayers {
		if d == i {
			return false
		}
	}
	step := max(cfg.DecoderSparseStep, 1)
	return cfg.NumExperts > 0 && (i+1)%step == 0
}
