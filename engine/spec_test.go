package engine

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/grammar"
	"github.com/mkserve/mkserve/models"
)

// rowModel is a fake model: its logits row after token t is what fill
// writes; it counts the tokens it was fed.
type rowModel struct {
	cfg  *models.Config
	fill func(t int32, row []float32)
	mu   sync.Mutex
	fed  int
}

func (m *rowModel) Config() *models.Config      { return m.cfg }
func (m *rowModel) KVFloatsPerToken() int       { return 8 }
func (m *rowModel) KVWidths() []backend.KVWidth { return []backend.KVWidth{{K: 4, V: 4}} }
func (m *rowModel) Forward(b *backend.Batch) (backend.Tensor, error) {
	m.mu.Lock()
	m.fed += len(b.Tokens)
	m.mu.Unlock()
	V := m.cfg.VocabSize
	rows := b.LogitRows
	if rows == nil {
		rows = make([]int, len(b.Tokens))
		for i := range rows {
			rows[i] = i
		}
	}
	out := make(fakeTensor, len(rows)*V)
	for r, i := range rows {
		m.fill(b.Tokens[i], out[r*V:(r+1)*V])
	}
	return out, nil
}

// settled is e's stats once its last step has published them: a request's
// final event reaches its caller before the step that produced it counts
// its drafts and steps.
func settled(t testing.TB, e *Engine) Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()
		if st.Running == 0 && st.Waiting == 0 || time.Now().After(deadline) {
			return st
		}
		time.Sleep(time.Millisecond)
	}
}

// stillClock stands still: speculation's meter sees no step time and
// never pauses (the tests that count drafts and steps use it).
func stillClock() time.Time { return time.Time{} }

// nextModel's greedy pick after token t is next(t), with a clear margin
// over every other token.
func nextModel(V int, next func(t int32) int32) *rowModel {
	return &rowModel{cfg: &models.Config{VocabSize: V, MaxPositions: 4096}, fill: func(t int32, row []float32) {
		for k := range row {
			row[k] = float32((k*37)%11) / 11 // some spread below the pick
		}
		row[next(t)] = 5
	}}
}

// probModel's next-token distribution after token t puts probability
// probs[k] on token (t+k+1) % V for k < len(probs), none elsewhere: a
// model whose draws a test can count.
func probModel(V int, probs []float64) *rowModel {
	return &rowModel{cfg: &models.Config{VocabSize: V, MaxPositions: 4096}, fill: func(t int32, row []float32) {
		for k := range row {
			row[k] = -1e9
		}
		for k, p := range probs {
			row[(int(t)+k+1)%V] = float32(math.Log(p))
		}
	}}
}

// TestNgramDraft: the draft follows the most recent earlier occurrence of
// the longest suffix that has one, within the bounds.
func TestNgramDraft(t *testing.T) {
	for _, c := range []struct {
		toks       []int32
		k, max, mn int
		want       []int32
	}{
		{[]int32{1, 2, 3, 4, 5, 1, 2}, 3, 4, 2, []int32{3, 4, 5}},
		{[]int32{1, 2, 3, 9, 2, 3, 7, 1, 2, 3}, 2, 4, 2, []int32{9, 2}}, // "1 2 3" wins over the later "2 3"
		{[]int32{5, 6, 7, 6, 7, 8, 6, 7}, 4, 3, 2, []int32{8, 6, 7}},    // most recent "6 7", cut at the end
		{[]int32{1, 2, 3, 4}, 4, 4, 2, nil},                             // no repeat
		{[]int32{1, 2, 1, 3, 1}, 2, 4, 1, []int32{3, 1}},                // unigram when allowed
		{[]int32{1, 2, 1, 3, 1}, 2, 4, 2, nil},                          // … not when n ≥ 2
		{[]int32{4, 4, 4, 4}, 3, 2, 2, []int32{4}},                      // overlapping occurrence, up to the end
	} {
		if got := ngramDraft(c.toks, c.k, c.max, c.mn); !slices.Equal(got, c.want) {
			t.Errorf("ngramDraft(%v, k %d, n %d..%d) = %v, want %v", c.toks, c.k, c.mn, c.max, got, c.want)
		}
	}
}

// TestSpeculationMatchesGreedy: with prompt-lookup speculation on, every
// greedy request's tokens, text and finish reason equal those of plain
// greedy decoding — with drafts that are right (a model that repeats a cycle the
// prompt shows), mostly wrong (a model that does not), ended mid-draft by
// max_tokens, an EOS token or a stop string, and beside requests that do
// not qualify (sampled, logprobs) — while the repeating model needs fewer
// steps, and the counts of drafted and accepted tokens add up.
func TestSpeculationMatchesGreedy(t *testing.T) {
	const V = 64
	cycle := func(t int32) int32 { return (t + 1) % 7 } // 0 1 2 … 6 0 1 …
	scramble := func(t int32) int32 { return (t*5 + 3) % V }
	prompts := [][]int32{
		{0, 1, 2, 3, 4, 5, 6, 0, 1, 2},
		{3, 4, 5, 6, 0, 1, 2, 3, 4},
		{9, 10, 11, 9, 10},
		{20, 21, 22, 23},
		{1, 8, 43, 0, 7, 1}, // scramble: 1 → 8 → 43 → 26: the draft after "1 8" is right once, then wrong
	}
	seed := uint64(3)
	params := []SamplingParams{
		{MaxTokens: 23, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true},
		{MaxTokens: 5, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true},
		{MaxTokens: 30, TopP: 1, RepetitionPenalty: 1},                                        // EOS (token 2) ends it
		{MaxTokens: 30, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true, Stop: []string{"fa"}}, // stop string
		{MaxTokens: 12, Temperature: 0.7, TopP: 1, RepetitionPenalty: 1, Seed: &seed, IgnoreEOS: true},
		{MaxTokens: 12, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true, Logprobs: true, TopLogprobs: 2},
		{N: 2, MaxTokens: 9, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}, // choices fork after the prompt, then speculate
	}
	for _, mc := range []struct {
		name string
		next func(int32) int32
	}{{"cycle", cycle}, {"scramble", scramble}} {
		t.Run(mc.name, func(t *testing.T) {
			run := func(spec int) ([]string, Stats, int) {
				m := nextModel(V, mc.next)
				// (through a gate: the requests are admitted together, so the
				// steps — compared below — do not depend on scheduling)
				gm := &clockedModel{rowModel: m, now: new(atomic.Int64), cost: func(*backend.Batch) time.Duration { return 0 }, gate: newGate()}
				e, err := New(gm, fakeBackend{}, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 20, SpeculativeTokens: spec},
					Options{Name: "t", EOS: []int32{2}, Clock: stillClock})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Shutdown(context.Background())
				chans := make([]<-chan Event, len(prompts)*len(params))
				gm.gate.send(len(chans), func(i int) {
					ch, err := e.Generate(context.Background(), &Request{Prompt: prompts[i/len(params)], Sampling: params[i%len(params)]})
					if err != nil {
						t.Fatal(err)
					}
					chans[i] = ch
				})
				var out []string
				for _, ch := range chans {
					toks := map[int][]int32{} // by choice
					text, reason := map[int]string{}, map[int]string{}
					lps := map[int][]string{}
					for ev := range ch {
						i := ev.Index
						toks[i] = append(toks[i], ev.TokenIDs...)
						text[i] += ev.Text
						for _, lp := range ev.Logprobs {
							lps[i] = append(lps[i], fmt.Sprintf("%d:%.4f", lp.ID, lp.Logprob))
						}
						if ev.FinishReason != "" {
							reason[i] = ev.FinishReason
						}
						if ev.Err != nil {
							t.Fatal(ev.Err)
						}
					}
					out = append(out, fmt.Sprintf("%v %v %v %v", toks, text, reason, lps))
				}
				return out, settled(t, e), m.fed
			}
			want, plain, plainFed := run(0)
			got, st, fed := run(4)
			// Accepted drafts are never fed again: the speculative run feeds
			// the plain run's tokens plus the rejected drafts (and, per
			// request, at most a draft cut off by its end).
			if extra := int64(fed - plainFed); extra < 0 || extra > st.SpecDrafted-st.SpecAccepted+int64(4*len(prompts)*len(params)) {
				t.Errorf("fed %d tokens against %d: %d more, with %d drafts rejected", fed, plainFed, extra, st.SpecDrafted-st.SpecAccepted)
			}
			for i := range want {
				if sp := params[i%len(params)]; sp.Temperature > 0 && !sp.Logprobs {
					continue // sampled with speculation: the same distribution, other draws (TestSpeculationSampled)
				}
				if got[i] != want[i] {
					t.Errorf("request %d (prompt %v, %+v):\nspeculative %s\ngreedy      %s", i, prompts[i/len(params)],
						params[i%len(params)], got[i], want[i])
				}
			}
			if st.SpecDrafted == 0 || st.SpecAccepted > st.SpecDrafted {
				t.Errorf("drafted %d, accepted %d", st.SpecDrafted, st.SpecAccepted)
			}
			t.Logf("steps %d → %d, drafted %d, accepted %d, fed %d → %d", plain.Steps, st.Steps, st.SpecDrafted, st.SpecAccepted, plainFed, fed)
			if mc.name == "cycle" && (st.Steps >= plain.Steps || st.SpecAccepted < st.SpecDrafted/2) {
				t.Errorf("a repeating model: %d steps against %d, %d of %d drafts accepted", st.Steps, plain.Steps, st.SpecAccepted, st.SpecDrafted)
			}
			if strings.Contains(strings.Join(got, ""), "error") {
				t.Error("an error finish")
			}
		})
	}
}

// TestSpeculationRealModel: on the CPU test model (its KV cache real: a
// rejected draft leaves entries past the sequence that later steps must
// overwrite, an accepted one must not be computed again), greedy outputs
// with speculation equal those without, over prompts that repeat.
func TestSpeculationRealModel(t *testing.T) {
	dir := "../models/testdata/golden/qwen3_moe"
	run := func(spec int) ([][]int32, Stats) {
		be := cpu.New(cpu.Options{})
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		e, err := New(l.Model, be, fakeDetok{}, Config{BlockSize: 4, SpeculativeTokens: spec, PrefixCaching: true}, Options{Name: "t", EOS: []int32{2}, Clock: stillClock})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		var chans []<-chan Event
		for i := range 6 {
			base := []int32{int32(10 + i), 40, 41, 42, 43, int32(50 + i), 44}
			prompt := append(slices.Repeat(base, 3), base[:3]...)
			ch, err := e.Generate(context.Background(), &Request{Prompt: prompt, Sampling: SamplingParams{MaxTokens: 24, TopP: 1,
				RepetitionPenalty: 1, IgnoreEOS: true}})
			if err != nil {
				t.Fatal(err)
			}
			chans = append(chans, ch)
		}
		return tokensOf(t, chans), settled(t, e)
	}
	want, _ := run(0)
	got, st := run(5)
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d:\nspeculative %v\ngreedy      %v", i, got[i], want[i])
		}
	}
	if st.SpecDrafted == 0 {
		t.Error("no drafts over repeating prompts")
	}
	t.Logf("drafted %d, accepted %d", st.SpecDrafted, st.SpecAccepted)
}

// TestSpeculationSampled: sampled requests with speculation draw from the
// model's distribution. A model whose next token is t+1 with probability
// 0.7, t+2 with 0.2 and t+3 with 0.1 runs 400 seeded requests over a
// prompt that repeats (so drafts exist and are partly right): the counts
// of each step size over all their tokens match 0.7 / 0.2 / 0.1 within
// 4 % absolute, as they do without speculation, and drafts were both
// accepted and rejected.
func TestSpeculationSampled(t *testing.T) {
	const V = 16
	run := func(spec int) ([3]int, Stats) {
		m := probModel(V, []float64{0.7, 0.2, 0.1})
		e, err := New(m, fakeBackend{}, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 22, SpeculativeTokens: spec, SpeculativeNgramMin: 1},
			Options{Name: "t", Clock: stillClock})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		var counts [3]int
		var chans []<-chan Event
		prompts := make([][]int32, 400)
		for i := range prompts {
			seed := uint64(i + 1)
			prompts[i] = []int32{0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}
			ch, err := e.Generate(context.Background(), &Request{Prompt: prompts[i], Sampling: SamplingParams{MaxTokens: 20,
				Temperature: 1, TopP: 1, RepetitionPenalty: 1, Seed: &seed, IgnoreEOS: true}})
			if err != nil {
				t.Fatal(err)
			}
			chans = append(chans, ch)
		}
		for i, ch := range chans {
			prev := prompts[i][len(prompts[i])-1]
			for ev := range ch {
				if ev.Err != nil {
					t.Fatal(ev.Err)
				}
				for _, tok := range ev.TokenIDs {
					d := (int(tok) - int(prev) - 1 + V) % V
					if d > 2 {
						t.Fatalf("token %d after %d: a step the model never takes", tok, prev)
					}
					counts[d]++
					prev = tok
				}
			}
		}
		return counts, settled(t, e)
	}
	for _, spec := range []int{0, 4} {
		c, st := run(spec)
		n := float64(c[0] + c[1] + c[2])
		t.Logf("speculative %d: steps of 1 / 2 / 3: %.3f / %.3f / %.3f over %d tokens; drafted %d, accepted %d",
			spec, float64(c[0])/n, float64(c[1])/n, float64(c[2])/n, int(n), st.SpecDrafted, st.SpecAccepted)
		for k, want := range []float64{0.7, 0.2, 0.1} {
			if got := float64(c[k]) / n; math.Abs(got-want) > 0.04 {
				t.Errorf("speculative %d: step %d has frequency %.3f, want %.2f", spec, k+1, got, want)
			}
		}
		if spec > 0 && (st.SpecAccepted == 0 || st.SpecAccepted == st.SpecDrafted) {
			t.Errorf("drafted %d, accepted %d: want some of each", st.SpecDrafted, st.SpecAccepted)
		}
	}
}

// TestSpecBackoff: a sequence whose drafts are mostly rejected over a
// window stops drafting for specBackoff steps; a good rate keeps it on.
func TestSpecBackoff(t *testing.T) {
	for _, c := range []struct {
		drafts, accepts []int
		pause           int
	}{
		{[]int{4, 4, 4, 4}, []int{4, 2, 1, 1}, 0},           // 8 of 16
		{[]int{4, 4, 4, 4}, []int{1, 0, 2, 0}, specBackoff}, // 3 of 16
		{[]int{4, 4, 4}, []int{0, 0, 0}, 0},                 // window not full yet
		{[]int{8, 8}, []int{3, 3}, specBackoff},             // 6 of 16
	} {
		s := &sequence{}
		for i := range c.drafts {
			s.specResult(c.drafts[i], c.accepts[i])
		}
		if s.specPause != c.pause {
			t.Errorf("drafts %v accepted %v: pause %d, want %d", c.drafts, c.accepts, s.specPause, c.pause)
		}
	}
}

// TestSpecConfig: the speculation settings' bounds, the n-gram minimum
// checked against the default maximum when that is 0.
func TestSpecConfig(t *testing.T) {
	for _, c := range []struct {
		cfg Config
		ok  bool
	}{
		{Config{SpeculativeTokens: 4}, true},
		{Config{SpeculativeTokens: MaxSpeculativeTokens + 1}, false},
		{Config{SpeculativeTokens: -1}, false},
		{Config{SpeculativeTokens: 4, SpeculativeNgramMin: 5}, false}, // above the default maximum 4
		{Config{SpeculativeTokens: 4, SpeculativeNgramMin: 5, SpeculativeNgramMax: 6}, true},
		{Config{SpeculativeTokens: 4, SpeculativeNgramMin: 3, SpeculativeNgramMax: 2}, false},
		{Config{SpeculativeNgramMax: 65}, false},
	} {
		if err := c.cfg.Validate(); (err == nil) != c.ok {
			t.Errorf("%+v: %v, want ok %v", c.cfg, err, c.ok)
		}
	}
}

// letterTok is a detokenizer with token bytes: token t is the letter
// 'a'+t (t < 26), then digits.
type letterTok struct{}

func (letterTok) tok(id int32) []byte {
	if id < 26 {
		return []byte{byte('a' + id)}
	}
	return []byte{byte('0' + id - 26)}
}
func (l letterTok) Decode(ids []int32, _ bool) (string, error) {
	var b []byte
	for _, id := range ids {
		b = append(b, l.tok(id)...)
	}
	return string(b), nil
}
func (l letterTok) TokenBytes(id int32) []byte { return l.tok(id) }
func (letterTok) HasTokenBytes() bool          { return true }

// TestSpeculationConstrained: constrained requests speculate too, each
// verify row sampled under the grammar's mask after the draft before it —
// greedy output equals plain constrained greedy decoding exactly and
// matches the grammar, and drafts are made and accepted. The model's pick
// is the lowest id a mask allows, so a verify row sampled under another
// position's mask picks a token its grammar refuses there.
func TestSpeculationConstrained(t *testing.T) {
	const V, eos = 32, 31
	re, err := grammar.CompileRegex(`(ab|ba)+0`)
	if err != nil {
		t.Fatal(err)
	}
	gr, err := grammar.CompileGrammar(`root ::= ("ac" "b"?)+ "0"`)
	if err != nil {
		t.Fatal(err)
	}
	run := func(spec int, device bool) ([][]int32, Stats) {
		// The model prefers lower ids whatever came before: under a mask
		// the pick is the lowest id the grammar allows there, so each
		// position's pick depends on its own mask.
		m := &rowModel{cfg: &models.Config{VocabSize: V, MaxPositions: 4096}, fill: func(_ int32, row []float32) {
			for k := range row {
				row[k] = -float32(k) / V
			}
		}}
		var be backend.Backend = fakeBackend{}
		if device {
			be = maskSampler{}
		}
		e, err := New(m, be, letterTok{}, Config{BlockSize: 4, SpeculativeTokens: spec, KVCacheBytes: 1 << 24},
			Options{Name: "t", EOS: []int32{eos}, Clock: stillClock})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		var chans []<-chan Event
		for i, g := range []func() grammar.Validator{re.New, gr.New, re.New, gr.New} {
			// Prompts that repeat what the outputs will (so drafts match)
			// and letters the grammars refuse (so drafts must be cut).
			base := []int32{0, 1, 0, 2, 0, 9, int32(4 + i)}
			prompt := slices.Repeat(base, 4)
			ch, err := e.Generate(context.Background(), &Request{Prompt: prompt, Sampling: SamplingParams{MaxTokens: 40, TopP: 1,
				RepetitionPenalty: 1, Grammar: g}})
			if err != nil {
				t.Fatal(err)
			}
			chans = append(chans, ch)
		}
		return tokensOf(t, chans), settled(t, e)
	}
	want, _ := run(0, false)
	for _, device := range []bool{false, true} {
		got, st := run(4, device)
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("device sampler %v, request %d:\nspeculative %v\nplain       %v", device, i, got[i], want[i])
			}
			text, _ := letterTok{}.Decode(got[i], false)
			v := []func() grammar.Validator{re.New, gr.New, re.New, gr.New}[i]()
			if !v.Advance([]byte(strings.TrimSuffix(text, string(letterTok{}.tok(eos))))) {
				t.Errorf("request %d: %q does not follow its grammar", i, text)
			}
		}
		if st.SpecDrafted == 0 || st.SpecAccepted == 0 {
			t.Errorf("drafted %d, accepted %d: the test exercises nothing", st.SpecDrafted, st.SpecAccepted)
		}
		t.Logf("device sampler %v: drafted %d, accepted %d", device, st.SpecDrafted, st.SpecAccepted)
	}
}

// maskSampler is a fake backend whose "device" sampler picks each row's
// greedy token among the tokens its mask allows (what the engine sends a
// device sampler of a constrained row).
type maskSampler struct{ fakeBackend }

func (maskSampler) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	l := logits.(fakeTensor)
	V := len(l) / len(rows)
	out := make([]backend.SampleResult, len(rows))
	for i, r := range rows {
		best := int32(-1)
		for k := range V {
			if (r.Allowed == nil || r.Allowed[k>>6]&(1<<(k&63)) != 0) && (best < 0 || l[i*V+k] > l[i*V+int(best)]) {
				best = int32(k)
			}
		}
		out[i] = backend.SampleResult{Token: best}
	}
	return out
}

// TestGrammarDraft: a constrained sequence's draft is cut before the first
// token its grammar refuses, an end-of-sequence or stop token, or once the
// text is complete; the grammar's state after each kept token is kept, and
// the sequence's own grammar does not move.
func TestGrammarDraft(t *testing.T) {
	re, err := grammar.CompileRegex(`(ab)+c`)
	if err != nil {
		t.Fatal(err)
	}
	l := letterTok{}
	for _, c := range []struct {
		prefix      string
		draft, want []int32
	}{
		{"", []int32{0, 1, 0, 1}, []int32{0, 1, 0, 1}},     // a b a b
		{"", []int32{0, 1, 1, 0}, []int32{0, 1}},           // a b | b: refused
		{"a", []int32{1, 0, 1, 2, 0}, []int32{1, 0, 1, 2}}, // b a b c | complete: nothing after
		{"ab", []int32{0, 31, 1}, []int32{0}},              // a | EOS
		{"ab", []int32{0, 1, 7}, []int32{0, 1}},            // a b | a stop token
		{"", []int32{2}, nil},                              // c first: refused, no draft
	} {
		g := re.New()
		g.Advance([]byte(c.prefix))
		s := &sequence{req: &request{r: &Request{Sampling: SamplingParams{StopTokenIDs: []int32{7}}}},
			sampler: &sampler{gram: g, tokBytes: l.TokenBytes}}
		got := s.grammarDraft(slices.Clone(c.draft), []int32{31})
		if !slices.Equal(got, c.want) || len(s.draftStates) != len(c.want) {
			t.Errorf("after %q, draft %v: %v (%d states), want %v", c.prefix, c.draft, got, len(s.draftStates), c.want)
			continue
		}
		text := c.prefix
		for j, tok := range got {
			text += string(l.tok(tok))
			if v := re.New(); !v.Advance([]byte(text)) || v.Complete() != s.draftStates[j].Complete() {
				t.Errorf("state %d after %q does not match the text", j, text)
			}
		}
		if g.Complete() != (c.prefix == "abc") || (c.prefix != "" && !g.Accept([]byte("a")) && !g.Accept([]byte("b"))) {
			t.Errorf("the sequence's own grammar moved")
		}
	}
}

// tokensOf is each request's tokens, failing the test on an error event.
func tokensOf(t *testing.T, chans []<-chan Event) [][]int32 {
	t.Helper()
	var out [][]int32
	for _, ch := range chans {
		var toks []int32
		for ev := range ch {
			if ev.Err != nil {
				t.Fatal(ev.Err)
			}
			toks = append(toks, ev.TokenIDs...)
		}
		out = append(out, toks)
	}
	return out
}
