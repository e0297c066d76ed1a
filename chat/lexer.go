package chat

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file applies Jinja2's whitespace control itself and rewrites the
// template for github.com/ardanlabs/jinja. That library always applies
// trim_blocks/lstrip_blocks on its own, but it looks for the nearest text
// segment across other tags ("{{ x }}{%- if %}" strips text before the
// "{{"), and it has no newline normalization or keep_trailing_newline=False.
// So we lex the template the way Jinja2's lexer does (trim_blocks=True,
// lstrip_blocks=True), and hand the library a template whose literal text
// is moved into variables ({{ __mkserve_tN }}) and whose tags carry no
// "-"/"+" markers: with no text segments left, its trimming does nothing.
//
// The same pass rewrites a few constructs to our own implementations:
// every {{ expr }} prints through __mkserve_str (Python's str(): None,
// floats, lists, dicts); the filters tojson and map use ours (Python
// json.dumps; map with a filter name); number literals with exponents or
// "_" separators are spelled out (the library parses neither); loop bodies
// restore the outer value of the names they assign at every iteration (see
// frame); and macro bodies count their depth.

// maxNesting bounds bracket nesting in a tag and maxMacroDepth macro
// recursion, so that hostile templates fail instead of exhausting the stack.
const (
	maxNesting    = 256
	maxMacroDepth = 256
)

// textVar names the variable that holds literal text number i.
func textVar(i int) string { return fmt.Sprintf("__mkserve_t%d", i) }

// rewrittenFilters maps a filter name to the implementation we substitute.
var rewrittenFilters = map[string]string{
	"tojson": "__mkserve_tojson",
	"map":    "__mkserve_map",
}

// pyIsSpace is Python's str.isspace / re's \s for one character.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// pyRStrip is Python's str.rstrip().
func pyRStrip(s string) string { return strings.TrimRightFunc(s, pyIsSpace) }

// skipSpace returns the index after the whitespace run starting at i.
func skipSpace(s string, i int) int {
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !pyIsSpace(r) {
			break
		}
		i += n
	}
	return i
}

// normalizeNewlines does what Jinja2's lexer does to the source first:
// \r\n, \r and \n all become \n, and one trailing newline is dropped
// (keep_trailing_newline=False).
func normalizeNewlines(src string) string {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	return strings.TrimSuffix(src, "\n")
}

// templateError is a syntax error found while lexing.
type templateError struct {
	line int
	msg  string
}

func (e *templateError) Error() string { return fmt.Sprintf("line %d: %s", e.line, e.msg) }

// lexer holds the state of one pass over a template.
type lexer struct {
	src    string
	chunks []string // output pieces; loop fix-ups are filled in at endfor
	texts  []string
	frames []frame // open blocks that scope assignments
	loops  int     // loops seen, for unique snapshot names
}

// frame is an open for loop, macro or call block. Jinja2 gives every loop
// iteration a fresh scope: a {% set %} in the body does not survive into
// the next iteration, which starts from the value outside the loop. The
// library keeps one scope for all iterations, so for each name assigned in
// a loop body we snapshot the outer value before the loop and restore it
// at the start of every iteration.
type frame struct {
	kind   string   // "for", "macro", "call", "filter", "set" (block set)
	before int      // chunk index reserved before the for tag
	after  int      // chunk index reserved after the for tag
	names  []string // plain names assigned in the body
}

func (l *lexer) write(s string) { l.chunks = append(l.chunks, s) }

func (l *lexer) errorf(pos int, format string, args ...any) error {
	return &templateError{line: 1 + strings.Count(l.src[:min(pos, len(l.src))], "\n"), msg: fmt.Sprintf(format, args...)}
}

func (l *lexer) emitText(s string) {
	if s == "" {
		return
	}
	l.write("{{ " + textVar(len(l.texts)) + " }}")
	l.texts = append(l.texts, s)
}

// preprocess lexes src like Jinja2 and returns the rewritten template and
// its literal texts.
func preprocess(src string) (string, []string, error) {
	l := &lexer{src: normalizeNewlines(src)}
	s := l.src
	pos := 0
	lineStarting := true
	for pos < len(s) {
		k := strings.Index(s[pos:], "{")
		var kind byte
		for k >= 0 {
			at := pos + k
			if at+1 < len(s) && (s[at+1] == '{' || s[at+1] == '%' || s[at+1] == '#') {
				kind = s[at+1]
				break
			}
			next := strings.Index(s[at+1:], "{")
			if next < 0 {
				k = -1
				break
			}
			k += 1 + next
		}
		if k < 0 {
			l.emitText(s[pos:])
			break
		}
		start := pos + k
		text := s[pos:start]
		sign := byte(0)
		if start+2 < len(s) && (s[start+2] == '-' || s[start+2] == '+') {
			sign = s[start+2]
		}
		isRaw, rawEnd := false, 0
		if kind == '%' {
			isRaw, rawEnd = matchRawBegin(s, start)
		}
		// Whitespace control of the text before the tag.
		switch {
		case sign == '-':
			text = pyRStrip(text)
		case sign != '+' && kind != '{':
			text = lstripBlock(text, lineStarting)
		}
		l.emitText(text)
		var end int
		var err error
		switch {
		case isRaw:
			end, err = l.raw(s, rawEnd)
		case kind == '#':
			end, err = l.comment(s, start)
		default:
			end, err = l.tag(s, start, kind)
		}
		if err != nil {
			return "", nil, err
		}
		lineStarting = end > 0 && s[end-1] == '\n'
		pos = end
	}
	if len(l.frames) > 0 {
		return "", nil, l.errorf(len(s), "unclosed %q block", l.frames[len(l.frames)-1].kind)
	}
	return strings.Join(l.chunks, ""), l.texts, nil
}

// lstripBlock applies lstrip_blocks: whitespace between the last newline
// (or the start of a line) and a block or comment tag is removed.
func lstripBlock(text string, lineStarting bool) string {
	lpos := strings.LastIndexByte(text, '\n') + 1
	if lpos == 0 && !lineStarting {
		return text
	}
	rest := text[lpos:]
	if rest != "" && strings.TrimLeftFunc(rest, pyIsSpace) == "" {
		return text[:lpos]
	}
	return text
}

// matchRawBegin matches {%(-|+|)\s*raw\s*(-%}\s*|%}) at i.
func matchRawBegin(s string, i int) (bool, int) {
	j := i + 2
	if j < len(s) && (s[j] == '-' || s[j] == '+') {
		j++
	}
	j = skipSpace(s, j)
	if !strings.HasPrefix(s[j:], "raw") {
		return false, 0
	}
	j = skipSpace(s, j+3)
	switch {
	case strings.HasPrefix(s[j:], "-%}"):
		return true, skipSpace(s, j+3)
	case strings.HasPrefix(s[j:], "%}"):
		return true, j + 2
	}
	return false, 0
}

// raw emits the body of a raw block starting at i and returns the end of
// its endraw tag.
func (l *lexer) raw(s string, i int) (int, error) {
	for j := i; ; {
		k := strings.Index(s[j:], "{%")
		if k < 0 {
			return 0, l.errorf(i, "missing end of raw directive")
		}
		at := j + k
		p := at + 2
		sign := byte(0)
		if p < len(s) && (s[p] == '-' || s[p] == '+') {
			sign = s[p]
			p++
		}
		p = skipSpace(s, p)
		if !strings.HasPrefix(s[p:], "endraw") {
			j = at + 2
			continue
		}
		p = skipSpace(s, p+6)
		var end int
		switch {
		case strings.HasPrefix(s[p:], "+%}"):
			end = p + 3
		case strings.HasPrefix(s[p:], "-%}"):
			end = skipSpace(s, p+3)
		case strings.HasPrefix(s[p:], "%}"):
			end = p + 2
			if end < len(s) && s[end] == '\n' {
				end++
			}
		default:
			j = at + 2
			continue
		}
		text := s[i:at]
		switch {
		case sign == '-':
			text = pyRStrip(text)
		case sign != '+':
			// The raw-begin tag ends the previous match; it never ends in a
			// newline unless -%} swallowed one.
			text = lstripBlock(text, i > 0 && s[i-1] == '\n')
		}
		l.emitText(text)
		return end, nil
	}
}

// comment skips a {# ... #} comment starting at i.
func (l *lexer) comment(s string, i int) (int, error) {
	body := i + 2
	if body < len(s) && (s[body] == '-' || s[body] == '+') {
		body++ // the opener's own marker is not part of the body
	}
	k := strings.Index(s[body:], "#}")
	if k < 0 {
		return 0, l.errorf(i, "missing end of comment tag")
	}
	at := body + k
	if at > body && s[at-1] == '-' {
		return skipSpace(s, at+2), nil
	}
	if at > body && s[at-1] == '+' {
		return at + 2, nil
	}
	end := at + 2
	if end < len(s) && s[end] == '\n' {
		end++
	}
	return end, nil
}

// tag copies a {{ ... }} or {% ... %} tag starting at i without its
// whitespace markers, rewriting printed expressions and some filters, and
// returns the index after its end (and after whatever whitespace the end
// marker swallows).
func (l *lexer) tag(s string, i int, kind byte) (int, error) {
	p := i + 2
	if p < len(s) && (s[p] == '-' || s[p] == '+') {
		p++
	}
	closer := "}}"
	if kind == '%' {
		closer = "%}"
	}
	var inner strings.Builder
	var stack []byte
	for {
		if p >= len(s) {
			return 0, l.errorf(i, "unclosed tag")
		}
		if len(stack) == 0 {
			end, ok := tagEnd(s, p, kind, closer)
			if ok {
				body := inner.String()
				if kind == '{' {
					l.write("{{ __mkserve_str((" + body + ")) }}")
				} else if err := l.statement(body, i); err != nil {
					return 0, err
				}
				return end, nil
			}
		}
		c := s[p]
		switch {
		case c == '\'' || c == '"':
			e := stringEnd(s, p)
			if e < 0 {
				return 0, l.errorf(p, "unterminated string")
			}
			inner.WriteString(s[p:e])
			p = e
			continue
		case c == '(' || c == '[' || c == '{':
			if len(stack) >= maxNesting {
				return 0, l.errorf(p, "brackets nested deeper than %d", maxNesting)
			}
			stack = append(stack, map[byte]byte{'(': ')', '[': ']', '{': '}'}[c])
		case c == ')' || c == ']' || c == '}':
			if len(stack) == 0 || stack[len(stack)-1] != c {
				return 0, l.errorf(p, "unexpected %q", c)
			}
			stack = stack[:len(stack)-1]
			inner.WriteByte(c)
			// Keep "}}" and "%}" out of the body: the library's scanner would
			// take them for the end of the tag.
			if p+1 < len(s) && (s[p+1] == '}' || (c == '}' && kind == '%')) {
				inner.WriteByte(' ')
			}
			p++
			continue
		case c == '%' && p+1 < len(s) && s[p+1] == '}':
			inner.WriteString("% ")
			p++
			continue
		case c >= '0' && c <= '9' && (p == 0 || !isIdentByte(s[p-1])):
			lit, e := numberLiteral(s, p)
			inner.WriteString(lit)
			p = e
			continue
		case c == '|':
			inner.WriteByte('|')
			q := skipSpace(s, p+1)
			name := identAt(s, q)
			if repl, ok := rewrittenFilters[name]; ok && name != "" {
				inner.WriteString(s[p+1:q] + repl)
				p = q + len(name)
				continue
			}
		}
		if c != '|' {
			inner.WriteByte(c)
		}
		p++
	}
}

// tagEnd matches the end of a tag at p: -}} / }} for expressions; +%} /
// -%} / %} (plus one newline, trim_blocks) for statements.
func tagEnd(s string, p int, kind byte, closer string) (int, bool) {
	switch {
	case kind == '%' && strings.HasPrefix(s[p:], "+%}"):
		return p + 3, true
	case strings.HasPrefix(s[p:], "-"+closer):
		return skipSpace(s, p+3), true
	case strings.HasPrefix(s[p:], closer):
		end := p + 2
		if kind == '%' && end < len(s) && s[end] == '\n' {
			end++
		}
		return end, true
	}
	return 0, false
}

// stringEnd returns the index after the string literal starting at p (a
// quote), honouring backslash escapes, or -1 if it is not terminated.
func stringEnd(s string, p int) int {
	q := s[p]
	for j := p + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case q:
			return j + 1
		}
	}
	return -1
}

// identAt returns the identifier starting at p, or "".
func identAt(s string, p int) string {
	j := p
	for j < len(s) {
		r, n := utf8.DecodeRuneInString(s[j:])
		if r == '_' || unicode.IsLetter(r) || (j > p && unicode.IsDigit(r)) {
			j += n
			continue
		}
		break
	}
	return s[p:j]
}

func isIdentByte(c byte) bool {
	return c == '_' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80
}

// numberLiteral reads the number literal at p (Jinja2 syntax: digits with
// optional _ separators, a fraction, an exponent) and returns it in a form
// the library parses (it knows neither exponents nor separators), plus
// the index after it.
func numberLiteral(s string, p int) (string, int) {
	digits := func(j int) int {
		k := j
		for k < len(s) && (s[k] >= '0' && s[k] <= '9' || (s[k] == '_' && k > j && k+1 < len(s) && s[k+1] >= '0' && s[k+1] <= '9')) {
			k++
		}
		return k
	}
	e := digits(p)
	if e+1 < len(s) && s[e] == '.' && s[e+1] >= '0' && s[e+1] <= '9' {
		e = digits(e + 1)
	}
	hasExp := false
	if e < len(s) && (s[e] == 'e' || s[e] == 'E') {
		k := e + 1
		if k < len(s) && (s[k] == '+' || s[k] == '-') {
			k++
		}
		if k < len(s) && s[k] >= '0' && s[k] <= '9' {
			e = digits(k)
			hasExp = true
		}
	}
	lit := strings.ReplaceAll(s[p:e], "_", "")
	if hasExp {
		if f, err := strconv.ParseFloat(lit, 64); err == nil && !math.IsInf(f, 0) {
			lit = strconv.FormatFloat(f, 'f', -1, 64)
			if !strings.Contains(lit, ".") {
				lit += ".0"
			}
		}
	}
	return lit, e
}

// statement writes a {% ... %} tag and tracks the blocks that scope
// assignments (see frame).
func (l *lexer) statement(body string, pos int) error {
	fields := strings.Fields(body)
	word := ""
	if len(fields) > 0 {
		word = fields[0]
	}
	tag := "{%" + body + "%}"
	switch word {
	case "for", "macro", "call", "filter":
		f := frame{kind: word}
		switch word {
		case "for":
			f.before = len(l.chunks)
			l.write("")
			l.write(tag)
			f.after = len(l.chunks)
			l.write("")
		case "macro":
			// Count macro depth so that runaway recursion is an error, not
			// a Go stack overflow.
			l.write(tag + "{{ __mkserve_enter() }}")
		default:
			l.write(tag)
		}
		l.frames = append(l.frames, f)
		return nil
	case "endfor", "endmacro", "endcall", "endfilter", "endset":
		want := strings.TrimPrefix(word, "end")
		if len(l.frames) == 0 || l.frames[len(l.frames)-1].kind != want {
			return l.errorf(pos, "unexpected %q", word)
		}
		f := l.frames[len(l.frames)-1]
		l.frames = l.frames[:len(l.frames)-1]
		if word == "endfor" && len(f.names) > 0 {
			l.loops++
			var snap, reset strings.Builder
			for _, n := range f.names {
				v := fmt.Sprintf("__mkserve_l%d_%s", l.loops, n)
				snap.WriteString("{% set " + v + " = " + n + " %}")
				reset.WriteString("{% set " + n + " = " + v + " %}")
			}
			l.chunks[f.before] = snap.String()
			l.chunks[f.after] = reset.String()
		}
		if word == "endmacro" {
			l.write("{{ __mkserve_leave() }}")
		}
		l.write(tag)
		return nil
	case "set":
		rest := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(body), "set"))
		target, _, isAssign := strings.Cut(rest, "=")
		if !isAssign {
			// {% set name %}...{% endset %}
			l.frames = append(l.frames, frame{kind: "set"})
			defer func() { l.noteAssigned(strings.TrimSpace(target), 1) }()
		} else {
			l.noteAssigned(target, 0)
		}
	}
	l.write(tag)
	return nil
}

// noteAssigned records the plain names of an assignment target in the
// innermost for loop, unless a macro or call block is closer. skip frames
// on top (a block set being opened) are ignored.
func (l *lexer) noteAssigned(target string, skip int) {
	for i := len(l.frames) - 1 - skip; i >= 0; i-- {
		f := &l.frames[i]
		switch f.kind {
		case "macro", "call":
			return
		case "for":
			for _, n := range strings.Split(target, ",") {
				n = strings.Trim(strings.TrimSpace(n), "()")
				if n == "" || identAt(n, 0) != n || slices.Contains(f.names, n) {
					continue
				}
				f.names = append(f.names, n)
			}
			return
		}
	}
}
