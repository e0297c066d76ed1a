package models_test

import (
	"fmt"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/models"
)

// benchModels are the largest checkpoints in the repository: the trained
// default model (11.5M parameters) and the biggest golden one.
var benchModels = []string{"default", "testdata/golden/mixtral"}

// weightModes are the CPU backend's weight storages the benchmarks compare:
// the default (a BF16 checkpoint's matrices in bf16) and float32.
var weightModes = []struct {
	name string
	opts cpu.Options
}{{"", cpu.Options{}}, {"f32weights/", cpu.Options{F32Weights: true}}}

func loadBench(b *testing.B, dir string, opts cpu.Options) (*models.Loaded, *cpu.Backend) {
	be := cpu.New(opts)
	l, err := models.Load(dir, be, models.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l, be
}

func benchIDs(n, vocab int) []int32 {
	ids := make([]int32, n)
	for i := range ids {
		ids[i] = int32((i*7919 + 13) % vocab)
	}
	return ids
}

// BenchmarkPrefill: one 256-token prompt per iteration, with each weight
// storage (f32weights/: cpu.Options.F32Weights, the baseline).
func BenchmarkPrefill(b *testing.B) {
	for _, wm := range weightModes {
		for _, dir := range benchModels {
			b.Run(wm.name+dir, func(b *testing.B) {
				l, be := loadBench(b, dir, wm.opts)
				const n = 256
				ids := benchIDs(n, l.Config.VocabSize)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					id := uint64(i + 1)
					if _, err := l.Model.Forward(backend.SingleSequence(id, ids, 0, false)); err != nil {
						b.Fatal(err)
					}
					be.FreeSequence(id)
				}
				b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}

// BenchmarkDecode: batches of B sequences each decoding one token after a
// 128-token context, with each weight storage.
func BenchmarkDecode(b *testing.B) {
	for _, wm := range weightModes {
		for _, dir := range benchModels {
			for _, B := range []int{1, 16} {
				b.Run(fmt.Sprintf("%s%s/batch=%d", wm.name, dir, B), func(b *testing.B) {
					l, be := loadBench(b, dir, wm.opts)
					const ctx = 128
					ids := benchIDs(ctx, l.Config.VocabSize)
					for s := 0; s < B; s++ {
						if _, err := l.Model.Forward(backend.SingleSequence(uint64(s+1), ids, 0, false)); err != nil {
							b.Fatal(err)
						}
					}
					batch := &backend.Batch{}
					for s := 0; s < B; s++ {
						batch.Tokens = append(batch.Tokens, ids[s])
						batch.Positions = append(batch.Positions, ctx)
						batch.Seqs = append(batch.Seqs, backend.SeqSpan{ID: uint64(s + 1), Offset: s, Len: 1, Past: ctx})
					}
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						// Re-decode position ctx each time: the cache rolls back to Past.
						if _, err := l.Model.Forward(batch); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(B*b.N)/b.Elapsed().Seconds(), "tokens/s")
					for s := 0; s < B; s++ {
						be.FreeSequence(uint64(s + 1))
					}
				})
			}
		}
	}
}
