package cuda

import (
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend"
)

// TestPagedMetaInput: the attention metadata a fast replay computes from a
// batch (graph key of 64 keys, blocks of 16 tokens: stride 4) is the packed
// [slots | rows | pos | table | blocks] of the paged group, tables padded to
// the stride with their last block, a padding row's slot −1 and table block
// 0's; and a batch the graph cannot hold (a position past its keys, a block
// outside the pool, a span without a table) is an error, not a panic. Runs
// without a GPU.
func TestPagedMetaInput(t *testing.T) {
	be := &Backend{paged: &pagedKV{blockSize: 16, numBlocks: 64}}
	be.gr.key = graphKey{rows: 4, keys: 64}
	batch := func() *backend.Batch {
		return &backend.Batch{Tokens: []int32{5, 6, 7, 0}, Positions: []int32{20, 3, 47, 0}, Seqs: []backend.SeqSpan{
			{ID: 1, Offset: 0, Len: 1, Past: 20, Blocks: []int32{4, 9}},
			{ID: 2, Offset: 1, Len: 1, Past: 3, Blocks: []int32{7}},
			{ID: 3, Offset: 2, Len: 1, Past: 47, Blocks: []int32{11, 12, 13}},
			{ID: 4, Offset: 3, Len: 1, Past: 0, Blocks: []int32{2, 3}}, // padding (padFrom 3)
		}}
	}
	be.gr.padFrom.Store(3)
	got, err := be.pagedMetaInput(true)(batch())
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Concat(
		[]int32{9*16 + 4, 7*16 + 3, 13*16 + 15, -1}, // slots
		[]int32{0, 1, 2, 3},                         // rows
		[]int32{20, 3, 47, 0},                       // positions
		[]int32{0, 4, 8, 12},                        // table offsets
		[]int32{4, 9, 9, 9, 7, 7, 7, 7, 11, 12, 13, 13, 2, 2, 2, 2},
	)
	if !slices.Equal(got, want) {
		t.Errorf("metadata\n got %v\nwant %v", got, want)
	}
	for _, c := range []struct {
		name, err string
		edit      func(b *backend.Batch)
	}{
		{"past the key", "beyond the graph's 64 keys", func(b *backend.Batch) { b.Seqs[2].Past = 64; b.Seqs[2].Blocks = []int32{1, 2, 3, 4, 5} }},
		{"block outside the pool", "outside the pool", func(b *backend.Batch) { b.Seqs[0].Blocks[1] = 64 }},
		{"table too short", "the block table has 1", func(b *backend.Batch) { b.Seqs[0].Blocks = b.Seqs[0].Blocks[:1] }},
		{"no table", "no block table", func(b *backend.Batch) { b.Seqs[1].Blocks = nil }},
	} {
		b := batch()
		c.edit(b)
		if _, err := be.pagedMetaInput(true)(b); err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
		}
	}
}

// TestStepInputs: the token and position inputs of a fast replay, and the
// aliasing test that decides at capture whether an op's upload is a field
// of the step's batch. Runs without a GPU.
func TestStepInputs(t *testing.T) {
	be := &Backend{}
	b := &backend.Batch{Tokens: []int32{3, 0, 9}, Positions: []int32{7, 8, 9}}
	if v, err := be.feedInput(10)(b); err != nil || !slices.Equal(v, []int32{3, 0, 9, -1, -1, -1}) {
		t.Errorf("tokens: %v, %v", v, err)
	}
	if _, err := be.feedInput(9)(b); err == nil || !strings.Contains(err.Error(), "ids[2] = 9") {
		t.Errorf("id 9 of 9 rows: error %v", err)
	}
	// Fed rows: their ids come from the latest asynchronous sampling's picks
	// on the device, which must hold that row.
	b.Feed = []int32{-1, 1, -1}
	if _, err := be.feedInput(10)(b); err == nil || !strings.Contains(err.Error(), "the device holds 0") {
		t.Errorf("a fed row without picks: error %v", err)
	}
	be.feed.last = &pending{rows: 2, onDevice: true}
	if v, err := be.feedInput(10)(b); err != nil || !slices.Equal(v, []int32{3, 0, 9, -1, 1, -1}) {
		t.Errorf("fed row 1: %v, %v", v, err)
	}
	b.Feed[1] = 2
	if _, err := be.feedInput(10)(b); err == nil || !strings.Contains(err.Error(), "takes pick 2") {
		t.Errorf("pick 2 of 2: error %v", err)
	}
	be.feed.last.onDevice = false // a synchronous fallback's picks are on the host only
	b.Feed[1] = 0
	if _, err := be.feedInput(10)(b); err == nil {
		t.Error("a fed row whose picks are not on the device: no error")
	}
	b.Feed = nil
	b.Tokens[1] = -1
	if _, err := be.feedInput(10)(b); err == nil {
		t.Error("id -1: no error")
	}
	if v, _ := positionsInput(b); !aliases(v, b.Positions) {
		t.Error("positions are not the batch's")
	}
	for _, c := range []struct {
		name string
		a, b []int32
		want bool
	}{
		{"same slice", b.Tokens, b.Tokens, true},
		{"a copy", slices.Clone(b.Tokens), b.Tokens, false},
		{"a prefix", b.Tokens[:2], b.Tokens, false},
		{"a suffix", b.Tokens[1:], b.Tokens[1:3], true},
		{"empty", nil, nil, false},
	} {
		if got := aliases(c.a, c.b); got != c.want {
			t.Errorf("%s: aliases %v, want %v", c.name, got, c.want)
		}
	}
}

// BenchmarkPagedMetaInput: the host time a fast replay spends on the paged
// attention metadata of a 256-row decode step in a 2048-key graph (blocks
// of 16: 128 table entries a row), the largest part of a fast replay.
func BenchmarkPagedMetaInput(b *testing.B) {
	be := &Backend{paged: &pagedKV{blockSize: 16, numBlocks: 1 << 16}}
	be.gr.key = graphKey{rows: 256, keys: 2048}
	batch := &backend.Batch{}
	for s := range 256 {
		past := 1000 + s
		blocks := make([]int32, (past+16)/16)
		for i := range blocks {
			blocks[i] = int32(s*128 + i)
		}
		batch.Tokens = append(batch.Tokens, int32(s))
		batch.Positions = append(batch.Positions, int32(past))
		batch.Seqs = append(batch.Seqs, backend.SeqSpan{ID: uint64(s), Offset: s, Len: 1, Past: past, Blocks: blocks})
	}
	in := be.pagedMetaInput(true)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := in(batch); err != nil {
			b.Fatal(err)
		}
	}
}
