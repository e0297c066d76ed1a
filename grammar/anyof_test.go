package grammar

import (
	"testing"
)

// TestAnyOf: several wrapped calls read side by side — the text of either
// is taken and complete, a mix of them is not — and masks over a
// vocabulary equal the naive scan (Prefixer and non-Prefixer members).
func TestAnyOf(t *testing.T) {
	a := mustSchema(t, `{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}`)
	b := mustSchema(t, `{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}`)
	c, err := NewChoice([]string{"none", "nothing!"})
	if err != nil {
		t.Fatal(err)
	}
	mk := func() Validator {
		return NewAnyOf(NewWrapped([]byte("<call>get\n"), a, []byte("</call>")), NewWrapped([]byte("<call>get_n\n"), b, []byte("</call>")), c.New())
	}
	for _, good := range []string{`<call>get` + "\n" + `{"city": "Rome"}</call>`, `<call>get_n` + "\n" + `{"n": 3}</call>`, "none", "nothing!"} {
		if v := mk(); !v.Advance([]byte(good)) || !v.Complete() {
			t.Errorf("%q refused", good)
		}
	}
	for _, bad := range []string{`<call>get` + "\n" + `{"n"`, `<call>get_n` + "\n" + `{"city"`, "no!", `<call>x`} {
		if mk().Advance([]byte(bad)) {
			t.Errorf("%q taken", bad)
		}
	}
	toks := []string{"<", "<call>", "get", "get_", "_n", "\n", "{\"", "city", "n", "\": ", "\"Rome\"", "3", "}", "</call>", "no", "ne", "thing", "!", "nothing!", "x"}
	tb := func(id int32) []byte { return []byte(toks[id]) }
	vocab := NewVocab(len(toks), tb)
	dst := make([]uint64, vocab.MaskWords())
	for _, prefix := range []string{"", "<call>", "<call>get", "<call>get\n", "<call>get_n\n{\"", "no", "<call>get\n{\"city\": \"Rome\"}"} {
		v := mk()
		if !v.Advance([]byte(prefix)) && prefix != "" {
			t.Fatalf("prefix %q refused", prefix)
		}
		vocab.Mask(v, dst)
		if want := naiveMask(v, len(toks), tb); dst[0] != want[0] {
			t.Errorf("after %q: mask %b, want %b", prefix, dst[0], want[0])
		}
	}
}
