package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
)

// TestJSONConstrained runs response_format json_object through the engine
// on the CPU model (trained on prose, so the grammar does the work): every
// choice's text is a prefix of a JSON object, a choice that stops is a
// whole object, the device sampler is bypassed, and a request the engine
// cannot constrain is refused.
func TestJSONConstrained(t *testing.T) {
	f := load(t)
	e, ds := newDevEngine(t, f)
	prompt, err := f.tok.Encode("And God said, Let there be light", false)
	if err != nil {
		t.Fatal(err)
	}
	open, okOpen := f.tok.TokenID("{")
	closeTok, okClose := f.tok.TokenID("}")
	if !okOpen || !okClose {
		t.Skip("the test tokenizer has no single-byte { or } token")
	}
	check := func(name string, r result, n int) {
		t.Helper()
		for i := range n {
			text := r.text[i]
			if !grammar.NewJSON(true).Advance([]byte(text)) && text != "" {
				t.Errorf("%s, choice %d: %q is not a prefix of a JSON object", name, i, text)
			}
			if r.reasons[i] == engine.FinishStop && !(json.Valid([]byte(text)) && strings.HasPrefix(strings.TrimSpace(text), "{")) {
				t.Errorf("%s, choice %d stopped with %q, not a whole JSON object", name, i, text)
			}
		}
	}
	before := ds.rows.Load()
	// Greedy, pushed toward "{}" by logit_bias: "}" first is refused, so the
	// text must be exactly {} and end there.
	forced := collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 8, TopP: 1, RepetitionPenalty: 1,
		Grammar: grammar.JSONObject, LogitBias: map[int32]float32{open: 100, closeTok: 100}}))
	if forced.text[0] != "{}" || forced.reasons[0] != engine.FinishStop {
		t.Errorf("biased toward {}: %q (%s), want \"{}\" (stop)", forced.text[0], forced.reasons[0])
	}
	check("forced", forced, 1)
	// Unbiased, greedy and sampled (several choices, seeded).
	greedy := collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 40, TopP: 1, RepetitionPenalty: 1, Grammar: grammar.JSONObject}))
	check("greedy", greedy, 1)
	t.Logf("greedy: %q (%s)", greedy.text[0], greedy.reasons[0])
	if !strings.HasPrefix(greedy.text[0], "{") {
		t.Errorf("greedy: %q does not start the object", greedy.text[0])
	}
	seed := uint64(7)
	sampled := collect(t, mustGen(t, e, prompt, engine.SamplingParams{N: 4, MaxTokens: 40, Temperature: 1, TopP: 0.95,
		TopK: 40, RepetitionPenalty: 1, Seed: &seed, Grammar: grammar.JSONObject}))
	check("sampled", sampled, 4)
	for i := range 4 {
		t.Logf("sampled %d: %q (%s)", i, sampled.text[i], sampled.reasons[i])
	}
	again := collect(t, mustGen(t, e, prompt, engine.SamplingParams{N: 4, MaxTokens: 40, Temperature: 1, TopP: 0.95,
		TopK: 40, RepetitionPenalty: 1, Seed: &seed, Grammar: grammar.JSONObject}))
	for i := range 4 {
		if again.text[i] != sampled.text[i] {
			t.Errorf("seeded choice %d differs between runs: %q, %q", i, sampled.text[i], again.text[i])
		}
	}
	if ds.rows.Load() == before {
		t.Error("JSON-constrained requests did not sample on the device (their masks go with the rows)")
	}
	// Refused: ignore_eos with json, and an engine without token bytes or EOS.
	if _, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt,
		Sampling: engine.SamplingParams{MaxTokens: 4, Grammar: grammar.JSONObject, IgnoreEOS: true}}); err == nil || !strings.Contains(err.Error(), "ignore_eos") {
		t.Errorf("json with ignore_eos: %v, want an error naming ignore_eos", err)
	}
	// Engines that cannot constrain: no EOS token, a tokenizer without bytes.
	for _, c := range []struct {
		name string
		tok  engine.Detokenizer
		eos  []int32
		want string
	}{
		{"no EOS token", f.tok, nil, "end-of-sequence"},
		{"no token bytes", decodeOnly{f.tok}, []int32{2}, "bytes"},
	} {
		e2, err := engine.New(f.m.Model, f.be, c.tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t2", EOS: c.eos})
		if err != nil {
			t.Fatal(err)
		}
		_, err = e2.Generate(context.Background(), &engine.Request{Prompt: prompt, Sampling: engine.SamplingParams{MaxTokens: 4, Grammar: grammar.JSONObject}})
		if !errors.Is(err, engine.ErrGrammarUnsupported) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrGrammarUnsupported naming %q", c.name, err, c.want)
		}
		e2.Shutdown(context.Background())
	}
}

// decodeOnly hides every method but Decode (a Detokenizer that is not a
// TokenByter).
type decodeOnly struct{ d engine.Detokenizer }

func (d decodeOnly) Decode(ids []int32, skipSpecial bool) (string, error) {
	return d.d.Decode(ids, skipSpecial)
}

// TestJSONSchemaConstrained: with a json_schema every choice is a prefix of
// an object matching it (keys forced in order), and one that stops is a
// whole instance.
func TestJSONSchemaConstrained(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 4})
	schema, err := grammar.CompileSchema([]byte(`{"type": "object", "properties": {
		"ok": {"type": "boolean"}, "kind": {"enum": ["light", "dark"]}, "words": {"type": "array", "items": {"type": "string"}},
		"n": {"type": ["integer", "null"]}}, "required": ["ok", "kind", "words", "n"], "additionalProperties": false}`))
	if err != nil {
		t.Fatal(err)
	}
	prompt, err := f.tok.Encode("And God said, Let there be light", false)
	if err != nil {
		t.Fatal(err)
	}
	seed := uint64(11)
	for _, sp := range []engine.SamplingParams{
		{MaxTokens: 48, TopP: 1, RepetitionPenalty: 1, Grammar: schema.New},
		{N: 3, MaxTokens: 48, Temperature: 1, TopP: 1, RepetitionPenalty: 1, Seed: &seed, Grammar: schema.New},
	} {
		r := collect(t, mustGen(t, e, prompt, sp))
		for i := range sp.N {
			text := r.text[i]
			t.Logf("choice %d: %q (%s)", i, text, r.reasons[i])
			if !grammar.NewSchemaJSON(schema).Advance([]byte(text)) {
				t.Errorf("choice %d: %q is not a prefix of an instance", i, text)
			}
			if !strings.HasPrefix(text, `{"ok"`) && !strings.HasPrefix(text, "{\n") && !strings.HasPrefix(text, "{ ") && len(text) > 5 {
				t.Errorf("choice %d: %q does not start with the first key", i, text)
			}
			if r.reasons[i] == engine.FinishStop {
				var v struct {
					OK    *bool    `json:"ok"`
					Kind  string   `json:"kind"`
					Words []string `json:"words"`
				}
				if err := json.Unmarshal([]byte(text), &v); err != nil || v.OK == nil || (v.Kind != "light" && v.Kind != "dark") || v.Words == nil {
					t.Errorf("choice %d stopped with %q: not an instance (%v)", i, text, err)
				}
			}
		}
	}
}

// TestGrammarForcedCall: a Grammar (a tool call's shape) holds the model to
// it: the text is a prefix of the call, and a choice that stops is whole.
func TestGrammarForcedCall(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 4})
	schema, err := grammar.CompileSchema([]byte(`{"type": "object", "properties": {"name": {"const": "get_weather"},
		"arguments": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}},
		"required": ["name", "arguments"]}`))
	if err != nil {
		t.Fatal(err)
	}
	mk := func() grammar.Validator {
		return grammar.NewWrapped([]byte("<tool_call>\n"), schema, []byte("\n</tool_call>"))
	}
	prompt, err := f.tok.Encode("Where is it warm?", false)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 110, TopP: 1, RepetitionPenalty: 1, Grammar: mk}))
	text := r.text[0]
	t.Logf("%q (%s)", text, r.reasons[0])
	if !mk().Advance([]byte(text)) {
		t.Fatalf("%q is not a prefix of the call", text)
	}
	if r.reasons[0] != engine.FinishStop {
		t.Fatalf("the call did not end within 110 tokens: %q", text)
	}
	{
		body, ok := strings.CutPrefix(text, "<tool_call>\n")
		body, ok2 := strings.CutSuffix(body, "\n</tool_call>")
		var call struct {
			Name      string
			Arguments struct{ City string }
		}
		if !ok || !ok2 || json.Unmarshal([]byte(body), &call) != nil || call.Name != "get_weather" || call.Arguments.City == "" {
			t.Fatalf("stopped with %q, not a whole call", text)
		}
	}
}

// TestGrammarSpecialTokens: a constrained request that keeps special
// tokens may write them as tokens (their content is their bytes); one
// that does not spells the same text with ordinary tokens. The end-of-
// sequence token never stands in for text.
func TestGrammarSpecialTokens(t *testing.T) {
	f := load(t)
	e, _ := newDevEngine(t, f)
	prompt, err := f.tok.Encode("And God said", false)
	if err != nil {
		t.Fatal(err)
	}
	c, err := grammar.NewChoice([]string{"<|im_start|>x", "<|im_start|>yz"})
	if err != nil {
		t.Fatal(err)
	}
	for _, keep := range []bool{true, false} {
		r := collect(t, mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 16, TopP: 1, RepetitionPenalty: 1,
			Grammar: c.New, KeepSpecialTokens: keep, LogitBias: map[int32]float32{1: 50, 2: 50}}))
		text, toks := r.text[0], r.tokens[0]
		if !strings.HasPrefix(text, "<|im_start|>") || r.reasons[0] != engine.FinishStop {
			t.Fatalf("keep %v: %q (%s), want a choice", keep, text, r.reasons[0])
		}
		if got := toks[0] == 1; got != keep {
			t.Errorf("keep %v: first token %d (the special token written as one: %v)", keep, toks[0], got)
		}
		if slices.Contains(toks[:len(toks)-1], 2) {
			t.Errorf("keep %v: the EOS token inside the text: %v", keep, toks)
		}
	}
}

// quitter is a validator that takes anything for a few tokens, then gives
// up (grammar.Failer), as a GrammarText does past its work limit.
type quitter struct {
	n, after int
	err      error
}

func (q *quitter) Accept(b []byte) bool { return q.err == nil && len(b) > 0 }
func (q *quitter) Advance(b []byte) bool {
	if !q.Accept(b) {
		return false
	}
	if q.n++; q.n >= q.after {
		q.err = grammar.ErrGrammarTooComplex
	}
	return true
}
func (q *quitter) Complete() bool { return false }
func (q *quitter) Err() error     { return q.err }

// TestGrammarGivesUp: a grammar that gives up mid-text fails its choice
// with its error (not a silent end-of-sequence), after the tokens it took;
// the engine's other requests go on.
func TestGrammarGivesUp(t *testing.T) {
	f := load(t)
	e := newEngine(t, f, engine.Config{BlockSize: 4})
	prompt, _ := f.tok.Encode("And God said", false)
	ch := mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 20, TopP: 1, RepetitionPenalty: 1,
		Grammar: func() grammar.Validator { return &quitter{after: 3} }})
	other := mustGen(t, e, prompt, engine.SamplingParams{MaxTokens: 6, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true})
	var toks int
	var failed error
	for ev := range ch {
		toks += len(ev.TokenIDs)
		if ev.Err != nil {
			failed = ev.Err
			if ev.FinishReason != engine.FinishError {
				t.Errorf("finish %q with an error", ev.FinishReason)
			}
		}
	}
	if !errors.Is(failed, grammar.ErrGrammarTooComplex) || toks != 3 {
		t.Errorf("error %v after %d tokens, want ErrGrammarTooComplex after 3", failed, toks)
	}
	if r := collect(t, other); len(r.tokens[0]) != 6 || r.reasons[0] != engine.FinishLength {
		t.Errorf("the other request: %d tokens, %q", len(r.tokens[0]), r.reasons[0])
	}
}
