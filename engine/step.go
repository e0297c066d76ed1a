package engine

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"go.uber.org/zap"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/internal/par"
)

// admitRequest turns a new request into its first sequence (choice 0; the
// other choices fork from it once the prompt is prefilled).
func (e *Engine) admitRequest(r *request) {
	s := e.newSequence(r, 0, slices.Clone(r.r.Prompt))
	r.seqs = []*sequence{s}
	e.waiting = append(e.waiting, s)
}

func (e *Engine) newSequence(r *request, index int, tokens []int32) *sequence {
	e.seqNum++
	sm := newSampler(&r.r.Sampling, index, r.r.Prompt)
	sm.vocabN = e.vocab
	if p := &r.r.Sampling; p.MinTokens > 0 {
		sm.banned = append(slices.Clone(p.StopTokenIDs), e.opts.EOS...)
		if p.IgnoreEOS {
			sm.banned = slices.Clone(p.StopTokenIDs)
		}
	}
	if p := &r.r.Sampling; p.Grammar != nil { // admission checked that the tokenizer gives bytes and an EOS exists
		sm.gram, sm.tokBytes, sm.gvocab, sm.eos, sm.met = p.Grammar(), e.tokBytes, e.gvocab(), e.opts.EOS[0], e.opts.Metrics
		if p.KeepSpecialTokens && e.gvocabSpecial != nil { // it may write special tokens
			sm.tokBytes, sm.gvocab = e.specialBytes, e.gvocabSpecial()
		}
	}
	return &sequence{
		id: NewSeqID(), req: r, index: index, tokens: tokens, prompt: len(r.r.Prompt),
		sampler: sm, text: newTextOut(e.tok, r.r.Sampling.Stop, r.r.Sampling.KeepSpecialTokens), order: e.seqNum,
	}
}

// reapAborted finishes every sequence of aborted requests and frees its blocks.
func (e *Engine) reapAborted() {
	keep := func(list []*sequence, wasWaiting bool) []*sequence {
		out := list[:0]
		for _, s := range list {
			if s.req.aborted.Load() {
				if wasWaiting && s.req.started.IsZero() && s.index == 0 {
					e.queued.Add(-1)
				}
				e.finish(s, FinishAbort, nil)
				continue
			}
			out = append(out, s)
		}
		return out
	}
	e.running = keep(e.running, false)
	e.waiting = keep(e.waiting, true)
}

// entry is one sequence's share of a step.
type entry struct {
	s      *sequence
	n      int     // tokens fed this step (with draft: 1 + len(draft))
	sample bool    // the step ends at the sequence's newest token: sample after it
	draft  []int32 // speculation: draft tokens fed after the newest token (spec.go)
}

// ensureBlocks gives s blocks for its first upto tokens.
func (e *Engine) ensureBlocks(s *sequence, upto int) bool {
	need := (upto + e.cfg.BlockSize - 1) / e.cfg.BlockSize
	for len(s.blocks) < need {
		b, ok := e.blocks.alloc()
		if !ok {
			return false
		}
		s.blocks = append(s.blocks, b)
	}
	return true
}

// preempt returns s to the front of the waiting queue and frees its blocks;
// it will be recomputed from scratch (prompt and output so far).
func (e *Engine) preempt(s *sequence) {
	e.blocks.releaseAll(s.blocks)
	s.blocks, s.hashes, s.computed = nil, nil, 0
	e.waiting = append([]*sequence{s}, e.waiting...)
	e.opts.Metrics.Preemption()
	st := e.Stats()
	st.Preemptions++
	e.stats.Store(&st)
}

// schedule picks this step's work within the token and sequence budgets.
func (e *Engine) schedule() []entry {
	budget := e.cfg.MaxNumBatchedTokens
	var plan []entry
	preempted := false
	// Running sequences first, oldest first.
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		if s.endsAtPending(e.cfg.MaxModelLen) {
			continue // overlapped decode: its token on the device is its last
		}
		n := min(len(s.tokens)-s.computed, budget)
		draft := e.draft(s, budget)
		n += len(draft)
		for !e.ensureBlocks(s, s.computed+n) {
			// Take blocks from the newest running sequence.
			last := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(last)
			preempted = true
			if last == s {
				n = 0
				break
			}
		}
		if n == 0 {
			break
		}
		plan = append(plan, entry{s: s, n: n, sample: s.computed+n-len(draft) == len(s.tokens), draft: draft})
		budget -= n
	}
	if preempted {
		return plan
	}
	// Then waiting ones by priority, FCFS within a priority.
	sort.SliceStable(e.waiting, func(a, b int) bool {
		pa, pb := e.waiting[a].req.r.Priority, e.waiting[b].req.r.Priority
		return pa < pb || (pa == pb && e.waiting[a].order < e.waiting[b].order)
	})
	for len(e.waiting) > 0 && budget > 0 && len(e.running) < e.cfg.MaxNumSeqs {
		s := e.waiting[0]
		looked := false
		if s.computed == 0 && e.cfg.PrefixCaching && len(s.blocks) == 0 && !s.req.r.Sampling.PromptLogprobs {
			// Keep at least one token to compute so the step yields logits.
			blocks, hashes := e.blocks.lookup(s.tokens, len(s.tokens)-1)
			s.blocks, s.hashes, s.computed = blocks, hashes, len(blocks)*e.cfg.BlockSize
			looked = true
		}
		n := min(len(s.tokens)-s.computed, budget)
		if !e.ensureBlocks(s, s.computed+n) {
			// Not enough memory now: undo and wait for running sequences to finish.
			e.blocks.releaseAll(s.blocks)
			s.blocks, s.hashes, s.computed = nil, nil, 0
			break
		}
		e.waiting = e.waiting[1:]
		e.running = append(e.running, s)
		if looked {
			e.blocks.countLookup(len(s.tokens)-1, s.computed)
			if s.index == 0 && s.req.started.IsZero() {
				s.req.usage.CachedTokens = s.computed
			}
		}
		if s.req.started.IsZero() {
			s.req.started = time.Now()
			e.queued.Add(-1)
		}
		plan = append(plan, entry{s: s, n: n, sample: s.computed+n == len(s.tokens)})
		budget -= n
	}
	return plan
}

// step schedules, runs one forward pass and samples.
func (e *Engine) step() {
	t0 := e.opts.Clock()
	e.spec.tick()
	stepTokens := 0 // tokens this step delivers, for speculation's meter
	plan := e.schedule()
	if len(plan) == 0 {
		// Everything running was preempted this round: admit again from
		// the waiting queue (which now holds them, their blocks freed).
		plan = e.schedule()
	}
	if len(plan) == 0 && e.inflight != nil {
		// Only sequences whose newest token is still on the device and
		// ends them (by length): deliver it.
		e.resolveInflight()
		e.dropFinished()
		e.publish(false)
		return
	}
	if len(plan) == 0 {
		// Nothing fits (e.g. every block is held by waiting forks): should
		// not happen with at least one running sequence; wait for a wake-up.
		e.publish(false)
		<-e.wake
		return
	}
	// Sample on the device when the backend can; rows that need the host
	// (needsHost: a fork, log-probabilities of changed logits) are sampled
	// there from their own logits rows, the others stay on the device.
	devSampler, _ := e.be.(backend.Sampler)
	if e.cfg.HostSampling {
		devSampler = nil
	}
	canDevice := devSampler != nil
	hostRows, promptRows := false, false
	for _, en := range plan {
		hostRows = hostRows || (en.sample && en.s.needsHost(en.n))
		promptRows = promptRows || en.s.wantsPromptLogprobs(en.n)
	}
	if promptRows { // the step's logits rows are not one a sample: all to the host
		devSampler, hostRows = nil, true
	}
	var async backend.AsyncSampler
	if !hostRows { // an overlapped step samples every row on the device
		async = e.overlapSampler(plan, devSampler)
	}
	if async == nil && e.inflight != nil {
		// This step needs the previous one's tokens on the host.
		e.resolveInflight()
		plan = slices.DeleteFunc(plan, func(en entry) bool { return en.s.done })
		if len(plan) == 0 {
			e.dropFinished()
			e.publish(false)
			return
		}
	}
	if e.cfg.SpeculativeTokens > 0 && decodeStep(plan) {
		on := e.spec.pause == 0
		defer func(seqs int) {
			before := e.spec.pauses
			if e.spec.observe(seqs, on, stepTokens, e.opts.Clock().Sub(t0)); e.spec.pauses > before {
				st := e.Stats()
				st.SpecPauses = e.spec.pauses
				e.stats.Store(&st)
				e.opts.Metrics.SpecPause()
				e.log.Debug("speculation paused: fewer tokens a second with it than without", zap.Int("sequences", seqs))
			}
		}(len(plan))
	}
	b := &backend.Batch{}
	var fed [][2]int32                  // overlapped decode: rows whose token is still on the device, and their picks
	sampleRow := make([]int, len(plan)) // each sampling entry's logits row
	var plRows []promptRow
	for k, en := range plan {
		s := en.s
		span := backend.SeqSpan{ID: s.id, Offset: len(b.Tokens), Len: en.n, Past: s.computed, Blocks: s.blocks}
		if cp := e.cfg.ContextParallel; cp > 1 && s.computed < s.prompt && s.prompt >= e.cfg.ContextParallelMin && en.n >= 2*cp {
			span.ContextParallel = cp
			e.cpTokens += int64(en.n)
			e.opts.Metrics.ContextParallelTokens(en.n)
		}
		if en.draft == nil {
			b.Seqs = append(b.Seqs, span)
		} else {
			b.Seqs = append(b.Seqs, verifySpans(span)...)
		}
		for j := 0; j < en.n; j++ {
			pos := s.computed + j
			switch {
			case s.pend != 0 && pos == s.pend-1: // still on the device: the in-flight step's pick
				fed = append(fed, [2]int32{int32(len(b.Tokens)), s.fedRow})
				b.Tokens = append(b.Tokens, 0)
			case pos >= len(s.tokens): // speculation: a draft token
				b.Tokens = append(b.Tokens, en.draft[pos-len(s.tokens)])
			default:
				b.Tokens = append(b.Tokens, s.tokens[pos])
			}
			b.Positions = append(b.Positions, int32(pos))
			if lps := s.req.promptLPs; promptRows && lps != nil && s.index == 0 && pos < len(lps) && lps[pos] == nil {
				plRows = append(plRows, promptRow{s: s, pos: pos, row: len(b.LogitRows)})
				b.LogitRows = append(b.LogitRows, len(b.Tokens)-1)
			}
		}
		if en.sample { // (with a draft: a row after the newest token and after each draft token)
			sampleRow[k] = len(b.LogitRows)
			for t := len(b.Tokens) - 1 - len(en.draft); t < len(b.Tokens); t++ {
				b.LogitRows = append(b.LogitRows, t)
			}
		}
	}
	if len(fed) > 0 {
		b.Feed = slices.Repeat([]int32{-1}, len(b.Tokens))
		for _, f := range fed {
			b.Feed[f[0]] = f[1]
		}
	}
	if async != nil {
		for _, en := range plan {
			if en.sample {
				stepTokens++ // (delivered when the next step resolves it)
			}
		}
		e.overlapStep(plan, b, async)
		return
	}
	logits, logitsT, err := e.forward(b, devSampler == nil)
	if err != nil {
		e.failStep(plan, "forward step failed", err, len(b.Tokens))
		return
	}
	V := e.vocab
	now := time.Now()
	for _, pr := range plRows { // the prompt tokens' log-probabilities
		p := &pr.s.req.r.Sampling
		pr.s.req.promptLPs[pr.pos] = logprobOf(logits[pr.row*V:(pr.row+1)*V], pr.s.tokens[pr.pos+1], p.TopLogprobs, pr.s.text.tokenText)
	}
	// Sample every sequence's next token in parallel (each sampler is
	// independent), then deliver them in order.
	var picks []pick
	var masked []int // constrained verify groups' first picks
	for k, en := range plan {
		en.s.computed += en.n - len(en.draft) // (the draft's KV counts once accepted)
		e.commitBlocks(en.s)
		if en.sample && !en.s.done {
			if len(en.draft) > 0 && en.s.sampler.gram != nil {
				masked = append(masked, len(picks))
			}
			for j := 0; j <= len(en.draft); j++ {
				row := sampleRow[k] + j
				pk := pick{s: en.s}
				if j == 0 {
					pk.draft = en.draft
				}
				if logits != nil {
					pk.logits = logits[row*V : (row+1)*V]
				}
				picks = append(picks, pk)
			}
		}
	}
	// The grammar's mask after each draft token, for the verify row there:
	// sequences in parallel, each one's rows in order.
	par.Each(len(masked), func(g int) {
		i := masked[g]
		s := picks[i].s
		sm := s.sampler
		for j := 1; j <= len(picks[i].draft); j++ {
			picks[i+j].mask = sm.maskOf(s.draftStates[j-1], make([]uint64, sm.gvocab.MaskWords()))
		}
	})
	if devSampler != nil {
		if err := e.mixedPicks(devSampler, logitsT, picks); err != nil {
			e.failStep(plan, "device sampling failed", err, len(b.Tokens))
			return
		}
	} else {
		if canDevice { // prompt log-probabilities took the whole step to the host
			e.opts.Metrics.HostSampledRows(len(picks))
		}
		parallelPicks(picks)
	}
	generated, drafted, accepts := 0, 0, 0
	for i := 0; i < len(picks); i++ {
		pk := picks[i]
		s := pk.s
		if pk.draft != nil { // speculation: the accepted draft tokens, then the model's own pick
			group := picks[i : i+len(pk.draft)+1]
			a := accepted(pk.draft, group)
			drafted, accepts = drafted+len(pk.draft), accepts+a
			s.specResult(len(pk.draft), a)
			if s.draftPred {
				s.req.usage.AcceptedPredictionTokens += a
				s.req.usage.RejectedPredictionTokens += len(pk.draft) - a
				e.opts.Metrics.Prediction(a, len(pk.draft)-a)
			}
			for j := 0; j <= a && !s.done; j++ {
				e.deliver(s, group[j].tok, group[j].lp, now)
				generated++
			}
			if !s.done {
				s.computed += a
				e.commitBlocks(s)
			}
			i += len(pk.draft)
			continue
		}
		if s.forksNow(0) {
			e.fork(s, pk.logits, now)
		}
		e.deliver(s, pk.tok, pk.lp, now)
		generated++
	}
	e.opts.Metrics.GenerationTokens(generated)
	stepTokens = generated
	if drafted > 0 {
		e.opts.Metrics.SpecDecode(drafted, accepts)
		st := e.Stats()
		st.SpecDrafted += int64(drafted)
		st.SpecAccepted += int64(accepts)
		e.stats.Store(&st)
	}
	e.takeExpertLoad()
	e.dropFinished()
	e.publish(true)
}

// endsAtPending reports whether s's newest token is still on the device
// and ends it by length (max_tokens, or maxLen tokens in all).
func (s *sequence) endsAtPending(maxLen int) bool {
	return s.pend != 0 && (len(s.tokens)-s.prompt >= s.req.r.Sampling.MaxTokens || len(s.tokens) >= maxLen)
}

// forksNow reports whether s's next sample, after n more tokens are
// computed, is its request's first (choice 0, the prompt done) with more
// choices to fork from it.
func (s *sequence) forksNow(n int) bool {
	return s.index == 0 && s.computed+n == s.prompt && len(s.req.seqs) == 1 && s.req.r.Sampling.N > 1
}

// failStep ends every sequence of the step's plan with err.
func (e *Engine) failStep(plan []entry, msg string, err error, tokens int) {
	e.log.Error(msg, zap.Error(err), zap.Int("tokens", tokens))
	for _, en := range plan {
		e.finish(en.s, FinishError, err)
	}
	e.dropFinished()
	e.publish(true)
}

// takeExpertLoad passes the expert loads the backend counted to the
// metrics and the rebalancer.
func (e *Engine) takeExpertLoad() {
	c, ok := e.be.(backend.ExpertCounter)
	if !ok || (e.opts.Metrics == nil && e.rebal == nil) {
		return
	}
	var load map[int][]int64
	if err := safely(func() { load = c.TakeExpertLoad() }); err != nil {
		e.log.Warn("reading the expert loads failed", zap.Error(err))
	}
	for layer, counts := range load {
		e.opts.Metrics.ExpertLoad(layer, counts)
		if e.rebal != nil {
			e.rebal.observe(layer, counts)
		}
	}
}

// forward runs the model, turning a panic in a backend op into an error so
// that one bad step fails its requests instead of the server. It returns
// the logits tensor, and its copy on the host when toHost.
func (e *Engine) forward(b *backend.Batch, toHost bool) (out []float32, t backend.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("engine: step panicked: %v", r)
		}
	}()
	if len(b.LogitRows) == 0 {
		b.LogitRows = []int{len(b.Tokens) - 1} // the model always returns some rows
	}
	t, err = backend.RunStep(e.be, b, func() (backend.Tensor, error) { return e.model.Forward(b) })
	if err != nil {
		return nil, nil, err
	}
	if toHost {
		out = e.be.ToHost(t)
	}
	return out, t, nil
}

// commitBlocks publishes s's newly completed blocks to the prefix cache.
func (e *Engine) commitBlocks(s *sequence) {
	if !e.cfg.PrefixCaching {
		return
	}
	bs := e.cfg.BlockSize
	known := s.computed
	if s.pend != 0 {
		known = min(known, s.pend-1) // placeholders for tokens still on the device
	}
	for full := known / bs; len(s.hashes) < full; {
		i := len(s.hashes)
		parent := uint64(0)
		if i > 0 {
			parent = s.hashes[i-1]
		}
		chunk := s.tokens[i*bs : (i+1)*bs]
		h := e.blocks.hashBlock(parent, chunk)
		e.blocks.commit(s.blocks[i], parent, h, chunk)
		s.hashes = append(s.hashes, h)
	}
}

// fork starts choices 1..N-1 of s's request from s's prefilled prompt:
// full blocks are shared, the partial last block is copied.
func (e *Engine) fork(s *sequence, logits []float32, now time.Time) {
	r := s.req
	bs := e.cfg.BlockSize
	full := s.computed / bs
	for i := 1; i < r.r.Sampling.N; i++ {
		c := e.newSequence(r, i, slices.Clone(s.tokens))
		c.computed = s.computed
		c.hashes = slices.Clone(s.hashes)
		for _, b := range s.blocks[:full] {
			e.blocks.share(b)
			c.blocks = append(c.blocks, b)
		}
		if full < len(s.blocks) {
			nb, ok := e.blocks.alloc()
			var err error
			if ok {
				err = safely(func() { e.be.CopyBlocks([]int32{s.blocks[full]}, []int32{nb}) })
				if err != nil {
					e.log.Warn("copying a forked choice's last block failed; it will be recomputed", zap.Error(err))
					e.blocks.release(nb)
				}
			}
			if !ok || err != nil {
				// No block for the copy, or the copy failed: recompute
				// this choice later.
				e.blocks.releaseAll(c.blocks)
				c.blocks, c.hashes, c.computed = nil, nil, 0
				r.seqs = append(r.seqs, c)
				e.waiting = append(e.waiting, c)
				continue
			}
			c.blocks = append(c.blocks, nb)
		}
		r.seqs = append(r.seqs, c)
		e.running = append(e.running, c)
		e.emit(c, logits, now)
	}
}

// safely runs f, turning a panic (a backend op's way to report a device
// failure) into an error, so that one failed call fails its work and not
// the server.
func safely(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("engine: %v", r)
		}
	}()
	f()
	return nil
}

// pick is one sequence's sampling work in a step.
type pick struct {
	s      *sequence
	logits []float32 // [V]
	mask   []uint64  // a verify row's grammar mask (nil: the sampler's own)
	tok    int32
	lp     *Logprob
	pos    int     // overlapped decode: the token's index in s.tokens
	draft  []int32 // speculation: the step's draft, on the first of its 1+len(draft) picks
}

// prepareMasks computes, in parallel, the grammar masks of the
// constrained sequences among seqs (sampler.allowed, memoised until their
// next token), before their sampling rows are built one by one.
func prepareMasks(seqs []*sequence) {
	var c []*sampler
	for _, s := range seqs {
		if s.sampler.gram != nil && !s.sampler.maskOK && !s.done && !slices.Contains(c, s.sampler) {
			c = append(c, s.sampler)
		}
	}
	if len(c) < 2 {
		return
	}
	par.Each(len(c), func(i int) { c[i].allowed() })
}

// parallelPicks samples every pick, spread over the cores.
func parallelPicks(picks []pick) {
	// A speculative verify step's picks (consecutive, one sequence) share a
	// sampler: they run in order in one goroutine (its scratch, and its
	// random stream in row order).
	var starts []int
	for i := range picks {
		if i == 0 || picks[i].s != picks[i-1].s {
			starts = append(starts, i)
		}
	}
	par.Each(len(starts), func(g int) {
		end := len(picks)
		if g+1 < len(starts) {
			end = starts[g+1]
		}
		for i := starts[g]; i < end; i++ {
			pk := &picks[i]
			pk.s.sampler.override = pk.mask
			pk.tok, pk.lp = pk.s.sampler.sample(pk.logits, pk.s.text.tokenText)
			pk.s.sampler.override = nil
		}
	})
}

// promptRow is a logits row whose log-probability of the next prompt token
// is asked for (SamplingParams.PromptLogprobs): position pos predicts
// token pos+1.
type promptRow struct {
	s        *sequence
	pos, row int
}

// wantsPromptLogprobs reports whether a step of s computing its next n
// positions computes prompt positions whose log-probabilities are still
// wanted.
func (s *sequence) wantsPromptLogprobs(n int) bool {
	lps := s.req.promptLPs
	if lps == nil || s.index != 0 {
		return false
	}
	for pos := s.computed; pos < min(s.computed+n, len(lps)); pos++ {
		if lps[pos] == nil {
			return true
		}
	}
	return false
}

// needsHost reports whether s's next sample, after n more tokens are
// computed, must be taken on the host: it forks (the siblings are drawn
// from the same host logits), or it asks for log-probabilities (of the
// raw logits) while a logit_bias, a grammar or min_tokens changes its
// logits — the device sampler would return those of the changed ones.
func (s *sequence) needsHost(n int) bool {
	return s.forksNow(n) || (s.req.r.Sampling.Logprobs && s.processed())
}

// processed reports whether s's logits change before sampling: a
// logit_bias, a grammar, or min_tokens not yet reached.
func (s *sequence) processed() bool {
	return len(s.req.r.Sampling.LogitBias) > 0 || s.sampler.gram != nil || s.sampler.banning()
}

// needsResolved reports whether building s's next sampling row needs its
// previous tokens on the host: its grammar's state (the mask), or
// min_tokens' count (the ban).
func (s *sequence) needsResolved() bool {
	return s.sampler.gram != nil || s.req.r.Sampling.MinTokens > 0
}

// mixedPicks samples the picks (logits rows of logitsT in pick order) on
// the device, except those that need the host: only their rows are copied
// back and sampled there, so one constrained request does not bring a whole
// batch's logits to the host.
func (e *Engine) mixedPicks(ds backend.Sampler, logitsT backend.Tensor, picks []pick) error {
	var dev, host []int
	for i := range picks {
		if picks[i].s.needsHost(0) {
			host = append(host, i)
		} else {
			dev = append(dev, i)
		}
	}
	if len(host) == 0 {
		return devicePicks(ds, logitsT, picks)
	}
	e.opts.Metrics.HostSampledRows(len(host))
	sub := func(idx []int) []pick {
		out := make([]pick, len(idx))
		for j, i := range idx {
			out[j] = picks[i]
		}
		return out
	}
	if len(dev) > 0 {
		var rows backend.Tensor
		if err := safely(func() { rows = e.be.Rows(logitsT, dev) }); err != nil {
			return err
		}
		dp := sub(dev)
		if err := devicePicks(ds, rows, dp); err != nil {
			return err
		}
		for j, i := range dev {
			picks[i] = dp[j]
		}
	}
	var hl []float32
	if err := safely(func() { hl = e.be.ToHost(e.be.Rows(logitsT, host)) }); err != nil {
		return err
	}
	V := e.vocab
	hp := sub(host)
	for j := range hp {
		hp[j].logits = hl[j*V : (j+1)*V]
	}
	parallelPicks(hp)
	for j, i := range host {
		picks[i] = hp[j]
	}
	return nil
}

// devicePicks samples every pick on the device: one SampleRow per pick, in
// logits row order, with the uniform draw taken from each sequence's own
// generator exactly when the host sampler would take it.
func devicePicks(ds backend.Sampler, logits backend.Tensor, picks []pick) (err error) {
	if len(picks) == 0 {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("engine: device sampling panicked: %v", r)
		}
	}()
	seqs := make([]*sequence, len(picks))
	for i := range picks {
		seqs[i] = picks[i].s
	}
	prepareMasks(seqs)
	rows := make([]backend.SampleRow, len(picks))
	for i := range picks {
		sm := picks[i].s.sampler
		sm.override = picks[i].mask
		rows[i] = sm.row()
		sm.override = nil
	}
	res := ds.Sample(logits, rows)
	if len(res) != len(picks) {
		return fmt.Errorf("engine: device sampler returned %d results for %d rows", len(res), len(picks))
	}
	for i := range picks {
		pk := &picks[i]
		pk.tok, pk.lp = pk.s.sampler.result(res[i], pk.s.text.tokenText)
	}
	return nil
}

// emit samples s's next token from logits and streams it.
func (e *Engine) emit(s *sequence, logits []float32, now time.Time) {
	tok, lp := s.sampler.sample(logits, s.text.tokenText)
	e.deliver(s, tok, lp, now)
}

// deliver appends a sampled token to s and streams it.
func (e *Engine) deliver(s *sequence, tok int32, lp *Logprob, now time.Time) {
	s.tokens = append(s.tokens, tok)
	e.deliverAt(s, len(s.tokens)-1, lp, now)
}

// deliverAt streams token pos of s (in s.tokens: the newest, or with
// overlapped decode one whose later tokens are still on the device) and
// ends s when it stops there; placeholders after it are then dropped.
func (e *Engine) deliverAt(s *sequence, pos int, lp *Logprob, now time.Time) {
	p := &s.req.r.Sampling
	tok := s.tokens[pos]
	s.sampler.observe(tok)
	if err := s.sampler.gramFail; err != nil {
		s.tokens = s.tokens[:pos]
		e.finish(s, FinishError, fmt.Errorf("engine: %w", err))
		return
	}
	if s.sampler.gramErr && !slices.Contains(e.opts.EOS, tok) && !slices.Contains(p.StopTokenIDs, tok) {
		// A token the grammar's mask excluded: a sampler that ignored it.
		s.tokens = s.tokens[:pos]
		e.finish(s, FinishError, fmt.Errorf("engine: token %d was sampled though the output's grammar refuses it", tok))
		return
	}
	r := s.req
	r.usage.CompletionTokens++
	if r.firstTok.IsZero() {
		r.firstTok = now
	} else if !s.lastTok.IsZero() {
		e.opts.Metrics.InterTokenLatency(now.Sub(s.lastTok))
	}
	s.lastTok = now
	ev := Event{Index: s.index, TokenIDs: []int32{tok}}
	if lp != nil {
		ev.Logprobs = []Logprob{*lp}
	}
	out := pos + 1 - s.prompt
	if out == 1 && r.promptLPs != nil { // the choice's first event carries the prompt's
		ev.PromptLogprobs = make([]Logprob, len(r.promptLPs))
		for j, x := range r.promptLPs {
			if x != nil {
				ev.PromptLogprobs[j] = *x
			}
		}
	}
	reason := ""
	isStop := (!p.IgnoreEOS && slices.Contains(e.opts.EOS, tok)) || slices.Contains(p.StopTokenIDs, tok)
	if isStop {
		reason = FinishStop
	} else {
		text, hit, err := s.text.add(tok)
		if err != nil {
			e.finish(s, FinishError, err)
			return
		}
		ev.Text = text
		if hit {
			reason = FinishStop
		}
	}
	if reason == "" && (out >= p.MaxTokens || pos+1 >= e.cfg.MaxModelLen) {
		reason = FinishLength
	}
	if reason == "" {
		r.out.push(ev)
		return
	}
	s.tokens = s.tokens[:pos+1]
	if reason != FinishStop || isStop {
		ev.Text += s.text.flush()
	}
	e.finishWith(s, reason, nil, ev)
}

// finish ends s with reason, emitting a final event.
func (e *Engine) finish(s *sequence, reason string, err error) {
	ev := Event{Index: s.index}
	if reason != FinishAbort && reason != FinishError {
		ev.Text = s.text.flush()
	}
	e.finishWith(s, reason, err, ev)
}

// finishWith ends s with ev as its last event; the request's last sequence
// also carries the usage and closes the stream.
func (e *Engine) finishWith(s *sequence, reason string, err error, ev Event) {
	if s.done {
		return
	}
	s.done = true
	e.blocks.releaseAll(s.blocks)
	s.blocks = nil
	r := s.req
	ev.FinishReason = reason
	if err != nil {
		ev.Err = err
		r.failure = err
	}
	r.finished++
	// Choices not yet forked (still only choice 0) count as finished with it
	// when the request ends before its prompt was prefilled.
	if len(r.seqs) == 1 && r.r.Sampling.N > 1 && (reason == FinishAbort || reason == FinishError) {
		r.finished = r.r.Sampling.N
	}
	if r.finished < r.r.Sampling.N {
		r.out.push(ev)
		return
	}
	u := r.usage
	ev.Usage = &u
	r.out.push(ev)
	r.out.close()
	now := time.Now()
	queue := time.Duration(0)
	if !r.started.IsZero() {
		queue = r.started.Sub(r.arrival)
	}
	ttft := time.Duration(0)
	if !r.firstTok.IsZero() {
		ttft = r.firstTok.Sub(r.arrival)
	}
	m := e.opts.Metrics
	m.PromptTokens(u.PromptTokens)
	m.RequestFinished(reason, queue, ttft, now.Sub(r.arrival))
	for _, c := range r.seqs {
		if !c.done { // an aborted request's other choices
			c.done = true
			e.blocks.releaseAll(c.blocks)
			c.blocks = nil
		}
	}
}

// dropFinished removes finished sequences from the running list.
func (e *Engine) dropFinished() {
	e.running = slices.DeleteFunc(e.running, func(s *sequence) bool { return s.done })
	e.waiting = slices.DeleteFunc(e.waiting, func(s *sequence) bool { return s.done })
}

// publish updates Stats and the gauges; stepped counts a forward pass.
func (e *Engine) publish(stepped bool) {
	old := e.Stats()
	steps := old.Steps
	if stepped {
		steps++
	}
	st := Stats{
		Running: len(e.running), Waiting: len(e.waiting) + int(e.queuedIncoming()),
		BlocksFree: e.blocks.available(), BlocksUsed: e.blocks.numBlocks() - e.blocks.available(),
		PrefixQueries: e.blocks.queries, PrefixHits: e.blocks.hits,
		Steps: steps, Preemptions: old.Preemptions, ContextParallelTokens: e.cpTokens,
		OverlappedSteps: old.OverlappedSteps, SpecDrafted: old.SpecDrafted, SpecAccepted: old.SpecAccepted, SpecPauses: e.spec.pauses,
	}
	if e.rebal != nil {
		st.ExpertPlacements = e.rebal.moves
	}
	e.stats.Store(&st)
	m := e.opts.Metrics
	m.SetRunning(st.Running)
	m.SetWaiting(st.Waiting)
	m.SetKVCacheUsage(e.blocks.usage())
	if dq, dh := st.PrefixQueries-old.PrefixQueries, st.PrefixHits-old.PrefixHits; dq > 0 {
		m.PrefixCache(dq, dh)
	}
}

func (e *Engine) queuedIncoming() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.incoming)
}
