package safetensors

import (
	"errors"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A scanner reads the strict JSON (RFC 8259) of safetensors headers and
// index files in one pass without building a tree: headers of large
// checkpoints hold tens of thousands of entries, and encoding/json's token
// API costs some 15 µs per entry. Duplicate keys are the caller's to check.
// The input must already be valid UTF-8.
type scanner struct {
	b []byte
	i int
}

// maxDepth bounds the nesting of skipped values.
const maxDepth = 512

// errNotObject reports a JSON value that is valid but not an object.
var errNotObject = errors.New("not a JSON object")

// syntaxError describes malformed JSON at the scanner's position.
func (s *scanner) syntaxError(what string) error {
	if s.i >= len(s.b) {
		return fmt.Errorf("not valid JSON: unexpected end (%s)", what)
	}
	return fmt.Errorf("not valid JSON at byte %d: %s, found %q", s.i, what, s.b[s.i])
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips white space and returns the next byte (0 at the end).
func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// end requires nothing but white space to remain.
func (s *scanner) end() error {
	if s.peek() != 0 || s.i < len(s.b) {
		return fmt.Errorf("trailing data after the JSON value at byte %d", s.i)
	}
	return nil
}

// object reads an object, calling member for each key with the scanner
// positioned at the value, which member must consume. A valid value that is
// not an object gives errNotObject.
func (s *scanner) object(member func(key string) error) error {
	if c := s.peek(); c != '{' {
		if c != 0 {
			save := s.i
			if s.skip(0) == nil {
				return errNotObject
			}
			s.i = save
		}
		return s.syntaxError("want '{'")
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return s.syntaxError("want a string key")
		}
		key, err := s.str()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return s.syntaxError("want ':'")
		}
		s.i++
		s.ws()
		if err := member(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.syntaxError("want ',' or '}'")
		}
	}
}

// str reads a string, decoding escapes. Lone surrogates in \u escapes
// become U+FFFD, as encoding/json does.
func (s *scanner) str() (string, error) {
	if s.peek() != '"' {
		return "", s.syntaxError("want a string")
	}
	s.i++
	start := s.i
	for s.i < len(s.b) { // fast path: no escapes
		c := s.b[s.i]
		if c == '"' {
			out := string(s.b[start:s.i])
			s.i++
			return out, nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", s.syntaxError("control character in string")
		}
		s.i++
	}
	buf := append([]byte(nil), s.b[start:s.i]...)
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return string(buf), nil
		case c < 0x20:
			return "", s.syntaxError("control character in string")
		case c != '\\':
			buf = append(buf, c)
			s.i++
			continue
		}
		s.i++ // the backslash
		if s.i >= len(s.b) {
			break
		}
		e := s.b[s.i]
		s.i++
		switch e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r, ok := s.hex4()
			if !ok {
				return "", s.syntaxError("bad \\u escape")
			}
			if utf16.IsSurrogate(r) {
				save := s.i
				if s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
					s.i += 2
					if r2, ok := s.hex4(); ok {
						if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
							buf = utf8.AppendRune(buf, d)
							continue
						}
					}
				}
				s.i = save // not a pair: the next escape stands alone
				r = utf8.RuneError
			}
			buf = utf8.AppendRune(buf, r)
		default:
			s.i--
			return "", s.syntaxError("bad escape")
		}
	}
	return "", s.syntaxError("unterminated string")
}

// hex4 reads four hex digits.
func (s *scanner) hex4() (rune, bool) {
	if s.i+4 > len(s.b) {
		return 0, false
	}
	var r rune
	for _, c := range s.b[s.i : s.i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	s.i += 4
	return r, true
}

// number reads a JSON number and returns its text.
func (s *scanner) number() ([]byte, error) {
	start := s.i
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	if s.i < len(s.b) && s.b[s.i] == '0' {
		s.i++
	} else if digits() == 0 {
		return nil, s.syntaxError("want a digit")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return nil, s.syntaxError("want a digit after '.'")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return nil, s.syntaxError("want a digit in the exponent")
		}
	}
	return s.b[start:s.i], nil
}

// skip reads and discards any value.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("JSON nested deeper than %d at byte %d", maxDepth, s.i)
	}
	switch c := s.peek(); {
	case c == '{':
		return s.object(func(string) error { return s.skip(depth + 1) })
	case c == '[':
		return s.array(func() error { return s.skip(depth + 1) })
	case c == '"':
		_, err := s.str()
		return err
	case c == '-' || '0' <= c && c <= '9':
		_, err := s.number()
		return err
	}
	for _, lit := range []string{"true", "false", "null"} {
		if s.literal(lit) {
			return nil
		}
	}
	return s.syntaxError("want a value")
}

// literal consumes lit if it comes next.
func (s *scanner) literal(lit string) bool {
	if s.i+len(lit) <= len(s.b) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return true
	}
	return false
}

// null consumes a null if one comes next.
func (s *scanner) null() bool {
	s.ws()
	return s.literal("null")
}

// array reads an array, calling elem with the scanner at each element.
func (s *scanner) array(elem func() error) error {
	if s.peek() != '[' {
		return s.syntaxError("want '['")
	}
	s.i++
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return s.syntaxError("want ',' or ']'")
		}
	}
}

// ints reads an array of integers (no fraction, no exponent, no quotes).
func (s *scanner) ints() ([]int64, error) {
	if c := s.peek(); c != '[' {
		save := s.i
		if c != 0 && s.skip(0) == nil {
			return nil, fmt.Errorf("%s is not an array", quoted(s.b[save:s.i]))
		}
		return nil, s.syntaxError("want '['")
	}
	var out []int64
	err := s.array(func() error {
		s.ws()
		start := s.i
		num, err := s.number()
		if err != nil {
			s.i = start
			if s.skip(0) == nil {
				return fmt.Errorf("element %d (%s) is not an integer", len(out), quoted(s.b[start:s.i]))
			}
			return err
		}
		v, perr := strconv.ParseInt(string(num), 10, 64)
		if perr != nil {
			return fmt.Errorf("element %d (%s) is not an integer in range", len(out), quoted(num))
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// stringValue reads a value that must be a string.
func (s *scanner) stringValue() (string, error) {
	if c := s.peek(); c != '"' {
		save := s.i
		if c != 0 && s.skip(0) == nil {
			return "", fmt.Errorf("%s is not a string", quoted(s.b[save:s.i]))
		}
		return "", s.syntaxError("want a string")
	}
	return s.str()
}

// stringMap reads an object whose values are all strings, refusing
// duplicate keys.
func (s *scanner) stringMap() (map[string]string, error) {
	out := map[string]string{}
	err := s.object(func(key string) error {
		if _, dup := out[key]; dup {
			return &dupKeyError{key}
		}
		v, err := s.stringValue()
		if err != nil {
			return fmt.Errorf("value of %q: %w", key, err)
		}
		out[key] = v
		return nil
	})
	return out, err
}

// dupKeyError reports a key that appears twice in one object.
type dupKeyError struct{ key string }

func (e *dupKeyError) Error() string { return fmt.Sprintf("duplicate key %q", e.key) }

// quoted shows at most 40 bytes of raw JSON in an error message.
func quoted(raw []byte) string {
	if len(raw) > 40 {
		return strconv.Quote(string(raw[:40])) + "…"
	}
	return strconv.Quote(string(raw))
}
