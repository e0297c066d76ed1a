package cuda

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models"
)

// benchModels are the checkpoints models/bench_test.go times on the CPU
// backend: the trained default model (Qwen3-MoE, 11.5M parameters, bf16)
// and the biggest golden one.
var benchModels = []struct{ name, dir string }{
	{"default", "../../models/default"},
	{"mixtral", filepath.Join(goldenDir, "mixtral")},
}

// benchModes are the two GEMM modes of bf16 weights (Options.SplitActivations).
var benchModes = []struct {
	name  string
	split bool
}{{"split", true}, {"fast", false}}

// loadBenchModel loads dir on a fresh backend in the given mode, skipping
// without a GPU like the tests.
func loadBenchModel(b *testing.B, dir string, split bool) (*models.Loaded, *Backend) {
	b.Helper()
	gpuBackend(b)
	be, err := New(Options{SplitActivations: &split})
	if err != nil {
		b.Fatal(err)
	}
	l, err := models.Load(dir, be, models.LoadOptions{})
	if err != nil {
		b.Fatalf("load %s: %v", dir, err)
	}
	b.Cleanup(func() { l.Close() })
	return l, be
}

// benchIDs are the token ids of models/bench_test.go.
func benchIDs(n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32((i*7919 + 13) % vocab)
	}
	return ids
}

// forwardSync runs one forward pass and copies its logits to the host, so
// that the timed work includes everything queued on the GPU.
func forwardSync(b *testing.B, l *models.Loaded, be *Backend, batch *backend.Batch) {
	out, err := l.Model.Forward(batch)
	if err != nil {
		b.Fatal(err)
	}
	if v := be.ToHost(out); len(v) == 0 {
		b.Fatal("forward returned no logits")
	}
}

// report adds tokens/s and wall milliseconds per forward pass.
func report(b *testing.B, tokensPerStep int) {
	s := b.Elapsed().Seconds()
	b.ReportMetric(float64(tokensPerStep*b.N)/s, "tokens/s")
	b.ReportMetric(1e3*s/float64(b.N), "ms/step")
}

// BenchmarkPrefill: one 256-token prompt per iteration (logits of the last
// row, copied to the host), unpaged KV cache freed after each.
func BenchmarkPrefill(b *testing.B) {
	for _, m := range benchModels {
		for _, mode := range benchModes {
			b.Run(m.name+"/"+mode.name, func(b *testing.B) {
				l, be := loadBenchModel(b, m.dir, mode.split)
				const n = 256
				ids := benchIDs(n, l.Config.VocabSize)
				forwardSync(b, l, be, backend.SingleSequence(1<<40, ids, 0, false)) // warm-up
				be.FreeSequence(1 << 40)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					id := uint64(i + 1)
					forwardSync(b, l, be, backend.SingleSequence(id, ids, 0, false))
					be.FreeSequence(id)
				}
				report(b, n)
			})
		}
	}
}

// BenchmarkDecode: batches of B sequences each decoding one token after a
// 128-token context (unpaged KV cache; each step re-decodes position 128,
// so the cache rolls back to Past and the context stays 128).
func BenchmarkDecode(b *testing.B) {
	for _, m := range benchModels {
		for _, mode := range benchModes {
			for _, B := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s/%s/batch=%d", m.name, mode.name, B), func(b *testing.B) {
					l, be := loadBenchModel(b, m.dir, mode.split)
					const ctx = 128
					ids := benchIDs(ctx, l.Config.VocabSize)
					for s := 0; s < B; s++ {
						forwardSync(b, l, be, backend.SingleSequence(uint64(s+1), ids, 0, false))
					}
					b.Cleanup(func() {
						for s := 0; s < B; s++ {
							be.FreeSequence(uint64(s + 1))
						}
					})
					batch := &backend.Batch{}
					for s := 0; s < B; s++ {
						batch.Tokens = append(batch.Tokens, ids[s])
						batch.Positions = append(batch.Positions, ctx)
						batch.Seqs = append(batch.Seqs, backend.SeqSpan{ID: uint64(s + 1), Offset: s, Len: 1, Past: ctx})
					}
					forwardSync(b, l, be, batch) // warm-up
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						forwardSync(b, l, be, batch)
					}
					report(b, B)
				})
			}
		}
	}
}
