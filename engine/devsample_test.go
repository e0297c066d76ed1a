package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
	"github.com/mkserve/mkserve/metrics"
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

// TestMixedSampling: in a batch where some requests need the host (a
// grammar or logit_bias with log-probabilities), the others still sample
// on the device — only the host rows' logits come back — and every output
// equals the all-host run's. Without log-probabilities the grammar's,
// bias's and min_tokens' rows sample on the device too (mask and bias with
// the rows), with the same outputs.
func TestMixedSampling(t *testing.T) {
	t.Run("host rows", func(t *testing.T) { testMixedSampling(t, true) })
	t.Run("all on the device", func(t *testing.T) { testMixedSampling(t, false) })
}

func testMixedSampling(t *testing.T, logprobs bool) {
	f := load(t)
	ds := &devSampler{Backend: f.be}
	seed := uint64(5)
	params := []engine.SamplingParams{
		{MaxTokens: 7, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true},
		{MaxTokens: 7, Temperature: 0.9, TopP: 0.9, RepetitionPenalty: 1, Seed: &seed, IgnoreEOS: true},
		{MaxTokens: 7, Temperature: 0.8, TopP: 1, RepetitionPenalty: 1, Seed: &seed, Grammar: grammar.JSONObject, Logprobs: logprobs},
		{MaxTokens: 7, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true, LogitBias: map[int32]float32{11: 3}, Logprobs: logprobs},
		{MaxTokens: 7, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true},
	}
	if !logprobs {
		params = append(params, engine.SamplingParams{MaxTokens: 7, MinTokens: 4, TopP: 1, RepetitionPenalty: 1,
			LogitBias: map[int32]float32{2: 50}})
	}
	reg := prometheus.NewRegistry()
	met := metrics.New(reg, "t")
	run := func(host bool) ([]result, int64) {
		o := engine.Options{Name: "t", EOS: []int32{2}}
		if !host {
			o.Metrics = met
		}
		e, err := engine.New(f.m.Model, ds, f.tok, engine.Config{BlockSize: 4, HostSampling: host}, o)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		before := ds.rows.Load()
		chans := make([]<-chan engine.Event, len(params))
		for i, p := range params {
			chans[i] = mustGen(t, e, []int32{3, 5, 7, 9 + int32(i)}, p)
		}
		out := make([]result, len(params))
		for i, ch := range chans {
			out[i] = collect(t, ch)
		}
		return out, ds.rows.Load() - before
	}
	hostRes, hostRows := run(true)
	mixRes, devRows := run(false)
	if hostRows != 0 {
		t.Errorf("host sampling drew %d rows on the device", hostRows)
	}
	plain := int64(0)
	for i, p := range params {
		if !slices.Equal(mixRes[i].tokens[0], hostRes[i].tokens[0]) {
			t.Errorf("request %d: mixed %v, host %v", i, mixRes[i].tokens[0], hostRes[i].tokens[0])
		}
		if !p.Logprobs {
			plain += int64(len(mixRes[i].tokens[0]))
		}
	}
	if devRows != plain {
		t.Errorf("the device sampled %d rows; the requests without log-probabilities made %d tokens", devRows, plain)
	}
	hostMade := 0
	if logprobs {
		hostMade = len(mixRes[2].tokens[0]) + len(mixRes[3].tokens[0])
	}
	if got := gathered(t, reg, "mkserve:host_sampled_rows_total"); got != float64(hostMade) {
		t.Errorf("host_sampled_rows_total %v, want %d (the grammar's and the bias's tokens with log-probabilities)", got, hostMade)
	}
	// One mask timed for each token of the JSON request (a state each).
	if got := gatheredCount(t, reg, "mkserve:grammar_mask_seconds"); got < uint64(len(mixRes[2].tokens[0])) {
		t.Errorf("grammar_mask_seconds counted %d masks for %d constrained tokens", got, len(mixRes[2].tokens[0]))
	}
	if !logprobs {
		if r := mixRes[5].tokens[0]; len(r) != 5 || r[4] != 2 {
			t.Errorf("min_tokens 4 with EOS pushed up: %v, want 4 tokens then EOS 2", r)
		}
	}
}

// newDevEngine is an engine over f whose backend samples on the "device"
// (devSampler counts the rows), EOS token 2, shut down with the test.
func newDevEngine(t *testing.T, f fixture) (*engine.Engine, *devSampler) {
	t.Helper()
	ds := &devSampler{Backend: f.be}
	e, err := engine.New(f.m.Model, ds, f.tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t", EOS: []int32{2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	return e, ds
}

// gathered is the value of the one-series counter name in reg.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	return metricOf(t, reg, name).GetCounter().GetValue()
}

// gatheredCount is the sample count of histogram name in reg.
func gatheredCount(t *testing.T, reg *prometheus.Registry, name string) uint64 {
	return metricOf(t, reg, name).GetHistogram().GetSampleCount()
}

// metricOf is the one series of family name in reg.
func metricOf(t *testing.T, reg *prometheus.Registry, name string) *dto.Metric {
	return engine.MetricOf(t, reg, name)
}

// wrongSampler is a device sampler that ignores masks: it always picks
// token pick.
type wrongSampler struct {
	*cpu.Backend
	pick int32
}

func (d *wrongSampler) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	out := make([]backend.SampleResult, len(rows))
	for i := range out {
		out[i].Token = d.pick
	}
	return out
}

// TestGrammarRefusedToken: a sampler that returns a token the grammar
// refuses fails that request with an error naming it, instead of
// streaming text outside the grammar; the engine goes on serving.
func TestGrammarRefusedToken(t *testing.T) {
	f := load(t)
	bad, ok := f.tok.TokenID("x")
	if !ok {
		t.Skip("the test tokenizer has no single-byte x token")
	}
	ds := &wrongSampler{Backend: f.be, pick: bad}
	e, err := engine.New(f.m.Model, ds, f.tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t", EOS: []int32{2}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	ch, err := e.Generate(context.Background(), &engine.Request{Prompt: []int32{5, 6, 7}, Sampling: engine.SamplingParams{MaxTokens: 4,
		TopP: 1, RepetitionPenalty: 1, Grammar: grammar.JSONObject}})
	if err != nil {
		t.Fatal(err)
	}
	var last engine.Event
	var text string
	for ev := range ch {
		text += ev.Text
		last = ev
	}
	if last.FinishReason != engine.FinishError || last.Err == nil || !strings.Contains(last.Err.Error(), "grammar") || text != "" {
		t.Errorf("finish %q, err %v, text %q; want an error naming the grammar and no text", last.FinishReason, last.Err, text)
	}
	// A plain request still gets its tokens.
	r := collect(t, mustGen(t, e, []int32{5, 6, 7}, engine.SamplingParams{MaxTokens: 3, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}))
	if len(r.tokens[0]) != 3 {
		t.Errorf("the next request: %v", r.tokens[0])
	}
}
