package engine

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models"
)

// fakeModel costs nothing per step: its logits are a fixed table, so a
// benchmark over it measures the engine's own scheduling, sampling and
// streaming overhead.
type fakeModel struct {
	cfg    *models.Config
	logits []float32 // [V]
}

func (m *fakeModel) Config() *models.Config      { return m.cfg }
func (m *fakeModel) KVFloatsPerToken() int       { return 64 }
func (m *fakeModel) KVWidths() []backend.KVWidth { return []backend.KVWidth{{K: 32, V: 32}} }
func (m *fakeModel) Forward(b *backend.Batch) (backend.Tensor, error) {
	rows := len(b.LogitRows)
	out := make(fakeTensor, 0, rows*len(m.logits))
	for r := 0; r < rows; r++ {
		out = append(out, m.logits...)
	}
	return out, nil
}

type fakeTensor []float32

func (fakeTensor) Shape() []int { return nil }

// fakeBackend implements only what the engine itself calls.
type fakeBackend struct{ backend.Backend }

func (fakeBackend) InitKV(int, int) error             { return nil }
func (fakeBackend) CopyBlocks([]int32, []int32)       {}
func (fakeBackend) ToHost(t backend.Tensor) []float32 { return t.(fakeTensor) }

type fakeDetok struct{}

func (fakeDetok) Decode(ids []int32, _ bool) (string, error) {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = 'a' + byte(id%26)
	}
	return string(b), nil
}

// BenchmarkStepOverhead measures one engine step (scheduling, block
// accounting, sampling with temperature and top-p, detokenising, stop-string
// checks, event delivery) with R running sequences in decode and a model
// that costs nothing.
func BenchmarkStepOverhead(b *testing.B) {
	const V = 32000
	// A peaked, Zipf-like distribution as language models give (the token of
	// rank r has logit −1.5·ln(r+1)), with ranks scattered over the ids.
	logits := make([]float32, V)
	for i := range logits {
		rank := (i * 7919) % V
		logits[i] = float32(-1.5 * math.Log(float64(rank+1)))
	}
	for _, R := range []int{1, 64, 256} {
		b.Run(fmt.Sprintf("seqs=%d", R), func(b *testing.B) {
			m := &fakeModel{cfg: &models.Config{VocabSize: V, MaxPositions: 1 << 20}, logits: logits}
			e, err := New(m, fakeBackend{}, fakeDetok{}, Config{MaxNumSeqs: R, KVCacheBytes: 1 << 28, MaxQueue: R, PrefixCaching: true},
				Options{Name: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Shutdown(context.Background())
			steps := b.N
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ResetTimer()
			// Rounds of at most 4096 steps: the sequences' KV stays within
			// the cache however large b.N grows.
			for left := steps; left > 0; left -= min(left, 4096) {
				n := min(left, 4096)
				var chans []<-chan Event
				for i := 0; i < R; i++ {
					ch, err := e.Generate(ctx, &Request{Prompt: []int32{1, 2, 3, 4}, Sampling: SamplingParams{
						MaxTokens: n, Temperature: 0.8, TopP: 0.9, IgnoreEOS: true, Stop: []string{"zzzz"}}})
					if err != nil {
						b.Fatal(err)
					}
					chans = append(chans, ch)
				}
				done := make(chan struct{})
				for _, ch := range chans {
					go func() {
						for range ch {
						}
						done <- struct{}{}
					}()
				}
				for range chans {
					<-done
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(steps), "µs/step")
		})
	}
}
