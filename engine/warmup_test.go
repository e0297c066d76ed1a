package engine_test

import (
	"slices"
	"sync"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
)

// warmRecorder is a CPU backend posing as a backend.GraphWarmer: it records
// the steps that come through GraphStep and runs them eagerly.
type warmRecorder struct {
	*cpu.Backend
	mu    sync.Mutex
	steps []*backend.Batch // copies of the batches GraphStep saw
}

func (w *warmRecorder) GraphStep(b *backend.Batch, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	w.mu.Lock()
	c := *b
	c.Seqs = slices.Clone(b.Seqs)
	w.steps = append(w.steps, &c)
	w.mu.Unlock()
	return f()
}

func (w *warmRecorder) GraphWarmupRows(maxRows int) []int {
	var out []int
	for _, n := range []int{1, 2, 4, 8, 16} {
		if n <= maxRows {
			out = append(out, n)
		}
	}
	return out
}

// TestGraphWarmup: with GraphWarmup on, New runs two one-token decode steps
// of every row count the backend names (valid batches: every row its own
// sequence at position 0 in block 0), and greedy outputs afterwards are
// those of an engine that never warmed up: the warm-up's KV in block 0 is
// overwritten before any sequence reads it.
func TestGraphWarmup(t *testing.T) {
	dir := testModel
	tok, prompts := testPrompts(t, 3, 77, 5, 4)
	run := func(warm bool) ([][]int32, *warmRecorder) {
		be := &warmRecorder{Backend: cpu.New(cpu.Options{})}
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		e, err := engine.New(l.Model, be, tok, engine.Config{BlockSize: 4, MaxNumSeqs: 8, KVCacheBytes: 4 << 20, GraphWarmup: warm},
			engine.Options{Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown(t, e)
		be.mu.Lock()
		warmSteps := len(be.steps)
		be.mu.Unlock()
		if warm != (warmSteps > 0) {
			t.Fatalf("warm-up %v: %d steps before serving", warm, warmSteps)
		}
		p := engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}
		var out [][]int32
		for _, pr := range prompts {
			out = append(out, collect(t, mustGen(t, e, pr, p)).tokens[0])
		}
		return out, be
	}
	cold, _ := run(false)
	warmed, be := run(true)
	for i := range cold {
		if !slices.Equal(cold[i], warmed[i]) {
			t.Errorf("prompt %d: %v without warm-up, %v after it", i, cold[i], warmed[i])
		}
	}
	// The warm-up: rows 1, 2, 4, 8 (MaxNumSeqs 8), two steps each, first.
	want := []int{1, 1, 2, 2, 4, 4, 8, 8}
	if len(be.steps) < len(want) {
		t.Fatalf("%d steps, want at least the %d of the warm-up", len(be.steps), len(want))
	}
	for i, n := range want {
		b := be.steps[i]
		if len(b.Tokens) != n || len(b.Seqs) != n || b.LogitRows != nil {
			t.Fatalf("warm-up step %d: %d tokens, %d spans, logit rows %v; want %d one-token rows", i, len(b.Tokens), len(b.Seqs), b.LogitRows, n)
		}
		if err := b.Validate(); err != nil {
			t.Fatalf("warm-up step %d: %v", i, err)
		}
		for j, s := range b.Seqs {
			if s.Len != 1 || s.Past != 0 || !slices.Equal(s.Blocks, []int32{0}) || b.Positions[j] != 0 {
				t.Fatalf("warm-up step %d row %d: %+v at position %d", i, j, s, b.Positions[j])
			}
		}
	}
}
