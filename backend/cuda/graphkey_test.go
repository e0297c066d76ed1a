package cuda

import (
	"slices"
	"testing"

	"github.com/mkserve/mkserve/backend"
)

// TestPadRows: row counts pad to 1, 2, 4, then multiples of 8, never fewer
// rows and never more than 7 extra; 256 stays 256 (graphMaxRows).
func TestPadRows(t *testing.T) {
	for _, c := range []struct{ in, want int }{{1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8}, {8, 8}, {9, 16}, {17, 24}, {255, 256}, {256, 256}} {
		if got := padRows(c.in); got != c.want {
			t.Errorf("padRows(%d) = %d, want %d", c.in, got, c.want)
		}
	}
	sizes := map[int]bool{}
	for T := 1; T <= graphMaxRows; T++ {
		p := padRows(T)
		if p < T || p-T > 7 || p > graphMaxRows {
			t.Fatalf("padRows(%d) = %d", T, p)
		}
		sizes[p] = true
	}
	if len(sizes) > 35 { // 1, 2, 4 and 8, 16, ..., 256
		t.Errorf("%d graph row counts for batches up to %d", len(sizes), graphMaxRows)
	}
}

// TestPadBatch: padding appends valid one-token spans that ask for every
// row's logits, and restore gives the caller its batch back unchanged.
func TestPadBatch(t *testing.T) {
	b := &backend.Batch{Tokens: []int32{5, 6, 7}, Positions: []int32{10, 3, 8}, LogitRows: []int{0, 1, 2},
		Seqs: []backend.SeqSpan{{ID: 1, Offset: 0, Len: 1, Past: 10, Blocks: []int32{4}},
			{ID: 2, Offset: 1, Len: 1, Past: 3, Blocks: []int32{5}}, {ID: 3, Offset: 2, Len: 1, Past: 8, Blocks: []int32{6}}}}
	want := &backend.Batch{Tokens: slices.Clone(b.Tokens), Positions: slices.Clone(b.Positions), LogitRows: slices.Clone(b.LogitRows),
		Seqs: slices.Clone(b.Seqs)}
	restore := padBatch(b, 8)
	if len(b.Tokens) != 8 || len(b.Seqs) != 8 || b.LogitRows != nil {
		t.Fatalf("padded: %d tokens, %d spans, logit rows %v", len(b.Tokens), len(b.Seqs), b.LogitRows)
	}
	if err := b.Validate(); err != nil {
		t.Fatalf("padded batch invalid: %v", err)
	}
	seen := map[uint64]bool{}
	for _, s := range b.Seqs {
		if seen[s.ID] {
			t.Fatalf("ID %d twice", s.ID)
		}
		seen[s.ID] = true
	}
	restore()
	if !slices.Equal(b.Tokens, want.Tokens) || !slices.Equal(b.Positions, want.Positions) ||
		!slices.Equal(b.LogitRows, want.LogitRows) || len(b.Seqs) != 3 || b.Seqs[2].ID != 3 {
		t.Errorf("restored %+v, want %+v", b, want)
	}
}
