package httpapi

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode"

	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/tokenizer"
)

// The test tokenizer and chat template: the golden Qwen3-MoE checkpoint's
// (in the repository, so these tests never skip).
var (
	tokOnce  sync.Once
	testTok  *tokenizer.Tokenizer
	testTmpl *chat.Template
	safeIDs  []int32 // token ids whose text is printable ASCII
	safeText = map[int32]string{}
	tokErr   error
)

func loadTok(t testing.TB) (*tokenizer.Tokenizer, *chat.Template) {
	t.Helper()
	tokOnce.Do(func() {
		dir := filepath.Join("..", "..", "models", "testdata", "golden", "qwen3_moe")
		if testTok, tokErr = tokenizer.LoadDir(dir); tokErr != nil {
			return
		}
		if testTmpl, tokErr = chat.Compile(testTok.Config().ChatTemplate); tokErr != nil {
			return
		}
		for id := range int32(testTok.VocabSize()) {
			s, err := testTok.Decode([]int32{id}, false)
			if err != nil || s == "" || strings.ContainsFunc(s, func(r rune) bool { return r > unicode.MaxASCII || !unicode.IsPrint(r) }) {
				continue
			}
			if _, special, _ := testTok.IDToken(id); special {
				continue
			}
			safeIDs = append(safeIDs, id)
			safeText[id] = s
		}
		if len(safeIDs) < 50 {
			tokErr = fmt.Errorf("only %d printable tokens in %s", len(safeIDs), dir)
		}
	})
	if tokErr != nil {
		t.Fatal(tokErr)
	}
	return testTok, testTmpl
}

// gpt2Path is the shared GPT-2 tokenizer, relative to this package.
var gpt2Path = filepath.Join("..", "..", "..", "shared", "tokenizers", "gpt2", "tokenizer.json")

// tokText is the text of a printable token.
func tokText(id int32) string {
	s, ok := safeText[id]
	if !ok {
		panic(fmt.Sprintf("token %d is not a printable test token", id))
	}
	return s
}

// tokenAt is the fake model: the k-th token of choice i after prompt, a
// hash of all three (so a prompt, index or length mix-up changes the text).
func tokenAt(prompt []int32, choice, k int) int32 { return tokenAtHash(promptHash(prompt), choice, k) }

// promptHash is FNV-1a over the prompt's ids.
func promptHash(prompt []int32) uint64 {
	h := uint64(14695981039346656037)
	for _, id := range prompt {
		for b := range 4 {
			h ^= uint64(byte(uint32(id) >> (8 * b)))
			h *= 1099511628211
		}
	}
	return h
}

func tokenAtHash(ph uint64, choice, k int) int32 {
	// splitmix64 finalizer over the prompt hash, choice and position.
	x := ph ^ uint64(choice)*0x9e3779b97f4a7c15 ^ uint64(k)*0xbf58476d1ce4e5b9
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	return safeIDs[x%uint64(len(safeIDs))]
}

// fakeLogprob is the fake's log-probability of token k of choice i, and of
// its j-th alternative.
func fakeLogprob(choice, k, j int) float32 {
	return -float32(k+1)/8 - float32(choice)/64 - float32(j)
}

func fakeTop(prompt []int32, choice, k, j int) int32 {
	return tokenAt(prompt, choice+1000*(j+1), k)
}

func fakeTopHash(ph uint64, choice, k, j int) int32 { return tokenAtHash(ph, choice+1000*(j+1), k) }

// earliestStop is the start of the first stop string in text (-1: none).
func earliestStop(text string, stops []string) int {
	best := -1
	for _, s := range stops {
		if p := strings.Index(text, s); p >= 0 && (best < 0 || p < best) {
			best = p
		}
	}
	return best
}

// expect is the reference output of one choice: its text, finish reason
// and number of generated tokens.
func expect(prompt []int32, choice int, sp engine.SamplingParams) (string, string, int) {
	text := ""
	for k := range sp.MaxTokens {
		id := tokenAt(prompt, choice, k)
		for _, s := range sp.StopTokenIDs {
			if s == id {
				return text, engine.FinishStop, k + 1
			}
		}
		text += tokText(id)
		if p := earliestStop(text, sp.Stop); p >= 0 {
			return text[:p], engine.FinishStop, k + 1
		}
	}
	return text, engine.FinishLength, sp.MaxTokens
}

// fakeGen is an engine.Generator whose output is a deterministic function
// of the request (tokenAt), streamed one token per event with choices
// interleaved and stop strings held back as a real engine does.
type fakeGen struct {
	maxCtx int

	mu   sync.Mutex
	reqs []engine.Request

	err       error // Generate returns it
	hold      bool  // after the first event, wait for ctx to end
	failAt    int   // > 0: choice 0 fails with FinishError at this token
	failErr   error // its error (nil: an internal one)
	panics    bool
	vocab     int            // ids the engine accepts (0: the test tokenizer's)
	noRecord  bool           // keep no copies of requests (fuzzing)
	reply     string         // when set, every choice's whole text, in events of 5 bytes, then stop
	cancelled chan string    // IDs whose ctx ended before their last event
	running   sync.WaitGroup // event goroutines
}

func newFake(maxCtx int) *fakeGen {
	return &fakeGen{maxCtx: maxCtx, cancelled: make(chan string, 64)}
}

func (f *fakeGen) ModelName() string { return "fake-moe" }
func (f *fakeGen) MaxContext() int   { return f.maxCtx }

func (f *fakeGen) requests() []engine.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]engine.Request(nil), f.reqs...)
}

func (f *fakeGen) Generate(ctx context.Context, req *engine.Request) (<-chan engine.Event, error) {
	if f.panics {
		panic("fake engine exploded: secret-internal-detail")
	}
	if f.err != nil {
		return nil, f.err
	}
	sp := req.Sampling
	if sp.N < 1 || sp.MaxTokens < 1 || len(req.Prompt) == 0 || req.ID == "" {
		return nil, fmt.Errorf("fake: invalid request %q n=%d max=%d prompt=%d", req.ID, sp.N, sp.MaxTokens, len(req.Prompt))
	}
	// What the real engine would refuse, the server must have refused.
	if err := sp.Validate(); err != nil {
		return nil, fmt.Errorf("fake: the engine refuses %+v: %w", sp, err)
	}
	vocab := f.vocab
	if vocab == 0 {
		vocab = testTok.VocabSize()
	}
	for _, id := range append(append([]int32(nil), req.Prompt...), sp.StopTokenIDs...) {
		if id < 0 || int(id) >= vocab {
			return nil, fmt.Errorf("fake: token id %d outside the vocabulary", id)
		}
	}
	if len(req.Prompt)+sp.MaxTokens > f.maxCtx {
		return nil, engine.ErrTooLong
	}
	if !f.noRecord {
		f.mu.Lock()
		f.reqs = append(f.reqs, *req)
		f.mu.Unlock()
	}
	events := f.script(req)
	ch := make(chan engine.Event) // unbuffered: the server must keep reading
	f.running.Add(1)
	go func() {
		defer f.running.Done()
		defer close(ch)
		for i, ev := range events {
			if f.hold && i == 1 {
				<-ctx.Done()
			}
			if ctx.Err() == nil {
				select {
				case ch <- ev:
					continue
				case <-ctx.Done():
				}
			}
			select {
			case f.cancelled <- req.ID:
			default:
			}
			// As the engine does: the unfinished choices end with abort.
			done := map[int]bool{}
			for _, e := range events[:i] {
				if e.FinishReason != "" {
					done[e.Index] = true
				}
			}
			for c := range sp.N {
				if !done[c] {
					ch <- engine.Event{Index: c, FinishReason: engine.FinishAbort}
				}
			}
			return
		}
	}()
	return ch, nil
}

// script is the whole event sequence of req.
func (f *fakeGen) script(req *engine.Request) []engine.Event {
	sp := req.Sampling
	if f.reply != "" {
		var events []engine.Event
		for i := range sp.N {
			for k := 0; k < len(f.reply); k += 5 {
				ev := engine.Event{Index: i, TokenIDs: []int32{1}, Text: f.reply[k:min(k+5, len(f.reply))]}
				if k+5 >= len(f.reply) {
					ev.FinishReason = engine.FinishStop
				}
				events = append(events, ev)
			}
		}
		events[len(events)-1].Usage = &engine.Usage{PromptTokens: len(req.Prompt), CompletionTokens: len(events)}
		return events
	}
	type state struct {
		text    string
		emitted int
		done    bool
	}
	st := make([]state, sp.N)
	hold := 0
	for _, s := range sp.Stop {
		hold = max(hold, len(s)-1)
	}
	var events []engine.Event
	generated := 0
	ph := promptHash(req.Prompt)
	for k := range sp.MaxTokens {
		for i := range sp.N {
			s := &st[i]
			if s.done {
				continue
			}
			id := tokenAtHash(ph, i, k)
			generated++
			ev := engine.Event{Index: i, TokenIDs: []int32{id}}
			if k == 0 && sp.PromptLogprobs { // each prompt token after the first, as the engine sends them
				for j, p := range req.Prompt[1:] {
					ev.PromptLogprobs = append(ev.PromptLogprobs, engine.Logprob{TokenLogprob: engine.TokenLogprob{ID: p, Text: tokText(p), Logprob: -float32(j+1) / 8}})
				}
			}
			if sp.Logprobs {
				lp := engine.Logprob{TokenLogprob: engine.TokenLogprob{ID: id, Text: tokText(id), Logprob: fakeLogprob(i, k, 0)}}
				for j := range sp.TopLogprobs {
					alt := fakeTopHash(ph, i, k, j)
					lp.Top = append(lp.Top, engine.TokenLogprob{ID: alt, Text: tokText(alt), Logprob: fakeLogprob(i, k, j+1)})
				}
				ev.Logprobs = []engine.Logprob{lp}
			}
			stopID := false
			for _, x := range sp.StopTokenIDs {
				stopID = stopID || x == id
			}
			switch {
			case i == 0 && f.failAt > 0 && k == f.failAt:
				ev.FinishReason, ev.Err = engine.FinishError, fmt.Errorf("fake: device lost (secret-internal-detail)")
				if f.failErr != nil {
					ev.Err = f.failErr
				}
				s.done = true
			case stopID:
				ev.Text, ev.FinishReason = s.text[s.emitted:], engine.FinishStop
				s.done = true
			default:
				s.text += tokText(id)
				if p := earliestStop(s.text, sp.Stop); p >= 0 {
					ev.Text, ev.FinishReason = s.text[s.emitted:p], engine.FinishStop
					s.done = true
				} else if k == sp.MaxTokens-1 {
					ev.Text, ev.FinishReason = s.text[s.emitted:], engine.FinishLength
					s.done = true
				} else if safe := len(s.text) - hold; safe > s.emitted {
					ev.Text = s.text[s.emitted:safe]
					s.emitted = safe
				}
			}
			events = append(events, ev)
		}
	}
	events[len(events)-1].Usage = &engine.Usage{PromptTokens: len(req.Prompt), CompletionTokens: generated, CachedTokens: len(req.Prompt) / 2}
	return events
}
