package safetensors

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// scanValid reports whether the scanner accepts b as one JSON value.
func scanValid(b []byte) (bool, error) {
	s := &scanner{b: b}
	err := s.skip(0)
	if err == nil {
		err = s.end()
	}
	return err == nil, err
}

func TestScannerAgainstEncodingJSON(t *testing.T) {
	cases := []string{
		`{}`, ` { "a" : [1, -2.5e+3, true, false, null, "x\n\u00e9\ud83d\ude00"] } `,
		`[]`, `[1,]`, `{"a":1,}`, `{"a" 1}`, `{a:1}`, `01`, `-`, `1.`, `1e`, `.5`, `+1`, `-0`, `0.0e-0`,
		`"\ud800"`, `"\ud800\u0041"`, `"\udc00\ud800"`, `"\ud83d\ude00"`, `"\x"`, `"\u12"`, `"a` + "\t" + `b"`,
		`tru`, `nul`, `null`, `true false`, `"a" "b"`, "[1\n,\r2\t]", `{"a":{"b":{"c":[[[]]]}}}`, "\"\x7f\"",
	}
	for _, c := range cases {
		got, err := scanValid([]byte(c))
		if want := json.Valid([]byte(c)); got != want {
			t.Errorf("%q: scanner valid=%v (%v), encoding/json valid=%v", c, got, err, want)
		}
		checkString(t, []byte(c))
	}
	deep := strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2)
	if _, err := scanValid([]byte(deep)); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("deep nesting: %v", err)
	}
}

// checkString compares the scanner's string decoding with encoding/json's.
func checkString(t *testing.T, b []byte) {
	t.Helper()
	if !strings.HasPrefix(strings.TrimLeft(string(b), " \t\r\n"), `"`) {
		return // encoding/json leaves a string unchanged on null, for one
	}
	s := &scanner{b: b}
	got, err := s.str()
	if err == nil {
		err = s.end()
	}
	var want string
	werr := json.Unmarshal(b, &want)
	if (err == nil) != (werr == nil) || (err == nil && got != want) {
		t.Errorf("string %q: scanner %q (%v), encoding/json %q (%v)", b, got, err, want, werr)
	}
}

// FuzzScanner checks the header scanner against encoding/json: the same
// inputs are valid JSON, and strings decode to the same text.
func FuzzScanner(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s.header))
	}
	f.Add([]byte(`"\ud800\udc00\u00e9\\\/\b\f\n\r\t"`))
	f.Add([]byte(`[-0.5e10, 1E+2, 0, true, false, null, {}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if !utf8.Valid(b) { // headers are checked for UTF-8 before scanning
			return
		}
		got, err := scanValid(b)
		if err != nil && strings.Contains(err.Error(), "nested deeper") {
			return // encoding/json allows deeper nesting
		}
		if want := json.Valid(b); got != want {
			t.Fatalf("%q: scanner valid=%v (%v), encoding/json valid=%v", b, got, err, want)
		}
		checkString(t, b)
	})
}
