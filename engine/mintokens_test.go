package engine_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/engine"
)

// TestMinTokens: with the end-of-sequence token pushed to the top by
// logit_bias, a choice stops at once — unless min_tokens holds it off for
// that many tokens (the stop token ids too), sampled on the host until then.
func TestMinTokens(t *testing.T) {
	f := load(t)
	e, ds := newDevEngine(t, f)
	prompt := []int32{5, 9, 13, 17}
	run := func(p engine.SamplingParams) result { return collect(t, mustGen(t, e, prompt, p)) }
	eos := map[int32]float32{2: 100}
	if r := run(engine.SamplingParams{MaxTokens: 12, TopP: 1, RepetitionPenalty: 1, LogitBias: eos}); len(r.tokens[0]) != 1 || r.reasons[0] != engine.FinishStop {
		t.Fatalf("EOS pushed up: %v (%s), want one token and stop", r.tokens[0], r.reasons[0])
	}
	r := run(engine.SamplingParams{MaxTokens: 12, MinTokens: 5, TopP: 1, RepetitionPenalty: 1, LogitBias: eos})
	if len(r.tokens[0]) != 6 || r.tokens[0][5] != 2 || slices.Contains(r.tokens[0][:5], 2) || r.reasons[0] != engine.FinishStop {
		t.Fatalf("min_tokens 5: %v (%s), want 5 tokens then EOS", r.tokens[0], r.reasons[0])
	}
	// A stop token id is held off too.
	r = run(engine.SamplingParams{MaxTokens: 8, MinTokens: 3, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true,
		StopTokenIDs: []int32{42}, LogitBias: map[int32]float32{42: 100}})
	if len(r.tokens[0]) != 4 || r.tokens[0][3] != 42 || slices.Contains(r.tokens[0][:3], 42) {
		t.Fatalf("min_tokens 3 with stop token 42: %v (%s)", r.tokens[0], r.reasons[0])
	}
	// Sampled on the device (the ban goes with the rows), except with
	// log-probabilities until min_tokens is reached.
	seed := uint64(3)
	before := ds.rows.Load()
	r = run(engine.SamplingParams{MaxTokens: 6, MinTokens: 2, Temperature: 1, TopP: 1, RepetitionPenalty: 1, Seed: &seed, IgnoreEOS: true})
	if got := ds.rows.Load() - before; got != int64(len(r.tokens[0])) {
		t.Errorf("%d of %d tokens sampled on the device; want all", got, len(r.tokens[0]))
	}
	before = ds.rows.Load()
	r = run(engine.SamplingParams{MaxTokens: 6, MinTokens: 2, Temperature: 1, TopP: 1, RepetitionPenalty: 1, Seed: &seed, Logprobs: true})
	if got := ds.rows.Load() - before; got != int64(len(r.tokens[0])-2) {
		t.Errorf("with logprobs, %d of %d tokens sampled on the device; want all but the first 2", got, len(r.tokens[0]))
	}
	if _, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 2, MinTokens: 3}}); err == nil || !strings.Contains(err.Error(), "min_tokens") {
		t.Errorf("min_tokens above max_tokens: %v", err)
	}
}
