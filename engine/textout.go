package engine

import (
	"strings"
	"unicode/utf8"
)

// Detokenizer turns token ids back into text (tokenizer.Tokenizer).
type Detokenizer interface {
	Decode(ids []int32, skipSpecial bool) (string, error)
}

// textOut turns one sequence's output tokens into stop-string-safe text
// increments. Tokens are decoded incrementally over a short window (a
// token's text can depend on its neighbours: byte fallback, leading-space
// rules), and text that could still become a stop string is held back until
// it cannot.
type textOut struct {
	tok          Detokenizer
	ids          []int32
	prefix, read int    // decode window: ids[prefix:read] already turned into text
	text         string // all text so far
	emitted      int    // bytes of text already handed out
	stops        []string
	maxStop      int
	skipSpecial  bool // special tokens leave no text (SamplingParams.KeepSpecialTokens unset)
}

func newTextOut(tok Detokenizer, stops []string, keepSpecial bool) *textOut {
	o := &textOut{tok: tok, stops: stops, skipSpecial: !keepSpecial}
	for _, s := range stops {
		o.maxStop = max(o.maxStop, len(s))
	}
	return o
}

// add appends a token and returns the text that may be emitted now, and
// whether a stop string ended the output (the text before it is returned,
// the stop string and anything after are dropped).
func (o *textOut) add(id int32) (string, bool, error) {
	o.ids = append(o.ids, id)
	prev, err := o.tok.Decode(o.ids[o.prefix:o.read], o.skipSpecial)
	if err != nil {
		return "", false, err
	}
	cur, err := o.tok.Decode(o.ids[o.prefix:], o.skipSpecial)
	if err != nil {
		return "", false, err
	}
	if len(cur) > len(prev) && strings.HasPrefix(cur, prev) && !strings.HasSuffix(cur, string(utf8.RuneError)) {
		o.text += cur[len(prev):]
		o.prefix, o.read = o.read, len(o.ids)
	}
	return o.release(false)
}

// tokenText is one token's own text (for logprobs).
func (o *textOut) tokenText(t int32) string {
	s, err := o.tok.Decode([]int32{t}, false)
	if err != nil {
		return ""
	}
	return s
}

// flush returns whatever text is still held back (at the end of output).
func (o *textOut) flush() string {
	s, _, _ := o.release(true)
	return s
}

func (o *textOut) release(final bool) (string, bool, error) {
	if len(o.stops) > 0 {
		from := max(0, o.emitted-o.maxStop+1)
		best := -1
		for _, s := range o.stops {
			if i := strings.Index(o.text[from:], s); i >= 0 && (best < 0 || from+i < best) {
				best = from + i
			}
		}
		if best >= 0 {
			out := ""
			if best > o.emitted {
				out = o.text[o.emitted:best]
			}
			o.emitted = len(o.text)
			return out, true, nil
		}
	}
	safe := len(o.text)
	if !final {
		safe -= o.heldBack()
	}
	if safe <= o.emitted {
		return "", false, nil
	}
	out := o.text[o.emitted:safe]
	o.emitted = safe
	return out, false, nil
}

// heldBack is the length of the longest suffix of the text that is a proper
// prefix of a stop string.
func (o *textOut) heldBack() int {
	h := 0
	for _, s := range o.stops {
		for n := min(len(s)-1, len(o.text)); n > h; n-- {
			if strings.HasSuffix(o.text, s[:n]) {
				h = n
				break
			}
		}
	}
	return h
}
