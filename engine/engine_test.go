package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/tokenizer"
)

const testModel = "../models/testdata/golden/qwen3_moe"

type fixture struct {
	m   *models.Loaded
	be  *cpu.Backend
	tok *tokenizer.Tokenizer
}

func load(t testing.TB) fixture {
	t.Helper()
	be := cpu.New(cpu.Options{})
	l, err := models.Load(testModel, be, models.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadDir(testModel)
	if err != nil {
		t.Fatal(err)
	}
	return fixture{l, be, tok}
}

// testPrompts is the test model's tokenizer and n random prompts, prompt i
// of base+step·i tokens (seeds i and seed).
func testPrompts(t testing.TB, n int, seed uint64, base, step int) (*tokenizer.Tokenizer, [][]int32) {
	t.Helper()
	tok, err := tokenizer.LoadDir(testModel)
	if err != nil {
		t.Fatal(err)
	}
	var prompts [][]int32
	for i := range n {
		prompts = append(prompts, randPrompt(rand.New(rand.NewPCG(uint64(i), seed)), base+step*i))
	}
	return tok, prompts
}

func newEngine(t testing.TB, f fixture, cfg engine.Config) *engine.Engine {
	t.Helper()
	e, err := engine.New(f.m.Model, f.be, f.tok, cfg, engine.Options{Name: "test", EOS: []int32{2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		e.Shutdown(ctx)
	})
	return e
}

// result is everything a request streamed, per choice.
type result struct {
	tokens    map[int][]int32
	text      map[int]string
	reasons   map[int]string
	logprobs  map[int][]engine.Logprob
	promptLPs map[int][]engine.Logprob
	usage     *engine.Usage
	events    int
}

func collect(t testing.TB, ch <-chan engine.Event) result {
	t.Helper()
	r := result{tokens: map[int][]int32{}, text: map[int]string{}, reasons: map[int]string{}, logprobs: map[int][]engine.Logprob{},
		promptLPs: map[int][]engine.Logprob{}}
	for ev := range ch {
		r.events++
		if ev.Err != nil {
			t.Errorf("choice %d failed: %v", ev.Index, ev.Err)
		}
		r.tokens[ev.Index] = append(r.tokens[ev.Index], ev.TokenIDs...)
		r.text[ev.Index] += ev.Text
		r.logprobs[ev.Index] = append(r.logprobs[ev.Index], ev.Logprobs...)
		if ev.PromptLogprobs != nil {
			r.promptLPs[ev.Index] = ev.PromptLogprobs
		}
		if ev.FinishReason != "" {
			if r.reasons[ev.Index] != "" {
				t.Errorf("choice %d finished twice", ev.Index)
			}
			r.reasons[ev.Index] = ev.FinishReason
		}
		if ev.Usage != nil {
			r.usage = ev.Usage
		}
	}
	return r
}

func randPrompt(r *rand.Rand, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(3 + r.IntN(500))
	}
	return p
}

// TestGreedyMatchesReference: many concurrent greedy requests through the
// continuous-batching engine (chunked prefill, a KV budget small enough to
// force preemption) give exactly the tokens of the single-sequence
// reference decoder.
func TestGreedyMatchesReference(t *testing.T) {
	f := load(t)
	rng := rand.New(rand.NewPCG(7, 7))
	const reqs = 12
	prompts := make([][]int32, reqs)
	want := make([][]int32, reqs)
	for i := range prompts {
		prompts[i] = randPrompt(rng, 3+rng.IntN(40))
		g, err := engine.Greedy(context.Background(), f.m.Model, f.be, prompts[i], engine.GreedyOptions{MaxTokens: 12})
		if err != nil {
			t.Fatal(err)
		}
		want[i] = g
	}
	for _, tc := range []struct {
		name string
		cfg  engine.Config
	}{
		{"roomy", engine.Config{MaxNumBatchedTokens: 4096, BlockSize: 16, PrefixCaching: true}},
		{"chunked", engine.Config{MaxNumBatchedTokens: 7, BlockSize: 4, PrefixCaching: true}},
		// 40 blocks of 4 tokens cannot hold 12 sequences of up to 54 tokens: preemption.
		{"preempting", engine.Config{MaxNumBatchedTokens: 64, BlockSize: 4, PrefixCaching: true, KVCacheBytes: 40 * 4 * int64(f.m.Model.KVFloatsPerToken()) * 4}},
		{"no-prefix-cache", engine.Config{MaxNumBatchedTokens: 32, BlockSize: 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, f, tc.cfg)
			var wg sync.WaitGroup
			got := make([]result, reqs)
			for i := range prompts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ch, err := e.Generate(context.Background(), &engine.Request{ID: fmt.Sprint(i), Prompt: prompts[i],
						Sampling: engine.SamplingParams{MaxTokens: 12, IgnoreEOS: true}})
					if err != nil {
						t.Error(err)
						return
					}
					got[i] = collect(t, ch)
				}()
			}
			wg.Wait()
			for i := range prompts {
				if !slices.Equal(got[i].tokens[0], want[i]) {
					t.Errorf("request %d: engine %v, reference %v", i, got[i].tokens[0], want[i])
				}
				if got[i].reasons[0] != engine.FinishLength || got[i].usage == nil ||
					got[i].usage.CompletionTokens != 12 || got[i].usage.PromptTokens != len(prompts[i]) {
					t.Errorf("request %d: reason %q usage %+v", i, got[i].reasons[0], got[i].usage)
				}
			}
			st := waitIdle(t, e)
			if st.BlocksUsed != 0 {
				t.Errorf("%d blocks still held after every request finished", st.BlocksUsed)
			}
			if tc.name == "preempting" && st.Preemptions == 0 {
				t.Errorf("the small KV budget caused no preemption")
			}
		})
	}
}

// waitIdle waits until the engine reports no work.
func waitIdle(t testing.TB, e *engine.Engine) engine.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()
		if st.Running == 0 && st.Waiting == 0 && st.BlocksUsed == 0 || time.Now().After(deadline) {
			return st
		}
		time.Sleep(time.Millisecond)
	}
}

func TestPrefixCacheSharesBlocks(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 4, PrefixCaching: true})
	prompt := randPrompt(rand.New(rand.NewPCG(1, 1)), 30)
	run := func() result {
		ch, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 6, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		return collect(t, ch)
	}
	a := run()
	b := run()
	if a.usage.CachedTokens != 0 || b.usage.CachedTokens != 28 {
		t.Errorf("cached tokens %d then %d, want 0 then 28", a.usage.CachedTokens, b.usage.CachedTokens)
	}
	if !slices.Equal(a.tokens[0], b.tokens[0]) {
		t.Errorf("prefix-cached run differs: %v vs %v", a.tokens[0], b.tokens[0])
	}
	if st := e.Stats(); st.PrefixHits != 28 {
		t.Errorf("stats report %d prefix hits", st.PrefixHits)
	}
}

func TestSeededSamplingAndN(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 4})
	prompt := randPrompt(rand.New(rand.NewPCG(2, 2)), 9) // a partial last block: forks copy it
	seed := uint64(42)
	req := func(seed uint64) result {
		ch, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{
			N: 4, MaxTokens: 10, Temperature: 1.2, TopP: 0.95, TopK: 50, Seed: &seed, IgnoreEOS: true, Logprobs: true, TopLogprobs: 3}})
		if err != nil {
			t.Fatal(err)
		}
		return collect(t, ch)
	}
	a, b, c := req(seed), req(seed), req(seed+1)
	for i := 0; i < 4; i++ {
		if len(a.tokens[i]) != 10 || !slices.Equal(a.tokens[i], b.tokens[i]) {
			t.Errorf("choice %d: same seed gave %v and %v", i, a.tokens[i], b.tokens[i])
		}
	}
	if slices.Equal(a.tokens[0], c.tokens[0]) && slices.Equal(a.tokens[1], c.tokens[1]) {
		t.Errorf("another seed gave the same output")
	}
	distinct := map[string]bool{}
	for i := 0; i < 4; i++ {
		distinct[fmt.Sprint(a.tokens[i])] = true
	}
	if len(distinct) < 2 {
		t.Errorf("4 sampled choices are all identical: %v", a.tokens)
	}
	if a.usage.CompletionTokens != 40 {
		t.Errorf("usage counts %d completion tokens, want 40", a.usage.CompletionTokens)
	}
	waitIdle(t, e)
}

// TestStopStrings: the text before a stop string is returned, the stop string
// never is, including when it spans tokens.
func TestStopStrings(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{})
	prompt := randPrompt(rand.New(rand.NewPCG(3, 3)), 8)
	full := collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 24, IgnoreEOS: true}))
	text := full.text[0]
	if len(text) < 12 {
		t.Skipf("reference output %q too short to cut", text)
	}
	for _, cut := range []int{len(text) / 3, len(text) / 2} {
		stop := text[cut : cut+3]
		want := text[:strings.Index(text, stop)]
		got := collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 24, IgnoreEOS: true, Stop: []string{"\x00never", stop}}))
		if got.text[0] != want || got.reasons[0] != engine.FinishStop {
			t.Errorf("stop %q: got %q (%s), want %q", stop, got.text[0], got.reasons[0], want)
		}
	}
	// Without a stop the streamed increments equal the decoded tokens.
	dec, err := f.tok.Decode(full.tokens[0], true)
	if err != nil || dec != text {
		t.Errorf("streamed text %q, decoded %q (%v)", text, dec, err)
	}
}

func mustGen(t testing.TB, e *engine.Engine, prompt []int32, p engine.SamplingParams) <-chan engine.Event {
	t.Helper()
	ch, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt, Sampling: p})
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func TestCancelFreesBlocks(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 4})
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := e.Generate(ctx, &engine.Request{Prompt: randPrompt(rand.New(rand.NewPCG(4, 4)), 20),
		Sampling: engine.SamplingParams{MaxTokens: 100, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	<-ch // first token; the step's stats are published right after it
	deadline := time.Now().Add(5 * time.Second)
	for e.Stats().BlocksUsed == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a running sequence holds no blocks")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	for range ch {
	}
	if st := waitIdle(t, e); st.BlocksUsed != 0 || st.Running != 0 {
		t.Errorf("after cancel: %+v", st)
	}
}

func TestRejections(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{MaxQueue: 1, MaxModelLen: 64})
	ok := engine.SamplingParams{MaxTokens: 4}
	for _, tc := range []struct {
		req  engine.Request
		want string
	}{
		{engine.Request{Prompt: nil, Sampling: ok}, "prompt"},
		{engine.Request{Prompt: []int32{5, 100000}, Sampling: ok}, "vocabulary"},
		{engine.Request{Prompt: randPrompt(rand.New(rand.NewPCG(5, 5)), 61), Sampling: ok}, "max_tokens"},
		{engine.Request{Prompt: []int32{5}, Sampling: engine.SamplingParams{MaxTokens: 4, Temperature: 3}}, "temperature"},
		{engine.Request{Prompt: []int32{5}, Sampling: engine.SamplingParams{MaxTokens: 4, TopP: 1.5}}, "top_p"},
		{engine.Request{Prompt: []int32{5}, Sampling: engine.SamplingParams{MaxTokens: 4, Stop: []string{""}}}, "stop"},
	} {
		if _, err := e.Generate(context.Background(), &tc.req); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Generate = %v, want an error naming %q", err, tc.want)
		}
	}
	// Fill the queue: the step loop is busy with a long request, so a burst
	// of submissions overflows a one-entry queue.
	var full int
	var chans []<-chan engine.Event
	for i := 0; i < 50; i++ {
		ch, err := e.Generate(context.Background(), &engine.Request{Prompt: []int32{5, 6, 7}, Sampling: engine.SamplingParams{MaxTokens: 8, IgnoreEOS: true}})
		if err == engine.ErrQueueFull {
			full++
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	if full == 0 {
		t.Errorf("50 instant submissions never hit a queue of 1")
	}
	for _, ch := range chans {
		if r := collect(t, ch); len(r.tokens[0]) != 8 {
			t.Errorf("an accepted request produced %d tokens", len(r.tokens[0]))
		}
	}
}

// TestManyConcurrentStreams: 200 concurrent streaming requests all finish,
// every block is free afterwards and no goroutine is left over.
func TestManyConcurrentStreams(t *testing.T) {
	f := load(t)
	before := runtime.NumGoroutine()
	e, err := engine.New(f.m.Model, f.be, f.tok, engine.Config{BlockSize: 8, MaxNumSeqs: 64}, engine.Options{Name: "t", EOS: []int32{2}})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(6, 6))
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for i := 0; i < 200; i++ {
		prompt := randPrompt(rng, 2+rng.IntN(20))
		ctx, cancel := context.WithCancel(context.Background())
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer cancel()
			ch, err := e.Generate(ctx, &engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 8, Temperature: 0.7, IgnoreEOS: true}})
			if err != nil {
				t.Error(err)
				return
			}
			if r := collect(t, ch); r.reasons[0] == engine.FinishLength {
				mu.Lock()
				done++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if done != 200 {
		t.Errorf("%d of 200 requests finished", done)
	}
	if st := waitIdle(t, e); st.BlocksUsed != 0 {
		t.Errorf("%d blocks held after all requests", st.BlocksUsed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines before, %d after", before, n)
	}
}

func TestShutdownDrains(t *testing.T) {
	f := load(t)
	e, err := engine.New(f.m.Model, f.be, f.tok, engine.Config{}, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	ch := mustGen(t, e, []int32{4, 5, 6}, engine.SamplingParams{MaxTokens: 20, IgnoreEOS: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- e.Shutdown(ctx) }()
	r := collect(t, ch)
	if len(r.tokens[0]) != 20 || r.reasons[0] != engine.FinishLength {
		t.Errorf("in-flight request cut short by shutdown: %d tokens, %q", len(r.tokens[0]), r.reasons[0])
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if _, err := e.Generate(context.Background(), &engine.Request{Prompt: []int32{1}}); err != engine.ErrDraining {
		t.Errorf("Generate after shutdown = %v, want ErrDraining", err)
	}
}

// TestSeedUnderConcurrency: a seeded request gives the same tokens alone and
// while other requests share its batches.
func TestSeedUnderConcurrency(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 8, PrefixCaching: true})
	prompt := randPrompt(rand.New(rand.NewPCG(8, 8)), 12)
	seed := uint64(7)
	p := engine.SamplingParams{MaxTokens: 16, Temperature: 1, TopP: 0.9, Seed: &seed, IgnoreEOS: true}
	alone := collect(t, mustGen(t, e, prompt, p)).tokens[0]
	rng := rand.New(rand.NewPCG(9, 9))
	var wg sync.WaitGroup
	results := make([][]int32, 6)
	for i := range 12 {
		other := randPrompt(rng, 1+rng.IntN(30))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				results[i/2] = collect(t, mustGen(t, e, prompt, p)).tokens[0]
				return
			}
			collect(t, mustGen(t, e, other, engine.SamplingParams{MaxTokens: 1 + i, Temperature: 0.5, IgnoreEOS: true}))
		}()
	}
	wg.Wait()
	for i, r := range results {
		if !slices.Equal(r, alone) {
			t.Errorf("copy %d under concurrency: %v, alone: %v", i, r, alone)
		}
	}
}
