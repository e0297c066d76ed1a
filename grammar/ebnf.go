package grammar

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// Context-free grammars in GBNF, the EBNF dialect of llama.cpp that
// xgrammar (vLLM's guided_grammar backend) reads too:
//
//	root   ::= answer ("," ws answer)*
//	answer ::= "yes" | "no" | [0-9]+
//	ws     ::= [ \t]?
//
// A rule is `name ::= alternatives`; alternatives are separated by `|`, each
// a sequence of string literals ("…", escapes \n \r \t \\ \" \xHH \uHHHH
// \UHHHHHHHH), character classes ([a-z], [^"\\], escapes as in strings),
// `.` (any character), rule names and parenthesised groups, any of them
// followed by `*`, `+`, `?` or `{m}`, `{m,}`, `{m,n}`, `{,n}`. `#` starts a
// comment. A rule may run over several lines: a new one starts where a line
// holds `name ::=`. The text must match rule `root` in full. Grammars are
// read character by character (UTF-8). Left recursion (`expr ::= expr "+"
// term`) is refused, as in llama.cpp: write it as repetition (`expr ::=
// term ("+" term)*`).

// Grammar limits: the source, elements after repetitions are expanded, and
// a bounded repetition's count.
const (
	MaxGrammarBytes = 64 << 10
	MaxGrammarElems = 1 << 16
	MaxGrammarRep   = 1000
)

// gElem kinds.
const (
	gEnd  uint8 = iota // the end of an alternative
	gChar              // one character in ranges (negated: outside them)
	gRef               // rule ref
)

// gElem is one element of an alternative, as rules are laid out in
// Grammar.elems: each alternative its elements then a gEnd.
type gElem struct {
	kind   uint8
	neg    bool
	ranges []rune // gChar: lo, hi pairs (inclusive)
	ref    int32  // gRef: the rule
}

// matches reports whether character c fits a gChar element.
func (e *gElem) matches(c rune) bool {
	in := false
	for i := 0; i < len(e.ranges); i += 2 {
		if c >= e.ranges[i] && c <= e.ranges[i+1] {
			in = true
			break
		}
	}
	return in != e.neg
}

// meets reports whether some character in [lo, hi] fits a gChar element.
func (e *gElem) meets(lo, hi rune) bool {
	if !e.neg {
		for i := 0; i < len(e.ranges); i += 2 {
			if lo <= e.ranges[i+1] && e.ranges[i] <= hi {
				return true
			}
		}
		return false
	}
	// Negated: some character of [lo, hi] outside every range. Walk lo
	// upwards past the ranges that cover it.
	for moved := true; moved && lo <= hi; {
		moved = false
		for i := 0; i < len(e.ranges); i += 2 {
			if lo >= e.ranges[i] && lo <= e.ranges[i+1] {
				lo, moved = e.ranges[i+1]+1, true
			}
		}
	}
	return lo <= hi
}

// Grammar is a compiled context-free grammar. Safe for concurrent use: its
// validators (New) share one parse-state cache under its lock.
type Grammar struct {
	src    string
	elems  []gElem
	alts   [][]int32 // alts[r]: rule r's alternatives, each its first element's index in elems
	names  []string  // rule names (generated ones in brackets, for errors)
	root   int32
	shared atomic.Pointer[gCache] // the validators' cache (cfg.go); nil until the first
}

// gbnfParser reads GBNF source into rules.
type gbnfParser struct {
	src   string
	pos   int
	g     *Grammar
	ids   map[string]int32 // rule name → id (defined or referenced)
	def   []bool           // def[id]: defined
	refAt map[int32]int    // a referenced rule's first use, for errors
}

// gAlt is a parsed alternative: its items in order.
type gAlt []gItem

// gItem is a parsed element with its repetition.
type gItem struct {
	atom     gAtom
	min, max int // repetition bounds (max −1: unbounded); 1, 1 when none
}

// gAtom is a literal's characters, a class, a rule reference or a group.
type gAtom struct {
	lit   []rune // a string literal (each character an element)
	class *gElem // a character class or '.'
	ref   int32  // a rule reference, when lit, class and group are nil (−1 otherwise)
	group []gAlt // a parenthesised group
	isLit bool   // lit holds a literal (possibly empty: "")
}

// CompileGrammar compiles GBNF source (see the comment above MaxGrammarBytes).
func CompileGrammar(src string) (*Grammar, error) {
	if len(src) > MaxGrammarBytes {
		return nil, fmt.Errorf("grammar is %d bytes; at most %d are supported", len(src), MaxGrammarBytes)
	}
	if !utf8.ValidString(src) {
		return nil, fmt.Errorf("grammar is not valid UTF-8")
	}
	p := &gbnfParser{src: src, g: &Grammar{src: src}, ids: map[string]int32{}, refAt: map[int32]int{}}
	bodies := map[int32][]gAlt{}
	var order []int32
	for {
		p.space(true)
		if p.pos >= len(p.src) {
			break
		}
		at := p.pos
		name := p.name()
		if name == "" {
			return nil, p.errf("expected a rule name")
		}
		p.space(false)
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return nil, p.errf("expected ::= after rule name %q", name)
		}
		p.pos += 3
		id := p.rule(name)
		if p.def[id] {
			return nil, p.errAt(at, "rule %q is defined twice", name)
		}
		p.def[id] = true
		alts, err := p.alternatives(false)
		if err != nil {
			return nil, err
		}
		bodies[id] = alts
		order = append(order, id)
	}
	root, ok := p.ids["root"]
	if !ok || !p.def[root] {
		return nil, fmt.Errorf("grammar has no rule named root")
	}
	for id, at := range p.refAt {
		if !p.def[id] {
			return nil, p.errAt(at, "rule %q is used but never defined", p.g.names[id])
		}
	}
	g := p.g
	g.root = root
	g.alts = make([][]int32, len(g.names))
	for _, id := range order {
		if err := p.lower(id, bodies[id]); err != nil {
			return nil, err
		}
	}
	if err := g.check(); err != nil {
		return nil, err
	}
	if newGCache(g).start().set == nil {
		return nil, fmt.Errorf("grammar: the text can start in more than %d ways at once (long runs of optional items); write them as bounded repetitions {m,n}", MaxGStacks)
	}
	return g, nil
}

// rule is the id of rule name, made on first sight.
func (p *gbnfParser) rule(name string) int32 {
	if id, ok := p.ids[name]; ok {
		return id
	}
	id := int32(len(p.g.names))
	p.ids[name] = id
	p.g.names = append(p.g.names, name)
	p.def = append(p.def, false)
	return id
}

// newRule is a generated rule's id (for groups and repetitions).
func (p *gbnfParser) newRule(of string) int32 {
	id := int32(len(p.g.names))
	p.g.names = append(p.g.names, "("+of+")")
	p.def = append(p.def, true)
	p.g.alts = append(p.g.alts, nil)
	return id
}

func (p *gbnfParser) errf(format string, args ...any) error { return p.errAt(p.pos, format, args...) }

// errAt is an error at byte offset at, as line:column.
func (p *gbnfParser) errAt(at int, format string, args ...any) error {
	line := 1 + strings.Count(p.src[:at], "\n")
	col := at - strings.LastIndexByte(p.src[:at], '\n')
	return fmt.Errorf("grammar line %d column %d: %s", line, col, fmt.Sprintf(format, args...))
}

// space skips blanks and comments; newlines too when nl.
func (p *gbnfParser) space(nl bool) {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t' || c == '\r':
			p.pos++
		case c == '\n' && nl:
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}

// name reads a rule name ("" if none).
func (p *gbnfParser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

// ruleStartsHere reports whether the text at the cursor is `name ::=`.
func (p *gbnfParser) ruleStartsHere() bool {
	save := p.pos
	defer func() { p.pos = save }()
	if p.name() == "" {
		return false
	}
	p.space(false)
	return strings.HasPrefix(p.src[p.pos:], "::=")
}

// alternatives reads `seq | seq | …` up to the end of the rule (or, nested,
// the closing parenthesis, which it leaves).
func (p *gbnfParser) alternatives(nested bool) ([]gAlt, error) {
	var alts []gAlt
	for {
		seq, err := p.sequence(nested)
		if err != nil {
			return nil, err
		}
		alts = append(alts, seq)
		p.space(true)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			continue
		}
		return alts, nil
	}
}

// sequence reads items up to `|`, `)` or the end of the rule.
func (p *gbnfParser) sequence(nested bool) (gAlt, error) {
	var seq gAlt
	for {
		p.space(true)
		if p.pos >= len(p.src) {
			if nested {
				return nil, p.errf("unclosed (")
			}
			return seq, nil
		}
		c := p.src[p.pos]
		if c == '|' || c == ')' {
			if c == ')' && !nested {
				return nil, p.errf("unmatched )")
			}
			return seq, nil
		}
		if !nested && isNameByte(c) && p.ruleStartsHere() {
			return seq, nil
		}
		atomAt := p.pos
		atom, err := p.atom()
		if err != nil {
			return nil, err
		}
		it := gItem{atom: atom, min: 1, max: 1}
		if p.pos < len(p.src) {
			switch p.src[p.pos] {
			case '*':
				it.min, it.max = 0, -1
				p.pos++
			case '+':
				it.min, it.max = 1, -1
				p.pos++
			case '?':
				it.min, it.max = 0, 1
				p.pos++
			case '{':
				if it.min, it.max, err = p.braces(); err != nil {
					return nil, err
				}
			}
		}
		if p.pos < len(p.src) && strings.IndexByte("*+?{", p.src[p.pos]) >= 0 {
			return nil, p.errf("two repetitions in a row after the item at column %d; group it first", atomAt-strings.LastIndexByte(p.src[:atomAt], '\n'))
		}
		seq = append(seq, it)
	}
}

// braces reads {m}, {m,}, {m,n} or {,n}.
func (p *gbnfParser) braces() (int, int, error) {
	at := p.pos
	end := strings.IndexByte(p.src[p.pos:], '}')
	if end < 0 {
		return 0, 0, p.errf("unclosed {")
	}
	body := p.src[p.pos+1 : p.pos+end]
	p.pos += end + 1
	num := func(s string) (int, error) {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 0 || n > MaxGrammarRep {
			return 0, p.errAt(at, "repetition count %q: want an integer 0…%d", s, MaxGrammarRep)
		}
		return n, nil
	}
	lo, hi, comma := body, body, false
	if i := strings.IndexByte(body, ','); i >= 0 {
		lo, hi, comma = body[:i], body[i+1:], true
	}
	var m, n int
	var err error
	if strings.TrimSpace(lo) == "" && comma {
		m = 0
	} else if m, err = num(lo); err != nil {
		return 0, 0, err
	}
	switch {
	case !comma:
		n = m
	case strings.TrimSpace(hi) == "":
		n = -1
	default:
		if n, err = num(hi); err != nil {
			return 0, 0, err
		}
		if n < m {
			return 0, 0, p.errAt(at, "repetition {%s}: the maximum is below the minimum", body)
		}
	}
	return m, n, nil
}

// atom reads a literal, class, '.', name or group.
func (p *gbnfParser) atom() (gAtom, error) {
	switch c := p.src[p.pos]; {
	case c == '"':
		p.pos++
		var lit []rune
		for {
			if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
				return gAtom{}, p.errf("unclosed string literal")
			}
			if p.src[p.pos] == '"' {
				p.pos++
				return gAtom{lit: lit, isLit: true, ref: -1}, nil
			}
			r, err := p.char()
			if err != nil {
				return gAtom{}, err
			}
			lit = append(lit, r)
		}
	case c == '[':
		e, err := p.class()
		return gAtom{class: e, ref: -1}, err
	case c == '.':
		p.pos++
		return gAtom{class: &gElem{kind: gChar, ranges: []rune{0, utf8.MaxRune}}, ref: -1}, nil
	case c == '(':
		p.pos++
		alts, err := p.alternatives(true)
		if err != nil {
			return gAtom{}, err
		}
		if p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return gAtom{}, p.errf("unclosed (")
		}
		p.pos++
		return gAtom{group: alts, ref: -1}, nil
	case isNameByte(c):
		at := p.pos
		name := p.name()
		id := p.rule(name)
		if _, seen := p.refAt[id]; !seen {
			p.refAt[id] = at
		}
		return gAtom{ref: id}, nil
	default:
		r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
		return gAtom{}, p.errf("unexpected %q", r)
	}
}

// class reads [...] (the cursor on '[').
func (p *gbnfParser) class() (*gElem, error) {
	p.pos++
	e := &gElem{kind: gChar}
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		e.neg = true
		p.pos++
	}
	for {
		if p.pos >= len(p.src) || p.src[p.pos] == '\n' {
			return nil, p.errf("unclosed [")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			if len(e.ranges) == 0 && !e.neg {
				return nil, p.errf("empty character class []")
			}
			return e, nil
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.errf("character range %q-%q is backwards", lo, hi)
			}
		}
		e.ranges = append(e.ranges, lo, hi)
	}
}

// char reads one character of a literal or class, escapes decoded.
func (p *gbnfParser) char() (rune, error) {
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	if r != '\\' {
		p.pos += n
		return r, nil
	}
	if p.pos+1 >= len(p.src) {
		return 0, p.errf("escape at the end of the grammar")
	}
	e := p.src[p.pos+1]
	p.pos += 2
	switch e {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case '0':
		return 0, nil
	case '\\', '"', '[', ']', '-', '^', '\'', '/':
		return rune(e), nil
	case 'x', 'u', 'U':
		digits := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
		if p.pos+digits > len(p.src) {
			return 0, p.errf("\\%c needs %d hex digits", e, digits)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+digits], 16, 32)
		if err != nil || v > utf8.MaxRune || v >= 0xD800 && v <= 0xDFFF {
			return 0, p.errf("\\%c%s is not a character", e, p.src[p.pos:p.pos+digits])
		}
		p.pos += digits
		return rune(v), nil
	}
	return 0, p.errAt(p.pos-2, "unknown escape \\%c", e)
}

// lower lays rule id's alternatives out in elems.
func (p *gbnfParser) lower(id int32, alts []gAlt) error {
	for _, a := range alts {
		var seq []gElem
		for _, it := range a {
			es, err := p.item(id, it)
			if err != nil {
				return err
			}
			seq = append(seq, es...)
		}
		if err := p.emit(id, seq); err != nil {
			return err
		}
	}
	return nil
}

// emit appends one alternative of rule id.
func (p *gbnfParser) emit(id int32, seq []gElem) error {
	g := p.g
	if len(g.elems)+len(seq)+1 > MaxGrammarElems {
		return fmt.Errorf("grammar expands to more than %d elements (repetitions count once per copy)", MaxGrammarElems)
	}
	g.alts[id] = append(g.alts[id], int32(len(g.elems)))
	g.elems = append(g.elems, seq...)
	g.elems = append(g.elems, gElem{kind: gEnd})
	return nil
}

// atomElems are an atom's elements once (a group becomes a generated rule).
func (p *gbnfParser) atomElems(in int32, a gAtom) ([]gElem, error) {
	switch {
	case a.isLit:
		es := make([]gElem, len(a.lit))
		for i, r := range a.lit {
			es[i] = gElem{kind: gChar, ranges: []rune{r, r}}
		}
		return es, nil
	case a.class != nil:
		return []gElem{*a.class}, nil
	case a.group != nil:
		r := p.newRule(p.g.names[in])
		if err := p.lower(r, a.group); err != nil {
			return nil, err
		}
		return []gElem{{kind: gRef, ref: r}}, nil
	}
	return []gElem{{kind: gRef, ref: a.ref}}, nil
}

// item is an item's elements: the atom min times, then the optional rest
// as generated rules (x* → R ::= x R | ; x{0,n} nested so as not to blow up).
func (p *gbnfParser) item(in int32, it gItem) ([]gElem, error) {
	one, err := p.atomElems(in, it.atom)
	if err != nil {
		return nil, err
	}
	if it.min == 1 && it.max == 1 {
		return one, nil
	}
	if len(one) != 1 { // a literal of several characters: repeat it as one rule
		r := p.newRule(p.g.names[in])
		if err := p.emit(r, one); err != nil {
			return nil, err
		}
		one = []gElem{{kind: gRef, ref: r}}
	}
	var out []gElem
	for range it.min {
		out = append(out, one...)
		if len(out) > MaxGrammarElems {
			return nil, fmt.Errorf("grammar expands to more than %d elements (repetitions count once per copy)", MaxGrammarElems)
		}
	}
	switch {
	case it.max < 0: // R ::= x R | ε
		r := p.newRule(p.g.names[in])
		if err := p.emit(r, append(append([]gElem{}, one...), gElem{kind: gRef, ref: r})); err != nil {
			return nil, err
		}
		if err := p.emit(r, nil); err != nil {
			return nil, err
		}
		out = append(out, gElem{kind: gRef, ref: r})
	case it.max > it.min: // R_k ::= x R_{k−1} | ε, R_1 ::= x | ε
		next := int32(-1)
		for range it.max - it.min {
			r := p.newRule(p.g.names[in])
			seq := append([]gElem{}, one...)
			if next >= 0 {
				seq = append(seq, gElem{kind: gRef, ref: next})
			}
			if err := p.emit(r, seq); err != nil {
				return nil, err
			}
			if err := p.emit(r, nil); err != nil {
				return nil, err
			}
			next = r
		}
		out = append(out, gElem{kind: gRef, ref: next})
	}
	return out, nil
}

// check refuses rules that can never finish (no alternative derives a
// finite text) and left recursion that grows the stack (a rule reached
// again, before any character, with something left to match after it).
func (g *Grammar) check() error {
	n := len(g.alts)
	nullable := make([]bool, n)
	productive := make([]bool, n)
	for changed := true; changed; {
		changed = false
		for r := range n {
			for _, a := range g.alts[r] {
				null, prod := true, true
				for i := a; g.elems[i].kind != gEnd; i++ {
					if e := &g.elems[i]; e.kind == gChar {
						null = false
					} else {
						null = null && nullable[e.ref]
						prod = prod && productive[e.ref]
					}
				}
				if null && !nullable[r] {
					nullable[r], changed = true, true
				}
				if prod && !productive[r] {
					productive[r], changed = true, true
				}
			}
		}
	}
	// Rules reachable from root must be productive.
	seen := make([]bool, n)
	stack := []int32{g.root}
	seen[g.root] = true
	var stuck []string
	for len(stack) > 0 {
		r := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if !productive[r] && !slices.Contains(stuck, strconv.Quote(g.ruleName(r))) {
			stuck = append(stuck, strconv.Quote(g.ruleName(r)))
		}
		for _, a := range g.alts[r] {
			for i := a; g.elems[i].kind != gEnd; i++ {
				if e := &g.elems[i]; e.kind == gRef && !seen[e.ref] {
					seen[e.ref] = true
					stack = append(stack, e.ref)
				}
			}
		}
	}
	if stuck != nil {
		return fmt.Errorf("grammar rule %s can never finish: every alternative recurses without end", strings.Join(stuck, ", "))
	}
	// Edges r → s where s may come first in r: grows when s is not last.
	type edge struct {
		to    int32
		grows bool
	}
	edges := make([][]edge, n)
	for r := range n {
		for _, a := range g.alts[r] {
			for i := a; g.elems[i].kind == gRef; i++ {
				e := &g.elems[i]
				edges[r] = append(edges[r], edge{e.ref, g.elems[i+1].kind != gEnd})
				if !nullable[e.ref] {
					break
				}
			}
		}
	}
	// A cycle with a growing edge: an edge inside one strongly connected
	// component (Tarjan's algorithm).
	comp := g.components(n, func(r int32, f func(int32)) {
		for _, e := range edges[r] {
			f(e.to)
		}
	})
	for r := range n {
		for _, e := range edges[r] {
			if e.grows && comp[r] == comp[e.to] {
				return fmt.Errorf("grammar rule %q is left-recursive (it can reach itself before matching a character); write it as a repetition", g.ruleName(int32(r)))
			}
		}
	}
	return nil
}

// components numbers the strongly connected components of the graph of n
// nodes whose edges out of r each calls f with.
func (g *Grammar) components(n int, each func(r int32, f func(int32))) []int32 {
	index := make([]int32, n) // 0: unvisited; else visit order + 1
	low := make([]int32, n)
	comp := make([]int32, n)
	onStack := make([]bool, n)
	var stack []int32
	var next, ncomp int32
	var visit func(r int32)
	visit = func(r int32) {
		next++
		index[r], low[r] = next, next
		stack = append(stack, r)
		onStack[r] = true
		each(r, func(s int32) {
			switch {
			case index[s] == 0:
				visit(s)
				low[r] = min(low[r], low[s])
			case onStack[s]:
				low[r] = min(low[r], index[s])
			}
		})
		if low[r] == index[r] {
			for {
				s := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[s] = false
				comp[s] = ncomp
				if s == r {
					break
				}
			}
			ncomp++
		}
	}
	for r := range int32(n) {
		if index[r] == 0 {
			visit(r)
		}
	}
	return comp
}

// ruleName is a rule's name for errors (a generated rule's: the rule it is in).
func (g *Grammar) ruleName(r int32) string {
	name := g.names[r]
	for strings.HasPrefix(name, "(") {
		name = strings.TrimSuffix(strings.TrimPrefix(name, "("), ")")
	}
	return name
}
