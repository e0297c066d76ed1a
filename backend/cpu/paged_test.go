package cpu

import (
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/tensor"
)

// TestPagedMatchesUnpaged runs the same steps through the unpaged cache and
// through a paged pool with scattered, non-contiguous block tables; the
// outputs must be identical — with a float32 pool, and with a bf16 pool
// (Options.KVBF16) given keys and values bf16 holds exactly. Then
// CopyBlocks forks a sequence.
func TestPagedMatchesUnpaged(t *testing.T) {
	for _, bf := range []bool{false, true} {
		t.Run(map[bool]string{false: "float32", true: "bf16"}[bf], func(t *testing.T) { testPagedMatchesUnpaged(t, bf) })
	}
}

// bf16T is x with its values rounded to bf16.
func bf16T(x *Tensor) *Tensor {
	for i, v := range x.data {
		x.data[i] = tensor.BF16ToF32(tensor.F32ToBF16(v))
	}
	return x
}

func testPagedMatchesUnpaged(t *testing.T, bf bool) {
	r := newRand(t)
	const H, KV, D, Dv, bs = 4, 2, 8, 6, 4
	p := &backend.AttnParams{Layer: 1, NumHeads: H, NumKVHeads: KV, HeadDim: D, VHeadDim: Dv, Scale: 0.3}
	plain, paged := New(Options{}), New(Options{KVBF16: bf})
	if err := paged.InitKV(bs, 32); err != nil {
		t.Fatal(err)
	}
	kvT := func(rows, cols int) *Tensor {
		x := randT(r, rows, cols)
		if bf {
			x = bf16T(x)
		}
		return x
	}
	// Block tables: sequence 1 takes blocks 7, 2, 30, 11; sequence 2 takes 0, 19, 5.
	tables := map[uint64][]int32{1: {7, 2, 30, 11}, 2: {0, 19, 5}}
	type span = backend.SeqSpan
	steps := [][]span{
		{{ID: 1, Len: 6}, {ID: 2, Len: 3}},
		{{ID: 2, Len: 5, Past: 3}, {ID: 1, Len: 1, Past: 6}},
		{{ID: 1, Len: 1, Past: 7}, {ID: 2, Len: 1, Past: 8}},
		{{ID: 1, Len: 5, Past: 8}},
	}
	for si, st := range steps {
		b := batchOf(r, st...)
		T := len(b.Tokens)
		q, k, v := randT(r, T, H*D), kvT(T, KV*D), kvT(T, KV*Dv)
		want := data(t, plain.Attention(q, k, v, b, p))
		for i := range b.Seqs {
			b.Seqs[i].Blocks = tables[b.Seqs[i].ID]
		}
		got := data(t, paged.Attention(q, k, v, b, p))
		if d := maxRelDiff(got, want); d != 0 {
			t.Fatalf("step %d: paged differs from unpaged by %g", si, d)
		}
	}
	// Fork sequence 1 (13 tokens: blocks 7, 2, 30 full, 11 with one row)
	// into sequence 3 sharing the full blocks and a copy of the last one.
	paged.CopyBlocks([]int32{11}, []int32{25})
	fork := []int32{7, 2, 30, 25}
	b := batchOf(r, span{ID: 1, Len: 1, Past: 13})
	q, k, v := randT(r, 1, H*D), kvT(1, KV*D), kvT(1, KV*Dv)
	b.Seqs[0].Blocks = tables[1]
	want := data(t, paged.Attention(q, k, v, b, p))
	b.Seqs[0].ID, b.Seqs[0].Blocks = 3, fork
	got := data(t, paged.Attention(q, k, v, b, p))
	if d := maxRelDiff(got, want); d != 0 {
		t.Fatalf("forked sequence differs by %g", d)
	}
	mustPanic(t, "outside the pool", func() { paged.CopyBlocks([]int32{40}, []int32{1}) })
	b.Seqs[0].Blocks = []int32{7}
	mustPanic(t, "block table", func() { paged.Attention(q, k, v, b, p) })
	if err := paged.InitKV(0, 4); err == nil {
		t.Error("InitKV accepted a zero block size")
	}
}
