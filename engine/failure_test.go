package engine_test

import (
	"context"
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
