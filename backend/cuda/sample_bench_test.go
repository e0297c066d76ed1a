package cuda_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cuda"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/models"
)

// BenchmarkSample times one sampling step for B rows of V logits, in µs
// per step (median of 5 batches of wall-clock time):
//
//	gpu:    Backend.Sample (upload of the parameters, the kernel, the
//	        copy of the results; synchronous)
//	tohost: Backend.ToHost of the logits alone (what the host path must copy)
//	host:   ToHost, then kernels.SampleHost for every row, spread over the
//	        cores as the engine's parallelPicks does (SampleHost follows the
//	        engine's sampler literally but with math.Exp for its fastExp and
//	        fresh scratch per row, so it is somewhat slower than the engine's)
//	engine: one engine step (engine.New over a model that costs nothing and
//	        returns fixed logits already on the host): the engine's real
//	        sampler plus its bookkeeping, without the copy
//
// for the typical settings (temperature 0.8, top-p 0.9, top-k 50) and greedy.
func BenchmarkSample(b *testing.B) {
	settings := []struct {
		name string
		p    engine.SamplingParams
	}{
		{"typical", engine.SamplingParams{Temperature: 0.8, TopP: 0.9, TopK: 50, RepetitionPenalty: 1}},
		{"greedy", engine.SamplingParams{Temperature: 0, TopP: 1, RepetitionPenalty: 1}},
	}
	for _, V := range []int{32000, 151936} {
		for _, B := range []int{1, 32, 256} {
			for _, s := range settings {
				name := fmt.Sprintf("V=%d/B=%d/%s", V, B, s.name)
				logits := benchLogits(B, V)
				rows := make([]backend.SampleRow, B)
				r := rand.New(rand.NewPCG(uint64(B), uint64(V)))
				for i := range rows {
					rows[i] = backend.SampleRow{Temperature: s.p.Temperature, TopK: s.p.TopK, TopP: s.p.TopP,
						RepetitionPenalty: 1, U: r.Float64()}
				}
				b.Run("gpu/"+name, func(b *testing.B) {
					be := sampleBackend(b)
					lt := be.FromFloat32([]int{B, V}, logits)
					iters := 50
					timeSteps(b, iters, func() { be.Sample(lt, rows) })
				})
				b.Run("tohost/"+name, func(b *testing.B) {
					be := sampleBackend(b)
					lt := be.FromFloat32([]int{B, V}, logits)
					timeSteps(b, max(3, 20/max(1, B/16)), func() { be.ToHost(lt) })
				})
				b.Run("host/"+name, func(b *testing.B) {
					be := sampleBackend(b)
					lt := be.FromFloat32([]int{B, V}, logits)
					timeSteps(b, max(3, 20/max(1, B/16)), func() { hostStep(be, lt, rows, V) })
				})
				b.Run("engine/"+name, func(b *testing.B) {
					benchEngine(b, logits, B, V, s.p)
				})
			}
		}
	}
}

// benchLogits are Zipf-like rows as language models give (the token of
// rank r has logit −1.5·ln(r+1), as engine's BenchmarkStepOverhead), ranks
// scattered differently per row, plus a little noise.
func benchLogits(B, V int) []float32 {
	out := make([]float32, B*V)
	r := rand.New(rand.NewPCG(1, 2))
	for b := 0; b < B; b++ {
		mul := 7919 + 2*b
		for i := 0; i < V; i++ {
			rank := (i*mul + b) % V
			out[b*V+i] = float32(-1.5*math.Log(float64(rank+1)) + 0.01*r.NormFloat64())
		}
	}
	return out
}

// hostStep is the host path: copy the logits, sample every row in parallel.
func hostStep(be *cuda.Backend, lt backend.Tensor, rows []backend.SampleRow, V int) {
	h := be.ToHost(lt)
	var wg sync.WaitGroup
	workers := min(len(rows), runtime.GOMAXPROCS(0))
	next := make(chan int, len(rows))
	for i := range rows {
		next <- i
	}
	close(next)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				kr := kernels.SampleRow(rows[i])
				kernels.SampleHost(h[i*V:(i+1)*V], &kr)
			}
		}()
	}
	wg.Wait()
}

// timeSteps runs f iters times per batch, 5 batches after a warm-up, and
// reports the median µs per call.
func timeSteps(b *testing.B, iters int, f func()) {
	f()
	var per []float64
	for k := 0; k < 5; k++ {
		t0 := time.Now()
		for i := 0; i < iters; i++ {
			f()
		}
		per = append(per, float64(time.Since(t0).Microseconds())/float64(iters))
	}
	slices.Sort(per)
	b.ReportMetric(per[len(per)/2], "µs/step")
	b.ReportMetric(0, "ns/op")
}

// benchEngine times engine steps with B running sequences over fixed
// logits (no copy: the model's output is already on the host).
func benchEngine(b *testing.B, logits []float32, B, V int, p engine.SamplingParams) {
	m := &sharedModel{cfg: &models.Config{VocabSize: V, MaxPositions: 1 << 20}, logits: logits, V: V}
	e, err := engine.New(m, hostBackend{}, letters{}, engine.Config{MaxNumSeqs: B, KVCacheBytes: 1 << 30, MaxQueue: B},
		engine.Options{Name: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	const steps = 40
	p.MaxTokens = steps + 1
	p.IgnoreEOS = true
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var chans []<-chan engine.Event
	for i := 0; i < B; i++ {
		ch, err := e.Generate(ctx, &engine.Request{ID: fmt.Sprint(i), Prompt: []int32{1, 2, 3, 4}, Sampling: p})
		if err != nil {
			b.Fatal(err)
		}
		chans = append(chans, ch)
	}
	// Time from the first token of the last sequence to the end: decode steps only.
	first := make(chan struct{}, B)
	done := make(chan time.Time, B)
	for _, ch := range chans {
		go func() {
			n := 0
			for ev := range ch {
				n += len(ev.TokenIDs)
				if n == len(ev.TokenIDs) && n > 0 {
					first <- struct{}{}
				}
			}
			done <- time.Now()
		}()
	}
	for i := 0; i < B; i++ {
		<-first
	}
	t0 := time.Now()
	var end time.Time
	for i := 0; i < B; i++ {
		if t := <-done; t.After(end) {
			end = t
		}
	}
	b.ReportMetric(float64(end.Sub(t0).Microseconds())/float64(steps-1), "µs/step")
	b.ReportMetric(0, "ns/op")
}

// sharedModel returns rows of one preallocated logits table (no copy).
type sharedModel struct {
	cfg    *models.Config
	logits []float32
	V      int
}

func (m *sharedModel) Config() *models.Config      { return m.cfg }
func (m *sharedModel) KVFloatsPerToken() int       { return 8 }
func (m *sharedModel) KVWidths() []backend.KVWidth { return []backend.KVWidth{{K: 4, V: 4}} }
func (m *sharedModel) Forward(b *backend.Batch) (backend.Tensor, error) {
	n := len(b.LogitRows)
	if n*m.V > len(m.logits) {
		out := make(hostTensor, 0, n*m.V)
		for len(out) < n*m.V {
			out = append(out, m.logits[:min(len(m.logits), n*m.V-len(out))]...)
		}
		return out, nil
	}
	return hostTensor(m.logits[:n*m.V]), nil
}
