package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is a token matched in the text before the model runs (HF's
// AddedToken).
type addedToken struct {
	id         int32
	content    string
	special    bool // skipped by Decode(skipSpecial=true)
	lstrip     bool // swallows whitespace on its left
	rstrip     bool // swallows whitespace on its right
	singleWord bool // only matches as a whole word
	normalized bool // matched against normalized text
}

// addedVocab holds the added tokens and finds them in text with HF's rules:
// leftmost-longest matching, the single_word/lstrip/rstrip flags, and two
// passes (tokens with normalized=false on the raw text, the others on the
// normalized remainder).
type addedVocab struct {
	byContent map[string]int32
	byID      map[int32]*addedToken
	order     []*addedToken // special tokens first, then the others, each in insertion order
	raw       *matchTrie    // normalized=false tokens
	norm      *matchTrie    // normalized=true tokens, by their normalized content
}

// segment is a span of text and, when id >= 0, the added token it is.
type segment struct {
	start, end int
	id         int32
}

// matchTrie is a byte trie of token contents for leftmost-longest search.
type matchTrie struct {
	root  [256]int32       // children of the root (0 = none); every text byte looks here
	next  []map[byte]int32 // node -> byte -> child, below the root
	token []*addedToken    // node -> token ending here (nil if none)
}

func newMatchTrie() *matchTrie {
	return &matchTrie{next: []map[byte]int32{{}}, token: []*addedToken{nil}}
}

func (t *matchTrie) child(n int32, b byte) (int32, bool) {
	if n == 0 {
		c := t.root[b]
		return c, c != 0
	}
	c, ok := t.next[n][b]
	return c, ok
}

func (t *matchTrie) insert(s string, tok *addedToken) {
	n := int32(0)
	for i := 0; i < len(s); i++ {
		c, ok := t.child(n, s[i])
		if !ok {
			c = int32(len(t.next))
			t.next = append(t.next, map[byte]int32{})
			t.token = append(t.token, nil)
			if n == 0 {
				t.root[s[i]] = c
			} else {
				t.next[n][s[i]] = c
			}
		}
		n = c
	}
	if t.token[n] == nil { // first inserted wins, as pattern order does in HF
		t.token[n] = tok
	}
}

// longestAt returns the longest token starting at s[i:] and its length.
func (t *matchTrie) longestAt(s string, i int) (*addedToken, int) {
	var best *addedToken
	bestLen := 0
	n := int32(0)
	for j := i; j < len(s); j++ {
		c, ok := t.child(n, s[j])
		if !ok {
			break
		}
		n = c
		if t.token[n] != nil {
			best, bestLen = t.token[n], j+1-i
		}
	}
	return best, bestLen
}

// isWordRune reports whether r matches Rust regex's Unicode \w.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.M, r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		r == 0x200C || r == 0x200D
}

// find splits s into added-token segments and the text between them (HF's
// AddedVocabulary::find_matches). An empty s gives no segments.
func (t *matchTrie) find(s string) []segment {
	var out []segment
	startOffset := 0
	for i := 0; i < len(s); {
		tok, n := t.longestAt(s, i)
		if tok == nil {
			i++
			continue
		}
		start, stop := i, i+n
		i = stop // the search resumes after the match even if it is discarded
		if tok.singleWord {
			before := start == 0
			if !before {
				r, _ := utf8.DecodeLastRuneInString(s[:start])
				before = !isWordRune(r)
			}
			after := stop == len(s)
			if !after {
				r, _ := utf8.DecodeRuneInString(s[stop:])
				after = !isWordRune(r)
			}
			if !before || !after {
				continue
			}
		}
		if tok.lstrip {
			ns := len(strings.TrimRightFunc(s[:start], unicode.IsSpace))
			start = max(ns, startOffset)
		}
		if tok.rstrip {
			stop += len(s[stop:]) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if start < startOffset {
			start = startOffset // only possible for tokens that start with whitespace
		}
		if startOffset < start {
			out = append(out, segment{startOffset, start, -1})
		}
		out = append(out, segment{start, stop, tok.id})
		startOffset = stop
	}
	if startOffset < len(s) {
		out = append(out, segment{startOffset, len(s), -1})
	}
	return out
}
