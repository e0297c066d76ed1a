package grammar

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// feedAll runs s through a fresh validator byte by byte; it returns the
// number of bytes accepted and whether the text is complete.
func feedAll(objectOnly bool, s string) (int, bool) {
	j := NewJSON(objectOnly)
	for i := 0; i < len(s); i++ {
		if !j.Advance([]byte{s[i]}) {
			return i, false
		}
	}
	return len(s), j.Complete()
}

func TestJSONTexts(t *testing.T) {
	cases := []struct {
		name       string
		objectOnly bool
		text       string
		accepted   int // bytes accepted (len(text): all)
		complete   bool
	}{
		{"empty object", true, `{}`, 2, true},
		{"spaces around", false, " \n{ } \n", 7, true},
		{"blank line", false, "\n\n{}", 1, false},
		{"space before the object", true, " {}", 0, false},
		{"spaces after the object", true, "{ } \n", 5, true},
		{"nested", true, `{"a": [1, -2.5e+3, 0, true, false, null, {"b": "c"}], "d": {}}`, 62, true},
		{"escapes", true, `{"k": "\"\\\/\b\f\n\r\t\u00e9\uD83D"}`, 37, true},
		{"utf8", true, `{"k": "héllo ☃ 😀"}`, len(`{"k": "héllo ☃ 😀"}`), true},
		{"prefix", true, `{"a": [1, 2`, 11, false},
		{"open string", true, `{"a": "xy`, 9, false},
		{"array top level refused", true, `[1]`, 0, false},
		{"array top level", false, `[1, [2, []]]`, 12, true},
		{"top-level number", false, `-0.5E-7`, 7, true},
		{"top-level number then space", false, `12 `, 3, true},
		{"top-level string", false, `"s"`, 3, true},
		{"literal", false, `null`, 4, true},
		{"trailing comma", true, `{"a": 1,}`, 8, false},
		{"missing colon", true, `{"a" 1}`, 5, false},
		{"bare key", true, `{a: 1}`, 1, false},
		{"leading zero", true, `{"a": 01}`, 7, false},
		{"lone minus", true, `{"a": -}`, 7, false},
		{"dot without digits", true, `{"a": 1.}`, 8, false},
		{"exponent without digits", true, `{"a": 1e}`, 8, false},
		{"bad escape", true, `{"a": "\x"}`, 8, false},
		{"short unicode escape", true, `{"a": "\u12G4"}`, 11, false},
		{"raw newline in string", true, "{\"a\": \"x\ny\"}", 8, false},
		{"bad literal", true, `{"a": tru }`, 9, false},
		{"mismatched close", true, `{"a": [1}`, 8, false},
		{"second value", true, `{} {}`, 3, false},
		{"close at top level", false, `]`, 0, false},
		{"overlong utf8", true, "{\"a\": \"\xC0\xAF\"}", 7, false},
		{"surrogate utf8", true, "{\"a\": \"\xED\xA0\x80\"}", 8, false},
		{"truncated utf8 then quote", true, "{\"a\": \"\xE2\x98\"}", 9, false},
		{"past U+10FFFF", true, "{\"a\": \"\xF4\x90\x80\x80\"}", 8, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, complete := feedAll(c.objectOnly, c.text)
			if n != c.accepted || complete != c.complete {
				t.Fatalf("%q: accepted %d bytes (complete %v), want %d (complete %v)", c.text, n, complete, c.accepted, c.complete)
			}
			// Every fully accepted, complete text is JSON by encoding/json.
			if n == len(c.text) && complete && !json.Valid([]byte(c.text)) {
				t.Fatalf("%q accepted as complete but encoding/json rejects it", c.text)
			}
		})
	}
}

func TestJSONLimits(t *testing.T) {
	deep := strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth)
	if n, ok := feedAll(false, deep); n != len(deep) || !ok {
		t.Fatalf("depth %d: accepted %d of %d bytes, complete %v", MaxDepth, n, len(deep), ok)
	}
	if n, _ := feedAll(false, strings.Repeat("[", MaxDepth+1)); n != MaxDepth {
		t.Fatalf("depth %d: accepted %d bytes, want %d", MaxDepth+1, n, MaxDepth)
	}
	// Between tokens: one space, or one newline and indentation.
	for _, c := range []struct {
		text     string
		accepted int
	}{
		{"{ }", 3},
		{"{  }", 2},
		{"{\t}", 3},
		{"{\n    }", 7},
		{"{\n         }", 10}, // indentation inside one object: at most (1+1)·4 = 8 bytes
		{"{\r\n}", 4},
		{"{\n\r}", 2},
		{"{ \n  }", 6},
		{"{\n  \n", 4}, // a blank line
		{"{\n  \"a\": [\n        1\n    ]\n}\n", 29},
	} {
		if n, _ := feedAll(true, c.text); n != c.accepted {
			t.Errorf("%q: accepted %d bytes, want %d", c.text, n, c.accepted)
		}
	}
	pretty := "{\n  \"a\": [\n    1,\n    2\n  ]\r\n}\n"
	if n, ok := feedAll(true, pretty); n != len(pretty) || !ok {
		t.Fatalf("pretty-printed: accepted %d of %d bytes", n, len(pretty))
	}
	// Whitespace inside strings does not count.
	s := `{"a": "` + strings.Repeat(" ", 100) + `"}`
	if n, ok := feedAll(true, s); n != len(s) || !ok {
		t.Fatalf("spaces in a string: accepted %d of %d bytes", n, len(s))
	}
}

func TestJSONAcceptLeavesStateAlone(t *testing.T) {
	j := NewJSON(true)
	if !j.Advance([]byte(`{"list": [1, `)) {
		t.Fatal("prefix rejected")
	}
	before := j.Clone()
	for _, tok := range []string{`2]}`, `]`, `}`, `"x"`, `{"y": [`, ` `, `3.`, ``} {
		j.Accept([]byte(tok))
	}
	if j.st != before.st || string(j.stack) != string(before.stack) || j.ws != before.ws {
		t.Fatalf("Accept changed the state: %+v, was %+v", j, before)
	}
	if j.Accept(nil) {
		t.Fatal("an empty token was accepted")
	}
	if j.Accept([]byte(`2]}x`)) {
		t.Fatal("a token with a bad last byte was accepted")
	}
	if j.Advance([]byte(`}`)) {
		t.Fatal("'}' closing an array was accepted")
	}
	if !j.Advance([]byte(`2]}`)) || !j.Complete() {
		t.Fatalf("the closing token was refused or left the text incomplete (state %d)", j.st)
	}
	// A clone goes its own way.
	c := before.Clone()
	if !c.Advance([]byte(`{}]}`)) || !c.Complete() {
		t.Fatal("clone could not finish its own text")
	}
	if before.Complete() {
		t.Fatal("advancing a clone moved the original")
	}
}

// FuzzJSON checks the validator against encoding/json: a text it accepts
// whole and calls complete is valid JSON, a valid JSON object within the
// limits is accepted whole and complete, and every prefix of an accepted
// text is accepted.
func FuzzJSON(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":[1,2,{"b":null}]}`, `{"s":"\u00e9\n"}`, ` { "x" : -1.5e3 } `, `[`, `{"a":tru}`,
		"{\"\xff\":1}", `{"a":01}`} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, objectOnly bool) {
		n, complete := feedAll(objectOnly, s)
		if n == len(s) && complete && !json.Valid([]byte(s)) {
			t.Fatalf("%q accepted as complete JSON; encoding/json disagrees", s)
		}
		// (encoding/json takes invalid UTF-8 in strings; the validator does not.)
		if json.Valid([]byte(s)) && utf8.ValidString(s) && withinLimits(s) {
			if (!objectOnly || strings.HasPrefix(s, "{")) && (n != len(s) || !complete) {
				t.Fatalf("valid JSON %q: accepted %d of %d bytes, complete %v", s, n, len(s), complete)
			}
		}
		// Tokens of any split are accepted exactly as the bytes one by one.
		j := NewJSON(objectOnly)
		for i := 0; i < len(s); i += 3 {
			end := min(i+3, len(s))
			if !j.Advance([]byte(s[i:end])) {
				if end <= n {
					t.Fatalf("%q: chunk [%d, %d) refused though bytes up to %d were accepted one by one", s, i, end, n)
				}
				break
			}
			if end > n {
				t.Fatalf("%q: chunk [%d, %d) accepted past byte %d, which was refused", s, i, end, n)
			}
		}
	})
}

// withinLimits reports whether a valid JSON text stays within MaxDepth and
// the whitespace rule (outside strings: one space, or one newline after at
// most one byte and then IndentPerLevel·(depth+1) bytes).
func withinLimits(s string) bool {
	depth, n, inStr, esc, nl := 0, 0, false, false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		if isSpace(c) {
			switch {
			case c == '\n':
				if nl {
					return false
				}
				nl, n = true, 0
			case c == '\r' && nl:
				return false
			default:
				n++
				if (nl && n > IndentPerLevel*(depth+1)) || (!nl && n > 1) {
					return false
				}
			}
			continue
		}
		n, nl = 0, false
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			if depth++; depth > MaxDepth {
				return false
			}
		case '}', ']':
			depth--
		}
	}
	return true
}

// TestCompact: compact validators take one space between tokens and no
// newline, in JSON objects, schema objects and their any-object values.
func TestCompact(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {"a": {"type": "object"}, "b": {"type": "integer"}}, "required": ["a", "b"]}`)
	for _, c := range []struct {
		name string
		f    func() Validator
		ok   string
		bad  []string
	}{
		{"json", Compact(JSONObject), `{"a": [1, {"b": null}]}`, []string{"{\n", `{"a":  1`, "{\"a\": [1,\n"}},
		{"schema", Compact(s.New), `{"a": {"x": [1, 2]}, "b": 3}`, []string{"{\n", `{"a": {"x":  1`, "{\"a\": {\"x\": [1,\n"}},
	} {
		v := c.f()
		if !v.Advance([]byte(c.ok)) || !v.Complete() {
			t.Errorf("%s: %q refused", c.name, c.ok)
		}
		for _, b := range c.bad {
			if c.f().Advance([]byte(b)) {
				t.Errorf("%s: %q taken", c.name, b)
			}
		}
	}
	if rx, err := CompileRegex("a b"); err != nil || !Compact(rx.New)().Advance([]byte("a b")) {
		t.Errorf("a regex through Compact: %v", err)
	}
}
