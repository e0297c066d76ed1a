package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
)

// history is the test's own copy of every (sequence, layer) KV history.
type history map[[2]uint64]*struct{ k, v []float32 }

func (h history) get(id uint64, layer int) *struct{ k, v []float32 } {
	key := [2]uint64{id, uint64(layer)}
	if h[key] == nil {
		h[key] = &struct{ k, v []float32 }{}
	}
	return h[key]
}

// batchOf lays spans end to end; spans give ID, Len and Past.
func batchOf(r *rand.Rand, spans ...backend.SeqSpan) *backend.Batch {
	b := &backend.Batch{}
	for _, s := range spans {
		s.Offset = len(b.Tokens)
		for j := 0; j < s.Len; j++ {
			b.Tokens = append(b.Tokens, int32(r.IntN(1000)))
			b.Positions = append(b.Positions, int32(s.Past+j))
		}
		b.Seqs = append(b.Seqs, s)
	}
	return b
}

// TestAttention runs three sequences through chunked prefill, mixed steps and
// decode on two layers, checking every step against attention.Causal called
// directly on the sequence's full history kept by the test.
func TestAttention(t *testing.T) {
	type span = backend.SeqSpan
	steps := [][]span{
		{{ID: 10, Len: 5}, {ID: 20, Len: 3}, {ID: 30, Len: 4}},                            // prefill, first chunks
		{{ID: 20, Len: 4, Past: 3}, {ID: 10, Len: 1, Past: 5}, {ID: 30, Len: 2, Past: 4}}, // chunk, decode, chunk
		{{ID: 10, Len: 1, Past: 6}, {ID: 20, Len: 1, Past: 7}, {ID: 30, Len: 1, Past: 6}}, // decode
		{{ID: 30, Len: 3, Past: 7}},                             // one sequence alone
		{{ID: 10, Len: 1, Past: 7}, {ID: 30, Len: 1, Past: 10}}, // decode after it
	}
	for _, c := range []struct {
		name                 string
		H, KV, D, Dv, window int
		sinks                bool
	}{
		{"mha", 2, 2, 8, 8, 0, false},
		{"gqa_dv", 4, 2, 8, 6, 0, false},
		{"window_sinks", 6, 3, 4, 4, 3, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRand(t)
			be := New(Options{})
			hist := history{}
			var sinks *Tensor
			var sinkVals []float32
			if c.sinks {
				sinks = FromFloat32([]int{c.H}, randVec(r, c.H, 2))
				sinkVals = sinks.Data()
			}
			for si, spans := range steps {
				b := batchOf(r, spans...)
				T := len(b.Tokens)
				for layer := 0; layer < 2; layer++ {
					p := &backend.AttnParams{Layer: layer, NumHeads: c.H, NumKVHeads: c.KV, HeadDim: c.D, VHeadDim: c.Dv,
						Scale: float32(1 / math.Sqrt(float64(c.D))), Window: c.window}
					if sinks != nil {
						p.Sinks = sinks
					}
					q, k, v := randT(r, T, c.H*c.D), randT(r, T, c.KV*c.D), randT(r, T, c.KV*c.Dv)
					got := be.Attention(q, k, v, b, p)
					checkShape(t, "attention", got, T, c.H*c.Dv)
					ap := &attention.Params{NumHeads: c.H, NumKVHeads: c.KV, HeadDim: c.D, VHeadDim: c.Dv,
						Scale: p.Scale, Window: c.window, Sinks: sinkVals}
					want := make([]float32, T*c.H*c.Dv)
					for _, s := range b.Seqs {
						h := hist.get(s.ID, layer)
						h.k = append(h.k, k.Data()[s.Offset*c.KV*c.D:(s.Offset+s.Len)*c.KV*c.D]...)
						h.v = append(h.v, v.Data()[s.Offset*c.KV*c.Dv:(s.Offset+s.Len)*c.KV*c.Dv]...)
						attention.Causal(want[s.Offset*c.H*c.Dv:(s.Offset+s.Len)*c.H*c.Dv],
							q.Data()[s.Offset*c.H*c.D:(s.Offset+s.Len)*c.H*c.D], h.k, h.v, s.Len, s.Past, ap)
						if n := be.cachedTokens(s.ID, layer); n != s.Past+s.Len {
							t.Fatalf("step %d: sequence %d layer %d caches %d tokens, want %d", si, s.ID, layer, n, s.Past+s.Len)
						}
					}
					checkClose(t, fmt.Sprintf("step %d layer %d", si, layer), data(t, got), f64(want), 0)
				}
			}
		})
	}
}

// TestAttentionRollbackAndFree resubmits a sequence from an earlier Past
// (its later cache entries are replaced) and frees sequences.
func TestAttentionRollbackAndFree(t *testing.T) {
	r := newRand(t)
	be := New(Options{})
	const H, D = 2, 4
	p := &backend.AttnParams{NumHeads: H, NumKVHeads: H, HeadDim: D, VHeadDim: D, Scale: 0.5}
	ap := &attention.Params{NumHeads: H, NumKVHeads: H, HeadDim: D, VHeadDim: D, Scale: 0.5}
	b := batchOf(r, backend.SeqSpan{ID: 1, Len: 6}, backend.SeqSpan{ID: 2, Len: 2})
	k, v := randT(r, 8, H*D), randT(r, 8, H*D)
	be.Attention(randT(r, 8, H*D), k, v, b, p)

	// Roll sequence 1 back to 3 tokens and append 2 new ones.
	b2 := batchOf(r, backend.SeqSpan{ID: 1, Len: 2, Past: 3})
	q2, k2, v2 := randT(r, 2, H*D), randT(r, 2, H*D), randT(r, 2, H*D)
	got := be.Attention(q2, k2, v2, b2, p)
	hk := append(slices.Clone(k.Data()[:3*H*D]), k2.Data()...)
	hv := append(slices.Clone(v.Data()[:3*H*D]), v2.Data()...)
	want := make([]float32, 2*H*D)
	attention.Causal(want, q2.Data(), hk, hv, 2, 3, ap)
	checkClose(t, "after rollback", data(t, got), f64(want), 0)
	if n := be.cachedTokens(1, 0); n != 5 {
		t.Fatalf("sequence 1 caches %d tokens after rollback, want 5", n)
	}

	be.FreeSequence(1)
	if n := be.cachedTokens(1, 0); n != 0 {
		t.Fatalf("sequence 1 caches %d tokens after FreeSequence, want 0", n)
	}
	if n := be.cachedTokens(2, 0); n != 2 {
		t.Fatalf("sequence 2 caches %d tokens after freeing 1, want 2", n)
	}
	mustPanic(t, "cpu.Attention: sequence 1 layer 0: cache holds 0 tokens", func() {
		be.Attention(randT(r, 1, H*D), randT(r, 1, H*D), randT(r, 1, H*D), batchOf(r, backend.SeqSpan{ID: 1, Len: 1, Past: 4}), p)
	})
	mustPanic(t, "cpu.Attention: sequence 2 appears twice", func() {
		be.Attention(randT(r, 2, H*D), randT(r, 2, H*D), randT(r, 2, H*D),
			batchOf(r, backend.SeqSpan{ID: 2, Len: 1, Past: 2}, backend.SeqSpan{ID: 2, Len: 1, Past: 3}), p)
	})
	mustPanic(t, "cpu.Attention: q [1 8], k [2 8]", func() {
		be.Attention(randT(r, 1, H*D), randT(r, 2, H*D), randT(r, 1, H*D), batchOf(r, backend.SeqSpan{ID: 3, Len: 1}), p)
	})
	mustPanic(t, "cpu.Attention: k has shape [1 6], want 8 columns", func() {
		be.Attention(randT(r, 1, H*D), randT(r, 1, 6), randT(r, 1, H*D), batchOf(r, backend.SeqSpan{ID: 3, Len: 1}), p)
	})
}

// TestAttentionValuesInKeys: a layer whose values are its keys' first
// columns gives the same outputs with AttnParams.ValuesInKeys (values not
// cached) as with the values cached apart, through a prompt and decode
// steps on the paged and the unpaged cache; more than one KV head is an
// error.
func TestAttentionValuesInKeys(t *testing.T) {
	const H, D, Dv = 4, 12, 8
	for _, paged := range []bool{false, true} {
		t.Run(fmt.Sprintf("paged=%v", paged), func(t *testing.T) {
			r := newRand(t)
			outs := map[bool][][]float32{}
			for _, vk := range []bool{false, true} {
				r2 := rand.New(rand.NewPCG(7, 8)) // the same inputs for both
				be := New(Options{})
				var blocks []int32
				if paged {
					if err := be.InitKV(4, 16); err != nil {
						t.Fatal(err)
					}
					blocks = []int32{9, 3, 14, 0, 5}
				}
				p := backend.AttnParams{Layer: 1, NumHeads: H, NumKVHeads: 1, HeadDim: D, VHeadDim: Dv, Scale: 0.3,
					ValuesInKeys: vk}
				past := 0
				for _, n := range []int{7, 1, 1, 3} {
					b := batchOf(r, backend.SeqSpan{ID: 4, Len: n, Past: past, Blocks: blocks})
					q, k := randVec(r2, n*H*D, 1), randVec(r2, n*D, 1)
					v := make([]float32, n*Dv)
					for j := range n {
						copy(v[j*Dv:(j+1)*Dv], k[j*D:])
					}
					outs[vk] = append(outs[vk], data(t, be.Attention(FromFloat32([]int{n, H * D}, q),
						FromFloat32([]int{n, D}, k), FromFloat32([]int{n, Dv}, v), b, &p)))
					past += n
				}
			}
			for i := range outs[false] {
				if !slices.Equal(outs[false][i], outs[true][i]) {
					t.Fatalf("step %d: values in keys differ from values cached apart", i)
				}
			}
		})
	}
	bad := backend.AttnParams{Layer: 0, NumHeads: 4, NumKVHeads: 2, HeadDim: 8, VHeadDim: 8, Scale: 1, ValuesInKeys: true}
	be := New(Options{})
	r := newRand(t)
	b := batchOf(r, backend.SeqSpan{ID: 1, Len: 1})
	mustPanic(t, "values in keys need one KV head", func() {
		be.Attention(FromFloat32([]int{1, 32}, randVec(r, 32, 1)), FromFloat32([]int{1, 16}, randVec(r, 16, 1)),
			FromFloat32([]int{1, 16}, randVec(r, 16, 1)), b, &bad)
	})
}
