package grammar

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

var regexCases = []struct {
	pattern, alphabet string
	good              []string // texts that match (mutated into near misses too)
}{
	{`\d{4}-\d{2}-\d{2}`, "0123456789-a", []string{"2024-12-31", "0000-00-00"}},
	{`[a-z]+@[a-z]+\.(com|org)`, "abcmo@.rgx", []string{"ab@cd.com", "x@y.org"}},
	{`(ab|cd)*e?`, "abcde", []string{"abcde", ""}},
	{`^\+?[0-9 ]{3,6}$`, "+0 9a", []string{"+1 23", "000"}},
	{`é+[ü]?x`, "éüxe", []string{"éüx", "ééx"}},
	{`[A-Z][a-z]*( [A-Z][a-z]*)*`, "Aab Z", []string{"Ab Zz", "A"}},
	{`(?i)hel+o`, "hHeElLoO", []string{"HeLLo", "hello"}},
	{`a|`, "ab", []string{"a", ""}},
	{`[^"\\]{0,4}`, "a\"\\ é", []string{"a é", ""}},
	{`(true|false|[0-9]+)`, "truefals0123", []string{"true", "12"}},
}

// TestRegexAgainstGo: on random texts over each pattern's alphabet, a text
// the regexp package matches whole is accepted byte by byte and complete;
// a text accepted whole is complete exactly when it matches; and a text
// whose prefix is refused has no match among the texts tried that extend
// that prefix.
func TestRegexAgainstGo(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range regexCases {
		re, err := CompileRegex(c.pattern)
		if err != nil {
			t.Fatalf("%s: %v", c.pattern, err)
		}
		full := regexp.MustCompile(`^(?:` + strings.TrimSuffix(strings.TrimPrefix(c.pattern, "^"), "$") + `)$`)
		alpha := []rune(c.alphabet)
		refused := map[string]bool{} // prefixes the validator refused
		matched := 0
		for k := range 6000 {
			var text string
			if k%2 == 0 { // random
				var sb strings.Builder
				for range r.IntN(12) {
					sb.WriteRune(alpha[r.IntN(len(alpha))])
				}
				text = sb.String()
			} else { // a good text, maybe cut, maybe one character changed
				g := []rune(c.good[r.IntN(len(c.good))])
				if len(g) > 0 && r.IntN(2) == 0 {
					g[r.IntN(len(g))] = alpha[r.IntN(len(alpha))]
				}
				if len(g) > 0 && r.IntN(3) == 0 {
					g = g[:r.IntN(len(g))]
				}
				text = string(g)
			}
			v := re.New()
			acc := len(text)
			for i := 0; i < len(text); i++ {
				if !v.Advance([]byte{text[i]}) {
					acc = i
					break
				}
			}
			m := full.MatchString(text)
			if m {
				matched++
			}
			switch {
			case m && acc < len(text):
				t.Fatalf("%s: %q matches but byte %d is refused", c.pattern, text, acc)
			case acc == len(text) && v.Complete() != m:
				t.Fatalf("%s: %q accepted, Complete %v, match %v", c.pattern, text, v.Complete(), m)
			case acc < len(text):
				refused[text[:acc+1]] = true
			}
			for p := range refused {
				if m && strings.HasPrefix(text, p) {
					t.Fatalf("%s: %q matches but its prefix %q was refused", c.pattern, text, p)
				}
			}
		}
		if matched == 0 {
			t.Errorf("%s: no random text matched: the test says little", c.pattern)
		}
	}
}

func TestRegexCompileErrors(t *testing.T) {
	for _, p := range []string{`(`, `\bword`, `(?m)^a$`, strings.Repeat(`[a-z]{1,60}`, 10)} {
		if _, err := CompileRegex(p); err == nil {
			t.Errorf("%q compiled", p)
		}
	}
}

// TestRegexMask: masks of a RegexText over a vocabulary with multi-byte
// tokens equal the naive scan (its AcceptLen skips refused runs).
func TestRegexMask(t *testing.T) {
	toks := [][]byte{[]byte("20"), []byte("2024"), []byte("-"), []byte("-0"), []byte("1"), []byte("12-"), []byte("é"), {0xC3}, {0xA9}, []byte("a"), []byte("-12-")}
	tb := func(id int32) []byte { return toks[id] }
	v := NewVocab(len(toks), tb)
	re, err := CompileRegex(`\d{4}-\d{2}-\d{2}`)
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]uint64, v.MaskWords())
	g := re.New()
	for _, step := range []string{"", "20", "2024", "2024-", "2024-12-", "2024-12-0"} {
		g = re.New()
		if !g.Advance([]byte(step)) && step != "" {
			t.Fatalf("%q refused", step)
		}
		v.Mask(g, dst)
		want := naiveMask(g, len(toks), tb)
		if dst[0] != want[0] {
			t.Errorf("after %q: mask %b, want %b", step, dst[0], want[0])
		}
	}
}

// FuzzRegex: for the test patterns and any text, a text Go's regexp
// matches whole is accepted and complete, and an accepted text is
// complete exactly when it matches.
func FuzzRegex(f *testing.F) {
	for i, c := range regexCases {
		for _, g := range c.good {
			f.Add(uint8(i), g)
		}
	}
	res := make([]*Regex, len(regexCases))
	fulls := make([]*regexp.Regexp, len(regexCases))
	for i, c := range regexCases {
		res[i], _ = CompileRegex(c.pattern)
		fulls[i] = regexp.MustCompile(`^(?:` + strings.TrimSuffix(strings.TrimPrefix(c.pattern, "^"), "$") + `)$`)
	}
	f.Fuzz(func(t *testing.T, which uint8, text string) {
		i := int(which) % len(regexCases)
		v := res[i].New()
		ok := v.Advance([]byte(text)) || text == ""
		if !utf8.ValidString(text) { // (Go's regexp reads bad bytes as U+FFFD; a generated text is never complete on them)
			if ok && v.Complete() {
				t.Fatalf("%s: invalid UTF-8 %q complete", regexCases[i].pattern, text)
			}
			return
		}
		m := fulls[i].MatchString(text)
		if m && !ok {
			t.Fatalf("%s: %q matches but is refused", regexCases[i].pattern, text)
		}
		if ok && v.Complete() != m {
			t.Fatalf("%s: %q accepted, Complete %v, match %v", regexCases[i].pattern, text, v.Complete(), m)
		}
	})
}
