package tokenizer

import (
	"strings"
	"unicode/utf8"

	sugar "github.com/sugarme/tokenizer"
)

// decoder turns token strings back into text pieces (HF's decode_chain);
// the final text is the concatenation of the pieces. Implementations also
// satisfy sugarme's tokenizer.Decoder through decoderAdapter.
type decoder interface {
	decodeChain(tokens []string) []string
}

// decoderAdapter exposes a decoder as sugarme's tokenizer.Decoder.
type decoderAdapter struct{ d decoder }

var _ sugar.Decoder = decoderAdapter{}

// Decode implements sugarme's tokenizer.Decoder.
func (a decoderAdapter) Decode(tokens []string) string {
	return strings.Join(a.d.decodeChain(tokens), "")
}

// DecodeChain implements sugarme's tokenizer.Decoder.
func (a decoderAdapter) DecodeChain(tokens []string) []string { return a.d.decodeChain(tokens) }

// byteLevelDec maps byte-level runes back to bytes and the bytes to text
// (invalid UTF-8 becomes U+FFFD as in Rust's from_utf8_lossy). A token with
// a rune outside the byte alphabet (an added token, say) contributes its
// own UTF-8 bytes.
type byteLevelDec struct{}

func (byteLevelDec) decodeChain(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		buf = appendByteLevelDecoded(buf, t)
	}
	return []string{lossyUTF8(buf)}
}

// appendByteLevelDecoded appends the bytes token t stands for.
func appendByteLevelDecoded(buf []byte, t string) []byte {
	start := len(buf)
	for _, r := range t {
		b, ok := runeToByte[r]
		if !ok {
			return append(buf[:start], t...)
		}
		buf = append(buf, byte(b))
	}
	return buf
}

// byteFallbackDec turns runs of <0xXX> tokens into text; an invalid run
// becomes one U+FFFD per byte.
type byteFallbackDec struct{}

// parseByteToken reports the byte of a "<0xXX>" token. Like Rust's
// u8::from_str_radix it accepts either hex case and a leading '+'.
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || !strings.HasPrefix(t, "<0x") || t[5] != '>' {
		return 0, false
	}
	h := t[3:5]
	if h[0] == '+' {
		h = h[1:]
	}
	var v int
	for i := 0; i < len(h); i++ {
		c := h[i]
		var d int
		switch {
		case c >= '0' && c <= '9':
			d = int(c - '0')
		case c >= 'a' && c <= 'f':
			d = int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = int(c-'A') + 10
		default:
			return 0, false
		}
		v = v*16 + d
	}
	return byte(v), true
}

func (byteFallbackDec) decodeChain(tokens []string) []string {
	out := make([]string, 0, len(tokens))
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if b, ok := parseByteToken(t); ok {
			pending = append(pending, b)
			continue
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// fuseDec joins all tokens into one.
type fuseDec struct{}

func (fuseDec) decodeChain(tokens []string) []string { return []string{strings.Join(tokens, "")} }

// stripDec removes up to start leading and stop trailing occurrences of a
// rune from every token.
type stripDec struct {
	content     rune
	start, stop int
}

func (s stripDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rs := []rune(t)
		lo := 0
		for j := 0; j < s.start && j < len(rs); j++ {
			if rs[j] != s.content {
				break
			}
			lo = j + 1
		}
		hi := len(rs)
		for j := 0; j < s.stop; j++ {
			k := len(rs) - j - 1
			if k < lo || rs[k] != s.content {
				break
			}
			hi = k
		}
		out[i] = string(rs[lo:hi])
	}
	return out
}

// replaceDec applies a Replace to every token.
type replaceDec struct{ r replaceNorm }

func (d replaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		s, err := d.r.normalize(t)
		if err != nil {
			s = t // a regex timeout cannot happen without a MatchTimeout
		}
		out[i] = s
	}
	return out
}

// metaspaceDec turns the replacement rune back into spaces; in the first
// token it is dropped unless the prepend scheme is "never".
type metaspaceDec struct {
	replacement rune
	scheme      prependScheme
}

func (m metaspaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		var sb strings.Builder
		for _, r := range t {
			if r == m.replacement {
				if i == 0 && m.scheme != prependNever {
					continue
				}
				sb.WriteByte(' ')
				continue
			}
			sb.WriteRune(r)
		}
		out[i] = sb.String()
	}
	return out
}

// wordPieceDec is HF's WordPiece decoder.
type wordPieceDec struct {
	prefix  string
	cleanup bool
}

func (w wordPieceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		if i != 0 {
			if strings.HasPrefix(t, w.prefix) {
				t = t[len(w.prefix):]
			} else {
				t = " " + t
			}
		}
		if w.cleanup {
			t = cleanupTokenization(t)
		}
		out[i] = t
	}
	return out
}

// cleanupTokenization removes spaces before punctuation and contractions
// (HF's decoders::wordpiece::cleanup).
func cleanupTokenization(s string) string {
	for _, r := range [][2]string{{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
		{" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}} {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

// bpeDec replaces the end-of-word suffix by a space (nothing after the last
// token).
type bpeDec struct{ suffix string }

func (b bpeDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		rep := " "
		if i == len(tokens)-1 {
			rep = ""
		}
		out[i] = strings.ReplaceAll(t, b.suffix, rep)
	}
	return out
}

// seqDec applies decoders in order.
type seqDec []decoder

func (q seqDec) decodeChain(tokens []string) []string {
	for _, d := range q {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}
