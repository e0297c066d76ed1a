package engine_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/metrics"
)

// flakyBackend is the CPU backend whose CopyBlocks and TakeExpertLoad
// fail the way a device op does (a panic).
type flakyBackend struct{ *cpu.Backend }

func (flakyBackend) CopyBlocks(src, dst []int32)     { panic("copy failed on the device") }
func (flakyBackend) TakeExpertLoad() map[int][]int64 { panic("counters unreadable") }

// TestBackendFailuresOutsideForward: a failing block copy (forking n > 1
// choices) and failing expert counters do not stop the engine: the forked
// choices are recomputed and every choice completes.
func TestBackendFailuresOutsideForward(t *testing.T) {
	f := load(t)
	be := flakyBackend{f.be}
	e, err := engine.New(f.m.Model, be, f.tok, engine.Config{BlockSize: 4},
		engine.Options{Name: "t", Metrics: metrics.New(prometheus.NewRegistry(), "t")})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	// 9 prompt tokens: the last block is partial, so forks copy it.
	res := collect(t, mustGen(t, e, []int32{3, 4, 5, 6, 7, 8, 9, 10, 11},
		engine.SamplingParams{N: 3, MaxTokens: 5, Temperature: 1, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}))
	for c := range 3 {
		if len(res.tokens[c]) != 5 || res.reasons[c] != "length" {
			t.Errorf("choice %d: %d tokens, finish %q", c, len(res.tokens[c]), res.reasons[c])
		}
	}
}

// onceFailing is a detokenizer that panics on its first call once armed.
type onceFailing struct {
	engine.Detokenizer
	armed atomic.Bool
}

func (d *onceFailing) Decode(ids []int32, skip bool) (string, error) {
	if d.armed.CompareAndSwap(true, false) {
		panic("detokenizer bug")
	}
	return d.Detokenizer.Decode(ids, skip)
}

// TestStepPanicFailsInFlight: a panic inside a step (here the
// detokenizer's) fails the requests in flight with an error, returns their
// KV blocks, and the engine goes on serving the next request.
func TestStepPanicFailsInFlight(t *testing.T) {
	f := load(t)
	tok := &onceFailing{Detokenizer: f.tok}
	e, err := engine.New(f.m.Model, f.be, tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	p := engine.SamplingParams{N: 1, MaxTokens: 4, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}
	tok.armed.Store(true)
	ch, err := e.Generate(context.Background(), &engine.Request{Prompt: []int32{3, 4, 5}, Sampling: p})
	if err != nil {
		t.Fatal(err)
	}
	var failed error
	for ev := range ch {
		if ev.Err != nil {
			failed = ev.Err
		}
	}
	if failed == nil || !strings.Contains(failed.Error(), "detokenizer bug") {
		t.Errorf("the request in flight: %v, want the step's panic as its error", failed)
	}
	res := collect(t, mustGen(t, e, []int32{3, 4, 5}, p))
	if len(res.tokens[0]) != 4 || res.reasons[0] != "length" {
		t.Errorf("the next request: %d tokens, finish %q", len(res.tokens[0]), res.reasons[0])
	}
	if st := e.Stats(); st.BlocksUsed != 0 && st.Running == 0 {
		t.Errorf("%d blocks still used with nothing running", st.BlocksUsed)
	}
}
