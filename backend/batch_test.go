package backend

import (
	"strings"
	"testing"
)

func TestBatchValidate(t *testing.T) {
	ok := func() *Batch {
		return &Batch{Tokens: []int32{7, 8, 9}, Positions: []int32{4, 5, 0},
			Seqs: []SeqSpan{{ID: 1, Offset: 0, Len: 2, Past: 4}, {ID: 2, Offset: 2, Len: 1}}}
	}
	if err := ok().Validate(); err != nil {
		t.Fatalf("valid batch: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(b *Batch)
		want string
	}{
		{"no tokens", func(b *Batch) { *b = Batch{} }, "no tokens"},
		{"positions", func(b *Batch) { b.Positions = b.Positions[:2] }, "positions"},
		{"gap", func(b *Batch) { b.Seqs[1].Offset = 3 }, "does not continue"},
		{"past the rows", func(b *Batch) { b.Seqs[1].Len = 5 }, "runs past"},
		{"negative past", func(b *Batch) { b.Seqs[1].Past = -1; b.Positions[2] = -1 }, "past -1"},
		{"position", func(b *Batch) { b.Positions[1] = 9 }, "position 9"},
		{"cover", func(b *Batch) { b.Seqs = b.Seqs[:1] }, "cover 2 of 3"},
		{"block", func(b *Batch) { b.Seqs[0].Blocks = []int32{3, -2} }, "negative block"},
		{"context parallel", func(b *Batch) { b.Seqs[0].ContextParallel = -1 }, "context-parallel"},
		{"logit row", func(b *Batch) { b.LogitRows = []int{3} }, "logit row 3"},
	} {
		b := ok()
		tc.mod(b)
		if err := b.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
