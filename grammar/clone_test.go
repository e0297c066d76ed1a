package grammar

import (
	"testing"
)

// TestClone: a copy continues from where the original was, and neither
// moves the other on.
func TestClone(t *testing.T) {
	re, _ := CompileRegex(`[a-z]+-[0-9]{2}`)
	g := mustGrammar(t, `root ::= "(" [a-z]+ ")" | "<" [0-9]+ ">"`)
	s := mustSchema(t, `{"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}, "required": ["a", "b"]}`)
	c, _ := NewChoice([]string{"alpha", "beta"})
	for _, tc := range []struct {
		name          string
		mk            func() Validator
		prefix, a, b  string // a and b: two ways on from prefix, each whole
		refusedAfterA string // a byte the text after a refuses, that b's path takes
	}{
		{"json", JSONObject, `{"k": [1`, `]}`, `, 2]}`, ","},
		{"schema", s.New, `{"a": "x`, `", "b": 1}`, `yz", "b": 22}`, "y"},
		{"wrapped", func() Validator { return NewWrapped([]byte("<c>"), s, []byte("</c>")) }, `<c>{"a": "x`, `","b":1}</c>`, `y","b":2}</c>`, "y"},
		{"regex", re.New, "ab", "-12", "c-34", "c"},
		{"choice", c.New, "", "alpha", "beta", "b"},
		{"grammar", g.New, "", "(ab)", "<12>", "<"},
		{"anyof", func() Validator { return NewAnyOf(re.New(), g.New()) }, "", "(ab)", "ab-12", "a"},
	} {
		v := tc.mk()
		if !v.Advance([]byte(tc.prefix)) && tc.prefix != "" {
			t.Fatalf("%s: prefix refused", tc.name)
		}
		w, ok := Clone(v)
		if !ok {
			t.Fatalf("%s: not cloned", tc.name)
		}
		if !v.Advance([]byte(tc.a)) || !v.Complete() {
			t.Errorf("%s: the original refuses %q", tc.name, tc.a)
		}
		if !w.Advance([]byte(tc.b)) || !w.Complete() {
			t.Errorf("%s: the copy refuses %q after the original took %q", tc.name, tc.b, tc.a)
		}
		u, _ := Clone(v)
		if u.Accept([]byte(tc.refusedAfterA)) {
			t.Errorf("%s: a copy of the finished original takes %q", tc.name, tc.refusedAfterA)
		}
	}
	if _, ok := Clone(quitterV{}); ok {
		t.Error("an unknown validator was cloned")
	}
}

type quitterV struct{}

func (quitterV) Accept([]byte) bool  { return false }
func (quitterV) Advance([]byte) bool { return false }
func (quitterV) Complete() bool      { return false }
