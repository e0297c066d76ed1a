package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/tokenizer"
)

// TestContextParallelPrefill: a long prompt prefilled with ring attention
// over R emulated context-parallel ranks (in chunks, so later chunks attend
// to a cached prefix) gives the same greedy tokens as plain prefill, on a
// full-attention model (Qwen3-MoE) and a sliding-window one with sinks
// (gpt-oss); prompts under the threshold stay plain.
func TestContextParallelPrefill(t *testing.T) {
	for _, tc := range []struct {
		family         string
		prompt, gen, R int
	}{
		{"qwen3_moe", 100, 10, 4},
		{"qwen3_moe", 75, 6, 3},
		{"gpt_oss", 48, 8, 2},
	} {
		t.Run(fmt.Sprintf("%s/R=%d", tc.family, tc.R), func(t *testing.T) {
			dir := "../models/testdata/golden/" + tc.family
			be := cpu.New(cpu.Options{})
			l, err := models.Load(dir, be, models.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tok, err := tokenizer.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			prompt := randPrompt(rand.New(rand.NewPCG(uint64(tc.prompt), 31)), tc.prompt)
			short := prompt[:20]
			run := func(cp int) (long, shortOut []int32, st engine.Stats) {
				e, err := engine.New(l.Model, be, tok, engine.Config{BlockSize: 4, MaxNumBatchedTokens: 32,
					ContextParallel: cp, ContextParallelMin: 40}, engine.Options{Name: "t"})
				if err != nil {
					t.Fatal(err)
				}
				p := engine.SamplingParams{MaxTokens: tc.gen, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}
				long = collect(t, mustGen(t, e, prompt, p)).tokens[0]
				shortOut = collect(t, mustGen(t, e, short, p)).tokens[0]
				st = waitIdle(t, e)
				shutdown(t, e)
				return long, shortOut, st
			}
			plain, plainShort, st0 := run(1)
			cp, cpShort, st := run(tc.R)
			if !slices.Equal(plain, cp) || len(cp) != tc.gen {
				t.Errorf("greedy tokens: plain %v, context-parallel %v", plain, cp)
			}
			if !slices.Equal(plainShort, cpShort) {
				t.Errorf("short prompt: plain %v, context-parallel %v", plainShort, cpShort)
			}
			if st0.ContextParallelTokens != 0 {
				t.Errorf("context parallelism off, yet %d tokens prefilled with it", st0.ContextParallelTokens)
			}
			// Chunks of 32 (the last one shorter) with at least 2R tokens.
			want := 0
			for off := 0; off < tc.prompt; off += 32 {
				if n := min(32, tc.prompt-off); n >= 2*tc.R {
					want += n
				}
			}
			if st.ContextParallelTokens != int64(want) {
				t.Errorf("%d prompt tokens prefilled with context parallelism, want %d", st.ContextParallelTokens, want)
			}
		})
	}
}

// shutdown stops e, failing the test if it does not drain in time.
func shutdown(t testing.TB, e *engine.Engine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}
