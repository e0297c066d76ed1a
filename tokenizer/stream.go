package tokenizer

import (
	"strings"
)

// StreamDecoder decodes ids one at a time for streaming output. Each Add
// returns only newly completed text: it holds back text while the decoded
// tail ends in an incomplete UTF-8 sequence (which decodes to U+FFFD for
// now) and, for byte-fallback tokenizers, while the ids end in a run of
// <0xXX> tokens that the next id could still extend. The concatenation of everything Add and Flush return
// equals Decode of all the ids.
//
// It decodes a short window of recent ids and emits the difference between
// the window with and without the new ids, so decoders that treat the first
// token specially (Strip, Metaspace) stay consistent and the cost per id
// does not grow with the length of the stream. A StreamDecoder is not safe
// for concurrent use.
type StreamDecoder struct {
	t      *Tokenizer
	skip   bool
	toks   []string // token strings of the window
	prefix int      // start of the already emitted part inside toks
}

// NewStreamDecoder starts a stream; skipSpecial drops special tokens as
// Decode(ids, true) does.
func (t *Tokenizer) NewStreamDecoder(skipSpecial bool) *StreamDecoder {
	return &StreamDecoder{t: t, skip: skipSpecial}
}

// Add feeds one id and returns the text it completes (often "", sometimes
// several characters).
func (d *StreamDecoder) Add(id int32) (string, error) {
	toks, err := d.t.tokens([]int32{id}, d.skip)
	if err != nil {
		return "", err
	}
	if len(toks) == 0 {
		return "", nil
	}
	d.toks = append(d.toks, toks[0])
	return d.emit(false), nil
}

// Flush returns any text still held back (an incomplete sequence at the end
// of the stream, decoded with U+FFFD as Decode does).
func (d *StreamDecoder) Flush() string { return d.emit(true) }

// emit returns the text of the window beyond its emitted prefix, unless it
// ends in U+FFFD (possibly an incomplete sequence) and final is false.
func (d *StreamDecoder) emit(final bool) string {
	if len(d.toks) == d.prefix {
		return ""
	}
	done := d.t.decodeTokens(d.toks[:d.prefix])
	all := d.t.decodeTokens(d.toks)
	if !final && (strings.HasSuffix(all, "\uFFFD") ||
		(d.t.byteFallback && isByteToken(d.toks[len(d.toks)-1]))) {
		// Wait: an incomplete sequence, or a byte-fallback run that a later
		// byte could still turn invalid (HF then renders the whole run as
		// one U+FFFD per byte).
		return ""
	}
	var out string
	if strings.HasPrefix(all, done) {
		out = all[len(done):]
	} else {
		// A decoder changed text it already produced; emit from where the
		// two texts part (the stream cannot take text back).
		i := 0
		for i < len(all) && i < len(done) && all[i] == done[i] {
			i++
		}
		out = all[i:]
	}
	if out == "" && !final {
		return ""
	}
	// Keep the last emitted token as context for the next step, and with it
	// any byte-fallback tokens it ends a run of (a run must be decoded whole).
	n := len(d.toks)
	k := n - 1
	for k > 0 && isByteToken(d.toks[k]) {
		k--
	}
	d.toks = d.toks[k:]
	d.prefix = len(d.toks)
	return out
}

func isByteToken(t string) bool {
	_, ok := parseByteToken(t)
	return ok
}
