package engine

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/mkserve/mkserve/backend"
)

// Overlapped decode (vLLM calls it async scheduling).
//
// A synchronous step launches the forward pass, samples, waits for the
// tokens, delivers them, and only then schedules and launches the next
// step: the GPU idles while the host delivers, schedules and prepares the
// launch (on an H200 at batch 1, 0.1 of Qwen3-30B-A3B's 0.83 ms step). With
// a backend.AsyncSampler the engine instead launches step N+1 while step
// N's tokens are still on the device:
//
//	step N+1: schedule → batch (rows whose input is a token of step N take
//	          it from the device: Batch.Feed) → forward → SampleAsync →
//	          wait for step N's tokens → deliver them (stream, stop checks)
//
// so the host's work for step N overlaps the GPU's for step N+1. A token
// still on the device is a placeholder in its sequence's tokens
// (sequence.pend); the KV blocks that hold it are committed to the prefix
// cache once it is known. A sequence that stops at a token of step N (a
// stop token or string) has already been fed to step N+1: that extra
// token is dropped when step N+1 resolves. A sequence whose pending token
// reaches max_tokens or the model length is not scheduled again.
//
// Steps that need the previous tokens on the host run synchronously after
// waiting for them: sampling with penalties (they read the output so far),
// forks and log-probabilities of changed logits (host sampling), and
// Config.SyncSteps. Constrained rows (a grammar's mask) and min_tokens
// (its ban) overlap too: their step resolves the previous one between its
// forward launch and its sampling (overlapStep).

// inflight is a launched step whose sampled tokens are still on the device.
type inflight struct {
	picks []pick // in picks-row order; pick.pos is the token's index in its sequence's tokens
	pend  backend.Pending
}

// overlapLoadEvery is how often (in overlapped steps) the engine reads the
// backend's expert loads for the metrics: reading them waits for the GPU,
// so an overlapped step does not do it each time (the counts accumulate
// meanwhile). With the expert rebalancer on, every step reads them (its
// period counts observations).
const overlapLoadEvery = 32

// overlapSampler returns the backend's AsyncSampler when plan's step may
// run overlapped, else nil: device sampling (devSampler) that can keep its
// picks on the device, no sampling sequence with penalties, and none that
// speculation may draft for.
func (e *Engine) overlapSampler(plan []entry, devSampler backend.Sampler) backend.AsyncSampler {
	as, ok := devSampler.(backend.AsyncSampler)
	if !ok || e.cfg.SyncSteps {
		return nil
	}
	for _, en := range plan {
		if !en.sample {
			continue
		}
		p := &en.s.req.r.Sampling
		if en.s.sampler.seen != nil || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
			return nil
		}
		if e.specK(en.s) > 0 && (e.spec.pause == 0 || len(en.s.req.r.Prediction) > 0) && en.s.specCandidate() && en.s.specPause == 0 { // (drafts come from tokens on the host)
			return nil
		}
	}
	return as
}

// overlapStep launches b's forward pass and its sampling without waiting
// for the tokens, then resolves the previous overlapped step. When a row's
// sampling depends on the previous tokens (needsResolved: a grammar's
// mask, min_tokens' ban), the previous step is resolved between the
// forward launch and the sampling's: the host delivers those tokens and
// computes the masks while the GPU runs the forward pass.
func (e *Engine) overlapStep(plan []entry, b *backend.Batch, as backend.AsyncSampler) {
	_, logitsT, err := e.forward(b, false)
	if err != nil {
		e.resolveInflight()
		e.failStep(plan, "forward step failed", err, len(b.Tokens))
		return
	}
	for _, en := range plan {
		en.s.computed += en.n
		e.commitBlocks(en.s)
	}
	prev := e.inflight
	e.inflight = nil
	resolved := false
	for _, en := range plan {
		if prev != nil && en.sample && en.s.needsResolved() {
			e.resolve(prev)
			resolved = true
			break
		}
	}
	var pend backend.Pending
	var picks []pick
	var rows []backend.SampleRow
	if resolved {
		seqs := make([]*sequence, 0, len(plan))
		for _, en := range plan {
			if en.sample {
				seqs = append(seqs, en.s)
			}
		}
		prepareMasks(seqs)
	}
	for _, en := range plan {
		if !en.sample {
			continue
		}
		picks = append(picks, pick{s: en.s})
		if en.s.done { // finished by the tokens just resolved: its row is sampled and dropped
			rows = append(rows, backend.SampleRow{TopP: 1, RepetitionPenalty: 1})
		} else {
			rows = append(rows, en.s.sampler.row())
		}
	}
	if len(rows) > 0 {
		pend, err = recovered("device sampling", func() (backend.Pending, error) { return as.SampleAsync(logitsT, rows) })
	}
	if err != nil {
		if !resolved && prev != nil {
			e.resolve(prev)
		}
		e.failStep(plan, "device sampling failed", err, len(b.Tokens))
		return
	}
	for i := range picks {
		s := picks[i].s
		if s.done {
			continue
		}
		picks[i].pos = len(s.tokens)
		s.tokens = append(s.tokens, 0) // placeholder until resolved
		if s.pend == 0 {
			s.pend = picks[i].pos + 1
		}
		s.fedRow = int32(i)
	}
	if len(picks) > 0 {
		e.inflight = &inflight{picks: picks, pend: pend}
	}
	st := e.Stats()
	if prev != nil {
		st.OverlappedSteps++
		e.stats.Store(&st)
		e.opts.Metrics.OverlappedStep()
		if !resolved {
			e.resolve(prev)
		}
	}
	if e.rebal != nil || st.OverlappedSteps%overlapLoadEvery == 0 {
		e.takeExpertLoad() // (the rebalancer counts steps in observations: every step)
	}
	e.dropFinished()
	e.publish(true)
}

// recovered is f() with a panic turned into an error naming what.
func recovered[T any](what string, f func() (T, error)) (v T, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("engine: %s panicked: %v", what, r)
		}
	}()
	return f()
}

// resolveInflight waits for the in-flight step's tokens and delivers them.
func (e *Engine) resolveInflight() {
	if prev := e.inflight; prev != nil {
		e.inflight = nil
		e.resolve(prev)
	}
}

// resolve waits for f's tokens and delivers them to the sequences still
// running (a sequence that finished meanwhile drops its token).
func (e *Engine) resolve(f *inflight) {
	res, err := recovered("waiting for the device's tokens", f.pend.Wait)
	if err == nil && len(res) != len(f.picks) {
		err = fmt.Errorf("engine: device sampler returned %d results for %d rows", len(res), len(f.picks))
	}
	if err != nil {
		e.log.Error("device sampling failed", zap.Error(err))
	}
	now := time.Now()
	generated := 0
	for i, pk := range f.picks {
		s := pk.s
		if s.done || s.pend == 0 || pk.pos >= len(s.tokens) {
			continue
		}
		if err != nil {
			e.finish(s, FinishError, err)
			continue
		}
		tok, lp := s.sampler.result(res[i], s.text.tokenText)
		s.tokens[pk.pos] = tok
		if s.pend-1 == pk.pos {
			s.pend = 0
			if pk.pos+1 < len(s.tokens) {
				s.pend = pk.pos + 2 // the next token is still on the device
			}
		}
		e.deliverAt(s, pk.pos, lp, now)
		generated++
		if !s.done {
			e.commitBlocks(s)
		}
	}
	e.opts.Metrics.GenerationTokens(generated)
}
