package engine_test

import (
	"math"
	"testing"

	"github.com/mkserve/mkserve/engine"
)

// TestPromptLogprobs: each prompt token's log-probability given the ones
// before, computed in chunks (a small token budget) with a prefix cache on,
// equals the log-softmax of the full-prompt logits the model gives alone;
// every choice's first event carries them; the prompt is not served from
// the cache for such a request.
func TestPromptLogprobs(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 4, MaxNumBatchedTokens: 5, PrefixCaching: true})
	prompt := []int32{5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45}
	// Warm the cache with the same prompt, so a cache hit would be possible.
	collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 1, IgnoreEOS: true}))
	r := collect(t, mustGen(t, e, prompt, engine.SamplingParams{N: 2, MaxTokens: 2, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true,
		PromptLogprobs: true, TopLogprobs: 2}))
	if r.usage == nil || r.usage.CachedTokens != 0 {
		t.Errorf("usage %+v: a prompt_logprobs request took cached tokens", r.usage)
	}
	want := fullPromptLogprobs(t, f, prompt)
	for c := range 2 {
		got := r.promptLPs[c]
		if len(got) != len(prompt)-1 {
			t.Fatalf("choice %d: %d prompt logprobs, want %d", c, len(got), len(prompt)-1)
		}
		for j, lp := range got {
			if lp.ID != prompt[j+1] || math.Abs(float64(lp.Logprob-want[j])) > 1e-3 || len(lp.Top) != 2 {
				t.Errorf("choice %d, prompt token %d: %+v, want id %d logprob %.5f", c, j+1, lp, prompt[j+1], want[j])
			}
		}
	}
}

// fullPromptLogprobs is log p(prompt[j+1] | prompt[:j+1]) by another path:
// a request of prompt[:j+1] whose one new token is forced to prompt[j+1] by
// logit_bias (its reported log-probability is the raw model's).
func fullPromptLogprobs(t *testing.T, f fixture, prompt []int32) []float32 {
	t.Helper()
	e := newEngine(t, f, engine.Config{BlockSize: 4})
	out := make([]float32, len(prompt)-1)
	for j := range out {
		r := collect(t, mustGen(t, e, prompt[:j+1], engine.SamplingParams{MaxTokens: 1, TopP: 1, RepetitionPenalty: 1,
			IgnoreEOS: true, Logprobs: true, LogitBias: map[int32]float32{prompt[j+1]: 100}}))
		lps := r.logprobs[0]
		if len(lps) != 1 || lps[0].ID != prompt[j+1] {
			t.Fatalf("forced token %d: %+v", prompt[j+1], lps)
		}
		out[j] = lps[0].Logprob
	}
	return out
}
