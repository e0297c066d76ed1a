package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
)

// asyncDev is devSampler (the CPU backend sampling with engine.RefSample)
// plus a backend.AsyncSampler standing for a GPU's: the picks stay "on the device" until Wait, and
// its GraphStep reads a batch's fed rows from the latest picks, as the CUDA
// backend's graph steps do. It counts how the engine used it.
type asyncDev struct {
	devSampler // Sample: engine.RefSample per row
	mu         sync.Mutex
	last       []int32 // the latest SampleAsync's tokens (the "device" picks)
	launched   int     // SampleAsync calls
	overlapped int     // Waits made after the next SampleAsync was queued
	fed        int     // rows whose token came from the picks
	failWait   int     // the SampleAsync whose Wait fails (0: none)
}

type asyncPending struct {
	d      *asyncDev
	n      int
	res    []backend.SampleResult
	waited bool
}

func (d *asyncDev) SampleAsync(logits backend.Tensor, rows []backend.SampleRow) (backend.Pending, error) {
	res := d.Sample(logits, rows)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.launched++
	d.last = d.last[:0]
	for _, r := range res {
		d.last = append(d.last, r.Token)
	}
	return &asyncPending{d: d, n: d.launched, res: res}, nil
}

func (p *asyncPending) Wait() ([]backend.SampleResult, error) {
	d := p.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if p.waited {
		return nil, errors.New("waited twice")
	}
	p.waited = true
	if d.launched > p.n {
		d.overlapped++
	}
	if d.failWait == p.n {
		return nil, errors.New("injected device failure")
	}
	return p.res, nil
}

func (d *asyncDev) GraphStep(b *backend.Batch, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	d.mu.Lock()
	for i, r := range b.Feed {
		if r < 0 {
			continue
		}
		if int(r) >= len(d.last) {
			d.mu.Unlock()
			return nil, fmt.Errorf("row %d takes pick %d of %d", i, r, len(d.last))
		}
		b.Tokens[i] = d.last[r]
		d.fed++
	}
	d.mu.Unlock()
	b.Feed = nil
	return f()
}

func (d *asyncDev) counts() (launched, overlapped, fed int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.launched, d.overlapped, d.fed
}

// runAll sends every prompt with p (concurrently) and collects the results.
func runAll(t *testing.T, e *engine.Engine, prompts [][]int32, p engine.SamplingParams) []result {
	t.Helper()
	got := make([]result, len(prompts))
	var wg sync.WaitGroup
	for i := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, err := e.Generate(context.Background(), &engine.Request{ID: fmt.Sprint(i), Prompt: prompts[i], Sampling: p})
			if err != nil {
				t.Error(err)
				return
			}
			got[i] = collect(t, ch)
		}()
	}
	wg.Wait()
	return got
}

// TestOverlapMatchesSync: overlapped decode (the next step launched with
// the previous step's tokens still on the device) streams exactly what
// synchronous steps stream — tokens, text, log-probabilities, finish
// reasons and usage — for every sampling family, stop conditions found
// only when the token reaches the host, max_tokens 1, forks, chunked
// prefill and preemption; steps really overlap where they may, and
// penalised sampling falls back to synchronous steps.
func TestOverlapMatchesSync(t *testing.T) {
	f := load(t)
	rng := rand.New(rand.NewPCG(3, 5))
	prompts := make([][]int32, 10)
	for i := range prompts {
		prompts[i] = randPrompt(rng, 3+rng.IntN(30))
	}
	seed := uint64(21)
	base := engine.SamplingParams{N: 1, MaxTokens: 10, Seed: &seed, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}
	roomy := engine.Config{MaxNumBatchedTokens: 4096, BlockSize: 4, PrefixCaching: true}
	cases := []struct {
		name    string
		cfg     engine.Config
		mod     func(p *engine.SamplingParams, sync []result)
		overlap bool // steps must overlap
		early   bool // rows built from resolved tokens: the previous step is waited for before the next sampling launch
	}{
		{"greedy", roomy, func(p *engine.SamplingParams, _ []result) { p.Seed = nil }, true, false},
		{"temperature top-p", roomy, func(p *engine.SamplingParams, _ []result) { p.Temperature = 0.9; p.TopP = 0.9 }, true, false},
		{"logprobs", roomy, func(p *engine.SamplingParams, _ []result) { p.Temperature = 1; p.Logprobs = true; p.TopLogprobs = 3 }, true, false},
		{"max_tokens 1", roomy, func(p *engine.SamplingParams, _ []result) { p.MaxTokens = 1 }, false, false},
		{"eos", roomy, func(p *engine.SamplingParams, _ []result) { p.IgnoreEOS = false; p.Temperature = 1.5; p.MaxTokens = 24 }, true, false},
		{"stop token", roomy, func(p *engine.SamplingParams, sync []result) {
			// A token the synchronous run emits third: most requests stop early.
			p.Seed = nil
			p.StopTokenIDs = nil
			for _, r := range sync {
				if len(r.tokens[0]) > 2 {
					p.StopTokenIDs = append(p.StopTokenIDs, r.tokens[0][2])
				}
			}
		}, true, false},
		{"stop string", roomy, func(p *engine.SamplingParams, sync []result) {
			p.Seed = nil
			if len(sync) > 0 { // a character from the middle of the first request's text
				s := sync[0].text[0]
				p.Stop = []string{s[len(s)/2:][:1]}
			}
		}, true, false},
		{"n=3", roomy, func(p *engine.SamplingParams, _ []result) { p.Temperature = 1; p.N = 3 }, true, false},
		{"chunked", engine.Config{MaxNumBatchedTokens: 7, BlockSize: 4, PrefixCaching: true},
			func(p *engine.SamplingParams, _ []result) { p.Seed = nil }, true, false},
		{"preempting", engine.Config{MaxNumBatchedTokens: 64, BlockSize: 4, PrefixCaching: true,
			KVCacheBytes: 24 * 4 * int64(f.m.Model.KVFloatsPerToken()) * 4}, func(p *engine.SamplingParams, _ []result) { p.Seed = nil }, true, false},
		{"json", roomy, func(p *engine.SamplingParams, _ []result) {
			p.Grammar, p.IgnoreEOS, p.Temperature, p.MaxTokens = grammar.JSONObject, false, 0.8, 24
		}, true, true},
		{"logit_bias", roomy, func(p *engine.SamplingParams, _ []result) {
			p.Temperature, p.LogitBias = 1, map[int32]float32{7: 2, 2: -100}
		}, true, false},
		{"min_tokens", roomy, func(p *engine.SamplingParams, _ []result) {
			p.IgnoreEOS, p.MinTokens, p.LogitBias, p.Temperature = false, 5, map[int32]float32{2: 4}, 1
		}, true, true},
		// (random prompts: few drafts found, so the sequences back off to overlapped steps)
		{"speculation on, sampled with logprobs", engine.Config{MaxNumBatchedTokens: 4096, BlockSize: 4, PrefixCaching: true, SpeculativeTokens: 4},
			func(p *engine.SamplingParams, _ []result) { p.Temperature = 0.9; p.Logprobs = true }, true, false},
		{"speculation on, greedy", engine.Config{MaxNumBatchedTokens: 4096, BlockSize: 4, PrefixCaching: true, SpeculativeTokens: 4,
			SpeculativeNgramMin: 1}, func(p *engine.SamplingParams, _ []result) { p.Seed = nil }, false, false},
		{"penalties", roomy, func(p *engine.SamplingParams, _ []result) {
			p.Temperature = 0.7
			p.RepetitionPenalty = 1.3
			p.FrequencyPenalty = 0.4
		}, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			run := func(syncSteps bool, p engine.SamplingParams) ([]result, *asyncDev, engine.Stats) {
				d := &asyncDev{devSampler: devSampler{Backend: f.be}}
				cfg := tc.cfg
				cfg.SyncSteps = syncSteps
				e, err := engine.New(f.m.Model, d, f.tok, cfg, engine.Options{Name: "t", EOS: []int32{2}, Clock: func() time.Time { return time.Time{} }}) // (speculation's meter off: a clock standing still)
				if err != nil {
					t.Fatal(err)
				}
				defer e.Shutdown(context.Background())
				got := runAll(t, e, prompts, p)
				st := waitIdle(t, e)
				if st.BlocksUsed != 0 {
					t.Errorf("sync=%v: %d blocks still held", syncSteps, st.BlocksUsed)
				}
				return got, d, st
			}
			p := base
			p0 := base
			tc.mod(&p0, nil) // the synchronous run's parameters, before the case reads its results
			if tc.name == "stop token" || tc.name == "stop string" {
				first, _, _ := run(true, p0)
				tc.mod(&p, first)
			} else {
				p = p0
			}
			want, _, _ := run(true, p)
			got, d, st := run(false, p)
			for i := range prompts {
				for c := 0; c < p.N; c++ {
					if !slices.Equal(got[i].tokens[c], want[i].tokens[c]) || got[i].text[c] != want[i].text[c] ||
						got[i].reasons[c] != want[i].reasons[c] {
						t.Errorf("request %d choice %d:\noverlapped %v %q %s\nsync       %v %q %s", i, c,
							got[i].tokens[c], got[i].text[c], got[i].reasons[c], want[i].tokens[c], want[i].text[c], want[i].reasons[c])
					}
					// Log-probabilities to rounding: a step's batch (and so the
					// order of the CPU's sums) depends on when requests arrive.
					if !sameLogprobs(got[i].logprobs[c], want[i].logprobs[c]) {
						t.Errorf("request %d choice %d: logprobs\noverlapped %v\nsync       %v", i, c, got[i].logprobs[c], want[i].logprobs[c])
					}
				}
				if fmt.Sprint(got[i].usage) != fmt.Sprint(want[i].usage) {
					t.Errorf("request %d: usage %+v, sync %+v", i, got[i].usage, want[i].usage)
				}
			}
			launched, overlapped, fed := d.counts()
			if tc.overlap && ((overlapped == 0 && !tc.early) || fed == 0 || st.OverlappedSteps == 0) {
				t.Errorf("no overlap: %d async samplings, %d waited after the next, %d fed rows, %d overlapped steps",
					launched, overlapped, fed, st.OverlappedSteps)
			}
			if tc.name == "preempting" && st.Preemptions == 0 {
				t.Error("the small KV budget caused no preemption")
			}
			if tc.name == "penalties" && (launched != 0 || st.OverlappedSteps != 0) {
				t.Errorf("penalised sampling overlapped: %d async samplings", launched)
			}
			if tc.name == "speculation on, greedy" && st.SpecDrafted == 0 {
				t.Errorf("greedy with speculation: no drafts (%d overlapped steps)", st.OverlappedSteps)
			}
			t.Logf("%d async samplings, %d overlapped waits, %d fed rows, %d overlapped steps", launched, overlapped, fed, st.OverlappedSteps)
		})
	}
}

// sameLogprobs reports whether a and b name the same tokens with
// log-probabilities within 1e-4.
func sameLogprobs(a, b []engine.Logprob) bool {
	near := func(x, y engine.TokenLogprob) bool {
		return x.ID == y.ID && x.Text == y.Text && math.Abs(float64(x.Logprob-y.Logprob)) <= 1e-4
	}
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !near(a[i].TokenLogprob, b[i].TokenLogprob) || len(a[i].Top) != len(b[i].Top) {
			return false
		}
		for j := range a[i].Top {
			if !near(a[i].Top[j], b[i].Top[j]) {
				return false
			}
		}
	}
	return true
}

// TestOverlapDeviceFailure: when the tokens of an overlapped step cannot be
// read, that step's requests fail with the error, the step already
// launched after it is dropped, and the engine serves the next requests.
func TestOverlapDeviceFailure(t *testing.T) {
	f := load(t)
	d := &asyncDev{devSampler: devSampler{Backend: f.be}, failWait: 4}
	e, err := engine.New(f.m.Model, d, f.tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t", EOS: []int32{2}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	ch, err := e.Generate(context.Background(), &engine.Request{Prompt: []int32{5, 6, 7},
		Sampling: engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	var failed error
	n := 0
	for ev := range ch {
		n += len(ev.TokenIDs)
		if ev.Err != nil {
			failed = ev.Err
		}
	}
	if failed == nil || n != 3 {
		t.Errorf("got %d tokens and error %v; want the 3 tokens before the failed step and its error", n, failed)
	}
	got := runAll(t, e, [][]int32{{9, 8, 7, 6}}, engine.SamplingParams{MaxTokens: 5, IgnoreEOS: true})
	if len(got[0].tokens[0]) != 5 || got[0].reasons[0] != engine.FinishLength {
		t.Errorf("after the failure: %v %q", got[0].tokens[0], got[0].reasons[0])
	}
	if st := waitIdle(t, e); st.BlocksUsed != 0 {
		t.Errorf("%d blocks still held", st.BlocksUsed)
	}
}

// TestOverlapAbort: requests cancelled while their tokens are on the device
// end without error, drop those tokens and free their blocks.
func TestOverlapAbort(t *testing.T) {
	f := load(t)
	d := &asyncDev{devSampler: devSampler{Backend: f.be}}
	e, err := engine.New(f.m.Model, d, f.tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t", EOS: []int32{2}})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		ch, err := e.Generate(ctx, &engine.Request{Prompt: []int32{int32(5 + i), 6, 7},
			Sampling: engine.SamplingParams{MaxTokens: 100, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for ev := range ch {
			n += len(ev.TokenIDs)
			if n == 3+i {
				cancel()
			}
			if ev.Err != nil {
				t.Errorf("abort %d: error %v", i, ev.Err)
			}
		}
		cancel()
		if n < 3+i || n >= 100 {
			t.Errorf("abort %d: %d tokens after cancelling at %d (of 100)", i, n, 3+i)
		}
	}
	if st := waitIdle(t, e); st.BlocksUsed != 0 || st.Running != 0 {
		t.Errorf("after the aborts: %+v", st)
	}
}
