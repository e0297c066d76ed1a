package grammar

import (
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/mkserve/mkserve/tokenizer"
)

// gpt2Path is the real GPT-2 tokenizer.json (../shared beside the checkout).
const gpt2Path = "../../shared/tokenizers/gpt2/tokenizer.json"

// naiveMask is Mask's reference: every token tried whole.
func naiveMask(g Validator, size int, tokBytes func(int32) []byte) []uint64 {
	m := make([]uint64, (size+63)/64)
	for id := range int32(size) {
		if b := tokBytes(id); len(b) > 0 && g.Accept(b) {
			m[id>>6] |= 1 << (id & 63)
		}
	}
	return m
}

// maskStates are validators of every kind at prefixes of texts they accept.
func maskStates(t *testing.T, every int) map[string]Validator {
	t.Helper()
	out := map[string]Validator{}
	add := func(name string, mk func() Validator, text string) {
		for k := 0; k <= len(text); k += every {
			g := mk()
			if !g.Advance([]byte(text[:k])) && k > 0 {
				t.Fatalf("%s: prefix %q refused", name, text[:k])
			}
			out[name+"@"+text[:k]] = g
		}
	}
	add("json", JSONObject, "{\"name\": \"Zoë\", \"list\": [1, -2.5e3, true, null, {\"a\": []}],\n    \"x\": \"\\u00e9\\n\"}")
	s := mustSchema(t, personSchema)
	add("schema", s.New, `{"name": "Zo", "age": -42, "height": 1.75e0, "role": "a", "level": 12, "tags": ["x", ""], `+
		`"address": {"city": "Paris", "zip": "75001"}, "ok": false, "empty": {}, "meta": {"k": [1]}}`)
	ws := mustSchema(t, `{"type": "object", "properties": {"name": {"const": "f"}, "arguments": {"type": "object",
		"properties": {"city": {"type": "string"}}, "required": ["city"]}}, "required": ["name", "arguments"]}`)
	add("wrapped", func() Validator { return NewWrapped([]byte("<tool_call>\n"), ws, []byte("\n</tool_call>")) },
		"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>")
	ps := mustSchema(t, `{"type": "object", "properties": {"id": {"type": "string", "pattern": "[A-Z]{2}-\\d{3}"},
		"d": {"type": "string", "format": "date"}, "e": {"type": "string", "pattern": "é+x?"},
		"nl": {"type": "string", "pattern": "a\\nb"}}, "required": ["id", "d", "e", "nl"]}`)
	add("pattern", ps.New, `{"id": "AB-123", "d": "2024-12-31", "e": "ééx", "nl": "a\nb"}`)
	us := mustSchema(t, `{"type": "object", "properties": {"pet": {"anyOf": [
		{"type": "object", "properties": {"kind": {"const": "cat"}, "name": {"type": "string"}}, "required": ["kind", "name"]},
		{"type": "object", "properties": {"kind": {"const": "dog"}, "tag": {"type": "string", "pattern": "[a-z]{3}-\\d+"}}, "required": ["kind", "tag"]},
		{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}]}}, "required": ["pet"]}`)
	add("union", us.New, `{"pet": {"kind": "dog", "tag": "abc-12"}}`)
	add("union cat", us.New, `{"pet": {"kind": "cat", "name": "Tom \"T\""}}`)
	add("union name", us.New, `{"pet": {"name": "Rex é"}}`)
	rx, err := CompileRegex(`(yes|no|[0-9]{1,3}( items)?)!?`)
	if err != nil {
		t.Fatal(err)
	}
	add("regex", rx.New, "12 items!")
	c, err := NewChoice([]string{"yes", "no", "yep sir!", "maybe"})
	if err != nil {
		t.Fatal(err)
	}
	add("choice", c.New, "yep sir!")
	jg, err := CompileGrammar(jsonGBNF)
	if err != nil {
		t.Fatal(err)
	}
	add("gbnf json", jg.New, "{\"name\": \"Zoë\", \"list\": [1, -2.5e3, true, null, {\"a\": []}],\n    \"x\": \"\\u00e9\\n\"}")
	ag, err := CompileGrammar("root ::= item (\", \" item)* \".\"\nitem ::= [A-Z] [a-zé]* | [0-9]{1,3} (\" items\")?")
	if err != nil {
		t.Fatal(err)
	}
	add("gbnf list", ag.New, "Zoé, 12 items, Abc.")
	return out
}

// TestMaskMatchesNaive: on the real GPT-2 vocabulary, Mask sets exactly
// the tokens a whole-token check accepts, for every kind of validator at
// many states (Prefixers and not).
func TestMaskMatchesNaive(t *testing.T) {
	tok, err := tokenizer.Load(gpt2Path)
	if err != nil {
		t.Skipf("GPT-2 tokenizer not available: %v", err)
	}
	V := tok.VocabSize()
	v := NewVocab(V, tok.TokenBytes)
	dst := make([]uint64, v.MaskWords())
	for name, g := range maskStates(t, 7) {
		want := naiveMask(g, V, tok.TokenBytes)
		n := v.Mask(g, dst)
		cnt := 0
		for i := range want {
			cnt += bits.OnesCount64(want[i])
			if dst[i] != want[i] {
				t.Errorf("%s: word %d: mask %#x, want %#x", name, i, dst[i], want[i])
				break
			}
		}
		if n != cnt {
			t.Errorf("%s: Mask counted %d, want %d", name, n, cnt)
		}
	}
}

// TestMaskSyntheticVocab: a small alphabet's random tokens share long
// prefixes (the runs Mask skips); Mask still equals the naive scan, and
// AcceptLen agrees with Accept on every token.
func TestMaskSyntheticVocab(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const alpha = "{}[]\":, 0123-.eatrufnl\\\n"
	toks := make([][]byte, 3000)
	for i := range toks {
		if i%97 == 0 {
			continue // no bytes: never accepted
		}
		b := make([]byte, 1+r.IntN(6))
		for j := range b {
			b[j] = alpha[r.IntN(len(alpha))]
		}
		toks[i] = b
	}
	tb := func(id int32) []byte { return toks[id] }
	v := NewVocab(len(toks), tb)
	dst := make([]uint64, v.MaskWords())
	for name, g := range maskStates(t, 3) {
		want := naiveMask(g, len(toks), tb)
		v.Mask(g, dst)
		for i := range want {
			if dst[i] != want[i] {
				t.Fatalf("%s: word %d: mask %#x, want %#x", name, i, dst[i], want[i])
			}
		}
		if px, ok := g.(Prefixer); ok {
			for _, b := range toks {
				if len(b) == 0 {
					continue
				}
				k := px.AcceptLen(b)
				if (k == len(b)) != g.Accept(b) || (k > 0 && !g.Accept(b[:k])) || (k < len(b) && g.Accept(b[:k+1])) {
					t.Fatalf("%s: AcceptLen(%q) = %d disagrees with Accept", name, b, k)
				}
			}
		}
	}
}

// BenchmarkMask is one whole mask over GPT-2's vocabulary inside a string
// (most tokens pass) and where a value must start (few do).
func BenchmarkMask(b *testing.B) {
	tok, err := tokenizer.Load(gpt2Path)
	if err != nil {
		b.Skipf("GPT-2 tokenizer not available: %v", err)
	}
	v := NewVocab(tok.VocabSize(), tok.TokenBytes)
	dst := make([]uint64, v.MaskWords())
	ps, err := CompileSchema([]byte(`{"type": "object", "properties": {"id": {"type": "string", "pattern": "[A-Za-z ]{2,40}-[0-9]+"},
		"d": {"type": "string", "format": "date-time"}}, "required": ["id", "d"]}`))
	if err != nil {
		b.Fatal(err)
	}
	us, err := CompileSchema([]byte(`{"type": "object", "properties": {"pet": {"anyOf": [
		{"type": "object", "properties": {"kind": {"const": "cat"}, "name": {"type": "string"}}, "required": ["kind", "name"]},
		{"type": "object", "properties": {"kind": {"const": "dog"}, "tag": {"type": "string"}}, "required": ["kind", "tag"]},
		{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}]}}, "required": ["pet"]}`))
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name, prefix string
		g            func() Validator
	}{
		{"in_string", `{"name": "Zo`, JSONObject},
		{"value_start", `{"list": [1, `, JSONObject},
		{"key_start", `{"a": 1, `, JSONObject},
		{"pattern_string", `{"id": "Zo`, ps.New},
		{"union_key", `{"pet": {"`, us.New},
		{"union_string", `{"pet": {"name": "Re`, us.New},
		{"date_time", `{"id": "ab-1", "d": "2024-1`, ps.New},
	} {
		b.Run(c.name, func(b *testing.B) {
			j := c.g()
			if !j.Advance([]byte(c.prefix)) {
				b.Fatalf("prefix %q refused", c.prefix)
			}
			n := 0
			for b.Loop() {
				n = v.Mask(j, dst)
			}
			b.ReportMetric(float64(n), "accepted")
		})
	}
}
