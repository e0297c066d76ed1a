package cuda

import (
	"context"
	"fmt"
	"github.com/mkserve/mkserve/kernels"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
)

// TestRingSpansMatchCPU: a context-parallel span (SeqSpan.ContextParallel =
// R) on the fast profile runs the ring kernel over R emulated ranks; its
// rows, and the rows of an ordinary span in the same batch, equal the CPU
// backend's plain attention. Cases cover R = 2, 4, 8, spans not divisible
// by R, cached history before the span (chunked prefill), GQA 1 and 4,
// a sliding window with sinks, and MLA head dims; paged and unpaged KV.
func TestRingSpansMatchCPU(t *testing.T) {
	cases := []struct {
		R, H, KV, D, Dv, window int
		sinks, paged            bool
		past, L                 int
	}{
		{R: 4, H: 8, KV: 2, D: 64, Dv: 64, paged: true, past: 100, L: 300},
		{R: 2, H: 4, KV: 4, D: 128, Dv: 128, paged: true, past: 0, L: 257},
		{R: 8, H: 8, KV: 2, D: 64, Dv: 64, window: 64, sinks: true, paged: true, past: 37, L: 333},
		{R: 4, H: 4, KV: 4, D: 192, Dv: 128, paged: false, past: 50, L: 210},
		{R: 3, H: 8, KV: 2, D: 64, Dv: 64, paged: true, past: 0, L: 61},
	}
	for _, c := range cases {
		name := fmt.Sprintf("r%d_h%d_kv%d_d%d_dv%d_w%d_past%d_l%d", c.R, c.H, c.KV, c.D, c.Dv, c.window, c.past, c.L)
		t.Run(name, func(t *testing.T) {
			be := fastBackend(t, false)
			cb := cpu.New(cpu.Options{})
			const bs = 16
			for _, x := range []backend.Backend{be, cb} {
				if err := x.InitKV(bs, 256); err != nil {
					t.Fatal(err)
				}
			}
			blocks := func(first, n int) []int32 {
				if !c.paged {
					return nil
				}
				v := make([]int32, (n+bs-1)/bs)
				for i := range v {
					v[i] = int32(first + 2*i) // scattered
				}
				return v
			}
			g := newGen(uint64(c.R*1000+c.L), false)
			p := &backend.AttnParams{Layer: 0, NumHeads: c.H, NumKVHeads: c.KV, HeadDim: c.D, VHeadDim: c.Dv,
				Scale: 0.125, Window: c.window}
			var sinksH = g.f32(1, c.H)
			run := func(spans []backend.SeqSpan) float64 {
				b := attnBatch(spans)
				T := len(b.Tokens)
				q, k, v := g.f32(1, T, c.H*c.D), g.kv(1, T, c.KV*c.D), g.kv(1, T, c.KV*c.Dv)
				pg, pc := *p, *p
				if c.sinks {
					pg.Sinks, pc.Sinks = W(t, be, sinksH), W(t, cb, sinksH)
				}
				got := be.ToHost(be.Attention(W(t, be, q), W(t, be, k), W(t, be, v), b, &pg))
				plain := attnBatch(spans)
				for i := range plain.Seqs {
					plain.Seqs[i].ContextParallel = 0
				}
				want := cb.ToHost(cb.Attention(W(t, cb, q), W(t, cb, k), W(t, cb, v), plain, &pc))
				return relL2(got, want)
			}
			if c.past > 0 {
				if e := run([]backend.SeqSpan{{ID: 2, Len: c.past, Blocks: blocks(1, c.past+c.L)}}); !(e <= 1e-2) {
					t.Fatalf("history chunk: relative L2 %.3g", e)
				}
			}
			// Both kinds of receive buffers, whichever
			// kernels.RingPreferGather picks.
			defer func() { ringPreferGather = kernels.RingPreferGather }()
			for _, gather := range []bool{true, false} {
				ringPreferGather = func(int, int) bool { return gather }
				e := run([]backend.SeqSpan{
					{ID: 1, Len: 5, Blocks: blocks(200, 5)},
					{ID: 2, Len: c.L, Past: c.past, Blocks: blocks(1, c.past+c.L), ContextParallel: c.R},
				})
				t.Logf("RING %s gather=%v: relative L2 to the CPU's plain attention %.3g", name, gather, e)
				if !(e <= 1e-2) {
					t.Errorf("gather=%v: relative L2 %.3g > 1e-2", gather, e)
				}
			}
		})
	}
}

// TestEngineContextParallel: a long prompt served by the engine with
// context parallelism 4 (ring attention over 4 emulated ranks on the GPU,
// fast profile) gives the greedy tokens engine.Greedy gives without it.
func TestEngineContextParallel(t *testing.T) {
	be := fastBackend(t, true)
	l := loadModel(t, "qwen3_moe", be)
	V := l.Config.VocabSize
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32((i*53 + 7) % V)
	}
	const maxTok = 8
	want, err := engine.Greedy(context.Background(), l.Model, be, prompt, engine.GreedyOptions{MaxTokens: maxTok})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(l.Model, be, idText{}, engine.Config{BlockSize: 16, MaxNumSeqs: 4, KVCacheBytes: 16 << 20,
		ContextParallel: 4, ContextParallelMin: 64}, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer stopEngine(e)
	got := generate(t, e, "cp", prompt, maxTok)
	cp := e.Stats().ContextParallelTokens
	t.Logf("CP engine: %v (context-parallel tokens %d), Greedy: %v", got, cp, want)
	if !slices.Equal(got, want) {
		t.Errorf("context-parallel engine %v, Greedy %v", got, want)
	}
	if cp == 0 {
		t.Errorf("no prompt token was prefilled with context parallelism")
	}
}
