package tokenizer

import (
	"testing"

	"github.com/mkserve/mkserve/grammar"
)

// BenchmarkJSONVocabScan is the worst case of JSON-constrained sampling's
// full check (engine's sampler, after its rejections): every token of the
// GPT-2 vocabulary tried against the grammar, inside a string (most tokens
// pass) and where a value must start (few do). ns/op is one whole scan.
func BenchmarkJSONVocabScan(b *testing.B) {
	tok, err := Load(gpt2Path)
	if err != nil {
		b.Skipf("GPT-2 tokenizer not available: %v", err)
	}
	for _, c := range []struct{ name, prefix string }{
		{"in_string", `{"name": "Zo`},
		{"value_start", `{"list": [1, `},
	} {
		b.Run(c.name, func(b *testing.B) {
			j := grammar.NewJSON(true)
			if !j.Advance([]byte(c.prefix)) {
				b.Fatalf("prefix %q refused", c.prefix)
			}
			V := tok.VocabSize()
			tok.TokenBytes(0) // build the table outside the timing
			ok := 0
			b.ResetTimer()
			for range b.N {
				ok = 0
				for id := range V {
					if t := tok.TokenBytes(int32(id)); t != nil && j.Accept(t) {
						ok++
					}
				}
			}
			b.ReportMetric(float64(ok), "accepted")
			b.ReportMetric(float64(V), "vocab")
		})
	}
}
