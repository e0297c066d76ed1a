package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"go.uber.org/zap"

	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
)

// statusClientClosed is logged for requests whose client went away
// (nginx's convention; never sent).
const statusClientClosed = 499

// call is the state of one generation request: what its log line reports.
type call struct {
	s        *Server
	endpoint string
	id       string
	start    time.Time
	model    string
	stream   bool
	n        int
	prompts  []string // logged when Options.LogPrompts
	status   int
	errMsg   string // what the client was told
	cause    error  // what went wrong inside (never sent)
	first    time.Time
	usage    engine.Usage
	finishes []string
	// errBody shapes an error the call answers with (nil: OpenAI's;
	// ollama's and Anthropic's endpoints set their own).
	errBody func(*apiError) any
}

func (s *Server) newCall(c *gin.Context, endpoint, idPrefix string) *call {
	k := &call{s: s, endpoint: endpoint, id: newID(idPrefix), start: time.Now(), status: http.StatusOK}
	c.Header("X-Request-Id", k.id)
	return k
}

// fail answers with e, unless the response has started (a stream).
// apiRequest is what both generation endpoints decode: a body embedding
// sampling, with its own checks.
type apiRequest interface {
	check() *apiError
	common() *sampling
}

// begin admits, reads, decodes and checks a generation request of type R,
// failing the call (and returning false) at the first problem.
func begin[T any, R interface {
	*T
	apiRequest
}](s *Server, c *gin.Context, k *call) (R, bool) {
	req := R(new(T))
	if e := s.admitBody(c, req); e != nil {
		k.fail(c, e)
		return nil, false
	}
	sp := req.common()
	k.model, k.stream = sp.Model, sp.streaming()
	if e := s.checkModel(sp.Model); e != nil {
		k.fail(c, e)
		return nil, false
	}
	if e := req.check(); e != nil {
		k.fail(c, e)
		return nil, false
	}
	return req, true
}

// admitBody admits a generation request and decodes its body into v.
func (s *Server) admitBody(c *gin.Context, v any) *apiError {
	if e := s.admit(); e != nil {
		return e
	}
	body, e := s.readBody(c)
	if e != nil {
		return e
	}
	return decodeBody(body, v)
}

func (k *call) fail(c *gin.Context, e *apiError) {
	k.status, k.errMsg = e.Status, e.Message
	switch {
	case c.Writer.Written():
	case k.errBody != nil:
		writeJSON(c, e.Status, k.errBody(e))
	default:
		writeError(c, e)
	}
}

// done writes the request's log line.
func (k *call) done() {
	lvl := zap.InfoLevel
	if k.status >= 500 && k.status != statusClientClosed {
		lvl = zap.ErrorLevel
	}
	ce := k.s.log.Check(lvl, "request")
	if ce == nil {
		return
	}
	model := k.model
	if model == "" {
		model = k.s.gen.ModelName()
	}
	f := []zap.Field{
		zap.String("id", k.id),
		zap.String("endpoint", k.endpoint),
		zap.String("model", model),
		zap.Int("status", k.status),
		zap.Bool("stream", k.stream),
		zap.Int("n", k.n),
		zap.Int("prompt_tokens", k.usage.PromptTokens),
		zap.Int("completion_tokens", k.usage.CompletionTokens),
		zap.Int("cached_tokens", k.usage.CachedTokens),
		zap.Duration("latency", time.Since(k.start)),
		zap.Strings("finish_reasons", k.finishes),
	}
	if u := k.usage; u.AcceptedPredictionTokens+u.RejectedPredictionTokens > 0 {
		f = append(f, zap.Int("accepted_prediction_tokens", u.AcceptedPredictionTokens),
			zap.Int("rejected_prediction_tokens", u.RejectedPredictionTokens))
	}
	if !k.first.IsZero() {
		f = append(f, zap.Duration("ttft", k.first.Sub(k.start)))
	}
	if k.errMsg != "" {
		f = append(f, zap.String("error", k.errMsg))
	}
	if k.cause != nil {
		f = append(f, zap.NamedError("cause", k.cause))
	}
	if k.s.opts.LogPrompts && k.prompts != nil {
		f = append(f, zap.Strings("prompt", k.prompts))
	}
	ce.Write(f...)
}

// fitContext checks a prompt of n tokens against the model's context and
// returns the completion length to ask for: max when given (0: not given;
// then def, shortened to fit, or everything left when def is 0).
func (s *Server) fitContext(n, max, def int, promptParam, maxParam string) (int, *apiError) {
	limit := s.gen.MaxContext()
	if limit <= 0 { // unknown: leave it to the engine
		if max == 0 {
			max = def
		}
		if max == 0 {
			return 0, invalid("max_tokens", "max_tokens is required: the server does not know the model's context length")
		}
		return max, nil
	}
	if n >= limit {
		return 0, invalid(promptParam, "this model's maximum context length is %d tokens, and the %s has %d; shorten it",
			limit, promptParam, n)
	}
	if max == 0 {
		max = limit - n
		if def > 0 {
			max = min(def, max)
		}
		return max, nil
	}
	if n+max > limit {
		return 0, invalid(maxParam, "this model's maximum context length is %d tokens; %d in the %s plus %s=%d exceed it",
			limit, n, promptParam, maxParam, max)
	}
	return max, nil
}

// submit queues every request; if one is refused, those already queued are
// cancelled and its error returned.
func (s *Server) submit(ctx context.Context, cancel context.CancelFunc, reqs []*engine.Request) ([]<-chan engine.Event, error) {
	chans := make([]<-chan engine.Event, 0, len(reqs))
	for _, r := range reqs {
		ch, err := s.gen.Generate(ctx, r)
		if err != nil {
			cancel()
			for _, c := range chans {
				go drain(c)
			}
			return nil, err
		}
		if ch == nil {
			cancel()
			return nil, fmt.Errorf("engine returned no event channel for %s", r.ID)
		}
		chans = append(chans, ch)
	}
	return chans, nil
}

// drain reads ch to its end so the engine is never blocked on a reader
// that left.
func drain(ch <-chan engine.Event) {
	for range ch {
	}
}

// promptEvent is an event of the request of one prompt.
type promptEvent struct {
	prompt int
	ev     engine.Event
}

// merge forwards the events of every channel into one, until ctx ends; a
// channel left behind is drained in the background.
func merge(ctx context.Context, chans []<-chan engine.Event) <-chan promptEvent {
	out := make(chan promptEvent)
	var wg sync.WaitGroup
	for p, ch := range chans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range ch {
				select {
				case out <- promptEvent{p, ev}:
				case <-ctx.Done():
					drain(ch)
					return
				}
			}
		}()
	}
	go func() { wg.Wait(); close(out) }()
	return out
}

// errClientGone reports that the client cancelled (disconnected).
var errClientGone = errors.New("client closed the request")

// run consumes the events of every prompt's request and calls emit with
// each, numbering choices as OpenAI does (prompt*n + index). It returns the
// summed usage; an error means the engine failed a choice, emit failed, or
// the client left (errClientGone). promptLens are the prompts' lengths.
func (k *call) run(ctx context.Context, cancel context.CancelFunc, chans []<-chan engine.Event, n int, promptLens []int,
	emit func(choice int, ev *engine.Event) error) (engine.Usage, error) {
	defer cancel()
	k.finishes = make([]string, len(chans)*n)
	counted := make([]int, len(chans)) // completion tokens seen per prompt
	usage := make([]*engine.Usage, len(chans))
	var failure error
	for pe := range merge(ctx, chans) {
		ev := &pe.ev
		if ev.Index < 0 || ev.Index >= n {
			failure = fmt.Errorf("engine sent choice index %d for a request with n=%d", ev.Index, n)
			break
		}
		choice := pe.prompt*n + ev.Index
		if k.first.IsZero() && (len(ev.TokenIDs) > 0 || ev.Text != "") {
			k.first = time.Now()
		}
		counted[pe.prompt] += len(ev.TokenIDs)
		if ev.Usage != nil {
			u := *ev.Usage
			usage[pe.prompt] = &u
		}
		if ev.FinishReason == engine.FinishError || ev.Err != nil {
			failure = ev.Err
			if failure == nil {
				failure = fmt.Errorf("engine failed choice %d", choice)
			}
			break
		}
		if ev.FinishReason != "" {
			k.finishes[choice] = ev.FinishReason
		}
		if err := emit(choice, ev); err != nil {
			failure = fmt.Errorf("writing the response: %w", err)
			break
		}
	}
	var total engine.Usage
	for p := range chans {
		if u := usage[p]; u != nil {
			total.PromptTokens += u.PromptTokens
			total.CompletionTokens += u.CompletionTokens
			total.CachedTokens += u.CachedTokens
			total.AcceptedPredictionTokens += u.AcceptedPredictionTokens
			total.RejectedPredictionTokens += u.RejectedPredictionTokens
		} else {
			total.PromptTokens += promptLens[p]
			total.CompletionTokens += counted[p]
		}
	}
	k.usage = total
	if failure != nil {
		return total, failure
	}
	for i, f := range k.finishes {
		if f == "" {
			if ctx.Err() != nil {
				return total, errClientGone
			}
			return total, fmt.Errorf("engine closed choice %d without a finish reason", i)
		}
	}
	return total, nil
}

// finishGeneration records how run ended and answers a failure (for a
// non-streaming request; streams report errors in-band).
func (k *call) finishGeneration(c *gin.Context, err error) {
	switch {
	case err == nil:
	case errors.Is(err, errClientGone) || c.Request.Context().Err() != nil:
		k.status, k.errMsg = statusClientClosed, errClientGone.Error()
	default:
		k.cause = err
		k.fail(c, runError(err))
	}
}

// runError is what a client is told of a generation that failed once
// running: the grammar's fault (a 400) or the server's (a 500 that reveals
// nothing).
func runError(err error) *apiError {
	if errors.Is(err, grammar.ErrGrammarTooComplex) {
		return generateError(err, "")
	}
	return errInternal
}

// engineRequestID names prompt p's engine request.
func engineRequestID(id string, p, prompts int) string {
	if prompts == 1 {
		return id
	}
	return id + "-" + strconv.Itoa(p)
}
