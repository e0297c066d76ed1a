package tokenizer

import (
	"strings"
	"testing"
)

// TestTokenBytes checks, for every test tokenizer, that the bytes of a
// text's tokens put together are the decoded text (with the leading space a
// decoder drops at the start of a text, where it drops one, and invalid
// UTF-8 replaced as Decode does), including UTF-8 sequences split over
// byte-level or byte-fallback tokens.
func TestTokenBytes(t *testing.T) {
	texts := []string{
		`{"name": "Zoë", "tags": ["a", "b"], "n": -1.5e3}`,
		"Hello world, 你好世界 🙂 — naïve café\n\tend",
		"  two leading spaces and trailing ones  ",
	}
	for _, c := range hfCases(t) {
		t.Run(c.name, func(t *testing.T) {
			if c.missing != "" {
				t.Skip(c.missing)
			}
			tok, err := Load(c.tokPath)
			if err != nil {
				t.Fatal(err)
			}
			if !tok.HasTokenBytes() {
				t.Skipf("%s: TokenBytes does not model this decoder", c.name)
			}
			for _, text := range texts {
				ids, err := tok.Encode(text, false)
				if err != nil {
					t.Fatal(err)
				}
				var got []byte
				for _, id := range ids {
					b := tok.TokenBytes(id)
					if b == nil {
						t.Fatalf("%q: token %d has no bytes", text, id)
					}
					got = append(got, b...)
				}
				want, err := tok.Decode(ids, false)
				if err != nil {
					t.Fatal(err)
				}
				// Decode turns invalid UTF-8 into U+FFFD; the raw bytes do not.
				if l := lossyUTF8(got); l != want && l != " "+want {
					t.Errorf("%q: token bytes %q, decoded %q", text, got, want)
				}
			}
			for _, id := range tok.SpecialIDs() {
				if b := tok.TokenBytes(id); b != nil {
					t.Errorf("special token %d has bytes %q", id, b)
				}
			}
			if tok.TokenBytes(-1) != nil || tok.TokenBytes(int32(tok.VocabSize())) != nil {
				t.Error("an id outside the vocabulary has bytes")
			}
		})
	}
}

// TestTokenBytesSplitUTF8 checks that a byte-level token holding part of a
// multi-byte character gives the raw bytes, not U+FFFD.
func TestTokenBytesSplitUTF8(t *testing.T) {
	tok, err := Load(gpt2Path)
	if err != nil {
		t.Skipf("GPT-2 tokenizer not available: %v", err)
	}
	ids, err := tok.Encode("🙂", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) < 2 {
		t.Fatalf("🙂 is %d GPT-2 token(s); the test wants it split", len(ids))
	}
	var got []byte
	for _, id := range ids {
		b := tok.TokenBytes(id)
		if strings.Contains(string(b), "\uFFFD") {
			t.Fatalf("token %d gives %q (a replacement character)", id, b)
		}
		got = append(got, b...)
	}
	if string(got) != "🙂" {
		t.Fatalf("bytes %q, want %q", got, "🙂")
	}
}
