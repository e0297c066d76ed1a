package tokenizer

import (
	"fmt"
	"strings"
	"unicode"

	sugar "github.com/sugarme/tokenizer"
	sugarnorm "github.com/sugarme/tokenizer/normalizer"
)

// piece is a span of normalized text on its way to the model. off is its
// byte offset in the original input as far as mkserve tracks it: exact when
// no normalizer changed lengths, and always 0 exactly for the piece that
// starts the input (which is all Metaspace's "first" scheme needs).
type piece struct {
	text string
	off  int
}

// preTokenizer splits a piece into words. Implementations also satisfy
// sugarme's tokenizer.PreTokenizer through preTokenizerAdapter.
type preTokenizer interface {
	split(p piece) ([]piece, error)
}

// preTokenizerAdapter exposes a preTokenizer as sugarme's
// tokenizer.PreTokenizer, splitting every untokenized split of a sugarme
// PreTokenizedString.
type preTokenizerAdapter struct{ p preTokenizer }

var _ sugar.PreTokenizer = preTokenizerAdapter{}

// PreTokenize implements sugarme's tokenizer.PreTokenizer.
func (a preTokenizerAdapter) PreTokenize(pts *sugar.PreTokenizedString) (*sugar.PreTokenizedString, error) {
	var firstErr error
	out := pts.Split(func(_ int, ns *sugarnorm.NormalizedString) []sugar.SplitIdx {
		if firstErr != nil {
			return nil
		}
		ps, err := a.p.split(piece{text: ns.GetNormalized(), off: ns.Shift()})
		if err != nil {
			firstErr = err
			return nil
		}
		res := make([]sugar.SplitIdx, len(ps))
		for i, p := range ps {
			res[i] = sugar.SplitIdx{Normalized: sugarnorm.NewNormalizedString(p.text, p.text, nil, nil, p.off)}
		}
		return res
	})
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// splitBehavior is how a pre-tokenizer keeps the matched delimiters.
type splitBehavior int

const (
	behaviorRemoved splitBehavior = iota
	behaviorIsolated
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

func parseBehavior(s string) (splitBehavior, error) {
	switch strings.ToLower(s) {
	case "removed":
		return behaviorRemoved, nil
	case "isolated":
		return behaviorIsolated, nil
	case "mergedwithprevious", "merged_with_previous":
		return behaviorMergedWithPrevious, nil
	case "mergedwithnext", "merged_with_next":
		return behaviorMergedWithNext, nil
	case "contiguous":
		return behaviorContiguous, nil
	}
	return 0, fmt.Errorf("unknown split behavior %q", s)
}

// splitBy splits p at the matches of pat according to behavior (HF's
// NormalizedString::split); empty pieces are dropped.
func splitBy(p piece, pat pattern, behavior splitBehavior) ([]piece, error) {
	ms, err := pat.findMatches(p.text)
	if err != nil {
		return nil, err
	}
	type span struct {
		start, end int
		remove     bool
	}
	var spans []span
	switch behavior {
	case behaviorIsolated:
		for _, m := range ms {
			spans = append(spans, span{m.start, m.end, false})
		}
	case behaviorRemoved:
		for _, m := range ms {
			spans = append(spans, span{m.start, m.end, m.match})
		}
	case behaviorContiguous:
		prev := false
		for _, m := range ms {
			if m.match == prev && len(spans) > 0 {
				spans[len(spans)-1].end = m.end
			} else {
				spans = append(spans, span{m.start, m.end, false})
			}
			prev = m.match
		}
	case behaviorMergedWithPrevious:
		prev := false
		for _, m := range ms {
			if m.match && !prev && len(spans) > 0 {
				spans[len(spans)-1].end = m.end
			} else {
				spans = append(spans, span{m.start, m.end, false})
			}
			prev = m.match
		}
	case behaviorMergedWithNext:
		prev := false
		for i := len(ms) - 1; i >= 0; i-- {
			m := ms[i]
			if m.match && !prev && len(spans) > 0 {
				spans[len(spans)-1].start = m.start
			} else {
				spans = append(spans, span{m.start, m.end, false})
			}
			prev = m.match
		}
		for i, j := 0, len(spans)-1; i < j; i, j = i+1, j-1 {
			spans[i], spans[j] = spans[j], spans[i]
		}
	}
	out := make([]piece, 0, len(spans))
	for _, s := range spans {
		if s.remove || s.end <= s.start {
			continue
		}
		out = append(out, piece{text: p.text[s.start:s.end], off: p.off + s.start})
	}
	return out, nil
}

// splitPre is HF's Split pre-tokenizer.
type splitPre struct {
	pat      pattern
	behavior splitBehavior
	invert   bool
}

func (s splitPre) split(p piece) ([]piece, error) {
	pat := s.pat
	if s.invert {
		pat = invertPattern{pat}
	}
	return splitBy(p, pat, s.behavior)
}

// gpt2Pattern is the GPT-2 pre-tokenization regex used by ByteLevel with
// use_regex.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// byteLevelPre is HF's ByteLevel pre-tokenizer: optional prefix space,
// optional GPT-2 regex split, then bytes mapped to printable runes.
type byteLevelPre struct {
	addPrefixSpace bool
	re             *regexPattern // nil when use_regex is false
}

func (b byteLevelPre) split(p piece) ([]piece, error) {
	if p.text == "" {
		return nil, nil
	}
	if b.addPrefixSpace && !strings.HasPrefix(p.text, " ") {
		p.text = " " + p.text
	}
	ps := []piece{p}
	if b.re != nil {
		var err error
		if ps, err = splitBy(p, b.re, behaviorIsolated); err != nil {
			return nil, err
		}
	}
	for i := range ps {
		ps[i].text = byteLevelEncode(ps[i].text)
	}
	return ps, nil
}

// prependScheme says when Metaspace adds the replacement character in
// front of a piece.
type prependScheme int

const (
	prependAlways prependScheme = iota
	prependNever
	prependFirst
)

func parsePrependScheme(s string) (prependScheme, error) {
	switch strings.ToLower(s) {
	case "always":
		return prependAlways, nil
	case "never":
		return prependNever, nil
	case "first":
		return prependFirst, nil
	}
	return 0, fmt.Errorf("unknown prepend_scheme %q", s)
}

// metaspacePre is HF's Metaspace pre-tokenizer: spaces become the
// replacement character, which is prepended per the scheme, and the text is
// optionally split before each replacement character.
type metaspacePre struct {
	replacement rune
	scheme      prependScheme
	splitWords  bool
}

func (m metaspacePre) split(p piece) ([]piece, error) {
	if p.text == "" {
		return nil, nil
	}
	rep := string(m.replacement)
	s := strings.ReplaceAll(p.text, " ", rep)
	if !strings.HasPrefix(s, rep) {
		if m.scheme == prependAlways || (m.scheme == prependFirst && p.off == 0) {
			s = rep + s
		}
	}
	q := piece{text: s, off: p.off}
	if !m.splitWords {
		return []piece{q}, nil
	}
	return splitBy(q, runePattern(func(r rune) bool { return r == m.replacement }), behaviorMergedWithNext)
}

// seqPre applies pre-tokenizers one after the other to every piece.
type seqPre []preTokenizer

func (q seqPre) split(p piece) ([]piece, error) {
	ps := []piece{p}
	for _, pt := range q {
		var next []piece
		for _, x := range ps {
			out, err := pt.split(x)
			if err != nil {
				return nil, err
			}
			next = append(next, out...)
		}
		ps = next
	}
	return ps, nil
}

// digitsPre splits digits from the rest, one by one or in runs.
type digitsPre struct{ individual bool }

func (d digitsPre) split(p piece) ([]piece, error) {
	b := behaviorContiguous
	if d.individual {
		b = behaviorIsolated
	}
	return splitBy(p, runePattern(unicode.IsNumber), b)
}

// whitespaceSplitPre splits on whitespace and drops it.
type whitespaceSplitPre struct{}

func (whitespaceSplitPre) split(p piece) ([]piece, error) {
	return splitBy(p, runePattern(unicode.IsSpace), behaviorRemoved)
}

// whitespacePre is HF's Whitespace pre-tokenizer: \w+|[^\w\s]+.
type whitespacePre struct{ re *regexPattern }

func (w whitespacePre) split(p piece) ([]piece, error) {
	return splitBy(p, invertPattern{w.re}, behaviorRemoved)
}

func isPunctuation(r rune) bool {
	return (r < 0x80 && unicode.IsPunct(r)) || (r < 0x80 && unicode.IsSymbol(r)) || unicode.IsPunct(r)
}

// punctuationPre splits on punctuation characters.
type punctuationPre struct{ behavior splitBehavior }

func (pp punctuationPre) split(p piece) ([]piece, error) {
	return splitBy(p, runePattern(isPunctuation), pp.behavior)
}

// bertPre is HF's BertPreTokenizer: split on whitespace, then isolate
// punctuation.
type bertPre struct{}

func (bertPre) split(p piece) ([]piece, error) {
	return seqPre{whitespaceSplitPre{}, punctuationPre{behaviorIsolated}}.split(p)
}
