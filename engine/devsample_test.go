package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
)

// devSampler is the CPU backend plus a backend.Sampler that answers each
// row with engine.RefSample, counting rows: it stands for a GPU sampler.
type devSampler struct {
	*cpu.Backend
	rows atomic.Int64
}

func (d *devSampler) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	v := d.ToHost(logits)
	V := len(v) / len(rows)
	out := make([]backend.SampleResult, len(rows))
	for i, r := range rows {
		out[i] = engine.RefSample(v[i*V:(i+1)*V], r)
	}
	d.rows.Add(int64(len(rows)))
	return out
}

// TestDeviceSamplingMatchesHost: with a backend.Sampler the engine hands
// sampling to the device, taking each request's uniform draws in the same
// order, so seeded outputs (tokens and log-probabilities) equal the host
// path's, for every parameter family, with forks (n > 1) falling back to
// the host for their first token.
func TestDeviceSamplingMatchesHost(t *testing.T) {
	f := load(t)
	ds := &devSampler{Backend: f.be}
	run := func(host bool, p engine.SamplingParams, prompt []int32) result {
		e, err := engine.New(f.m.Model, ds, f.tok, engine.Config{BlockSize: 4, HostSampling: host}, engine.Options{Name: "t", EOS: []int32{2}})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		ch, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt, Sampling: p})
		if err != nil {
			t.Fatal(err)
		}
		return collect(t, ch)
	}
	seed := uint64(11)
	base := engine.SamplingParams{N: 1, MaxTokens: 12, Seed: &seed, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}
	cases := []struct {
		name string
		mod  func(p *engine.SamplingParams)
	}{
		{"greedy", func(p *engine.SamplingParams) {}},
		{"temperature", func(p *engine.SamplingParams) { p.Temperature = 1 }},
		{"top-k top-p", func(p *engine.SamplingParams) { p.Temperature = 0.8; p.TopK = 20; p.TopP = 0.9 }},
		{"min-p", func(p *engine.SamplingParams) { p.Temperature = 1.3; p.MinP = 0.05 }},
		{"penalties", func(p *engine.SamplingParams) {
			p.Temperature = 0.7
			p.RepetitionPenalty = 1.3
			p.PresencePenalty = 0.5
			p.FrequencyPenalty = 0.4
		}},
		{"logprobs", func(p *engine.SamplingParams) { p.Temperature = 1; p.Logprobs = true; p.TopLogprobs = 5 }},
		{"n=3", func(p *engine.SamplingParams) { p.Temperature = 1; p.N = 3; p.Logprobs = true }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := base
			tc.mod(&p)
			prompt := randPrompt(rand.New(rand.NewPCG(uint64(i), 9)), 7)
			before := ds.rows.Load()
			host := run(true, p, prompt)
			if ds.rows.Load() != before {
				t.Fatalf("HostSampling: the device sampler was called")
			}
			dev := run(false, p, prompt)
			used := ds.rows.Load() - before
			if want := int64(p.N * p.MaxTokens); used < want-int64(p.N) || used > want {
				t.Errorf("device sampler took %d rows, want %d (less the forks' first tokens)", used, want)
			}
			for c := 0; c < p.N; c++ {
				if !slices.Equal(host.tokens[c], dev.tokens[c]) || len(host.tokens[c]) != p.MaxTokens {
					t.Errorf("choice %d: host %v, device %v", c, host.tokens[c], dev.tokens[c])
				}
				if fmt.Sprint(host.logprobs[c]) != fmt.Sprint(dev.logprobs[c]) {
					t.Errorf("choice %d: logprobs differ:\nhost   %v\ndevice %v", c, host.logprobs[c], dev.logprobs[c])
				}
			}
		})
	}
}
