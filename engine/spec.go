package engine

import (
	"bytes"
	"math/bits"
	"slices"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/grammar"
)

// Prompt-lookup speculation (Config.SpeculativeTokens): a decode step of a
// sequence whose last tokens occurred before feeds, after its newest
// token, the tokens that followed that occurrence (the draft). The step
// computes logits at every fed position and picks a token at each as a
// decode step would (greedy, or sampled with its own draw); the draft is
// kept up to its first token that differs from the pick at the position
// before it, and that pick follows — one to 1+len(draft) tokens a step.
// Greedy output is exactly greedy decoding's (up to the rounding of a
// multi-token step against a one-token one); sampled output follows the
// model's distribution (specCandidate), though a seeded request draws
// differently than without speculation.

// verifySpans is a verify step's span of 1+len(draft) tokens as that many
// one-token spans over the same block table, token j's with j more tokens
// past: a batch of one-token spans is what backends run as a decode step
// (the CUDA backend as a graph), and each span's attention sees the KV the
// step writes for the tokens before it (a backend writes a batch's KV
// before it attends; the CUDA backend's kernel that does both in one pass
// is not used when spans share blocks). The spans after the first get IDs
// derived from the sequence's.
func verifySpans(span backend.SeqSpan) []backend.SeqSpan {
	out := make([]backend.SeqSpan, span.Len)
	for j := range out {
		out[j] = backend.SeqSpan{ID: span.ID, Offset: span.Offset + j, Len: 1, Past: span.Past + j, Blocks: span.Blocks}
		if j > 0 {
			out[j].ID = span.ID ^ (uint64(j) << 56) ^ 0x9e3779b97f4a7c15
		}
	}
	return out
}

// specWindow is how many of a sequence's latest tokens a draft lookup
// searches: bounded work a step whatever the context.
const specWindow = 4096

// ngramDraft is up to k tokens after the most recent earlier occurrence of
// toks' last n tokens, for n from maxN down to minN (the first that has
// one), searching the last specWindow tokens; nil when none occurs.
func ngramDraft(toks []int32, k, maxN, minN int) []int32 {
	L := len(toks)
	lo := max(0, L-specWindow)
	for n := min(maxN, L-1); n >= minN && n >= 1; n-- {
		suffix := toks[L-n:]
		for start := L - n - 1; start >= lo; start-- {
			if toks[start+n-1] != suffix[n-1] || !slices.Equal(toks[start:start+n], suffix) {
				continue
			}
			if end := min(start+n+k, L); start+n < end {
				return slices.Clone(toks[start+n : end])
			}
		}
	}
	return nil
}

// specCandidate reports whether s qualifies for speculation: not about to
// fork its choices, nothing that depends on the tokens before a row within
// the step or changes the logits (penalties, a bias, a grammar,
// min_tokens' ban), no prompt log-probabilities. (Each row's own
// log-probabilities are those of its position.) Greedy or sampled: each verify row is sampled as a
// decode step would be (its own uniform draw), and a draft token is kept
// when the token sampled at its position is that token — for a draft that
// is one fixed token this is exactly speculative sampling's rule (kept
// with the model's probability of it; otherwise the token sampled there,
// a draw from the rest of the distribution, ends the step), so the output
// follows the model's distribution.
func (s *sequence) specCandidate() bool {
	p := &s.req.r.Sampling
	return !s.forksNow(0) && s.sampler.seen == nil && p.PresencePenalty == 0 &&
		p.FrequencyPenalty == 0 && len(p.LogitBias) == 0 && s.gramClonable() && !s.sampler.banning() &&
		s.req.promptLPs == nil
}

// gramClonable reports whether s has no grammar, or one whose state can be
// copied: each verify row after a draft token is then sampled under the
// mask of the grammar after the draft so far (its draftStates), which is
// exactly the mask a decode step would use there.
func (s *sequence) gramClonable() bool {
	if s.sampler.gram == nil {
		return true
	}
	_, ok := grammar.Clone(s.sampler.gram)
	return ok
}

// grammarDraft cuts a constrained sequence's draft before its first token
// the grammar refuses (or an end-of-sequence or stop token, or once the
// text is complete: only the end can follow) and keeps the grammar's state
// after each token kept (s.draftStates).
func (s *sequence) grammarDraft(d []int32, eos []int32) []int32 {
	s.draftStates = s.draftStates[:0]
	if s.sampler.gram == nil {
		return d
	}
	g, _ := grammar.Clone(s.sampler.gram)
	for j, t := range d {
		if g.Complete() || slices.Contains(eos, t) || slices.Contains(s.req.r.Sampling.StopTokenIDs, t) || !g.Advance(s.sampler.tokBytes(t)) {
			d = d[:j]
			break
		}
		s.draftStates = append(s.draftStates, g)
		if j+1 < len(d) {
			g, _ = grammar.Clone(g)
		}
	}
	if len(d) == 0 {
		return nil
	}
	return d
}

// PredictionTokens is the most tokens a decode step drafts from a
// request's prediction (Request.Prediction), whatever the engine's
// speculative_tokens (0 included).
const PredictionTokens = 8

// MaxPredictionTokens bounds a request's prediction (Request.Prediction).
const MaxPredictionTokens = 65536

// Unpredictable names the parameter of p that rules out drafts (and so a
// prediction): a presence, frequency or repetition penalty, or a logit
// bias; "" when none does.
func (p *SamplingParams) Unpredictable() string {
	switch {
	case p.PresencePenalty != 0:
		return "presence_penalty"
	case p.FrequencyPenalty != 0:
		return "frequency_penalty"
	case p.RepetitionPenalty != 1 && p.RepetitionPenalty != 0:
		return "repetition_penalty"
	case len(p.LogitBias) > 0:
		return "logit_bias"
	}
	return ""
}

// specK is the most draft tokens s may carry a step: the engine's
// speculative_tokens, or PredictionTokens with a prediction if more.
func (e *Engine) specK(s *sequence) int {
	k := e.cfg.SpeculativeTokens
	if len(s.req.r.Prediction) > 0 {
		k = max(k, PredictionTokens)
	}
	return k
}

// predictionDraft is up to k tokens of s's prediction from where its
// output has reached in it: where the last draft from the prediction left
// off, when the output has followed the prediction since; else after the
// occurrence of the output's last tokens (4 down to 2; the first token
// alone at the start) nearest after that place, or failing that the
// first anywhere. nil when the output's end occurs nowhere in it.
//
// With the tokens' bytes (tb not nil) the output is first followed through
// the prediction's text: a reply that writes the predicted text in other
// tokens than the prediction's own ("Go"+"d" for "God") stays in place,
// and drafts resume at the next token boundary the two share.
func (s *sequence) predictionDraft(k int, tb func(int32) []byte) []int32 {
	pred, out := s.req.r.Prediction, s.tokens[s.prompt:]
	if len(out) == 0 || k <= 0 {
		return nil
	}
	pt := s.req.predictionText(tb)
	from := func(at int) []int32 {
		if at >= len(pred) {
			return nil
		}
		s.predAt, s.predOut = at, len(out)
		if pt != nil && !s.predOff && s.predTok == len(out) && s.predByte == pt.starts[at] {
			return slices.Clone(pred[at:min(at+k, len(pred))])
		}
		if pt != nil { // found by tokens: the text's place is that token's start
			s.predByte, s.predTok, s.predOff = pt.starts[at], len(out), false
		}
		return slices.Clone(pred[at:min(at+k, len(pred))])
	}
	if pt != nil && !s.predOff {
		if at, ok := s.followText(pt, out, tb); ok {
			if at < 0 {
				s.predInside = at == -1 // (not at the text's end)
				return nil              // inside a token of the prediction: the next token may reach its end
			}
			return from(at)
		}
	}
	minN := 2
	if len(out) == 1 {
		minN = 1
	}
	if s.predOut > 0 {
		c := s.predAt + len(out) - s.predOut // (the output followed the draft this far)
		if n := min(len(out), 4); c >= n && c <= len(pred) && slices.Equal(pred[c-n:c], out[len(out)-n:]) {
			return from(c)
		}
	}
	for n := min(len(out), 4); n >= minN; n-- {
		suffix := out[len(out)-n:]
		first, after := -1, -1 // the first occurrence, and the first ending at or past predAt
		for i := 0; i+n <= len(pred); i++ {
			if pred[i] == suffix[0] && slices.Equal(pred[i:i+n], suffix) {
				if first < 0 {
					first = i
				}
				if i+n >= s.predAt {
					after = i
					break
				}
			}
		}
		if after >= 0 {
			return from(after + n)
		}
		if first >= 0 {
			return from(first + n)
		}
	}
	return nil
}

// predText is a prediction's text and where each of its tokens starts
// (starts[len(prediction)] is the text's length).
type predText struct {
	text   []byte
	starts []int
}

// predictionText is r's prediction as text, built on first use; nil when
// tb is nil or a token of the prediction has no bytes (a special token).
func (r *request) predictionText(tb func(int32) []byte) *predText {
	if r.ptDone {
		return r.pt
	}
	r.ptDone = true
	if tb == nil {
		return nil
	}
	pt := &predText{starts: make([]int, 0, len(r.r.Prediction)+1)}
	for _, t := range r.r.Prediction {
		b := tb(t)
		if len(b) == 0 {
			return nil
		}
		pt.starts = append(pt.starts, len(pt.text))
		pt.text = append(pt.text, b...)
	}
	pt.starts = append(pt.starts, len(pt.text))
	r.pt = pt
	return pt
}

// followText carries s's place in the prediction's text over the output
// tokens since the last call. ok: the output's bytes have matched the text
// all along; at is then the prediction's token that starts where the
// output has reached, −1 inside one, −2 at the text's end.
func (s *sequence) followText(pt *predText, out []int32, tb func(int32) []byte) (at int, ok bool) {
	for ; s.predTok < len(out); s.predTok++ {
		b := tb(out[s.predTok])
		if len(b) == 0 || !bytes.HasPrefix(pt.text[s.predByte:], b) {
			s.predOff = true
			return 0, false
		}
		s.predByte += len(b)
	}
	i, found := slices.BinarySearch(pt.starts, s.predByte)
	switch {
	case i >= len(pt.starts)-1:
		return -2, true // the text's end
	case !found:
		return -1, true
	}
	return i, true
}

// draft is s's draft for a decode step with budget tokens left in the
// step: none when speculation is off or s does not qualify; never past
// max_tokens or the model length (its own next token must still fit).
// With a prediction the draft comes from it, or, where the output has
// left it, from the prompt lookup when speculation is on.
func (e *Engine) draft(s *sequence, budget int) []int32 {
	s.draftPred = false
	k := e.specK(s)
	if k == 0 || !s.specCandidate() || s.computed+1 != len(s.tokens) {
		return nil
	}
	if s.specPause > 0 { // (overlapped decode meanwhile: see Engine.overlapSampler)
		s.specPause--
		return nil
	}
	if e.spec.pause > 0 && len(s.req.r.Prediction) == 0 { // the meter's verdict: prompt lookup does not pay now
		return nil
	}
	if s.pend != 0 {
		return nil
	}
	left := min(s.req.r.Sampling.MaxTokens-(len(s.tokens)-s.prompt), e.cfg.MaxModelLen-len(s.tokens)) - 1
	k = min(k, left, budget-1)
	if k <= 0 {
		return nil
	}
	var d []int32
	s.predInside = false
	if len(s.req.r.Prediction) > 0 {
		d = s.predictionDraft(k, e.tokBytes)
		s.draftPred = d != nil
	}
	if d == nil && e.cfg.SpeculativeTokens > 0 {
		d = ngramDraft(s.tokens, min(k, e.cfg.SpeculativeTokens), e.cfg.SpeculativeNgramMax, e.cfg.SpeculativeNgramMin)
	}
	d = s.grammarDraft(d, e.opts.EOS)
	if d == nil {
		s.specPause = specRetry
		if s.predInside { // (the output is inside a token of its prediction: the next token most likely ends it)
			s.specPause = 0
		}
		s.draftPred = false
	}
	return d
}

// Speculation backs off where it does not pay: a sequence whose drafts
// were accepted at less than specMinRate over the last specWindowDrafts
// draft tokens, or that found no draft, decodes specBackoff (specRetry)
// steps without drafting — and, on a backend that can, overlapped — before
// it tries again. (A verify step of 1+K tokens costs 1.9–2.9 decode steps
// on the H200's MoE shapes, docs/PERF.md: below about half the drafts
// accepted it loses.)
const (
	specWindowDrafts = 16
	specMinRate      = 0.4
	specBackoff      = 32
	specRetry        = 4
)

// specResult records a verify step's draft length and accepted count, and
// backs off when the rate over the window is poor.
func (s *sequence) specResult(drafted, accepted int) {
	s.specDrafted += drafted
	s.specAccepted += accepted
	if s.specDrafted < specWindowDrafts {
		return
	}
	if float64(s.specAccepted) < specMinRate*float64(s.specDrafted) {
		s.specPause = specBackoff
	}
	s.specDrafted, s.specAccepted = 0, 0
}

// accepted is how many of draft's tokens the step keeps: the run of them
// each equal to the model's pick at the position before it (picks[j] is
// the pick after the j-th fed token of the step: the newest token, then
// the draft's).
func accepted(draft []int32, picks []pick) int {
	a := 0
	for a < len(draft) && picks[a].tok == draft[a] {
		a++
	}
	return a
}

// Speculation also backs off for every sequence at once when it does not
// pay in time. Its costs are more than the rejected drafts: a step whose
// sequences may draft runs synchronously (drafts come from tokens on the
// host, so it cannot overlap the previous step), even when no draft is
// found; a verify step computes 1+K rows for each drafting sequence and,
// for a constrained one, a grammar mask for each row. (On the H200,
// JSON-schema requests at concurrency 4 served 0.83× as many requests
// with K = 4 as without, half the drafts accepted, and plain chat at
// concurrency 16 0.76×; docs/PERF.md.) The engine therefore measures its
// output rate — tokens delivered per second of decode steps — while
// speculation is on and while it is paused, by batch size, and compares
// the current period of speculation with the latest pause: when
// speculation is more than specMeterMargin slower, no sequence drafts for
// specMeterPause steps (doubled after each such verdict in a row, up to
// 16×). Verdicts are taken after 16, 32, 64 … steps of a batch size
// (fewer are too noisy: at batch 1 a step of the default model on the
// H200 takes ~0.25 ms, and its steps jitter by more than the 5–10 %
// being judged); with no pause measured at that size, or after
// specMeterStale steps of speculation, the engine pauses for
// specMeterMin+2 steps to measure one (a probe). The first
// step of each period is not counted: it holds the switch between
// overlapped and synchronous steps. The meter governs prompt lookup only:
// a request's prediction is the client's own ask and drafts through the
// pauses (its per-sequence back-off still stops a prediction the output
// has left), and the meter runs where prompt lookup is on.
const (
	specMeterBuckets = 10   // batch sizes 1, 2–3, 4–7, … 512+
	specMeterMin     = 16   // steps of a period before a verdict
	specMeterMargin  = 0.03 // how much slower speculation may be measured without a verdict against it
	specMeterPause   = 64
	specMeterStale   = 1024
)

// specMeter is the engine's record of decode steps' time and output while
// speculation is paused and on (index 0 and 1), by batch-size bucket: the
// latest pause's and the current period's sums.
type specMeter struct {
	secs, toks [2][specMeterBuckets]float64
	n          [2][specMeterBuckets]int
	on         bool  // the latest step counted ran with speculation on
	run        int   // steps of the current period of speculation
	pause      int   // steps to go without any draft
	streak     int   // verdicts against speculation in a row
	pauses     int64 // verdicts against speculation so far
}

// meterBucket is the bucket of a step of seqs sequences.
func meterBucket(seqs int) int {
	return min(bits.Len(uint(seqs))-1, specMeterBuckets-1)
}

// observe records a decode step of seqs sequences that delivered tokens
// in d, with speculation on or paused, and pauses speculation to probe or
// when it is measured slower than without.
func (m *specMeter) observe(seqs int, on bool, tokens int, d time.Duration) {
	if seqs <= 0 || tokens <= 0 || d <= 0 {
		return
	}
	k, b := 0, meterBucket(seqs)
	if on {
		k = 1
	}
	if on != m.on { // a new period
		m.on, m.run = on, 0
		m.secs[k], m.toks[k], m.n[k] = [specMeterBuckets]float64{}, [specMeterBuckets]float64{}, [specMeterBuckets]int{}
		return
	}
	m.secs[k][b] += d.Seconds()
	m.toks[k][b] += float64(tokens)
	m.n[k][b]++
	if !on {
		return
	}
	m.run++
	n := m.n[1][b]
	switch {
	case m.n[0][b] < specMeterMin && n >= specMeterMin, m.run >= specMeterStale:
		m.pause = specMeterMin + 2 // a probe
	case n < specMeterMin || n&(n-1) != 0:
	case m.toks[1][b]/m.secs[1][b] < (1-specMeterMargin)*m.toks[0][b]/m.secs[0][b]:
		m.pause = specMeterPause << min(m.streak, 4)
		m.streak++
		m.pauses++
	default:
		m.streak = 0
	}
}

// tick starts a step: one fewer to go in a pause.
func (m *specMeter) tick() {
	if m.pause > 0 {
		m.pause--
	}
}

// decodeStep reports whether plan is a decode step: every entry samples
// after its newest token and its draft, nothing is prefilled.
func decodeStep(plan []entry) bool {
	for _, en := range plan {
		if !en.sample || en.n != 1+len(en.draft) {
			return false
		}
	}
	return len(plan) > 0
}
