package engine

import (
	"math"
	"math/rand/v2"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/grammar"
)

// fixedU is a rand.Source whose Float64 is u.
type fixedU float64

func (u fixedU) Uint64() uint64 { return uint64(float64(u) * (1 << 53)) } // Float64 keeps the low 53 bits

// RefSample is the host sampler's answer to a device SampleRow: what a
// correct backend.Sampler returns for one row of logits [V].
func RefSample(logits []float32, r backend.SampleRow) backend.SampleResult {
	p := &SamplingParams{Temperature: r.Temperature, TopK: r.TopK, TopP: r.TopP, MinP: r.MinP,
		RepetitionPenalty: r.RepetitionPenalty, PresencePenalty: r.PresencePenalty,
		FrequencyPenalty: r.FrequencyPenalty, Logprobs: true, TopLogprobs: r.TopLogprobs}
	if p.RepetitionPenalty == 0 {
		p.RepetitionPenalty = 1
	}
	s := &sampler{p: p, rng: rand.New(fixedU(r.U)), counts: map[int32]int{}}
	if p.RepetitionPenalty != 1 {
		s.seen = map[int32]bool{}
		for _, t := range r.Seen {
			s.seen[t] = true
		}
	}
	for i, t := range r.Output {
		s.counts[t] = int(r.Counts[i])
	}
	if r.Processed() { // the bias, then the mask, on a copy (backend.SampleRow's contract)
		logits = append([]float32(nil), logits...)
		for i, t := range r.BiasIDs {
			logits[t] += r.BiasVals[i]
		}
		for t := range logits {
			if r.Allowed != nil && !grammar.Allowed(r.Allowed, int32(t)) {
				logits[t] = float32(math.Inf(-1))
			}
		}
	}
	tok, lp := s.sample(logits, func(int32) string { return "" })
	out := backend.SampleResult{Token: tok, Logprob: lp.Logprob}
	for _, a := range lp.Top {
		out.TopIDs = append(out.TopIDs, a.ID)
		out.TopLogp = append(out.TopLogp, a.Logprob)
	}
	return out
}
