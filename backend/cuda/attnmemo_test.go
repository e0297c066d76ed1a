package cuda

import (
	"slices"
	"testing"

	"github.com/mkserve/mkserve/backend"
)

// TestPagedSignature: the attention group memo's key changes with every
// input the paged group depends on, including block ids changed in place
// (the engine's copy-on-write edits a table without reallocating it), and
// is nil when a span has no block table (the private cache keeps per-layer
// state) or no pool exists. Runs without a GPU.
func TestPagedSignature(t *testing.T) {
	be := &Backend{paged: &pagedKV{blockSize: 16, numBlocks: 64}}
	batch := func() *backend.Batch {
		return &backend.Batch{Tokens: []int32{5, 6}, Positions: []int32{20, 3}, Seqs: []backend.SeqSpan{
			{ID: 1, Offset: 0, Len: 1, Past: 20, Blocks: []int32{4, 9}},
			{ID: 2, Offset: 1, Len: 1, Past: 3, Blocks: []int32{7}},
		}}
	}
	base := slices.Clone(be.pagedSignature(batch(), true))
	if base == nil {
		t.Fatal("nil signature for an all-paged batch")
	}
	if got := be.pagedSignature(batch(), true); !slices.Equal(got, base) {
		t.Fatal("the same inputs gave another signature")
	}
	for _, c := range []struct {
		name string
		edit func(b *backend.Batch) (ring bool)
	}{
		{"block id edited in place", func(b *backend.Batch) bool { b.Seqs[0].Blocks[1] = 10; return true }},
		{"table grown", func(b *backend.Batch) bool { b.Seqs[1].Blocks = append(b.Seqs[1].Blocks, 8); return true }},
		{"past", func(b *backend.Batch) bool { b.Seqs[0].Past++; return true }},
		{"offset", func(b *backend.Batch) bool { b.Seqs[0].Offset, b.Seqs[1].Offset = 1, 0; return true }},
		{"length", func(b *backend.Batch) bool { b.Seqs[1].Len = 2; b.Tokens = append(b.Tokens, 1); return true }},
		{"id", func(b *backend.Batch) bool { b.Seqs[1].ID = 3; return true }},
		{"context parallel", func(b *backend.Batch) bool { b.Seqs[0].ContextParallel = 2; return true }},
		{"ring flag", func(*backend.Batch) bool { return false }},
		{"one span fewer", func(b *backend.Batch) bool { b.Seqs = b.Seqs[:1]; b.Tokens = b.Tokens[:1]; return true }},
	} {
		b := batch()
		ring := c.edit(b)
		if got := be.pagedSignature(b, ring); got == nil || slices.Equal(got, base) {
			t.Errorf("%s: signature unchanged (%v)", c.name, got)
		}
	}
	be.gr.padFrom.Store(1)
	if got := be.pagedSignature(batch(), true); slices.Equal(got, base) {
		t.Error("padding rows from row 1: signature unchanged")
	}
	be.gr.padFrom.Store(0)
	be.paged = &pagedKV{blockSize: 16, numBlocks: 65}
	if got := be.pagedSignature(batch(), true); slices.Equal(got, base) {
		t.Error("another pool size: signature unchanged")
	}
	b := batch()
	b.Seqs[1].Blocks = nil
	if got := be.pagedSignature(b, true); got != nil {
		t.Errorf("a span without a block table: signature %v, want nil", got)
	}
	be.paged = nil
	if got := be.pagedSignature(batch(), true); got != nil {
		t.Errorf("no pool: signature %v, want nil", got)
	}
}

// BenchmarkAttentionHostChecks: the host-side checks Attention makes when
// it cannot reuse the graph step's group (the step's first layer, and
// every layer of an eager step): Validate, the paged signature and its
// comparison, at 256 rows of 1024-token contexts (16-token blocks). Inside a
// graph step the other layers skip them (attnMemo.stepBatch). Runs without
// a GPU.
func BenchmarkAttentionHostChecks(b *testing.B) {
	be := &Backend{paged: &pagedKV{blockSize: 16, numBlocks: 1 << 16}}
	bt := &backend.Batch{}
	for i := range 256 {
		bl := make([]int32, 65)
		for j := range bl {
			bl[j] = int32(i*65 + j)
		}
		bt.Seqs = append(bt.Seqs, backend.SeqSpan{ID: uint64(i), Offset: i, Len: 1, Past: 1024, Blocks: bl})
		bt.Tokens = append(bt.Tokens, 1)
		bt.Positions = append(bt.Positions, 1024)
	}
	sig := slices.Clone(be.pagedSignature(bt, true))
	b.ResetTimer()
	for range b.N {
		if err := bt.Validate(); err != nil {
			b.Fatal(err)
		}
		if !slices.Equal(be.pagedSignature(bt, true), sig) {
			b.Fatal("the signature changed")
		}
	}
}
