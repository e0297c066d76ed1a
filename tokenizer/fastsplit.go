package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The three pre-tokenizer regexes that nearly every byte-level LLM
// tokenizer uses run on hand-written matchers: regexp2 allocates on every
// match and makes these patterns the bulk of encoding time. Each matcher
// follows the backtracking semantics of its pattern exactly (alternatives
// in order, greedy quantifiers giving back as needed), with the same
// character classes as regexp2 (\s = unicode.IsSpace, \p{L} = letters,
// \p{N} = numbers); TestFastSplitMatchesRegexp2 checks them against
// regexp2 on random text.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// fastMatcher returns the end (byte offset) of the match starting at byte
// i of s, or -1 when the pattern does not match there.
type fastMatcher func(s string, i int) int

// fastMatchers maps a regex source to its hand-written matcher.
var fastMatchers = map[string]fastMatcher{
	gpt2Pattern:   matchGPT2,
	llama3Pattern: func(s string, i int) int { return matchLlama(s, i, 3) },
	qwen2Pattern:  func(s string, i int) int { return matchLlama(s, i, 1) },
}

func isL(c rune) bool    { return unicode.IsLetter(c) }
func isN(c rune) bool    { return unicode.IsNumber(c) }
func isS(c rune) bool    { return unicode.IsSpace(c) }
func isCRLF(c rune) bool { return c == '\r' || c == '\n' }
func isPunc(c rune) bool { return !isS(c) && !isL(c) && !isN(c) } // [^\s\p{L}\p{N}]

// runeAt decodes the rune at byte i (an invalid byte is one U+FFFD, as
// regexp2 sees it).
func runeAt(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// runOf returns the end of the run of runes satisfying f from i.
func runOf(s string, i int, f func(rune) bool) int {
	for i < len(s) {
		c, n := runeAt(s, i)
		if !f(c) {
			break
		}
		i += n
	}
	return i
}

// contraction matches 's 't 're 've 'm 'll 'd at i; fold makes it case
// insensitive (regexp2 compares unicode.ToLower of both sides; only ASCII
// letters lower to these).
func contraction(s string, i int, fold bool) int {
	if s[i] != '\'' || i+1 >= len(s) {
		return -1
	}
	low := func(b byte) byte {
		if fold && b >= 'A' && b <= 'Z' {
			return b + 'a' - 'A'
		}
		return b
	}
	switch c := low(s[i+1]); c {
	case 's', 't', 'm', 'd':
		return i + 2
	case 'r', 'v', 'l':
		if i+2 < len(s) {
			d := low(s[i+2])
			if (c == 'r' || c == 'v') && d == 'e' || c == 'l' && d == 'l' {
				return i + 3
			}
		}
	}
	return -1
}

// spaceTail matches \s*[\r\n]+ (when withNewline) | \s+(?!\S) | \s+ at i,
// in that order.
func spaceTail(s string, i int, withNewline bool) int {
	lastNL, lastStart := -1, i
	j := i
	for j < len(s) {
		c, n := runeAt(s, j)
		if !isS(c) {
			break
		}
		if isCRLF(c) {
			lastNL = j
		}
		lastStart = j
		j += n
	}
	if j == i {
		return -1
	}
	if withNewline && lastNL >= 0 {
		return lastNL + 1 // \s* gives back to the last CR/LF of the run
	}
	if j == len(s) || lastStart == i {
		return j // the whole run: at the end, or a single char (\s+)
	}
	return lastStart // \s+(?!\S) leaves the last space to the next word
}

// matchLlama is the Llama-3 (maxDigits 3) and Qwen2 (maxDigits 1) pattern.
func matchLlama(s string, i, maxDigits int) int {
	if e := contraction(s, i, true); e >= 0 {
		return e
	}
	c, n := runeAt(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	if isL(c) {
		return runOf(s, i+n, isL)
	}
	if !isCRLF(c) && !isN(c) && i+n < len(s) {
		if d, m := runeAt(s, i+n); isL(d) {
			return runOf(s, i+n+m, isL)
		}
	}
	// \p{N}{1,maxDigits}
	if isN(c) {
		j, k := i+n, 1
		for j < len(s) && k < maxDigits {
			d, m := runeAt(s, j)
			if !isN(d) {
				break
			}
			j += m
			k++
		}
		return j
	}
	// ' '?[^\s\p{L}\p{N}]+[\r\n]*
	if c == ' ' && i+1 < len(s) {
		if d, _ := runeAt(s, i+1); isPunc(d) {
			return runOf(s, runOf(s, i+1, isPunc), isCRLF)
		}
	}
	if isPunc(c) {
		return runOf(s, runOf(s, i, isPunc), isCRLF)
	}
	return spaceTail(s, i, true)
}

// matchGPT2 is the GPT-2 pattern.
func matchGPT2(s string, i int) int {
	if e := contraction(s, i, false); e >= 0 {
		return e
	}
	c, _ := runeAt(s, i)
	var d rune = -1 // the rune after a leading space
	if c == ' ' && i+1 < len(s) {
		d, _ = runeAt(s, i+1)
	}
	for _, class := range [...]func(rune) bool{isL, isN, isPunc} {
		// ' '?class+: with the space when it is followed by the class.
		if d >= 0 && class(d) {
			return runOf(s, i+1, class)
		}
		if class(c) {
			return runOf(s, i, class)
		}
	}
	return spaceTail(s, i, false)
}
