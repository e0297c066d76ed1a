package tokenizer

import (
	"strings"
	"unicode/utf8"

	sugarpre "github.com/sugarme/tokenizer/pretokenizer"
)

// byteToRune maps each byte to the printable rune GPT-2's byte-level BPE uses
// for it (bytes 0-32, 127-160 and 173 are moved to U+0100 and up). The table
// comes from sugarme's pretokenizer.BytesChar.
var byteToRune [256]rune

// runeToByte is the inverse of byteToRune; -1 for runes outside the alphabet.
var runeToByte map[rune]int

func init() {
	runeToByte = make(map[rune]int, 256)
	for b := 0; b < 256; b++ {
		r, _ := utf8.DecodeRuneInString(sugarpre.BytesChar[uint8(b)])
		byteToRune[b] = r
		runeToByte[r] = b
	}
}

// byteLevelEncode maps every byte of s to its byte-level rune.
func byteLevelEncode(s string) string {
	var sb strings.Builder
	sb.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteToRune[s[i]])
	}
	return sb.String()
}

// lossyUTF8 converts b to a string the way Rust's String::from_utf8_lossy
// does: every maximal invalid subsequence becomes one U+FFFD.
func lossyUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + 8)
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			sb.WriteByte(c)
			i++
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || size > 1 {
			sb.Write(b[i : i+size])
			i += size
			continue
		}
		sb.WriteRune(utf8.RuneError)
		i += invalidPrefixLen(b[i:])
	}
	return sb.String()
}

// invalidPrefixLen returns how many bytes at the start of b (which does not
// start with a valid UTF-8 sequence) form one maximal subpart of an
// ill-formed sequence (Unicode §3.9, "U+FFFD substitution of maximal
// subparts", which Rust follows).
func invalidPrefixLen(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF)
	switch {
	case c >= 0xC2 && c <= 0xDF:
		return 1 // the one continuation byte is missing or invalid
	case c >= 0xE0 && c <= 0xEF:
		need = 2
		if c == 0xE0 {
			lo = 0xA0
		} else if c == 0xED {
			hi = 0x9F
		}
	case c >= 0xF0 && c <= 0xF4:
		need = 3
		if c == 0xF0 {
			lo = 0x90
		} else if c == 0xF4 {
			hi = 0x8F
		}
	default:
		return 1
	}
	n := 1
	if n < len(b) && b[n] >= lo && b[n] <= hi {
		n++
		for n < len(b) && n <= need && b[n] >= 0x80 && b[n] <= 0xBF {
			n++
		}
	}
	if n > need {
		n = need // cannot happen for invalid input; keeps the bound obvious
	}
	return n
}
