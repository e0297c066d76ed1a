package tokenizer

import (
	"strings"
	"unicode"

	"github.com/dlclark/regexp2"
	sugarnorm "github.com/sugarme/tokenizer/normalizer"
	"golang.org/x/text/unicode/norm"
)

// textNormalizer is one normalization step on plain text. Every
// implementation also satisfies sugarme's normalizer.Normalizer through
// normalizerAdapter, so it can be plugged into a sugarme pipeline.
type textNormalizer interface {
	normalize(s string) (string, error)
}

// normalizerAdapter exposes a textNormalizer as sugarme's
// normalizer.Normalizer. Offsets are not tracked (mkserve never reports
// them); the original text and shift of the input are kept.
type normalizerAdapter struct{ n textNormalizer }

var _ sugarnorm.Normalizer = normalizerAdapter{}

// Normalize implements sugarme's normalizer.Normalizer.
func (a normalizerAdapter) Normalize(ns *sugarnorm.NormalizedString) (*sugarnorm.NormalizedString, error) {
	out, err := a.n.normalize(ns.GetNormalized())
	if err != nil {
		return nil, err
	}
	return sugarnorm.NewNormalizedString(ns.GetOriginal(), out, nil, nil, ns.Shift()), nil
}

// unicodeNorm is NFC, NFD, NFKC or NFKD.
type unicodeNorm struct{ form norm.Form }

func (u unicodeNorm) normalize(s string) (string, error) { return u.form.String(s), nil }

// lowercaseNorm lowercases every character (Rust char::to_lowercase).
type lowercaseNorm struct{}

func (lowercaseNorm) normalize(s string) (string, error) {
	var sb strings.Builder
	sb.Grow(len(s))
	for _, r := range s {
		if r == 'İ' { // the one unconditional multi-character lowercase mapping
			sb.WriteString("i\u0307")
			continue
		}
		sb.WriteRune(unicode.ToLower(r))
	}
	return sb.String(), nil
}

// prependNorm prepends a string to non-empty text.
type prependNorm struct{ prepend string }

func (p prependNorm) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return p.prepend + s, nil
}

// stripNorm removes whitespace on the left and/or right.
type stripNorm struct{ left, right bool }

func (st stripNorm) normalize(s string) (string, error) {
	if st.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s, nil
}

// stripAccentsNorm removes combining marks (Mn).
type stripAccentsNorm struct{}

func (stripAccentsNorm) normalize(s string) (string, error) {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s), nil
}

// byteLevelNorm maps every byte to its byte-level rune (HF's ByteLevel
// normalizer).
type byteLevelNorm struct{}

func (byteLevelNorm) normalize(s string) (string, error) { return byteLevelEncode(s), nil }

// replaceNorm replaces every match of a pattern with content (HF's Replace
// normalizer, also used as a decoder).
type replaceNorm struct {
	pat     pattern
	content string
}

func (r replaceNorm) normalize(s string) (string, error) {
	ms, err := r.pat.findMatches(s)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	sb.Grow(len(s))
	for _, m := range ms {
		if m.match {
			sb.WriteString(r.content)
		} else {
			sb.WriteString(s[m.start:m.end])
		}
	}
	return sb.String(), nil
}

// seqNorm applies normalizers in order.
type seqNorm []textNormalizer

func (q seqNorm) normalize(s string) (string, error) {
	var err error
	for _, n := range q {
		if s, err = n.normalize(s); err != nil {
			return "", err
		}
	}
	return s, nil
}

// bertNorm is HF's BertNormalizer.
type bertNorm struct {
	cleanText, chineseChars, stripAccents, lowercase bool
}

func (b bertNorm) normalize(s string) (string, error) {
	var sb strings.Builder
	for _, r := range s {
		if b.cleanText {
			if r == 0 || r == 0xFFFD || (isControlBert(r)) {
				continue
			}
			if isWhitespaceBert(r) {
				r = ' '
			}
		}
		if b.chineseChars && isChineseChar(r) {
			sb.WriteByte(' ')
			sb.WriteRune(r)
			sb.WriteByte(' ')
			continue
		}
		sb.WriteRune(r)
	}
	out := sb.String()
	if b.stripAccents {
		out = norm.NFD.String(out)
		out, _ = stripAccentsNorm{}.normalize(out)
	}
	if b.lowercase {
		out, _ = lowercaseNorm{}.normalize(out)
	}
	return out, nil
}

func isWhitespaceBert(r rune) bool { return unicode.IsSpace(r) }

// isControlBert is HF's is_control: any "other" (C*) character except
// \t, \n, \r; unassigned code points count as other.
func isControlBert(r rune) bool {
	switch r {
	case '\t', '\n', '\r':
		return false
	}
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs) ||
		!unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z)
}

func isChineseChar(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

// match is one piece of a pattern search: [start, end) bytes and whether it
// matched.
type match struct {
	start, end int
	match      bool
}

// pattern finds the pieces of a text that match something; the pieces
// cover the whole text in order (as HF's Pattern::find_matches).
type pattern interface {
	findMatches(s string) ([]match, error)
}

// stringPattern matches a literal string.
type stringPattern string

func (p stringPattern) findMatches(s string) ([]match, error) {
	if s == "" {
		return []match{{0, 0, false}}, nil
	}
	if p == "" {
		return []match{{0, len(s), false}}, nil
	}
	var out []match
	prev := 0
	for i := 0; i <= len(s)-len(p); {
		j := strings.Index(s[i:], string(p))
		if j < 0 {
			break
		}
		st := i + j
		if st > prev {
			out = append(out, match{prev, st, false})
		}
		out = append(out, match{st, st + len(p), true})
		prev = st + len(p)
		i = prev
	}
	if prev < len(s) {
		out = append(out, match{prev, len(s), false})
	}
	return out, nil
}

// runePattern matches every rune for which fn is true.
type runePattern func(rune) bool

func (fn runePattern) findMatches(s string) ([]match, error) {
	if s == "" {
		return []match{{0, 0, false}}, nil
	}
	var out []match
	last := 0
	for i, r := range s {
		if fn(r) {
			if last < i {
				out = append(out, match{last, i, false})
			}
			n := len(string(r))
			if r == 0xFFFD {
				n = runeLenAt(s, i)
			}
			out = append(out, match{i, i + n, true})
			last = i + n
		}
	}
	if last < len(s) {
		out = append(out, match{last, len(s), false})
	}
	return out, nil
}

// runeLenAt returns the byte length of the (possibly invalid) rune at s[i].
func runeLenAt(s string, i int) int {
	for n := 1; n <= 4 && i+n <= len(s); n++ {
		if i+n == len(s) || (s[i+n]&0xC0) != 0x80 {
			return n
		}
	}
	return 1
}

// regexPattern matches an Oniguruma-style regular expression, run with
// regexp2 (backtracking, lookaround, Unicode classes), which HF's Split
// patterns need and Go's RE2-based regexp cannot run.
type regexPattern struct {
	re   *regexp2.Regexp
	fast fastMatcher // hand-written equivalent of re, if any
}

func compileRegex(src string) (*regexPattern, error) {
	// Oniguruma's default (Ruby) syntax makes ^ and $ line anchors.
	re, err := regexp2.Compile(src, regexp2.Multiline)
	if err != nil {
		return nil, err
	}
	return &regexPattern{re: re, fast: fastMatchers[src]}, nil
}

func (p *regexPattern) findMatches(s string) ([]match, error) {
	if s == "" {
		return []match{{0, 0, false}}, nil
	}
	var out []match
	prev := 0
	add := func(st, en int) {
		if st > prev {
			out = append(out, match{prev, st, false})
		}
		out = append(out, match{st, en, true})
		prev = en
	}
	if p.fast != nil {
		out = make([]match, 0, len(s)/3+2)
		for i := 0; i < len(s); {
			if e := p.fast(s, i); e > i { // these patterns never match empty
				add(i, e)
				i = e
				continue
			}
			_, n := runeAt(s, i)
			i += n
		}
	} else {
		runes := []rune(s)
		// byte offset of each rune index (and of the end); an invalid byte
		// is one rune (U+FFFD) of length 1.
		offs := make([]int, len(runes)+1)
		b := 0
		for i := range runes {
			offs[i] = b
			_, n := runeAt(s, b)
			b += n
		}
		offs[len(runes)] = b
		m, err := p.re.FindRunesMatch(runes)
		for ; m != nil && err == nil; m, err = p.re.FindNextMatch(m) {
			add(offs[m.Index], offs[m.Index+m.Length])
		}
		if err != nil {
			return nil, err
		}
	}
	if prev < len(s) {
		out = append(out, match{prev, len(s), false})
	}
	return out, nil
}

// invertPattern flips the match flag of another pattern.
type invertPattern struct{ p pattern }

func (ip invertPattern) findMatches(s string) ([]match, error) {
	ms, err := ip.p.findMatches(s)
	for i := range ms {
		ms[i].match = !ms[i].match
	}
	return ms, err
}
