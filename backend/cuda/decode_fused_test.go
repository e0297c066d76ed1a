package cuda

import (
	"testing"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/tensor"
)

// TestNormRoPEAttention: the fused decode attention (q/k norms, RoPE, KV
// write and attention in one kernel) against the same ops one by one on
// the same fast-profile backend (a second layer, so a second cache) and
// against the CPU backend: a prefill step (not fused: ok false), then three
// decode steps (fused: ok must be true), each reading the keys the fused
// kernel stored the step before. Fresh random inputs; shapes of Qwen3 (per-
// head norms, head dim 128) and of gpt-oss (no norms, head dim 64, YaRN,
// sinks, a sliding window).
func TestNormRoPEAttention(t *testing.T) {
	gpuBackend(t) // skips without a GPU
	off := false
	be, err := New(Options{SplitActivations: &off})
	if err != nil {
		t.Fatal(err)
	}
	yarn := &attention.RoPE{Dim: 64, Theta: 150000, Scaling: attention.RoPEScaling{Type: "yarn", Factor: 32,
		OriginalMaxPos: 4096, BetaFast: 32, BetaSlow: 1}}
	cases := []struct {
		name          string
		H, KV, D      int
		norm, sinks   bool
		window        int
		rope          *attention.RoPE
		layerA, layer int
	}{
		{"qwen3_d128_norms", 8, 2, 128, true, false, 0, &attention.RoPE{Dim: 128, Theta: 1e6}, 10, 11},
		{"gptoss_d64_yarn_sinks_window", 8, 1, 64, false, true, 9, yarn, 12, 13},
		{"d128_partial_interleaved", 16, 1, 128, true, false, 0,
			&attention.RoPE{Dim: 64, Theta: 10000, Style: attention.Interleaved}, 14, 15},
	}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cb := cpu.New(cpu.Options{})
			for _, b := range []backend.Backend{be, cb} {
				if err := b.InitKV(16, 64); err != nil {
					t.Fatal(err)
				}
			}
			g := newGen(uint64(0xdec0de+ci), true)
			var qw, kw, sinks []float32
			if c.norm {
				qw, kw = g.vals(c.D, 0.5, false), g.vals(c.D, 0.5, false)
				for i := range qw {
					qw[i] += 1
					kw[i] += 1
				}
			}
			p := func(layer int) *backend.AttnParams {
				return &backend.AttnParams{Layer: layer, NumHeads: c.H, NumKVHeads: c.KV, HeadDim: c.D, VHeadDim: c.D,
					Scale: 0.1, Window: c.window}
			}
			if c.sinks {
				sinks = g.vals(c.H, 2, false)
			}
			A := []int32{17, 3, 29, 8, 40, 35}
			B := []int32{5, 38, 2, 14, 27, 9}
			C := []int32{33, 1, 60, 50, 44, 21}
			steps := [][]backend.SeqSpan{
				{{ID: 1, Len: 20, Past: 0, Blocks: A[:2]}, {ID: 2, Len: 3, Past: 0, Blocks: B[:1]},
					{ID: 3, Len: 1, Past: 0, Blocks: C[:1]}},
				{{ID: 1, Len: 1, Past: 20, Blocks: A[:2]}, {ID: 2, Len: 1, Past: 3, Blocks: B[:1]},
					{ID: 3, Len: 1, Past: 1, Blocks: C[:1]}},
				{{ID: 3, Len: 1, Past: 2, Blocks: C[:1]}, {ID: 1, Len: 1, Past: 21, Blocks: A[:2]}},
				{{ID: 2, Len: 1, Past: 4, Blocks: B[:1]}, {ID: 1, Len: 1, Past: 22, Blocks: A[:2]},
					{ID: 3, Len: 1, Past: 3, Blocks: C[:1]}},
			}
			for si, s := range steps {
				b := attnBatch(s)
				T := len(b.Tokens)
				qh, kh, vh := g.f32(1, T, c.H*c.D), g.f32(1, T, c.KV*c.D), g.f32(1, T, c.KV*c.D)
				run := func(bk backend.Backend, layer int, fused bool) (backend.Tensor, bool) {
					q, k, v := W(t, bk, qh), W(t, bk, kh), W(t, bk, vh)
					var qwt, kwt backend.Tensor
					if c.norm {
						qwt, kwt = W(t, bk, tensor.FromFloat32("qn", []int{c.D}, qw)), W(t, bk, tensor.FromFloat32("kn", []int{c.D}, kw))
					}
					pp := p(layer)
					if sinks != nil {
						pp.Sinks = W(t, bk, tensor.FromFloat32("sinks", []int{c.H}, sinks))
					}
					if fused {
						return bk.(*Backend).NormRoPEAttention(q, k, v, qwt, kwt, 1e-6, c.rope, b, pp)
					}
					q, k = backend.NormRoPE(bk, q, k, qwt, kwt, 1e-6, c.H, c.KV, c.D, c.rope, b.Positions)
					return bk.Attention(q, k, v, b, pp), true
				}
				decode := si > 0
				got, ok := run(be, c.layerA, true)
				if ok != decode {
					t.Fatalf("step %d: NormRoPEAttention ok = %v, want %v (decode step)", si, ok, decode)
				}
				if !ok {
					got, _ = run(be, c.layerA, false)
				}
				sep, _ := run(be, c.layer, false)
				ref, _ := run(cb, 0, false)
				gh, sh, rh := be.ToHost(got), be.ToHost(sep), cb.ToHost(ref)
				eSep, eCPU := relL2(gh, sh), relL2(gh, rh)
				t.Logf("step %d (%d rows): fused vs separate %.3g, vs CPU %.3g", si, T, eSep, eCPU)
				if !(eSep <= 5e-3) || !(eCPU <= 1e-2) {
					t.Fatalf("step %d: relative L2 %.3g against the separate ops (≤ 5e-3), %.3g against the CPU (≤ 1e-2)",
						si, eSep, eCPU)
				}
			}
		})
	}
	// Not fused: norms over all heads (OLMoE), a span without a block table.
	b := attnBatch([]backend.SeqSpan{{ID: 7, Len: 1, Past: 0, Blocks: []int32{4}}})
	q, k, v := W(t, be, newGen(1, true).f32(1, 1, 8*128)), W(t, be, newGen(2, true).f32(1, 1, 2*128)),
		W(t, be, newGen(3, true).f32(1, 1, 2*128))
	p := &backend.AttnParams{Layer: 16, NumHeads: 8, NumKVHeads: 2, HeadDim: 128, VHeadDim: 128, Scale: 0.1}
	whole := W(t, be, tensor.FromFloat32("all", []int{8 * 128}, make([]float32, 8*128)))
	rope := &attention.RoPE{Dim: 128, Theta: 1e6}
	if _, ok := be.NormRoPEAttention(q, k, v, whole, nil, 1e-6, rope, b, p); ok {
		t.Error("fused with a norm over all heads")
	}
	bu := attnBatch([]backend.SeqSpan{{ID: 8, Len: 1, Past: 0}})
	if _, ok := be.NormRoPEAttention(q, k, v, nil, nil, 1e-6, rope, bu, p); ok {
		t.Error("fused with a span without a block table")
	}
}
