package cuda

import (
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/tensor"
)

// kv is an F32 host tensor of bf16-exact random values in [-s, s): keys and
// values as the bf16 KV cache holds them, so that the CPU reference attends
// over the same numbers.
func (g *gen) kv(s float32, shape ...int) *tensor.Host {
	return tensor.FromFloat32("t", shape, g.vals(tensor.NumElements(shape), s, true))
}

// TestAttentionMetaOnce: the layers of one step share one metadata upload
// per pool, a changed batch uploads again, and every layer's output matches
// the CPU backend.
func TestAttentionMetaOnce(t *testing.T) {
	be := gpuBackend(t)
	if err := be.InitKV(16, 64); err != nil {
		t.Fatal(err)
	}
	g := newGen(0xdec0de, false)
	H, KV, D := 8, 2, 32
	const layers = 4
	cb := cpu.New(cpu.Options{})
	if err := cb.InitKV(16, 64); err != nil {
		t.Fatal(err)
	}
	steps := [][]backend.SeqSpan{
		{{ID: 1, Len: 20, Blocks: []int32{7, 3}}, {ID: 2, Len: 5, Blocks: []int32{40}}},
		{{ID: 1, Len: 1, Past: 20, Blocks: []int32{7, 3}}, {ID: 2, Len: 1, Past: 5, Blocks: []int32{40}}},
	}
	for si, s := range steps {
		b := attnBatch(s)
		T := len(b.Tokens)
		before := be.paged.meta.uploads
		for l := range layers {
			p := &backend.AttnParams{Layer: l, NumHeads: H, NumKVHeads: KV, HeadDim: D, VHeadDim: D, Scale: 0.2}
			q, k, v := g.f32(1, T, H*D), g.kv(1, T, KV*D), g.kv(1, T, KV*D)
			got := be.ToHost(be.Attention(W(t, be, q), W(t, be, k), W(t, be, v), b, p))
			want := cb.ToHost(cb.Attention(W(t, cb, q), W(t, cb, k), W(t, cb, v), b, p))
			if e := relL2(got, want); !(e <= 5e-5) {
				t.Errorf("step %d layer %d: relative L2 %.3g > 5e-5", si, l, e)
			}
		}
		if n := be.paged.meta.uploads - before; n != 1 {
			t.Errorf("step %d: %d metadata uploads for %d layers, want 1", si, n, layers)
		}
	}
}
