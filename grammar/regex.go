package grammar

import (
	"fmt"
	"math/bits"
	"regexp/syntax"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Regular expressions as grammars: vLLM's guided_regex (the whole text
// matches) and JSON Schema's "pattern" on strings (the string's characters
// match, in full — as constrained decoders read it, not JSON Schema's
// search). The expression (Go's RE2 syntax, which covers what JSON Schema
// and pydantic write but for look-around and backreferences) is compiled
// by regexp/syntax into an NFA whose states are kept as a fixed bitset, so
// a validator copies by value and a mask's Accept calls allocate nothing.

// MaxRegexInsts is the most NFA instructions a compiled expression may have
// (repetitions count once per copy: [a-z]{1,100} is about 200).
const MaxRegexInsts = 512

// reSet is a set of NFA instructions.
type reSet [MaxRegexInsts / 64]uint64

func (s *reSet) add(pc int)      { s[pc>>6] |= 1 << (pc & 63) }
func (s *reSet) has(pc int) bool { return s[pc>>6]&(1<<(pc&63)) != 0 }
func (s *reSet) empty() bool     { return *s == reSet{} }

func (s *reSet) or(t *reSet) {
	for i := range s {
		s[i] |= t[i]
	}
}

// meets reports whether s and t share an instruction.
func (s *reSet) meets(t *reSet) bool {
	for i := range s {
		if s[i]&t[i] != 0 {
			return true
		}
	}
	return false
}

// each calls f for every instruction in s.
func (s *reSet) each(f func(pc int)) {
	for i, w := range s {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			f(i*64 + b)
			w &= w - 1
		}
	}
}

// Regex is a compiled expression. Safe for concurrent use.
type Regex struct {
	src     string
	prog    *syntax.Prog
	start   reSet   // the states before the first character
	after   []reSet // after[pc]: the states a character matched by rune instruction pc leads to
	matchOK reSet   // states that match when the text ends here
	// A DFA over ASCII characters, built at compile time from the start
	// (at most maxDFA states): dfaSets[i] is state i's set of NFA states,
	// dfaNext[128·i + c] the state after character c (dfaDead: no match
	// possible; dfaUnbuilt: past the cap, the NFA steps), dfaOf a set's
	// state. Read-only once built.
	dfaSets []reSet
	dfaNext []int32
	dfaOf   map[reSet]int32
	plain   sync.Map     // plainKey → *plainMask: masks of plain string tokens by DFA state (mask.go)
	plainN  atomic.Int32 // masks computed (kept up to maxPlainMasks)
}

// DFA limits and markers.
const (
	maxDFA     = 4096
	dfaDead    = -1
	dfaUnbuilt = -2
)

// CompileRegex compiles pattern (RE2 syntax; the whole text must match:
// a leading ^ and a trailing $ are allowed and change nothing). Word
// boundaries and multi-line anchors are not supported.
func CompileRegex(pattern string) (*Regex, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %v", pattern, err)
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %v", pattern, err)
	}
	if len(prog.Inst) > MaxRegexInsts {
		return nil, fmt.Errorf("pattern %q compiles to %d NFA states; at most %d are supported", pattern, len(prog.Inst), MaxRegexInsts)
	}
	for _, in := range prog.Inst {
		if in.Op == syntax.InstEmptyWidth && syntax.EmptyOp(in.Arg)&^(syntax.EmptyBeginText|syntax.EmptyEndText) != 0 {
			return nil, fmt.Errorf("pattern %q: word boundaries and line anchors in multi-line mode are not supported", pattern)
		}
	}
	r := &Regex{src: pattern, prog: prog, after: make([]reSet, len(prog.Inst))}
	live := r.liveStates()
	r.start = r.closure(prog.Start, true, false, live)
	for pc, in := range prog.Inst {
		if isRuneInst(in.Op) {
			r.after[pc] = r.closure(int(in.Out), false, false, live)
		}
	}
	for pc := range prog.Inst {
		if m := r.closure(pc, false, true, nil); m.has(r.matchPC()) {
			r.matchOK.add(pc)
		}
	}
	r.buildDFA()
	return r, nil
}

// buildDFA explores the ASCII transitions from the start set.
func (r *Regex) buildDFA() {
	r.dfaOf = map[reSet]int32{r.start: 0}
	r.dfaSets = []reSet{r.start}
	for i := 0; i < len(r.dfaSets); i++ {
		row := make([]int32, 128)
		for c := range rune(128) {
			ns := r.step(&r.dfaSets[i], c)
			switch id, ok := r.dfaOf[ns]; {
			case ns.empty():
				row[c] = dfaDead
			case ok:
				row[c] = id
			case len(r.dfaSets) < maxDFA:
				row[c] = int32(len(r.dfaSets))
				r.dfaOf[ns] = row[c]
				r.dfaSets = append(r.dfaSets, ns)
			default:
				row[c] = dfaUnbuilt
			}
		}
		r.dfaNext = append(r.dfaNext, row...)
	}
}

// String is the source pattern.
func (r *Regex) String() string { return r.src }

func isRuneInst(op syntax.InstOp) bool {
	return op == syntax.InstRune || op == syntax.InstRune1 || op == syntax.InstRuneAny || op == syntax.InstRuneAnyNotNL
}

// matchPC is the program's match instruction.
func (r *Regex) matchPC() int {
	for pc, in := range r.prog.Inst {
		if in.Op == syntax.InstMatch {
			return pc
		}
	}
	return -1
}

// closure is the set of rune, match and pending end-of-text states reached
// from pc without a character (begin: at the start of the text; end: at
// its end), keeping only live ones when live is given.
func (r *Regex) closure(pc int, begin, end bool, live *reSet) reSet {
	var out, seen reSet
	var walk func(pc int)
	walk = func(pc int) {
		if seen.has(pc) {
			return
		}
		seen.add(pc)
		in := &r.prog.Inst[pc]
		switch in.Op {
		case syntax.InstAlt, syntax.InstAltMatch:
			walk(int(in.Out))
			walk(int(in.Arg))
		case syntax.InstCapture, syntax.InstNop:
			walk(int(in.Out))
		case syntax.InstEmptyWidth:
			op := syntax.EmptyOp(in.Arg)
			switch {
			case op&syntax.EmptyBeginText != 0 && !begin:
			case op&syntax.EmptyEndText != 0 && !end:
				out.add(pc) // passable once the text ends
			default:
				walk(int(in.Out))
			}
		case syntax.InstFail:
		default: // rune instructions and match
			out.add(pc)
		}
	}
	walk(pc)
	if live != nil {
		for i := range out {
			out[i] &= live[i]
		}
	}
	return out
}

// liveStates are the states from which the text can still match.
func (r *Regex) liveStates() *reSet {
	var live reSet
	live.add(r.matchPC())
	for changed := true; changed; {
		changed = false
		for pc, in := range r.prog.Inst {
			if live.has(pc) {
				continue
			}
			ok := false
			switch in.Op {
			case syntax.InstAlt, syntax.InstAltMatch:
				ok = live.has(int(in.Out)) || live.has(int(in.Arg))
			case syntax.InstCapture, syntax.InstNop, syntax.InstEmptyWidth, syntax.InstRune, syntax.InstRune1,
				syntax.InstRuneAny, syntax.InstRuneAnyNotNL:
				ok = live.has(int(in.Out))
			}
			if ok {
				live.add(pc)
				changed = true
			}
		}
	}
	return &live
}

// step is the states after character c from s (empty: no match is possible).
func (r *Regex) step(s *reSet, c rune) reSet {
	var out reSet
	s.each(func(pc int) {
		if in := &r.prog.Inst[pc]; isRuneInst(in.Op) && in.MatchRune(c) {
			out.or(&r.after[pc])
		}
	})
	return out
}

// canRange reports whether some character in [lo, hi] can come next from s.
func (r *Regex) canRange(s *reSet, lo, hi rune) bool {
	ok := false
	s.each(func(pc int) {
		if ok {
			return
		}
		in := &r.prog.Inst[pc]
		switch in.Op {
		case syntax.InstRuneAny:
			ok = true
		case syntax.InstRuneAnyNotNL:
			ok = lo != '\n' || hi != '\n'
		case syntax.InstRune1:
			ok = in.Rune[0] >= lo && in.Rune[0] <= hi
		case syntax.InstRune:
			if syntax.Flags(in.Arg)&syntax.FoldCase != 0 {
				ok = true // (folded ranges: taken as possible)
				return
			}
			for k := 0; k+1 < len(in.Rune); k += 2 {
				if in.Rune[k] <= hi && in.Rune[k+1] >= lo {
					ok = true
					return
				}
			}
			if len(in.Rune) == 1 {
				ok = in.Rune[0] >= lo && in.Rune[0] <= hi
			}
		}
	})
	return ok
}

// reText is the state of matching characters: the NFA states and a UTF-8
// character still being assembled from its bytes.
type reText struct {
	d   int32 // the DFA state of the NFA states (Regex.dfaSets), or -1: they are set
	set reSet
	buf [utf8.UTFMax]byte
	n   uint8 // bytes of buf in use
}

// startText is the state before any character.
func (r *Regex) startText() reText { return reText{d: 0} }

// cur is t's set of NFA states.
func (r *Regex) cur(t *reText) *reSet {
	if t.d >= 0 {
		return &r.dfaSets[t.d]
	}
	return &t.set
}

// char takes one whole character.
func (r *Regex) char(t *reText, c rune) bool {
	if c < 128 && t.d >= 0 {
		switch nd := r.dfaNext[int(t.d)<<7|int(c)]; nd {
		case dfaDead:
			return false
		case dfaUnbuilt:
		default:
			t.d = nd
			return true
		}
	}
	ns := r.step(r.cur(t), c)
	if ns.empty() {
		return false
	}
	if id, ok := r.dfaOf[ns]; ok {
		t.d = id
	} else {
		t.d, t.set = -1, ns
	}
	return true
}

// byte takes one byte of UTF-8 text: a character once it is whole; a
// partial one is taken if some character it can still become may come.
func (r *Regex) byte(t *reText, b byte) bool {
	if t.n == 0 && b < utf8.RuneSelf {
		return r.char(t, rune(b))
	}
	t.buf[t.n] = b
	t.n++
	p := t.buf[:t.n]
	if utf8.FullRune(p) {
		c, size := utf8.DecodeRune(p)
		t.n = 0
		if c == utf8.RuneError && size <= 1 {
			return false
		}
		return r.char(t, c)
	}
	lo, hi, ok := utf8Range(p)
	return ok && r.canRange(r.cur(t), lo, hi)
}

// done reports whether the text may end here.
func (r *Regex) done(t *reText) bool { return t.n == 0 && r.cur(t).meets(&r.matchOK) }

// utf8Range is the range of characters whose encodings start with the
// incomplete sequence p, and false when no valid encoding does.
func utf8Range(p []byte) (lo, hi rune, ok bool) {
	b0 := p[0]
	var n int
	var v rune
	switch {
	case b0 >= 0xC2 && b0 <= 0xDF:
		n, v = 2, rune(b0&0x1F)
	case b0 >= 0xE0 && b0 <= 0xEF:
		n, v = 3, rune(b0&0x0F)
	case b0 >= 0xF0 && b0 <= 0xF4:
		n, v = 4, rune(b0&0x07)
	default:
		return 0, 0, false
	}
	for _, c := range p[1:] {
		if c&0xC0 != 0x80 {
			return 0, 0, false
		}
		v = v<<6 | rune(c&0x3F)
	}
	rest := 6 * (n - len(p))
	lo, hi = v<<rest, v<<rest|(1<<rest-1)
	// The shortest encodings only: no overlong forms, no surrogates, ≤ U+10FFFF.
	minimum := [...]rune{0, 0, 0x80, 0x800, 0x10000}[n]
	lo, hi = max(lo, minimum), min(hi, utf8.MaxRune)
	if lo >= 0xD800 && hi <= 0xDFFF {
		return 0, 0, false
	}
	return lo, hi, lo <= hi
}

// RegexText validates a whole text against a Regex (vLLM's guided_regex).
type RegexText struct {
	re *Regex
	t  reText
}

var _ Validator = (*RegexText)(nil)

// New is a fresh validator at the start of a text: a grammar factory for
// engine.SamplingParams.Grammar (the method value r.New).
func (r *Regex) New() Validator { return &RegexText{re: r, t: r.startText()} }

// Accept reports whether b may come next; an empty b is not accepted.
func (v *RegexText) Accept(b []byte) bool { return len(b) > 0 && v.AcceptLen(b) == len(b) }

// AcceptLen is the length of b's longest prefix that may come next (Prefixer).
func (v *RegexText) AcceptLen(b []byte) int {
	t := v.t
	for i, c := range b {
		if !v.re.byte(&t, c) {
			return i
		}
	}
	return len(b)
}

// Advance appends b if it is accepted and reports whether it was.
func (v *RegexText) Advance(b []byte) bool {
	if !v.Accept(b) {
		return false
	}
	for _, c := range b {
		v.re.byte(&v.t, c)
	}
	return true
}

// Complete reports whether the text matches.
func (v *RegexText) Complete() bool { return v.re.done(&v.t) }
