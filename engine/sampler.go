package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/grammar"
	"github.com/mkserve/mkserve/internal/logprob"
	"github.com/mkserve/mkserve/metrics"
)

// Validate checks sampling parameters, naming the first bad one with its
// OpenAI parameter name.
func (p *SamplingParams) Validate() error {
	switch {
	case p.N < 1 || p.N > 128:
		return fmt.Errorf("n must be in [1, 128], got %d", p.N)
	case p.MaxTokens < 1:
		return fmt.Errorf("max_tokens must be at least 1, got %d", p.MaxTokens)
	case p.MinTokens < 0 || p.MinTokens > p.MaxTokens:
		return fmt.Errorf("min_tokens must be in [0, max_tokens %d], got %d", p.MaxTokens, p.MinTokens)
	case !(p.Temperature >= 0 && p.Temperature <= 2):
		return fmt.Errorf("temperature must be in [0, 2], got %v", p.Temperature)
	case !(p.TopP > 0 && p.TopP <= 1):
		return fmt.Errorf("top_p must be in (0, 1], got %v", p.TopP)
	case p.TopK < 0:
		return fmt.Errorf("top_k must not be negative, got %d", p.TopK)
	case !(p.MinP >= 0 && p.MinP <= 1):
		return fmt.Errorf("min_p must be in [0, 1], got %v", p.MinP)
	case !(p.PresencePenalty >= -2 && p.PresencePenalty <= 2):
		return fmt.Errorf("presence_penalty must be in [-2, 2], got %v", p.PresencePenalty)
	case !(p.FrequencyPenalty >= -2 && p.FrequencyPenalty <= 2):
		return fmt.Errorf("frequency_penalty must be in [-2, 2], got %v", p.FrequencyPenalty)
	case !(p.RepetitionPenalty > 0 && p.RepetitionPenalty <= 10):
		return fmt.Errorf("repetition_penalty must be in (0, 10], got %v", p.RepetitionPenalty)
	case p.TopLogprobs < 0 || p.TopLogprobs > 20:
		return fmt.Errorf("top_logprobs must be in [0, 20], got %d", p.TopLogprobs)
	case p.Grammar != nil && p.IgnoreEOS:
		return fmt.Errorf("ignore_eos cannot be used with a constrained output (response_format json_object / json_schema, a forced tool call): the choice ends when the text is complete")
	}
	for i, s := range p.Stop {
		if s == "" {
			return fmt.Errorf("stop[%d] must not be empty", i)
		}
	}
	if len(p.LogitBias) > MaxLogitBias {
		return fmt.Errorf("logit_bias has %d entries; at most %d are allowed", len(p.LogitBias), MaxLogitBias)
	}
	for id, b := range p.LogitBias {
		if id < 0 {
			return fmt.Errorf("logit_bias: token id %d is negative", id)
		}
		if !(b >= -100 && b <= 100) {
			return fmt.Errorf("logit_bias: the bias of token %d must be in [-100, 100], got %v", id, b)
		}
	}
	return nil
}

// MaxLogitBias is the most logit_bias entries a request may carry.
const MaxLogitBias = 1024

// Defaults fills the neutral values of unset fields (zero TopP and
// RepetitionPenalty mean "off", N and MaxTokens 1 and 16 as OpenAI's).
func (p *SamplingParams) Defaults() {
	if p.N == 0 {
		p.N = 1
	}
	if p.MaxTokens == 0 {
		p.MaxTokens = 16
	}
	if p.TopP == 0 {
		p.TopP = 1
	}
	if p.RepetitionPenalty == 0 {
		p.RepetitionPenalty = 1
	}
}

// SamplingDefaults are a model's preferred sampling settings
// (generation_config.json). Like vLLM, the servers use them for the
// parameters a request leaves unset; nil fields fall back to OpenAI's
// defaults.
type SamplingDefaults struct {
	Temperature       *float32
	TopP              *float32
	TopK              *int
	MinP              *float32
	RepetitionPenalty *float32
}

// Base is what a request that sets nothing samples with: temperature 1,
// top_p 1, no top-k, min-p or repetition penalty, each replaced by the
// model's default where it has one. N and MaxTokens are left zero.
func (d *SamplingDefaults) Base() SamplingParams {
	p := SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1}
	if d == nil {
		return p
	}
	set := func(dst *float32, v *float32) {
		if v != nil {
			*dst = *v
		}
	}
	set(&p.Temperature, d.Temperature)
	set(&p.TopP, d.TopP)
	set(&p.MinP, d.MinP)
	set(&p.RepetitionPenalty, d.RepetitionPenalty)
	if d.TopK != nil && *d.TopK > 0 {
		p.TopK = *d.TopK
	}
	return p
}

// sampler picks one sequence's next tokens. Its random stream depends only
// on the seed and the choice index, so a seeded request repeats itself.
type sampler struct {
	p      *SamplingParams
	rng    *rand.Rand
	counts map[int32]int  // output token → occurrences (presence/frequency)
	seen   map[int32]bool // prompt and output tokens (repetition penalty)
	// Constrained choices (SamplingParams.Grammar): the grammar's state,
	// each token's bytes, the vocabulary for its masks, the token that ends
	// the text, and whether an emitted token was one the grammar refused
	// (a device sampler that ignored the mask).
	gram     grammar.Validator
	tokBytes func(int32) []byte
	gvocab   *grammar.Vocab
	eos      int32
	gramErr  bool
	gramFail error            // the grammar gave up (grammar.Failer): the choice fails with it
	met      *metrics.Metrics // mask times (nil: none)
	override []uint64         // a speculative verify row's mask, while it is sampled (nil: the grammar's own)
	maskOK   bool             // mask holds allowed()'s answer for the grammar's current state
	vocabN   int              // logits a row (the model's vocabulary)
	// MinTokens: the tokens banned until n reaches it (end-of-sequence and
	// stop tokens), and n, the tokens emitted so far.
	banned []int32
	n      int
	// scratch
	mask  []uint64
	work  []float32
	order []int32
	probs []float64
}

func newSampler(p *SamplingParams, index int, prompt []int32) *sampler {
	var seed uint64
	if p.Seed != nil {
		seed = *p.Seed
	} else {
		seed = rand.Uint64()
	}
	s := &sampler{p: p, rng: rand.New(rand.NewPCG(seed, uint64(index)*0x9e3779b97f4a7c15+1)), counts: map[int32]int{}}
	if p.RepetitionPenalty != 1 {
		s.seen = map[int32]bool{}
		for _, t := range prompt {
			s.seen[t] = true
		}
	}
	return s
}

// observe records an emitted token for the penalties, and advances the
// grammar by it.
func (s *sampler) observe(t int32) {
	s.n++
	s.counts[t]++
	if s.seen != nil {
		s.seen[t] = true
	}
	if s.gram != nil {
		s.maskOK = false
		if t != s.eos && !s.gram.Advance(s.tokBytes(t)) {
			s.gramErr = true
		}
	}
}

// allowed is the mask of the tokens a constrained choice may take next
// (nil without a grammar): those whose bytes the grammar accepts; only the
// end-of-sequence token once the text is complete, or when no token fits.
// It is computed once for each state of the grammar (observe moves it on).
func (s *sampler) allowed() []uint64 {
	if s.gram == nil {
		return nil
	}
	if s.override != nil {
		return s.override
	}
	if s.maskOK {
		return s.mask
	}
	if s.mask == nil {
		s.mask = make([]uint64, s.gvocab.MaskWords())
	}
	s.maskOK = true
	return s.maskOf(s.gram, s.mask)
}

// maskOf fills m with the tokens a choice whose grammar is at g may take
// next (what allowed keeps for the grammar's own state) and returns it.
func (s *sampler) maskOf(g grammar.Validator, m []uint64) []uint64 {
	if s.met != nil {
		defer func(t0 time.Time) { s.met.GrammarMask(time.Since(t0)) }(time.Now())
	}
	if !g.Complete() && s.gvocab.Mask(g, m) > 0 {
		m[s.eos>>6] &^= 1 << (s.eos & 63)    // (an EOS with bytes still ends the text only when it is complete)
		for _, t := range s.p.StopTokenIDs { // (nor does a stop token)
			if int(t) < s.vocabN {
				m[t>>6] &^= 1 << (t & 63)
			}
		}
		if grammar.Count(m) > 0 {
			return m
		}
	}
	if f, ok := g.(grammar.Failer); ok && f.Err() != nil && g == s.gram {
		s.gramFail = f.Err()
	}
	clear(m)
	m[s.eos>>6] |= 1 << (s.eos & 63)
	return m
}

// banning reports whether min_tokens still bans the stop tokens.
func (s *sampler) banning() bool { return s.n < s.p.MinTokens && len(s.banned) > 0 }

// bias is the row's logit bias for a device sampler: logit_bias, and −Inf
// on the tokens min_tokens still bans (ids sorted, distinct, in the
// vocabulary).
func (s *sampler) bias() (ids []int32, vals []float32) {
	p := s.p
	ban := s.banning()
	if len(p.LogitBias) == 0 && !ban {
		return nil, nil
	}
	for t := range p.LogitBias {
		if int(t) < s.vocabN {
			ids = append(ids, t)
		}
	}
	if ban {
		for _, t := range s.banned {
			if int(t) < s.vocabN && !slices.Contains(ids, t) {
				ids = append(ids, t)
			}
		}
	}
	slices.Sort(ids)
	vals = make([]float32, len(ids))
	for i, t := range ids {
		vals[i] = p.LogitBias[t]
		if ban && slices.Contains(s.banned, t) {
			vals[i] = float32(math.Inf(-1))
		}
	}
	return ids, vals
}

// sample picks the next token from logits [V] (not modified) and, when asked,
// returns its log-probability record (from the raw model distribution).
func (s *sampler) sample(logits []float32, decode func(int32) string) (int32, *Logprob) {
	p := s.p
	w := logits // read only below, unless a bias, penalty, ban or constraint applies to a copy
	ban := s.banning()
	if len(p.LogitBias) > 0 || s.seen != nil || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || s.gram != nil || ban {
		w = append(s.work[:0], logits...)
		s.work = w
		for t, b := range p.LogitBias {
			if int(t) < len(w) {
				w[t] += b
			}
		}
		// Penalties.
		if s.seen != nil {
			for t := range s.seen {
				if w[t] > 0 {
					w[t] /= p.RepetitionPenalty
				} else {
					w[t] *= p.RepetitionPenalty
				}
			}
		}
		if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
			for t, c := range s.counts {
				w[t] -= p.FrequencyPenalty*float32(c) + p.PresencePenalty
			}
		}
		if ban {
			for _, t := range s.banned {
				if int(t) < len(w) {
					w[t] = float32(math.Inf(-1))
				}
			}
		}
	}
	if m := s.allowed(); m != nil {
		ninf := float32(math.Inf(-1))
		for t := range w {
			if !grammar.Allowed(m, int32(t)) {
				w[t] = ninf
			}
		}
	}
	tok := s.pick(w)
	var lp *Logprob
	if p.Logprobs {
		lp = logprobOf(logits, tok, p.TopLogprobs, decode)
	}
	return tok, lp
}

// pick is the argmax of w (greedy) or a draw from it.
func (s *sampler) pick(w []float32) int32 {
	if s.p.Temperature == 0 {
		return int32(Argmax(w))
	}
	return s.draw(w)
}

// row is the device-sampler request equivalent to sample's work, taking
// the uniform draw from the generator when sample would (temperature > 0).
func (s *sampler) row() backend.SampleRow {
	p := s.p
	r := backend.SampleRow{Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP,
		RepetitionPenalty: p.RepetitionPenalty, PresencePenalty: p.PresencePenalty,
		FrequencyPenalty: p.FrequencyPenalty}
	if s.seen != nil {
		r.Seen = make([]int32, 0, len(s.seen))
		for t := range s.seen {
			r.Seen = append(r.Seen, t)
		}
		slices.Sort(r.Seen)
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		r.Output = make([]int32, 0, len(s.counts))
		for t := range s.counts {
			r.Output = append(r.Output, t)
		}
		slices.Sort(r.Output)
		r.Counts = make([]int32, len(r.Output))
		for i, t := range r.Output {
			r.Counts[i] = int32(s.counts[t])
		}
	}
	if p.Temperature != 0 {
		r.U = s.rng.Float64()
	}
	if p.Logprobs {
		r.TopLogprobs = p.TopLogprobs
	}
	r.Allowed = s.allowed()
	r.BiasIDs, r.BiasVals = s.bias()
	return r
}

// result turns a device sampler's pick into sample's results.
func (s *sampler) result(r backend.SampleResult, decode func(int32) string) (int32, *Logprob) {
	if !s.p.Logprobs {
		return r.Token, nil
	}
	lp := &Logprob{TokenLogprob: TokenLogprob{ID: r.Token, Text: decode(r.Token), Logprob: r.Logprob}}
	for i, id := range r.TopIDs {
		lp.Top = append(lp.Top, TokenLogprob{ID: id, Text: decode(id), Logprob: r.TopLogp[i]})
	}
	return r.Token, lp
}

// draw samples from softmax(w/T) restricted, in this order, by top-k, min-p
// (relative to the most likely token) and top-p (over the top-k
// distribution). It never sorts the whole vocabulary: only the tokens above a
// probability threshold that is lowered until it provably contains the
// kept set.
func (s *sampler) draw(w []float32) int32 {
	p := s.p
	inv := 1 / p.Temperature
	maxv := float32(math.Inf(-1))
	for _, x := range w {
		if x > maxv {
			maxv = x
		}
	}
	if math.IsInf(float64(maxv), -1) || math.IsNaN(float64(maxv)) {
		return int32(Argmax(w))
	}
	if p.TopK == 0 && p.TopP >= 1 && p.MinP == 0 {
		return s.drawAll(w, maxv, inv)
	}
	// A logit more than 40 nats under the best contributes < 5e-18 of the
	// mass: skip its exp.
	// Unnormalised probabilities: the most likely token has 1.
	probs := s.probs[:0]
	var total float64
	for _, x := range w {
		q := 0.0
		if z := float64((x - maxv) * inv); z > -40 {
			q = fastExp(z)
		}
		probs = append(probs, q)
		total += q
	}
	s.probs = probs
	order := s.order[:0]
	for tau := 1.0 / 64; ; tau /= 64 {
		order = order[:0]
		var mass float64
		for i, q := range probs {
			if q >= tau && q > 0 {
				order = append(order, int32(i))
				mass += q
			}
		}
		enoughK := p.TopK > 0 && len(order) >= p.TopK
		enoughP := p.TopK == 0 && mass >= float64(p.TopP)*total
		enoughMin := p.TopK == 0 && p.TopP >= 1 && tau <= float64(p.MinP)
		if enoughK || enoughP || enoughMin || tau < 1e-300 || len(order) == len(probs) {
			break
		}
	}
	s.order = order
	sort.Slice(order, func(a, b int) bool {
		qa, qb := probs[order[a]], probs[order[b]]
		return qa > qb || (qa == qb && order[a] < order[b])
	})
	norm := total
	if p.TopK > 0 && p.TopK < len(order) {
		order = order[:p.TopK]
	}
	if p.TopK > 0 {
		norm = 0
		for _, t := range order {
			norm += probs[t]
		}
	}
	n := len(order)
	if p.MinP > 0 {
		for n > 1 && probs[order[n-1]] < float64(p.MinP) {
			n--
		}
	}
	if p.TopP < 1 {
		var c float64
		for i := 0; i < n; i++ {
			c += probs[order[i]] / norm
			if c >= float64(p.TopP) {
				n = i + 1
				break
			}
		}
	}
	var mass float64
	for _, t := range order[:n] {
		mass += probs[t]
	}
	u := s.rng.Float64() * mass
	for _, t := range order[:n] {
		u -= probs[t]
		if u < 0 {
			return t
		}
	}
	return order[n-1]
}

// drawAll samples from the whole softmax(w/T) without sorting.
func (s *sampler) drawAll(w []float32, maxv, inv float32) int32 {
	probs := s.probs[:0]
	var sum float64
	for _, x := range w {
		q := 0.0
		if z := float64((x - maxv) * inv); z > -40 {
			q = fastExp(z)
		}
		probs = append(probs, q)
		sum += q
	}
	s.probs = probs
	u := s.rng.Float64() * sum
	for i, q := range probs {
		u -= q
		if u < 0 && q > 0 {
			return int32(i)
		}
	}
	return int32(Argmax(w))
}

// logprobOf is tok's log-softmax under logits, with the top alternatives
// (logprob.Of).
func logprobOf(logits []float32, tok int32, top int, decode func(int32) string) *Logprob {
	lp, ids, lps := logprob.Of(logits, tok, top)
	out := &Logprob{TokenLogprob: TokenLogprob{ID: tok, Text: decode(tok), Logprob: lp}}
	for i, t := range ids {
		out.Top = append(out.Top, TokenLogprob{ID: t, Text: decode(t), Logprob: lps[i]})
	}
	return out
}
