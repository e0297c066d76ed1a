package tokenizer

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
)

// benchText is about 8 KB of mixed prose, code, numbers and CJK.
func benchText() string {
	r := rand.New(rand.NewPCG(7, 7))
	words := strings.Fields("the quick brown fox jumps over the lazy dog and we can not dedicate this ground " +
		"def forward(self, x): return self.norm(h) # [tokens, hidden] 1234567 3.14159 你好世界 日本語 👍 café naïve")
	var sb strings.Builder
	for sb.Len() < 8<<10 {
		sb.WriteString(words[r.IntN(len(words))])
		if r.IntN(12) == 0 {
			sb.WriteString(".\n")
		} else {
			sb.WriteByte(' ')
		}
	}
	return sb.String()
}

func benchTokenizers(b *testing.B) []hfCase {
	var out []hfCase
	for _, c := range hfCases(b) {
		switch c.name {
		case "gpt2", "llama3", "bytefallback":
			if c.missing == "" {
				out = append(out, c)
			}
		}
	}
	return out
}

func BenchmarkEncode(b *testing.B) {
	text := benchText()
	for _, c := range benchTokenizers(b) {
		b.Run(c.name, func(b *testing.B) {
			tok, err := Load(c.tokPath)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if _, err := tok.Encode(text, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	text := benchText()
	for _, c := range benchTokenizers(b) {
		b.Run(c.name, func(b *testing.B) {
			tok, err := Load(c.tokPath)
			if err != nil {
				b.Fatal(err)
			}
			ids, _ := tok.Encode(text, false)
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if _, err := tok.Decode(ids, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStreamDecoder measures the cost per streamed token.
func BenchmarkStreamDecoder(b *testing.B) {
	text := benchText()
	for _, c := range benchTokenizers(b) {
		b.Run(c.name, func(b *testing.B) {
			tok, err := Load(c.tokPath)
			if err != nil {
				b.Fatal(err)
			}
			ids, _ := tok.Encode(text, false)
			b.ResetTimer()
			n := 0
			for b.Loop() {
				d := tok.NewStreamDecoder(false)
				for _, id := range ids {
					if _, err := d.Add(id); err != nil {
						b.Fatal(err)
					}
				}
				n += len(ids)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/token")
		})
	}
}

func BenchmarkLoadGPT2(b *testing.B) {
	p := gpt2Path
	if _, err := Load(p); err != nil {
		b.Skipf("GPT-2 tokenizer not available at %s: %v", p, err)
	}
	for b.Loop() {
		if _, err := Load(filepath.Clean(p)); err != nil {
			b.Fatal(err)
		}
	}
}
