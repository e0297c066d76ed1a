// Package grpcapi serves the mkserve.v1.Inference gRPC service on an
// engine.Generator: Generate (unary), GenerateStream (one message per
// engine event) and BatchGenerate (many prompts, each prompt's result sent
// as soon as it finishes), plus the standard health and reflection
// services.
//
// Data flow: GenerateRequest → prepare (validate, tokenize, defaults;
// FieldError or ErrTooLong) → engine.Generate(ctx = the RPC's context) →
// events → response messages. Every error leaves through ToStatus, the
// one table mapping errors to codes. Cancelling the RPC cancels the
// engine request.
package grpcapi

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/engine"
	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
	"github.com/mkserve/mkserve/tokenizer"
)

// Options tune a Server; the zero value is usable.
type Options struct {
	// Logger receives one line per RPC from the interceptors (nil: none).
	Logger *zap.Logger
	// Registerer gets the per-method RPC count and latency collectors
	// (nil: not recorded). Several Servers may share one.
	Registerer prometheus.Registerer
	// Defaults are the model's sampling defaults (generation_config.json),
	// used for parameters a request leaves unset; nil: OpenAI's.
	Defaults *engine.SamplingDefaults
	// DefaultMaxTokens is max_tokens when a request leaves it unset,
	// capped by what the context has left (0: what the context has left).
	DefaultMaxTokens int
	// CompactJSON holds JSON-constrained output to compact whitespace (at
	// most one space between tokens, no newlines; json_whitespace compact).
	CompactJSON bool
	// MaxBatch bounds the requests of one BatchGenerate (0 or more than
	// the package's MaxBatch: MaxBatch).
	MaxBatch int
	// BatchParallel bounds how many requests of one BatchGenerate are in
	// the engine at once (0: 256); the rest wait in the server, not in the
	// engine's queue.
	BatchParallel int
	// Template is the checkpoint's chat template, for requests that send a
	// Chat (nil: they get InvalidArgument).
	Template *chat.Template
}

// Server implements pb.InferenceServer.
type Server struct {
	pb.UnimplementedInferenceServer
	gen    engine.Generator
	tok    *tokenizer.Tokenizer
	opts   Options
	log    *zap.Logger
	health *health.Server
	rpc    *rpcMetrics // nil: no RPC metrics
}

// serviceName is the name health reports under, beside "" (the server).
const serviceName = "mkserve.v1.Inference"

// New returns a server for gen; tok tokenizes text prompts (nil: only
// token-id prompts are accepted). Health starts NOT_SERVING: call
// SetServing(true) once the engine is ready.
func New(gen engine.Generator, tok *tokenizer.Tokenizer, opts Options) *Server {
	if opts.MaxBatch <= 0 || opts.MaxBatch > MaxBatch {
		opts.MaxBatch = MaxBatch
	}
	if opts.BatchParallel <= 0 {
		opts.BatchParallel = 256
	}
	s := &Server{gen: gen, tok: tok, opts: opts, log: opts.Logger, health: health.NewServer()}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if opts.Registerer != nil {
		s.rpc = newRPCMetrics(opts.Registerer)
	}
	s.SetServing(false)
	return s
}

// Register adds the Inference, health and reflection services to gs.
func (s *Server) Register(gs *grpc.Server) {
	pb.RegisterInferenceServer(gs, s)
	healthpb.RegisterHealthServer(gs, s.health)
	reflection.Register(gs)
}

// SetServing sets the health status of the server ("") and of
// mkserve.v1.Inference to SERVING or NOT_SERVING.
func (s *Server) SetServing(serving bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(serviceName, st)
}

// Generate runs one request and returns its complete result.
func (s *Server) Generate(ctx context.Context, req *pb.GenerateRequest) (*pb.GenerateResponse, error) {
	p, err := s.prepare(req, nil, time.Now())
	if err != nil {
		return nil, ToStatus(err)
	}
	resp, err := s.collect(ctx, p)
	return resp, ToStatus(err)
}

// GenerateStream sends one message per engine event.
func (s *Server) GenerateStream(req *pb.GenerateRequest, stream grpc.ServerStreamingServer[pb.GenerateStreamResponse]) error {
	p, err := s.prepare(req, nil, time.Now())
	if err != nil {
		return ToStatus(err)
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	events, err := s.gen.Generate(ctx, p.req)
	if err != nil {
		return ToStatus(err)
	}
	defer drain(events)
	var failed error
	for ev := range events {
		if ev.Index < 0 || ev.Index >= p.req.Sampling.N {
			return ToStatus(fmt.Errorf("engine: event for choice %d of %d", ev.Index, p.req.Sampling.N))
		}
		if ev.FinishReason == engine.FinishError && failed == nil {
			failed = engineErr(ev)
		}
		msg := &pb.GenerateStreamResponse{
			RequestId:    p.clientID,
			Index:        int32(ev.Index),
			TokenIds:     ev.TokenIDs,
			Text:         ev.Text,
			Logprobs:     logprobs(ev.Logprobs),
			FinishReason: ev.FinishReason,
			Usage:        usage(ev.Usage),
		}
		if err := stream.Send(msg); err != nil {
			return err // the client is gone; cancel() aborts the request
		}
	}
	if err := ctx.Err(); err != nil {
		return ToStatus(context.Cause(ctx))
	}
	return ToStatus(failed)
}

// BatchGenerate runs every request concurrently (at most
// Options.BatchParallel in the engine at once) and sends each result as
// soon as it is complete. A bad request fails the whole call before any
// runs; an engine error fails only its request (BatchGenerateResponse.error).
func (s *Server) BatchGenerate(req *pb.BatchGenerateRequest, stream grpc.ServerStreamingServer[pb.BatchGenerateResponse]) error {
	n := len(req.GetRequests())
	switch {
	case n == 0:
		return ToStatus(fieldErr("requests", "empty batch"))
	case n > s.opts.MaxBatch:
		return ToStatus(fieldErr("requests", "%d requests, at most %d", n, s.opts.MaxBatch))
	}
	arrival := time.Now()
	reqs := make([]*prepared, n)
	for i, r := range req.Requests {
		p, err := s.prepare(r, req.Sampling, arrival)
		if err != nil {
			where := fmt.Sprintf("requests[%d]", i)
			if !isFieldError(err) {
				err = fmt.Errorf("%s: %w", where, err)
			}
			return ToStatus(at(where, err))
		}
		reqs[i] = p
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	results := make(chan *pb.BatchGenerateResponse)
	go func() {
		var wg sync.WaitGroup
		sem := make(chan struct{}, s.opts.BatchParallel)
	launch:
		for i, p := range reqs {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break launch
			}
			wg.Go(func() {
				defer func() { <-sem }()
				out := &pb.BatchGenerateResponse{Index: int32(i)}
				if resp, err := s.collectSafely(ctx, p); err != nil {
					out.Result = &pb.BatchGenerateResponse_Error{Error: &pb.Error{
						Code: int32(Code(err)), Message: err.Error(),
					}}
				} else {
					out.Result = &pb.BatchGenerateResponse_Response{Response: resp}
				}
				select {
				case results <- out:
				case <-ctx.Done():
				}
			})
		}
		wg.Wait()
		close(results)
	}()
	for out := range results {
		if err := stream.Send(out); err != nil {
			cancel()
			drainBatch(results)
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return ToStatus(context.Cause(ctx))
	}
	return nil
}

// collectSafely is collect on a goroutine of its own, where a panic would
// escape the interceptor's recovery: it becomes this request's Internal
// error.
func (s *Server) collectSafely(ctx context.Context, p *prepared) (resp *pb.GenerateResponse, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.panicked("/mkserve.v1.Inference/BatchGenerate", r)
		}
	}()
	return s.collect(ctx, p)
}

// collect runs p to completion and gathers its choices.
func (s *Server) collect(ctx context.Context, p *prepared) (*pb.GenerateResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events, err := s.gen.Generate(ctx, p.req)
	if err != nil {
		return nil, err
	}
	defer drain(events)
	nChoices := p.req.Sampling.N
	choices := make([]*pb.Choice, nChoices)
	for i := range choices {
		choices[i] = &pb.Choice{Index: int32(i)}
	}
	texts := make([]strings.Builder, nChoices) // += would be quadratic in long outputs
	resp := &pb.GenerateResponse{RequestId: p.clientID, Choices: choices}
	var failed error
	for ev := range events {
		if ev.Index < 0 || ev.Index >= nChoices {
			return nil, fmt.Errorf("engine: event for choice %d of %d", ev.Index, nChoices)
		}
		c := choices[ev.Index]
		c.TokenIds = append(c.TokenIds, ev.TokenIDs...)
		texts[ev.Index].WriteString(ev.Text)
		c.Logprobs = append(c.Logprobs, logprobs(ev.Logprobs)...)
		if ev.FinishReason != "" {
			c.FinishReason = ev.FinishReason
		}
		if ev.FinishReason == engine.FinishError && failed == nil {
			failed = engineErr(ev)
		}
		if ev.Usage != nil {
			resp.Usage = usage(ev.Usage)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, context.Cause(ctx)
	}
	if failed != nil {
		return nil, failed
	}
	for i, c := range choices {
		c.Text = texts[i].String()
		if c.FinishReason == "" {
			return nil, fmt.Errorf("engine: request %s ended before choice %d finished", p.req.ID, c.Index)
		}
	}
	return resp, nil
}

// engineErr is the error of an event that finished with FinishError.
func engineErr(ev engine.Event) error {
	if ev.Err != nil {
		return fmt.Errorf("engine: choice %d: %w", ev.Index, ev.Err)
	}
	return fmt.Errorf("engine: choice %d failed", ev.Index)
}

// drain reads events until the engine closes the channel, so an engine
// that sends without watching ctx never blocks on a request we left.
func drain(events <-chan engine.Event) {
	go func() {
		for range events {
		}
	}()
}

func drainBatch(results <-chan *pb.BatchGenerateResponse) {
	for range results {
	}
}

func logprobs(lps []engine.Logprob) []*pb.Logprob {
	if len(lps) == 0 {
		return nil
	}
	out := make([]*pb.Logprob, len(lps))
	for i, lp := range lps {
		out[i] = &pb.Logprob{TokenId: lp.ID, Text: lp.Text, Logprob: lp.Logprob}
		if len(lp.Top) > 0 {
			out[i].Top = make([]*pb.TopLogprob, len(lp.Top))
			for j, t := range lp.Top {
				out[i].Top[j] = &pb.TopLogprob{TokenId: t.ID, Text: t.Text, Logprob: t.Logprob}
			}
		}
	}
	return out
}

func usage(u *engine.Usage) *pb.Usage {
	if u == nil {
		return nil
	}
	return &pb.Usage{
		PromptTokens:     int32(u.PromptTokens),
		CompletionTokens: int32(u.CompletionTokens),
		CachedTokens:     int32(u.CachedTokens),

		AcceptedPredictionTokens: int32(u.AcceptedPredictionTokens),
		RejectedPredictionTokens: int32(u.RejectedPredictionTokens),
	}
}
