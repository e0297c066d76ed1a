package grpcapi

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mkserve/mkserve/engine"
)

// fakeGen is a deterministic engine.Generator: choice i's k-th token is
// fakeToken(prompt, i, k); it stops on a stop token or after MaxTokens,
// one event per token, choices interleaved, delay between tokens. A
// request whose ID starts with a key of errs fails with that error; one
// starting with "midfail" ends choice 0 with FinishError after one token;
// one starting with "panic" panics in Generate.
type fakeGen struct {
	maxCtx int
	vocab  int
	delay  time.Duration
	errs   map[string]error

	mu        sync.Mutex
	seen      []*engine.Request
	started   chan string // request IDs, when generation starts (buffered)
	cancelled chan string // request IDs whose ctx ended before they finished
}

func newFake(maxCtx, vocab int) *fakeGen {
	return &fakeGen{maxCtx: maxCtx, vocab: vocab, started: make(chan string, 1024), cancelled: make(chan string, 1024)}
}

func (f *fakeGen) ModelName() string { return "fake-moe" }
func (f *fakeGen) MaxContext() int   { return f.maxCtx }

// fakeToken is a token id derived from the whole prompt, the choice and
// the position.
func fakeToken(prompt []int32, choice, k, vocab int) int32 {
	var h uint64 = 1469598103934665603
	for _, id := range prompt {
		h = (h ^ uint64(uint32(id))) * 1099511628211
	}
	h = (h ^ uint64(choice)) * 1099511628211
	h = (h ^ uint64(k)) * 1099511628211
	return int32(h % uint64(vocab))
}

func fakeText(id int32) string { return fmt.Sprintf("<%d>", id) }

func fakeLogprob(k int) float32 { return -float32(k+1) / 8 }

func (f *fakeGen) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Event, error) {
	if strings.HasPrefix(req.ID, "panic") {
		panic("fake generator: " + req.ID)
	}
	for prefix, err := range f.errs {
		if strings.HasPrefix(req.ID, prefix) {
			return nil, err
		}
	}
	if len(req.Prompt)+req.Sampling.MaxTokens > f.maxCtx {
		return nil, engine.ErrTooLong
	}
	f.mu.Lock()
	f.seen = append(f.seen, req)
	f.mu.Unlock()
	out := make(chan engine.Event)
	go f.run(ctx, req, out)
	return out, nil
}

func (f *fakeGen) run(ctx context.Context, req *engine.Request, out chan<- engine.Event) {
	defer close(out)
	note(f.started, req.ID)
	sp := req.Sampling
	done := make([]bool, sp.N)
	counts := make([]int, sp.N)
	send := func(ev engine.Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	left := sp.N
	for k := 0; left > 0; k++ {
		select {
		case <-ctx.Done():
			note(f.cancelled, req.ID)
			for i := range sp.N {
				if !done[i] {
					// Best effort, as an engine would: nobody may be reading.
					select {
					case out <- engine.Event{Index: i, FinishReason: engine.FinishAbort}:
					default:
					}
				}
			}
			return
		case <-time.After(f.delay):
		}
		for i := range sp.N {
			if done[i] {
				continue
			}
			id := fakeToken(req.Prompt, i, k, f.vocab)
			ev := engine.Event{Index: i, TokenIDs: []int32{id}, Text: fakeText(id)}
			counts[i]++
			if sp.Logprobs {
				lp := engine.Logprob{TokenLogprob: engine.TokenLogprob{ID: id, Text: fakeText(id), Logprob: fakeLogprob(k)}}
				for j := range sp.TopLogprobs {
					alt := (id + int32(j)) % int32(f.vocab)
					lp.Top = append(lp.Top, engine.TokenLogprob{ID: alt, Text: fakeText(alt), Logprob: fakeLogprob(k + j)})
				}
				ev.Logprobs = []engine.Logprob{lp}
			}
			switch {
			case i == 0 && strings.HasPrefix(req.ID, "midfail"):
				ev.FinishReason, ev.Err = engine.FinishError, fmt.Errorf("fake: device lost")
			case slices.Contains(sp.StopTokenIDs, id):
				ev.FinishReason, ev.Text = engine.FinishStop, ""
			case counts[i] == sp.MaxTokens:
				ev.FinishReason = engine.FinishLength
			}
			if ev.FinishReason != "" {
				done[i] = true
				left--
			}
			if left == 0 {
				total := 0
				for _, c := range counts {
					total += c
				}
				ev.Usage = &engine.Usage{PromptTokens: len(req.Prompt), CompletionTokens: total, CachedTokens: len(req.Prompt) / 2}
				if len(req.Prediction) > 0 { // (counts the tests can predict)
					ev.Usage.AcceptedPredictionTokens, ev.Usage.RejectedPredictionTokens = len(req.Prediction), 1
				}
			}
			if !send(ev) {
				note(f.cancelled, req.ID)
				return
			}
		}
	}
}

// note sends id on c unless c is full.
func note(c chan<- string, id string) {
	select {
	case c <- id:
	default:
	}
}

// requests returns the engine requests seen so far.
func (f *fakeGen) requests() []*engine.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// want is what the fake produces for prompt with settings sp: per choice
// the token ids, text, logprobs and finish reason (an independent
// re-statement of run's rules).
type wantChoice struct {
	ids    []int32
	text   string
	lps    []float32
	finish string
}

func expect(prompt []int32, sp engine.SamplingParams, vocab int) []wantChoice {
	out := make([]wantChoice, sp.N)
	for i := range out {
		for k := range sp.MaxTokens {
			id := fakeToken(prompt, i, k, vocab)
			out[i].ids = append(out[i].ids, id)
			out[i].lps = append(out[i].lps, fakeLogprob(k))
			if slices.Contains(sp.StopTokenIDs, id) {
				out[i].finish = engine.FinishStop
				break
			}
			out[i].text += fakeText(id)
		}
		if out[i].finish == "" {
			out[i].finish = engine.FinishLength
		}
	}
	return out
}
