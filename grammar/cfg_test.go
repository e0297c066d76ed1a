package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/mkserve/mkserve/tokenizer"
)

func mustGrammar(t testing.TB, src string) *Grammar {
	t.Helper()
	g, err := CompileGrammar(src)
	if err != nil {
		t.Fatalf("%v\n%s", err, src)
	}
	return g
}

// acceptLen feeds text to a fresh validator byte by byte: the bytes taken
// and whether the text is then complete.
func acceptLen(mk func() Validator, text string) (int, bool) {
	v := mk()
	for i := 0; i < len(text); i++ {
		if !v.Advance([]byte{text[i]}) {
			return i, false
		}
	}
	return len(text), v.Complete()
}

func TestGrammarCompileErrors(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{``, "no rule named root"},
		{`start ::= "a"`, "no rule named root"},
		{`root ::= a`, `"a" is used but never defined`},
		{"root ::= \"a\"\nroot ::= \"b\"", "defined twice"},
		{`root ::= root "a" | "b"`, `"root" is left-recursive`},
		{"root ::= x\nx ::= y \"a\"\ny ::= \"\" | x \"b\"", "left-recursive"},
		{`root ::= "a" root`, "can never finish"},
		{"root ::= \"a\" x\nx ::= \"b\" x", `"x" can never finish`},
		{`root ::= "abc`, "unclosed string"},
		{`root ::= [a-`, "unclosed ["},
		{`root ::= []`, "empty character class"},
		{`root ::= [z-a]`, "backwards"},
		{`root ::= ("a"`, "unclosed ("},
		{`root ::= "a")`, "unmatched )"},
		{`root ::= "\q"`, `unknown escape \q`},
		{`root ::= "\uD800"`, "not a character"},
		{`root ::= "a"{2,1}`, "below the minimum"},
		{`root ::= "a"{1001}`, "want an integer"},
		{`root ::= "a"**`, "two repetitions"},
		{`root "a"`, "expected ::="},
		{`root ::= @`, `unexpected '@'`},
		{manyRules(70, `"a"{1000}`) + "root ::= x0", "more than 65536 elements"},
		{"root ::= \"a\"\n\xff", "not valid UTF-8"},
	} {
		_, err := CompileGrammar(c.src)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one containing %q", c.src, err, c.want)
		}
	}
	if _, err := CompileGrammar(`root ::= "a"` + strings.Repeat(" ", MaxGrammarBytes)); err == nil {
		t.Error("an oversized grammar compiled")
	}
}

// manyRules is n rules x0 … x(n−1) with the same body.
func manyRules(n int, body string) string {
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, "x%d ::= %s\n", i, body)
	}
	return sb.String()
}

// TestGrammarCases: whole texts accepted and refused, across the syntax.
func TestGrammarCases(t *testing.T) {
	for _, c := range []struct {
		src       string
		good, bad []string
	}{
		{`root ::= "yes" | "no"`, []string{"yes", "no"}, []string{"", "ye", "yess", "n o"}},
		{"# answers\nroot ::= answer (\",\" ws answer)*  # a list\nanswer ::= \"yes\" | \"no\" | [0-9]+\nws ::= [ \\t]?",
			[]string{"yes", "1,no", "yes, 22,\tno"}, []string{"yes,", "1,,2", "yes,  no", "maybe"}},
		{"root ::= greeting\n  | farewell\ngreeting ::= \"hi\"\nfarewell ::=\n  \"bye\"", []string{"hi", "bye"}, []string{"hibye"}},
		{`root ::= [^"\\]* "\""`, []string{`"`, `abc é"`}, []string{`a\"`, `""`}},
		{`root ::= "a"{3}`, []string{"aaa"}, []string{"aa", "aaaa"}},
		{`root ::= "ab"{2,}`, []string{"abab", "ababab"}, []string{"ab", "aba"}},
		{`root ::= "a"{,2} "b"{1,3}`, []string{"b", "aab", "abbb"}, []string{"aaab", "abbbb", "a"}},
		{`root ::= . "\x41\u00e9\U0001F600" [\n\t]`, []string{"xAé😀\n", "中Aé😀\t"}, []string{"Aé😀\n", "xAé😀 "}},
		{`root ::= ("(" root ")" | "[" root "]")*`, []string{"", "()", "([])[]", "[[()]]"}, []string{"(", "(]", "())"}},
		{`root ::= "" | "x" root "y"`, []string{"", "xy", "xxxyyy"}, []string{"x", "xyy", "yx"}},
		{"root ::= a? b\na ::= (\"\")* \"a\"\nb ::= ws \"b\"\nws ::= \" \"*", []string{"b", "ab", "a  b"}, []string{"aa b", "a"}},
		{`root ::= [a-c\-]+ [^a-z0-9]`, []string{"a-c!", "bb-É"}, []string{"ab", "abz"}},
		{`root ::= [\]\[]+`, []string{"][", "]"}, []string{"a"}},
	} {
		g := mustGrammar(t, c.src)
		for _, s := range c.good {
			if n, ok := acceptLen(g.New, s); n != len(s) || !ok {
				t.Errorf("%q: %q refused at byte %d (complete %v)", c.src, s, n, ok)
			}
		}
		for _, s := range c.bad {
			if n, ok := acceptLen(g.New, s); n == len(s) && ok {
				t.Errorf("%q: %q accepted", c.src, s)
			}
		}
	}
}

// reNode is a random regular expression, rendered both as GBNF and as RE2.
type reNode struct {
	kind     string // lit, class, cat, alt, rep, rule
	s        string
	neg      bool
	kids     []*reNode
	min, max int
}

const reAlpha = "abcé中"

func randRe(r *rand.Rand, depth int) *reNode {
	k := r.IntN(6)
	if depth <= 0 {
		k = r.IntN(2)
	}
	alpha := []rune(reAlpha)
	switch k {
	case 0:
		var sb strings.Builder
		for range r.IntN(3) {
			sb.WriteRune(alpha[r.IntN(len(alpha))])
		}
		return &reNode{kind: "lit", s: sb.String()}
	case 1:
		var sb strings.Builder
		for range 1 + r.IntN(2) {
			sb.WriteRune(alpha[r.IntN(len(alpha))])
		}
		return &reNode{kind: "class", s: sb.String(), neg: r.IntN(4) == 0}
	case 2:
		return &reNode{kind: "cat", kids: []*reNode{randRe(r, depth-1), randRe(r, depth-1)}}
	case 3:
		return &reNode{kind: "alt", kids: []*reNode{randRe(r, depth-1), randRe(r, depth-1)}}
	case 4:
		n := &reNode{kind: "rep", kids: []*reNode{randRe(r, depth-1)}}
		switch r.IntN(4) {
		case 0:
			n.min, n.max = 0, -1
		case 1:
			n.min, n.max = 1, -1
		case 2:
			n.min, n.max = 0, 1
		default:
			n.min = r.IntN(3)
			n.max = n.min + r.IntN(3)
		}
		return n
	}
	return &reNode{kind: "rule", kids: []*reNode{randRe(r, depth-1)}}
}

// gbnf renders n; rules it names are appended to rules.
func (n *reNode) gbnf(rules *[]string) string {
	switch n.kind {
	case "lit":
		return `"` + n.s + `"`
	case "class":
		if n.neg {
			return "[^" + n.s + "]"
		}
		return "[" + n.s + "]"
	case "cat":
		return n.kids[0].gbnf(rules) + " " + n.kids[1].gbnf(rules)
	case "alt":
		return "(" + n.kids[0].gbnf(rules) + " | " + n.kids[1].gbnf(rules) + ")"
	case "rep":
		x := "(" + n.kids[0].gbnf(rules) + ")"
		switch {
		case n.min == 0 && n.max < 0:
			return x + "*"
		case n.min == 1 && n.max < 0:
			return x + "+"
		case n.min == 0 && n.max == 1:
			return x + "?"
		}
		return fmt.Sprintf("%s{%d,%d}", x, n.min, n.max)
	}
	name := fmt.Sprintf("r%d", len(*rules))
	*rules = append(*rules, "")
	i := len(*rules) - 1
	(*rules)[i] = name + " ::= " + n.kids[0].gbnf(rules)
	return name
}

func (n *reNode) re2() string {
	switch n.kind {
	case "lit":
		return "(?:" + n.s + ")"
	case "class":
		if n.neg {
			return "[^" + n.s + "]"
		}
		return "[" + n.s + "]"
	case "cat":
		return n.kids[0].re2() + n.kids[1].re2()
	case "alt":
		return "(?:" + n.kids[0].re2() + "|" + n.kids[1].re2() + ")"
	case "rep":
		x := "(?:" + n.kids[0].re2() + ")"
		switch {
		case n.min == 0 && n.max < 0:
			return x + "*"
		case n.min == 1 && n.max < 0:
			return x + "+"
		}
		return fmt.Sprintf("%s{%d,%d}", x, n.min, n.max)
	}
	return n.kids[0].re2()
}

// TestGrammarAgainstRegex: random regular grammars, written both in GBNF
// and as a regular expression, accept the same prefixes of random texts
// byte for byte (both validators are exact about prefixes, so their
// refusals must fall on the same byte) and complete the same texts.
func TestGrammarAgainstRegex(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	alpha := []rune(reAlpha + "x")
	compared := 0
	for range 300 {
		n := randRe(r, 4)
		var rules []string
		root := "root ::= " + n.gbnf(&rules)
		src := strings.Join(append([]string{root}, rules...), "\n")
		re, err := CompileRegex(n.re2())
		if err != nil {
			continue // too many NFA states for the regex side
		}
		g := mustGrammar(t, src)
		for k := range 60 {
			var sb strings.Builder
			for range r.IntN(8) {
				sb.WriteRune(alpha[r.IntN(len(alpha))])
			}
			text := sb.String()
			if k%3 == 0 { // a text the regex takes, extended at random
				v := re.New()
				sb.Reset()
				for range 12 {
					c := string(alpha[r.IntN(len(alpha))])
					if v.Advance([]byte(c)) {
						sb.WriteString(c)
					}
				}
				text = sb.String()
			}
			gn, gok := acceptLen(g.New, text)
			rn, rok := acceptLen(re.New, text)
			if gn != rn || gok != rok {
				t.Fatalf("grammar\n%s\nregex %s\ntext %q: grammar takes %d bytes (complete %v), regex %d (%v)", src, n.re2(), text, gn, gok, rn, rok)
			}
			compared++
		}
	}
	if compared < 5000 {
		t.Errorf("only %d texts compared", compared)
	}
}

// TestGrammarBrackets: a context-free language (nested brackets) against
// its reference: a prefix is fine while every closer matches the opener
// on top, and whole when none is left open; nested 500 deep.
func TestGrammarBrackets(t *testing.T) {
	g := mustGrammar(t, `root ::= ("(" root ")" | "[" root "]" | "x")*`)
	r := rand.New(rand.NewPCG(7, 8))
	ref := func(s string) (int, bool) {
		var open []byte
		for i := 0; i < len(s); i++ {
			switch c := s[i]; c {
			case '(', '[':
				open = append(open, c)
			case ')', ']':
				if len(open) == 0 || open[len(open)-1] != map[byte]byte{')': '(', ']': '['}[c] {
					return i, false
				}
				open = open[:len(open)-1]
			case 'x':
			default:
				return i, false
			}
		}
		return len(s), len(open) == 0
	}
	for range 3000 {
		var sb strings.Builder
		depth := 0
		for range r.IntN(30) {
			switch r.IntN(7) {
			case 0, 1:
				sb.WriteByte("(["[r.IntN(2)])
				depth++
			case 2, 3:
				sb.WriteByte(")]"[r.IntN(2)])
			case 4:
				sb.WriteByte('x')
			case 5:
				if depth > 0 {
					sb.WriteByte(')')
				}
			default:
				sb.WriteByte("y("[r.IntN(2)])
			}
		}
		s := sb.String()
		gn, gok := acceptLen(g.New, s)
		rn, rok := ref(s)
		if gn != rn || gok != rok {
			t.Fatalf("%q: grammar %d %v, reference %d %v", s, gn, gok, rn, rok)
		}
	}
	deep := strings.Repeat("([", 250) + strings.Repeat("])", 250)
	if n, ok := acceptLen(g.New, deep); n != len(deep) || !ok {
		t.Errorf("500 deep: %d %v", n, ok)
	}
}

// jsonGBNF is JSON (RFC 8259) as a GBNF grammar, the value first.
const jsonGBNF = `root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws (member ("," ws member)*)? "}" ws
member ::= string ":" ws value
array  ::= "[" ws (value ("," ws value)*)? "]" ws
string ::= "\"" ([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws
ws     ::= [ \t\n\r]*
`

// TestGrammarJSON: the JSON grammar completes exactly the texts
// encoding/json calls valid and are UTF-8 (texts without leading whitespace), and takes
// every prefix of a valid one.
func TestGrammarJSON(t *testing.T) {
	g := mustGrammar(t, jsonGBNF)
	r := rand.New(rand.NewPCG(9, 10))
	docs := []string{`{"a": [1, -2.5e+3, true, null, {"b": "\u00e9\n"}], "c": {}}`, `[]`, `"x\"y"`, `0`, `-0.0e0`, `{"":[[],{}]}` + " \n"}
	for range 200 {
		v := map[string]any{"n": r.Float64() * 1e6, "s": strings.Repeat("é\"\\", r.IntN(3)), "l": []any{r.IntN(100), nil, r.IntN(2) == 0}}
		b, _ := json.MarshalIndent(v, "", strings.Repeat(" ", r.IntN(3)))
		docs = append(docs, string(b))
	}
	valid := 0
	for k := range 4000 {
		doc := []byte(docs[r.IntN(len(docs))])
		if k%2 == 0 && len(doc) > 0 { // a near miss
			const near = "{}[],:\" 01-.eE\\tfnux"
			doc[r.IntN(len(doc))] = near[r.IntN(len(near))]
		}
		s := string(doc)
		if s != "" && strings.ContainsRune(" \t\n\r", rune(s[0])) {
			continue
		}
		n, ok := acceptLen(g.New, s)
		want := json.Valid(doc) && utf8.Valid(doc) // (encoding/json lets invalid UTF-8 through)
		if want {
			valid++
		}
		if want && (n != len(s) || !ok) || !want && ok {
			t.Fatalf("%q: grammar takes %d of %d bytes (complete %v); encoding/json valid %v", s, n, len(s), ok, want)
		}
	}
	if valid < 1000 {
		t.Errorf("only %d valid documents tried", valid)
	}
}

// TestGrammarCacheRebuild: a long text through a grammar whose states keep
// changing outgrows the cache; it is rebuilt and the text still validates.
func TestGrammarCacheRebuild(t *testing.T) {
	g := mustGrammar(t, `root ::= ("(" root ")" | "x")*`)
	v := g.New().(*GrammarText)
	text := strings.Repeat("(", 40000) + strings.Repeat(")", 40000)
	rebuilt := false
	for i := 0; i < len(text); i++ {
		c := v.c
		if !v.Advance([]byte{text[i]}) {
			t.Fatalf("byte %d refused", i)
		}
		rebuilt = rebuilt || v.c != c
	}
	if !v.Complete() || !rebuilt {
		t.Errorf("complete %v, cache rebuilt %v", v.Complete(), rebuilt)
	}
}

// TestGrammarAmbiguityBound: a grammar whose stacks double with each
// character is refused once they pass MaxGStacks, not followed forever.
func TestGrammarAmbiguityBound(t *testing.T) {
	g := mustGrammar(t, `root ::= "a" root "b" | "a" root "c" | ""`)
	n, _ := acceptLen(g.New, strings.Repeat("a", 20))
	if n < 8 || n >= 20 {
		t.Errorf("took %d of 20 a's; want refusal once 2^n passes %d", n, MaxGStacks)
	}
	if n, ok := acceptLen(g.New, "aabc"); n != 4 || !ok {
		t.Errorf("aabc: %d %v", n, ok)
	}
}

// TestGrammarMaskCache: a kept mask is the one computed, and states met
// again reuse it.
func TestGrammarMaskCache(t *testing.T) {
	toks := [][]byte{[]byte("a"), []byte(","), []byte("a,"), []byte(",a"), []byte("b"), []byte("a,a,")}
	tb := func(id int32) []byte { return toks[id] }
	voc := NewVocab(len(toks), tb)
	g := mustGrammar(t, `root ::= "a" ("," "a")*`)
	v := g.New()
	dst := make([]uint64, voc.MaskWords())
	for i, step := range []string{"", "a", ",", "a", ",", "a"} {
		if step != "" && !v.Advance([]byte(step)) {
			t.Fatalf("%q refused", step)
		}
		voc.Mask(v, dst)
		if want := naiveMask(v, len(toks), tb); dst[0] != want[0] {
			t.Fatalf("step %d: mask %b, want %b", i, dst[0], want[0])
		}
	}
	if m := v.(*GrammarText).c.maskB; m != 3*8*voc.MaskWords() {
		t.Errorf("%d bytes of masks kept over 3 distinct states", m)
	}
}

// FuzzGrammar: any source either fails to compile with an error or gives
// a validator that survives any text, with AcceptLen agreeing with Accept.
func FuzzGrammar(f *testing.F) {
	f.Add(jsonGBNF, `{"a": [1, 2]}`)
	f.Add(`root ::= ("(" root ")")* "x"{1,3}`, "(()xx")
	f.Add(`root ::= [^a-z]+ | "é"?`, "AB")
	f.Add("root ::= a\na ::= \"\" | \"b\" a", "bbb")
	f.Fuzz(func(t *testing.T, src, text string) {
		g, err := CompileGrammar(src)
		if err != nil {
			return
		}
		v := g.New()
		px := v.(Prefixer)
		for i := 0; i < len(text) && i < 200; i++ {
			rest := []byte(text[i:min(len(text), i+6)])
			k := px.AcceptLen(rest)
			if (k == len(rest)) != v.Accept(rest) || (k > 0 && !v.Accept(rest[:k])) {
				t.Fatalf("AcceptLen(%q) = %d disagrees with Accept", rest, k)
			}
			if !v.Advance([]byte{text[i]}) {
				return
			}
		}
		_ = v.Complete()
	})
}

// BenchmarkGrammarMask is one mask over GPT-2's vocabulary for the JSON
// grammar: cold (a fresh validator: its states and transitions built as
// the vocabulary is walked) and warm (the state's mask kept).
func BenchmarkGrammarMask(b *testing.B) {
	tok, err := tokenizer.Load(gpt2Path)
	if err != nil {
		b.Skipf("GPT-2 tokenizer not available: %v", err)
	}
	voc := NewVocab(tok.VocabSize(), tok.TokenBytes)
	dst := make([]uint64, voc.MaskWords())
	g := mustGrammar(b, jsonGBNF)
	for _, c := range []struct{ name, prefix string }{
		{"value_start", `{"list": [1, `},
		{"in_string", `{"name": "Zo`},
		{"key_start", `{"a": 1, `},
	} {
		b.Run(c.name+"/cold", func(b *testing.B) {
			n := 0
			for b.Loop() {
				v := g.New()
				v.Advance([]byte(c.prefix))
				n = voc.Mask(v, dst)
			}
			b.ReportMetric(float64(n), "tokens")
		})
		b.Run(c.name+"/second_state", func(b *testing.B) {
			// The validator has been through the vocabulary once from a
			// neighbouring state: transitions are cached, the mask is not.
			v := g.New().(*GrammarText)
			v.Advance([]byte(c.prefix))
			voc.mask(v, dst)
			n := 0
			for b.Loop() {
				n = voc.mask(v, dst)
			}
			b.ReportMetric(float64(n), "tokens")
		})
	}
}

// TestGrammarWorkLimit: a grammar whose every character means gathering
// thousands of stacks gives up (ErrGrammarTooComplex) within the work
// limit, with an empty mask, instead of stalling; ordinary grammars over
// GPT-2 stay far below the limit.
func TestGrammarWorkLimit(t *testing.T) {
	toks := make([][]byte, 0, 2000)
	for a := 'a'; a <= 'z'; a++ {
		for b := 'a'; b <= 'z'; b++ {
			toks = append(toks, []byte{byte(a)}, []byte{byte(a), byte(b)}, []byte{byte(a), byte(b), 'x'})
		}
	}
	voc := NewVocab(len(toks), func(id int32) []byte { return toks[id] })
	dst := make([]uint64, voc.MaskWords())
	if _, err := CompileGrammar(`root ::= ([a-z]?){1000} ([a-z]?){1000} "."`); err == nil || !strings.Contains(err.Error(), "start in more than") {
		t.Errorf("a grammar with 2000 ways to start: %v", err)
	}
	g := mustGrammar(t, `root ::= "b" ([a-z]?){400} ([a-z]? [a-z]?){300}  "."`)
	v := g.New().(*GrammarText)
	if !v.Advance([]byte("b")) {
		t.Fatal("b refused")
	}
	n := voc.Mask(v, dst)
	if n != 0 || !errors.Is(v.Err(), ErrGrammarTooComplex) || v.Accept([]byte("a")) || v.Complete() {
		t.Fatalf("mask %d tokens, err %v", n, v.Err())
	}
	if v.c.work > 3*MaxGrammarWork {
		t.Errorf("gave up after %d units of work (limit %d)", v.c.work, MaxGrammarWork)
	}
	j := mustGrammar(t, jsonGBNF).New().(*GrammarText)
	j.Advance([]byte(`{"a": [1, "x`))
	voc.Mask(j, dst)
	if j.Err() != nil || j.c.work > MaxGrammarWork/20 {
		t.Errorf("the JSON grammar: err %v, %d units", j.Err(), j.c.work)
	}
}

// TestGrammarLoopMask: in a state that loops on plain characters (inside
// a string), the mask is the vocabulary's kept set of tokens made of them
// plus the others walked: equal to the naive scan, with the set built once
// and reused by a later state that loops on the same bytes.
func TestGrammarLoopMask(t *testing.T) {
	var toks [][]byte
	for _, s := range []string{"ab", "a b", "abc\"", "\"", "x", "zz", "é", "a\\", "q r s", "A", "b\"c", "\" ", "ba"} {
		toks = append(toks, []byte(s))
	}
	for c := byte('a'); c <= 'z'; c++ {
		toks = append(toks, []byte{c, c, c})
	}
	tb := func(id int32) []byte { return toks[id] }
	voc := NewVocab(len(toks), tb)
	dst := make([]uint64, voc.MaskWords())
	g := mustGrammar(t, `root ::= "\"" [a-z ]* "\"" " " "\"" [a-z ]* "\""`)
	for _, prefix := range []string{`"ab`, `"ab c`, `"ab" "x`} {
		v := g.New()
		if !v.Advance([]byte(prefix)) {
			t.Fatalf("%q refused", prefix)
		}
		n := voc.Mask(v, dst)
		want := naiveMask(v, len(toks), tb)
		if dst[0] != want[0] || n != Count(want) {
			t.Errorf("after %q: mask %b (%d), want %b", prefix, dst[0], n, want[0])
		}
	}
	if got := voc.loopsN.Load(); got != 1 {
		t.Errorf("%d loop sets built, want 1 (the same bytes loop in both strings)", got)
	}
}

// TestGrammarSharedCache: validators of one Grammar share its parse-state
// cache — a second request through the same states computes no mask —
// from many goroutines at once (masks equal the naive scan's; run with
// -race), and a cache grown past its bound is rebuilt and becomes the
// Grammar's for later validators.
func TestGrammarSharedCache(t *testing.T) {
	var toks [][]byte
	for _, s := range []string{"1", "2", ":", "3:", " ", ".", "\n", "a", "b", "ab", "ba", " a", "a.", ",", "b,", "9:1", "12", "\n1"} {
		toks = append(toks, []byte(s))
	}
	tb := func(id int32) []byte { return toks[id] }
	voc := NewVocab(len(toks), tb)
	g := mustGrammar(t, `root  ::= verse ("\n" verse){0,3}
verse ::= ref " " words "."
ref   ::= [1-9] [0-9]? ":" [1-9] [0-9]?
words ::= word (" " word){2,9}
word  ::= [a-b]+ ","?`)
	text := "12:3 ab ba, a.\n9:1 b a b."
	follow := func(t *testing.T) *gCache {
		v := g.New()
		dst := make([]uint64, voc.MaskWords())
		for i := 0; i <= len(text); i++ {
			voc.Mask(v, dst)
			if want := naiveMask(v, len(toks), tb); dst[0] != want[0] {
				t.Errorf("after %q: mask %b, want %b", text[:i], dst[0], want[0])
				return nil
			}
			if i < len(text) && !v.Advance([]byte{text[i]}) {
				t.Errorf("%q refused after %q", text[i], text[:i])
				return nil
			}
		}
		return v.(*GrammarText).c
	}
	c1 := follow(t)
	kept := c1.maskB
	if c2 := follow(t); c2 != c1 || c2.maskB != kept || kept == 0 {
		t.Errorf("a second request through the same states: cache %p (the first's %p), %d bytes of masks kept (after the first: %d)", c2, c1, c2.maskB, kept)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				follow(t)
			}
		}()
	}
	wg.Wait()

	long := mustGrammar(t, `root ::= ("a" [a-b]{999}){0,6}`)
	c0 := long.New().(*GrammarText).c
	v := long.New()
	for i := range 5000 {
		if !v.Advance([]byte{"ab"[i%2]}) {
			t.Fatalf("refused at %d", i)
		}
	}
	if c := v.(*GrammarText).c; c == c0 || long.shared.Load() != c || len(c.states) > maxGStates {
		t.Errorf("after 5000 states: the validator's cache %p (first %p, the grammar's %p), %d states", c, c0, long.shared.Load(), len(c.states))
	}
	if !v.Advance([]byte("a")) || !long.New().Accept([]byte("ab")) {
		t.Error("refused after the rebuild")
	}
}

// BenchmarkGrammarRequest is a request's masks over GPT-2's vocabulary
// following a text of scripts/bench_grammar.gbnf (two verses, a token a
// step, the longest the mask allows): with a Grammar of its own (every
// state's transitions and mask computed afresh, as each request's
// validator did before validators shared their Grammar's cache) and with
// one Grammar for every request (its cache warm).
func BenchmarkGrammarRequest(b *testing.B) {
	tok, err := tokenizer.Load(gpt2Path)
	if err != nil {
		b.Skipf("GPT-2 tokenizer not available: %v", err)
	}
	src, err := os.ReadFile("../scripts/bench_grammar.gbnf")
	if err != nil {
		b.Fatal(err)
	}
	voc := NewVocab(tok.VocabSize(), tok.TokenBytes)
	dst := make([]uint64, voc.MaskWords())
	text := "12:3 And God said unto Moses, let there be light.\n4:15 The waters were gathered together; and it was good."
	// The request's tokens: at each step the longest the grammar allows
	// that prefixes the rest of the text.
	var ids []int32
	{
		v := mustGrammar(b, string(src)).New()
		for rest := text; rest != ""; {
			voc.Mask(v, dst)
			best := int32(-1)
			for id := range int32(tok.VocabSize()) {
				t := tok.TokenBytes(id)
				if len(t) > 0 && strings.HasPrefix(rest, string(t)) && Allowed(dst, id) && (best < 0 || len(t) > len(tok.TokenBytes(best))) {
					best = id
				}
			}
			if best < 0 || !v.Advance(tok.TokenBytes(best)) {
				b.Fatalf("no token for %q", rest)
			}
			ids = append(ids, best)
			rest = rest[len(tok.TokenBytes(best)):]
		}
	}
	shared := mustGrammar(b, string(src))
	for _, c := range []struct {
		name string
		g    func() *Grammar
	}{
		{"own_grammar", func() *Grammar { return mustGrammar(b, string(src)) }},
		{"shared_grammar", func() *Grammar { return shared }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				v := c.g().New()
				for _, id := range ids {
					voc.Mask(v, dst)
					v.Advance(tok.TokenBytes(id))
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(ids)), "µs/mask")
		})
	}
}
