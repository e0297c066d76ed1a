package engine_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/engine"
)

// TestLogitBias: +100 on a token makes greedy decoding pick it every step;
// -100 on the first unbiased greedy choice bans it; a request with biases
// samples on the host even when the backend samples on the device (the
// device sampler takes no biases), and bad biases are refused.
func TestLogitBias(t *testing.T) {
	f := load(t)
	ds := &devSampler{Backend: f.be}
	e, err := engine.New(f.m.Model, ds, f.tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	prompt := []int32{5, 9, 13, 17}
	greedy := func(bias map[int32]float32) []int32 {
		return collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, TopP: 1,
			RepetitionPenalty: 1, LogitBias: bias})).tokens[0]
	}
	before := ds.rows.Load()
	plain := greedy(nil)
	if ds.rows.Load() == before {
		t.Fatal("an unbiased request did not sample on the device")
	}
	forced := greedy(map[int32]float32{42: 100})
	for i, tok := range forced {
		if tok != 42 {
			t.Fatalf("token %d is %d under +100 on token 42: %v", i, tok, forced)
		}
	}
	banned := greedy(map[int32]float32{plain[0]: -100})
	if slices.Contains(banned, plain[0]) {
		t.Errorf("token %d banned by -100 was still generated: %v", plain[0], banned)
	}
	before = ds.rows.Load()
	greedy(map[int32]float32{7: 1})
	if ds.rows.Load()-before != 6 {
		t.Errorf("%d of 6 tokens with logit_bias sampled on the device (the bias goes with the rows)", ds.rows.Load()-before)
	}
	// With log-probabilities (of the raw logits) the host samples.
	before = ds.rows.Load()
	collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true, TopP: 1,
		RepetitionPenalty: 1, LogitBias: map[int32]float32{7: 1}, Logprobs: true}))
	if ds.rows.Load() != before {
		t.Error("a request with logit_bias and logprobs sampled on the device")
	}
	// A special token (1, <|im_start|>) forced: no text by default, its
	// text with KeepSpecialTokens.
	for _, keep := range []bool{false, true} {
		r := collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 2, IgnoreEOS: true, TopP: 1,
			RepetitionPenalty: 1, LogitBias: map[int32]float32{1: 100}, KeepSpecialTokens: keep}))
		want := ""
		if keep {
			want = "<|im_start|><|im_start|>"
		}
		if !slices.Equal(r.tokens[0], []int32{1, 1}) || r.text[0] != want {
			t.Errorf("keep special %v: %v %q, want [1 1] %q", keep, r.tokens[0], r.text[0], want)
		}
	}
	for _, bad := range []map[int32]float32{{3: 101}, {-1: 1}, {1 << 30: 1}} {
		_, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt,
			Sampling: engine.SamplingParams{MaxTokens: 2, LogitBias: bad}})
		if err == nil || !strings.Contains(err.Error(), "logit_bias") {
			t.Errorf("bias %v: %v, want an error naming logit_bias", bad, err)
		}
	}
}
