// Package grammar holds incremental validators that constrain generated
// text: the engine asks one whether a token's bytes may come next and
// samples only tokens it accepts (OpenAI's response_format).
package grammar

// Validator is what constrained sampling needs of a grammar: whether bytes
// may come next, taking them, and whether the text may end. JSON and
// SchemaJSON are Validators.
type Validator interface {
	Accept(b []byte) bool
	Advance(b []byte) bool
	Complete() bool
}

// Failer is a Validator that can give up on a text (GrammarText: a grammar
// too costly to follow); Err says why, nil while it has not.
type Failer interface {
	Err() error
}

var (
	_ Validator = (*JSON)(nil)
	_ Validator = (*SchemaJSON)(nil)
	_ Validator = (*Wrapped)(nil)
)

// JSON validates, a byte at a time, the prefixes of one JSON text (RFC
// 8259): a single value with whitespace around it — or, made by
// NewJSON(true), an object that starts the text (no whitespace before it:
// a model would otherwise spend tokens on it). Strings must be valid UTF-8 without raw control
// characters. Limits keep a model from running on forever inside the
// grammar (a known failure of constrained decoding: whitespace without
// end): between two tokens, one space — or one newline (after at most one
// space or carriage return) and an indentation of at most IndentPerLevel
// bytes a nesting level plus one level, as pretty printing writes it —
// and containers nested at most MaxDepth deep. The zero value is not
// usable; copy one with Clone.
type JSON struct {
	stack      []byte // open containers, '{' or '['
	st         state
	objectOnly bool
	compact    bool   // between tokens at most one space (SetCompact)
	lit        string // literal (true / false / null): the bytes still to come
	n          int8   // hex digits of a \u escape, or UTF-8 continuation bytes, still to come
	lo, hi     byte   // the next continuation byte's range (UTF-8 overlong / surrogate rules)
	key        bool   // the string being read is an object key
	ws         wsRun
	scratch    []byte // Accept's copy of the stack
}

// wsRun counts a run of whitespace between tokens against the limits.
type wsRun struct {
	n  int  // bytes in the run since its start or its newline
	nl bool // the run holds a newline
}

// take adds whitespace byte c to the run at nesting depth: before a
// newline one byte (a space, a tab or the '\r' of "\r\n"), then one
// newline, then at most IndentPerLevel·(depth+1) bytes of indentation.
func (w *wsRun) take(c byte, depth int) bool {
	if c == '\n' {
		if w.nl {
			return false
		}
		w.nl, w.n = true, 0
		return true
	}
	if c == '\r' && w.nl {
		return false
	}
	w.n++
	if w.nl {
		return w.n <= IndentPerLevel*(depth+1)
	}
	return w.n <= 1
}

// IndentPerLevel is the indentation a nesting level may add after a
// newline (4: what json.dumps(indent=4) writes; 2 and tabs fit too).
const IndentPerLevel = 4

// MaxDepth is the deepest nesting of objects and arrays JSON accepts.
const MaxDepth = 64

type state uint8

const (
	stStart      state = iota // before the top-level value
	stValue                   // a value must come (after ':' or ',' in an array)
	stValueOrEnd              // after '[': a value or ']'
	stKeyOrEnd                // after '{': a key or '}'
	stKey                     // after ',' in an object: a key
	stColon                   // after a key: ':'
	stCommaOrEnd              // after a value inside a container
	stDone                    // the top-level value is complete
	stString                  // inside a string
	stEscape                  // after '\' in a string
	stHex                     // inside \uXXXX (n digits to come)
	stUTF8                    // inside a multi-byte UTF-8 sequence (n bytes to come)
	stLiteral                 // inside true / false / null (lit to come)
	stMinus                   // after '-': a digit must come
	stZero                    // a number's integer part is 0
	stInt                     // in a number's integer digits
	stDot                     // after '.': a digit must come
	stFrac                    // in a number's fraction digits
	stExp                     // after 'e' / 'E': a sign or digit must come
	stExpSign                 // after the exponent's sign: a digit must come
	stExpInt                  // in the exponent's digits
)

// JSONObject is a fresh validator of one JSON object (response_format
// json_object): a grammar factory for engine.SamplingParams.Grammar.
func JSONObject() Validator { return NewJSON(true) }

// NewJSON returns a validator at the start of a JSON text; objectOnly
// requires an object as the text's first byte.
func NewJSON(objectOnly bool) *JSON {
	return &JSON{st: stStart, objectOnly: objectOnly}
}

// Clone returns an independent copy of j.
func (j *JSON) Clone() *JSON {
	c := *j
	c.stack = append([]byte(nil), j.stack...)
	c.scratch = nil
	return &c
}

// Complete reports whether the text so far is one whole JSON value (plus
// whitespace): the end of the text may come now. After a closed object,
// array, string or literal only whitespace may follow; a top-level number
// may still grow.
func (j *JSON) Complete() bool {
	switch j.st {
	case stDone:
		return true
	case stZero, stInt, stFrac, stExpInt:
		return len(j.stack) == 0
	}
	return false
}

// Accept reports whether b may come next, leaving j unchanged. An empty b
// is not accepted (it would not advance the text).
func (j *JSON) Accept(b []byte) bool { return len(b) > 0 && j.AcceptLen(b) == len(b) }

// TokenClass is StringBody inside a string with nothing pending (Classer).
func (j *JSON) TokenClass() TokenClass {
	if j.st == stString {
		return StringBody
	}
	return NoClass
}

// AcceptLen is the length of b's longest prefix that may come next
// (len(b): all of it), leaving j unchanged (Prefixer).
func (j *JSON) AcceptLen(b []byte) int {
	t := *j
	t.stack = append(j.scratch[:0], j.stack...)
	n := 0
	for n < len(b) && t.byte(b[n]) {
		n++
	}
	j.scratch = t.stack[:0] // keep the (possibly grown) buffer for the next call
	return n
}

// Advance appends b, which must be accepted; it reports whether it was
// (j is unchanged when it was not).
func (j *JSON) Advance(b []byte) bool {
	if !j.Accept(b) {
		return false
	}
	j.feed(b)
	return true
}

// feed runs the bytes of b through j, stopping at the first one the
// grammar rejects.
func (j *JSON) feed(b []byte) bool {
	for _, c := range b {
		if !j.byte(c) {
			return false
		}
	}
	return true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || (c|0x20) >= 'a' && (c|0x20) <= 'f' }

// space takes a whitespace byte c between tokens, within the limits.
func (j *JSON) space(c byte) bool {
	if j.compact && (c != ' ' || j.ws.n > 0) {
		return false
	}
	return j.ws.take(c, len(j.stack))
}

// Compacter is a Validator that can be held to compact whitespace: at
// most one space between tokens, no newlines (fewer tokens spent on
// layout; a small model otherwise likes to indent).
type Compacter interface {
	SetCompact()
}

// SetCompact holds j to compact whitespace (Compacter).
func (j *JSON) SetCompact() { j.compact = true }

// Compact is factory's validators held to compact whitespace where they
// can be (Compacter); others as they are.
func Compact(factory func() Validator) func() Validator {
	return func() Validator {
		v := factory()
		if c, ok := v.(Compacter); ok {
			c.SetCompact()
		}
		return v
	}
}

// open starts an object or array.
func (j *JSON) open(c byte) bool {
	if len(j.stack) >= MaxDepth {
		return false
	}
	j.stack = append(j.stack, c)
	if c == '{' {
		j.st = stKeyOrEnd
	} else {
		j.st = stValueOrEnd
	}
	return true
}

// valueDone moves past a complete value: to the container's separator, or
// to the end of the text.
func (j *JSON) valueDone() {
	if len(j.stack) == 0 {
		j.st = stDone
	} else {
		j.st = stCommaOrEnd
	}
}

// value starts a value with byte c (in a state where one must come).
func (j *JSON) value(c byte) bool {
	switch {
	case c == '{' || c == '[':
		return j.open(c)
	case c == '"':
		j.st, j.key = stString, false
	case c == '-':
		j.st = stMinus
	case c == '0':
		j.st = stZero
	case isDigit(c):
		j.st = stInt
	case c == 't':
		j.st, j.lit = stLiteral, "rue"
	case c == 'f':
		j.st, j.lit = stLiteral, "alse"
	case c == 'n':
		j.st, j.lit = stLiteral, "ull"
	default:
		return false
	}
	return true
}

// close ends the innermost container with c (']' or '}').
func (j *JSON) close(c byte) bool {
	n := len(j.stack)
	if n == 0 || (c == '}') != (j.stack[n-1] == '{') {
		return false
	}
	j.stack = j.stack[:n-1]
	j.valueDone()
	return true
}

// endNumber ends a number at byte c, which then runs in the state after
// the value. A top-level number only ends at whitespace.
func (j *JSON) endNumber(c byte) bool {
	j.valueDone()
	return j.byte(c)
}

// byte advances j by one byte.
func (j *JSON) byte(c byte) bool {
	if !isSpace(c) || j.st >= stString {
		j.ws = wsRun{}
	}
	switch j.st {
	case stStart:
		if j.objectOnly {
			return c == '{' && j.open(c)
		}
		if isSpace(c) {
			return j.space(c)
		}
		return j.value(c)
	case stValue:
		if isSpace(c) {
			return j.space(c)
		}
		return j.value(c)
	case stValueOrEnd:
		if isSpace(c) {
			return j.space(c)
		}
		if c == ']' {
			return j.close(c)
		}
		return j.value(c)
	case stKeyOrEnd, stKey:
		if isSpace(c) {
			return j.space(c)
		}
		if c == '}' && j.st == stKeyOrEnd {
			return j.close(c)
		}
		if c != '"' {
			return false
		}
		j.st, j.key = stString, true
		return true
	case stColon:
		if isSpace(c) {
			return j.space(c)
		}
		if c != ':' {
			return false
		}
		j.st = stValue
		return true
	case stCommaOrEnd:
		if isSpace(c) {
			return j.space(c)
		}
		switch c {
		case ',':
			if j.stack[len(j.stack)-1] == '{' {
				j.st = stKey
			} else {
				j.st = stValue
			}
			return true
		case '}', ']':
			return j.close(c)
		}
		return false
	case stDone:
		return isSpace(c) && j.space(c)
	case stString:
		switch {
		case c == '"':
			if j.key {
				j.st = stColon
			} else {
				j.valueDone()
			}
		case c == '\\':
			j.st = stEscape
		case c < 0x20:
			return false
		case c < 0x80:
		default:
			return j.utf8Lead(c)
		}
		return true
	case stEscape:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			j.st = stString
		case 'u':
			j.st, j.n = stHex, 4
		default:
			return false
		}
		return true
	case stHex:
		if !isHex(c) {
			return false
		}
		if j.n--; j.n == 0 {
			j.st = stString
		}
		return true
	case stUTF8:
		if c < j.lo || c > j.hi {
			return false
		}
		j.lo, j.hi = 0x80, 0xBF
		if j.n--; j.n == 0 {
			j.st = stString
		}
		return true
	case stLiteral:
		if c != j.lit[0] {
			return false
		}
		if j.lit = j.lit[1:]; j.lit == "" {
			j.valueDone()
		}
		return true
	case stMinus:
		switch {
		case c == '0':
			j.st = stZero
		case isDigit(c):
			j.st = stInt
		default:
			return false
		}
		return true
	case stZero, stInt:
		switch {
		case isDigit(c) && j.st == stInt:
		case c == '.':
			j.st = stDot
		case c == 'e' || c == 'E':
			j.st = stExp
		case isDigit(c): // a digit after a leading 0
			return false
		default:
			return j.endNumber(c)
		}
		return true
	case stDot:
		if !isDigit(c) {
			return false
		}
		j.st = stFrac
		return true
	case stFrac:
		switch {
		case isDigit(c):
		case c == 'e' || c == 'E':
			j.st = stExp
		default:
			return j.endNumber(c)
		}
		return true
	case stExp:
		switch {
		case c == '+' || c == '-':
			j.st = stExpSign
		case isDigit(c):
			j.st = stExpInt
		default:
			return false
		}
		return true
	case stExpSign:
		if !isDigit(c) {
			return false
		}
		j.st = stExpInt
		return true
	case stExpInt:
		if isDigit(c) {
			return true
		}
		return j.endNumber(c)
	}
	return false
}

// utf8Lead starts a multi-byte UTF-8 sequence in a string with lead byte c
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
func (j *JSON) utf8Lead(c byte) bool {
	j.lo, j.hi = 0x80, 0xBF
	switch {
	case c >= 0xC2 && c <= 0xDF:
		j.n = 1
	case c == 0xE0:
		j.n, j.lo = 2, 0xA0
	case c == 0xED:
		j.n, j.hi = 2, 0x9F
	case c >= 0xE1 && c <= 0xEF:
		j.n = 2
	case c == 0xF0:
		j.n, j.lo = 3, 0x90
	case c == 0xF4:
		j.n, j.hi = 3, 0x8F
	case c >= 0xF1 && c <= 0xF3:
		j.n = 3
	default:
		return false
	}
	j.st = stUTF8
	return true
}
