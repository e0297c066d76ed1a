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
		{"feed length", func(b *Batch) { b.Feed = []int32{-1, 0} }, "2 feed rows for 3 tokens"},
		{"feed row", func(b *Batch) { b.Feed = []int32{-1, -2, 0} }, "fed from pick -2"},
	} {
		b := ok()
		tc.mod(b)
		if err := b.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

// TestBatchFed: Fed reports a row taking its token from the device, and a
// batch of fed rows is valid; RunStep refuses it on a backend that cannot
// resolve them.
func TestBatchFed(t *testing.T) {
	b := &Batch{Tokens: []int32{0, 5}, Positions: []int32{3, 0}, Seqs: []SeqSpan{{ID: 1, Len: 1, Past: 3}, {ID: 2, Offset: 1, Len: 1}}}
	for _, c := range []struct {
		feed []int32
		want bool
	}{{nil, false}, {[]int32{-1, -1}, false}, {[]int32{0, -1}, true}, {[]int32{-1, 3}, true}} {
		b.Feed = c.feed
		if got := b.Fed(); got != c.want {
			t.Errorf("feed %v: Fed %v, want %v", c.feed, got, c.want)
		}
		if err := b.Validate(); err != nil {
			t.Errorf("feed %v: %v", c.feed, err)
		}
	}
	b.Feed = []int32{0, -1}
	ran := false
	if _, err := RunStep(nil, b, func() (Tensor, error) { ran = true; return nil, nil }); err == nil || ran {
		t.Errorf("RunStep of a fed batch without a StepGrapher: error %v, forward ran %v", err, ran)
	}
}
