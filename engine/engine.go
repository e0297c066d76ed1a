package engine

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/grammar"
	"github.com/mkserve/mkserve/metrics"
	"github.com/mkserve/mkserve/models"
)

// Options wire an Engine to its surroundings.
type Options struct {
	Name    string           // served model name
	EOS     []int32          // end-of-sequence tokens (generation_config / config)
	Metrics *metrics.Metrics // nil: none
	Logger  *zap.Logger      // nil: none
	// Clock times steps for speculation's cost check (spec.go's
	// specMeter); nil: time.Now. Tests give a fake one (one that stands
	// still turns the check off).
	Clock func() time.Time
}

// Engine runs continuous batching over one model: requests join and leave
// the running batch at every step, each step spends a token budget on
// decode tokens first and prompt chunks after (chunked prefill falls out of
// the budget), KV lives in a paged cache with prefix sharing, and blocks
// that run out are reclaimed by preempting the newest sequence (it is
// recomputed later; users never see an error).
//
// One goroutine (the step loop) owns the model, the backend and all
// scheduling state; Generate only queues work and wakes it.
type Engine struct {
	model models.Model
	be    backend.Backend
	tok   Detokenizer
	// tokBytes gives each token's raw bytes (tok as a TokenByter that has
	// them); nil: constrained requests are refused.
	tokBytes func(int32) []byte
	// gvocab is the vocabulary arranged for grammar masks, built once
	// (off the step loop at start) when tokBytes is set.
	gvocab func() *grammar.Vocab
	// specialBytes and gvocabSpecial are tokBytes and gvocab with special
	// tokens' bytes too (but never an end-of-sequence token's), for
	// constrained requests that keep special tokens; built on first use.
	specialBytes  func(int32) []byte
	gvocabSpecial func() *grammar.Vocab
	cfg           Config
	opts          Options
	vocab         int
	blocks        *blockManager
	log           *zap.Logger

	mu       sync.Mutex
	incoming []*request
	draining bool
	queued   atomic.Int64 // requests not yet scheduled (incoming + waiting), for MaxQueue
	abortAll atomic.Bool  // Shutdown's deadline passed: abort everything
	wake     chan struct{}
	done     chan struct{}

	// Owned by the step loop.
	waiting  []*sequence
	running  []*sequence
	seqNum   uint64
	cpTokens int64       // prompt tokens prefilled with context parallelism
	rebal    *rebalancer // nil: expert rebalancing off
	inflight *inflight   // overlapped decode: the step whose tokens are still on the device
	spec     specMeter   // speculation's measured cost (spec.go)
	stats    atomic.Pointer[Stats]
}

// Stats is a snapshot of the engine's state after its latest step.
type Stats struct {
	Running, Waiting       int
	BlocksUsed, BlocksFree int
	PrefixQueries          int   // prompt tokens looked up in the prefix cache
	PrefixHits             int   // of which were found
	Steps                  int64 // forward passes (failed ones too)
	Preemptions            int64
	ContextParallelTokens  int64 // prompt tokens prefilled with ring attention (Config.ContextParallel)
	ExpertPlacements       int64 // per-layer expert placements installed by the rebalancer (Config.RebalanceEvery)
	OverlappedSteps        int64 // steps launched before the previous step's tokens reached the host (Config.SyncSteps off)
	SpecDrafted            int64 // draft tokens verified (Config.SpeculativeTokens)
	SpecAccepted           int64 // of which were accepted
	SpecPauses             int64 // times every sequence stopped drafting because steps with drafts measured slower
}

// New sizes the paged KV cache from cfg.KVCacheBytes, initialises it on be,
// and starts the step loop. Close it with Shutdown.
func New(m models.Model, be backend.Backend, tok Detokenizer, cfg Config, o Options) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	mc := m.Config()
	if cfg.MaxModelLen == 0 {
		cfg.MaxModelLen = mc.MaxPositions
		if cfg.MaxModelLen <= 0 {
			cfg.MaxModelLen = 4096
		}
	}
	elem := int64(4) // float32, unless the backend says otherwise
	alloc, _ := be.(backend.KVAllocator)
	if alloc != nil {
		elem = int64(alloc.KVElemBytes())
	}
	perToken := int64(m.KVFloatsPerToken()) * elem
	numBlocks := int(cfg.KVCacheBytes / (perToken * int64(cfg.BlockSize)))
	if numBlocks < 2 {
		return nil, fmt.Errorf("kv_cache_bytes %d holds %d blocks of %d tokens (%d bytes a token); need at least 2", cfg.KVCacheBytes, numBlocks, cfg.BlockSize, perToken)
	}
	if tokens := numBlocks * cfg.BlockSize; cfg.MaxModelLen > tokens {
		cfg.MaxModelLen = tokens // one sequence can never outgrow the pool
	}
	if err := be.InitKV(cfg.BlockSize, numBlocks); err != nil {
		return nil, err
	}
	if alloc != nil {
		if err := alloc.AllocKV(m.KVWidths()); err != nil {
			return nil, fmt.Errorf("kv_cache_bytes %d (%d blocks of %d tokens): %w", cfg.KVCacheBytes, numBlocks, cfg.BlockSize, err)
		}
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if cfg.GraphWarmup {
		warmGraphs(m, be, cfg.MaxNumSeqs, o.Logger)
	}
	rb, err := newRebalancer(cfg, be, o.Logger, o.Metrics)
	if err != nil {
		return nil, err
	}
	e := &Engine{rebal: rb,
		model: m, be: be, tok: tok, cfg: cfg, opts: o, vocab: mc.VocabSize,
		blocks: newBlockManager(numBlocks, cfg.BlockSize), log: o.Logger,
		wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	if tb, ok := tok.(TokenByter); ok && tb.HasTokenBytes() {
		e.tokBytes = tb.TokenBytes
		e.gvocab = sync.OnceValue(func() *grammar.Vocab { return grammar.NewVocab(e.vocab, tb.TokenBytes) })
		if st, ok := tok.(SpecialTokenByter); ok {
			e.specialBytes = func(id int32) []byte {
				if slices.Contains(e.opts.EOS, id) {
					return nil
				}
				return st.SpecialTokenBytes(id)
			}
			e.gvocabSpecial = sync.OnceValue(func() *grammar.Vocab { return grammar.NewVocab(e.vocab, e.specialBytes) })
		}
		// Build the tables now, off the step loop: the first constrained
		// request would otherwise stall a step while they are made.
		go e.gvocab()
	}
	e.stats.Store(&Stats{BlocksFree: numBlocks})
	go e.loop()
	return e, nil
}

// ModelName implements Generator.
func (e *Engine) ModelName() string { return e.opts.Name }

// MaxContext implements Generator.
func (e *Engine) MaxContext() int { return e.cfg.MaxModelLen }

// Config is the engine's effective configuration (defaults filled in).
func (e *Engine) Config() Config { return e.cfg }

// Stats returns the state after the latest step.
func (e *Engine) Stats() Stats { return *e.stats.Load() }

// request is one Generate call: one or more sequences (choices) sharing a
// prompt and an output stream.
type request struct {
	r        *Request
	out      *outbox
	aborted  atomic.Bool
	seqs     []*sequence // choice 0 first; the others after the prompt is prefilled
	finished int
	usage    Usage
	arrival  time.Time
	started  time.Time // first scheduled
	firstTok time.Time
	failure  error
	// promptLPs: SamplingParams.PromptLogprobs' records, position j for
	// prompt token j+1, filled as the prompt's chunks are computed.
	promptLPs []*Logprob
	// pt is the prediction's text (spec.go predText), built at the first
	// draft from it (ptDone); nil without token bytes.
	pt     *predText
	ptDone bool
}

// sequence is one choice being generated.
type sequence struct {
	id       uint64
	req      *request
	index    int
	tokens   []int32 // prompt, then output
	prompt   int
	computed int // tokens whose KV is in the cache
	blocks   []int32
	hashes   []uint64 // hash chain of the full blocks committed so far
	sampler  *sampler
	text     *textOut
	order    uint64 // admission order (FCFS within a priority)
	lastTok  time.Time
	done     bool
	// Overlapped decode: pend is 1 + the position of the oldest token of
	// tokens still on the device (a placeholder until the step that sampled
	// it is resolved; the later tokens are placeholders too), 0 when none;
	// fedRow is the row of the newest one in the in-flight step's picks.
	pend   int
	fedRow int32
	// Speculation (spec.go): draft tokens verified and accepted since the
	// last look at the acceptance rate, and decode steps to go without
	// drafting (after a poor rate, or no draft found).
	specDrafted, specAccepted, specPause int
	// A request's prediction (Request.Prediction): this step's draft came
	// from it (draftPred), and the last such draft started at
	// prediction[predAt] when the output was predOut tokens long.
	draftPred       bool
	predAt, predOut int
	// Where the output has reached in the prediction's text: predByte
	// bytes, its first predTok tokens accounted for; predOff once its
	// bytes left the text (until a draft finds the prediction again).
	predByte, predTok int
	predOff           bool
	predInside        bool // this step's output ends inside a token of the prediction
	// draftStates are a constrained sequence's grammar after each token
	// of its step's draft (draftStates[j]: after draft[:j+1]), for the
	// masks of the verify rows after them.
	draftStates []grammar.Validator
}

// Generate implements Generator.
func (e *Engine) Generate(ctx context.Context, r *Request) (<-chan Event, error) {
	if r == nil {
		return nil, fmt.Errorf("nil request")
	}
	p := r.Sampling
	p.Defaults()
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if len(r.Prompt) == 0 {
		return nil, fmt.Errorf("prompt must contain at least one token")
	}
	for i, t := range r.Prompt {
		if t < 0 || int(t) >= e.vocab {
			return nil, fmt.Errorf("prompt token %d at position %d is outside the vocabulary [0, %d)", t, i, e.vocab)
		}
	}
	if len(r.Prediction) > MaxPredictionTokens {
		return nil, fmt.Errorf("prediction of %d tokens; at most %d are allowed", len(r.Prediction), MaxPredictionTokens)
	}
	for i, t := range r.Prediction {
		if t < 0 || int(t) >= e.vocab {
			return nil, fmt.Errorf("prediction token %d at position %d is outside the vocabulary [0, %d)", t, i, e.vocab)
		}
	}
	for t := range p.LogitBias {
		if int(t) >= e.vocab {
			return nil, fmt.Errorf("logit_bias: token id %d is outside the vocabulary [0, %d)", t, e.vocab)
		}
	}
	if p.Grammar != nil && e.tokBytes == nil {
		return nil, fmt.Errorf("%w: its tokenizer does not give its tokens' bytes", ErrGrammarUnsupported)
	}
	if p.Grammar != nil && len(e.opts.EOS) == 0 {
		return nil, fmt.Errorf("%w: it has no end-of-sequence token to end the text with", ErrGrammarUnsupported)
	}
	if p.Grammar != nil && p.KeepSpecialTokens && e.gvocabSpecial != nil {
		e.gvocabSpecial() // built here, on the caller's goroutine, not in a step
	}
	if len(r.Prompt)+p.MaxTokens > e.cfg.MaxModelLen {
		return nil, fmt.Errorf("%w: %d prompt tokens + max_tokens %d > %d", ErrTooLong, len(r.Prompt), p.MaxTokens, e.cfg.MaxModelLen)
	}
	req := &request{r: r, arrival: r.Arrival}
	if p.PromptLogprobs {
		req.promptLPs = make([]*Logprob, len(r.Prompt)-1)
	}
	if req.arrival.IsZero() {
		req.arrival = time.Now()
	}
	rc := *r
	rc.Sampling = p
	req.r = &rc
	req.usage.PromptTokens = len(r.Prompt)

	e.mu.Lock()
	if e.draining {
		e.mu.Unlock()
		return nil, ErrDraining
	}
	if int(e.queued.Load()) >= e.cfg.MaxQueue {
		e.mu.Unlock()
		return nil, ErrQueueFull
	}
	e.queued.Add(1)
	ch := make(chan Event, 16)
	req.out = newOutbox(ch)
	e.incoming = append(e.incoming, req)
	e.mu.Unlock()
	go req.out.pump(ctx, func() { req.aborted.Store(true); e.poke() })
	e.poke()
	return ch, nil
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Shutdown stops accepting requests, lets running and queued ones finish
// until ctx ends, aborts the rest, and stops the step loop.
func (e *Engine) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.draining = true
	e.mu.Unlock()
	e.poke()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
	}
	e.mu.Lock()
	for _, r := range e.incoming {
		r.aborted.Store(true)
	}
	e.mu.Unlock()
	// Abort whatever the loop holds; it exits once empty.
	e.abortAll.Store(true)
	e.poke()
	<-e.done
	return ctx.Err()
}

// ───────────────────────────── step loop ─────────────────────────────

func (e *Engine) loop() {
	defer close(e.done)
	for {
		e.mu.Lock()
		in := e.incoming
		e.incoming = nil
		draining := e.draining
		e.mu.Unlock()
		for _, r := range in {
			e.admitRequest(r)
		}
		if e.abortAll.Load() {
			for _, s := range slices.Concat(e.running, e.waiting) {
				s.req.aborted.Store(true)
			}
		}
		e.reapAborted()
		if len(e.running) == 0 && len(e.waiting) == 0 {
			if e.inflight != nil { // every sequence of it finished (aborted)
				if err := safely(e.resolveInflight); err != nil {
					e.failAll(err)
				}
			}
			e.publish(false)
			if draining {
				e.mu.Lock()
				empty := len(e.incoming) == 0
				e.mu.Unlock()
				if empty {
					return
				}
				continue
			}
			<-e.wake
			continue
		}
		if err := safely(e.step); err != nil {
			e.failAll(err)
		}
	}
}

// failAll ends every running and waiting sequence with err after a step
// panicked (a bug, or a backend failure nothing else caught): the step's
// state cannot be trusted, so its requests fail and their blocks return,
// and the engine serves the requests that come next.
func (e *Engine) failAll(err error) {
	e.log.Error("engine step failed; failing the requests in flight", zap.Error(err), zap.Stack("stack"))
	for _, s := range slices.Concat(e.running, e.waiting) {
		if serr := safely(func() { e.finish(s, FinishError, err) }); serr != nil {
			e.log.Error("failing a request", zap.Error(serr))
		}
	}
	e.dropFinished()
	e.running, e.waiting = nil, nil
	e.inflight = nil
	e.publish(false)
}
