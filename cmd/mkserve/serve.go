package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/backend/cuda"
	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/config"
	"github.com/mkserve/mkserve/dist"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/internal/version"
	"github.com/mkserve/mkserve/metrics"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/server/grpcapi"
	"github.com/mkserve/mkserve/server/httpapi"
	"github.com/mkserve/mkserve/tokenizer"
	"github.com/mkserve/mkserve/transport"
)

// lateGenerator lets the servers start (and answer /health with 503) while
// the model loads; it forwards to the engine once set.
type lateGenerator struct {
	name   string
	engine atomic.Pointer[engine.Engine]
}

func (g *lateGenerator) Generate(ctx context.Context, r *engine.Request) (<-chan engine.Event, error) {
	e := g.engine.Load()
	if e == nil {
		return nil, engine.ErrDraining
	}
	return e.Generate(ctx, r)
}

func (g *lateGenerator) ModelName() string { return g.name }

func (g *lateGenerator) MaxContext() int {
	if e := g.engine.Load(); e != nil {
		return e.MaxContext()
	}
	return 0
}

// serveSignals are the signals that start a graceful shutdown.
var serveSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT}

func cmdServe(args []string, _ io.Reader, _ io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), serveSignals...)
	defer stop()
	return serve(ctx, args, os.LookupEnv, nil)
}

// serve runs the server until ctx ends, then drains and returns nil. ready,
// when not nil, receives the bound HTTP and gRPC addresses once the model
// is loaded and requests are accepted (for tests).
func serve(ctx context.Context, args []string, lookup func(string) (string, bool), ready func(httpAddr, grpcAddr string)) error {
	fs := newFlags("serve")
	cfg, err := config.Parse(fs, args, lookup)
	if err != nil {
		return err
	}
	log, err := cfg.NewLogger()
	if err != nil {
		return err
	}
	defer log.Sync()

	// Tokenizer and chat template first: they are small, and the servers need them.
	tok, err := tokenizer.LoadDir(cfg.Model)
	if err != nil {
		return err
	}
	var tmpl *chat.Template
	toolFormat, reasoning := "", ""
	if src := tok.Config().ChatTemplate; src != "" {
		if tmpl, err = chat.Compile(src); err != nil {
			return fmt.Errorf("%s: chat template: %w", cfg.Model, err)
		}
		toolFormat, reasoning = httpapi.DetectToolFormat(src), httpapi.DetectReasoning(src)
	}
	switch cfg.ReasoningParser {
	case "none":
		reasoning = ""
	case "think", "harmony":
		reasoning = cfg.ReasoningParser
	}
	gc, err := models.LoadGenerationConfig(cfg.Model)
	if err != nil {
		return err
	}
	defaults := samplingDefaults(gc)
	reg := metrics.NewRegistry()
	met := metrics.New(reg, cfg.ModelName())
	gen := &lateGenerator{name: cfg.ModelName()}

	// Servers up before the model: /health answers 503 until ready.
	hs := httpapi.New(gen, tok, tmpl, httpapi.Options{
		APIKey: cfg.APIKey, CORSOrigins: cfg.CORSOrigins, MaxBodyBytes: cfg.MaxBodyBytes,
		Logger: log, LogPrompts: cfg.LogPrompts, Metrics: metrics.Handler(reg), Defaults: defaults,
		ToolFormat: toolFormat, Reasoning: reasoning, CompactJSON: cfg.JSONWhitespace == "compact",
		ResponsesStore: cfg.ResponsesStore, Version: version.Get(),
	})
	hl, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("http_addr %s: %w", cfg.HTTPAddr, err)
	}
	httpSrv := &http.Server{Handler: hs.Handler(), ReadHeaderTimeout: 10 * time.Second}
	httpErr := make(chan error, 1)
	go func() { httpErr <- httpSrv.Serve(hl) }()

	var gs *grpc.Server
	var gapi *grpcapi.Server
	grpcAddr := ""
	if cfg.GRPCAddr != "" {
		gapi = grpcapi.New(gen, tok, grpcapi.Options{Logger: log, Registerer: reg, Defaults: defaults,
			CompactJSON: cfg.JSONWhitespace == "compact", Template: tmpl})
		gs = grpc.NewServer(gapi.ServerOptions()...)
		gapi.Register(gs)
		gl, err := net.Listen("tcp", cfg.GRPCAddr)
		if err != nil {
			httpSrv.Close()
			return fmt.Errorf("grpc_addr %s: %w", cfg.GRPCAddr, err)
		}
		grpcAddr = gl.Addr().String()
		go func() { _ = gs.Serve(gl) }()
	}
	log.Info("listening", zap.String("http", hl.Addr().String()), zap.String("grpc", grpcAddr), zap.String("model", cfg.Model))

	// The model, on this process alone or as rank 0 of a world of processes.
	start := time.Now()
	fail := func(err error) error {
		httpSrv.Close()
		if gs != nil {
			gs.Stop()
		}
		return err
	}
	var be backend.Backend
	var leader *dist.Leader
	spec := backendSpec{name: cfg.Backend, ep: cfg.EP, precision: cfg.Precision, moePath: cfg.MoEPath, moeTuning: cfg.MoETuning,
		cpuWeights: cfg.CPUWeights, cudaWeights: cfg.CUDAWeights, kvDtype: cfg.KVCacheDtype}
	if cfg.WorldSize > 1 {
		joinCtx, cancelJoin := context.WithCancelCause(ctx)
		joined := make(chan struct{})
		if cfg.Coordinator == "" {
			// No coordinator: this process starts the workers itself.
			lw, err := startLocalWorkers(cfg, os.Stderr, log)
			if err != nil {
				cancelJoin(nil)
				return fail(err)
			}
			defer lw.wait(30 * time.Second) // after the leader stopped them
			lw.watch(cancelJoin, joined)    // a worker that dies early ends the wait
		}
		log.Info("waiting for the world", zap.Int("world_size", cfg.WorldSize), zap.String("coordinator", cfg.Coordinator))
		comm, err := transport.JoinGRPC(joinCtx, transport.GRPCConfig{Rank: 0, Size: cfg.WorldSize, Coordinator: cfg.Coordinator,
			JoinTimeout: worldJoinTimeout})
		close(joined)
		if err != nil {
			if cause := context.Cause(joinCtx); cause != nil && cause != context.Canceled {
				err = fmt.Errorf("the world did not form: %w", cause)
			}
			cancelJoin(nil)
			return fail(err)
		}
		defer cancelJoin(nil)
		defer comm.Close()
		spec.ep, spec.world, spec.worldTransport = 1, comm, cfg.WorldTransport
		if err := worldAgree(ctx, comm, worldProfile(spec)); err != nil {
			return fail(err)
		}
		if be, err = newBackend(spec); err != nil {
			return fail(err)
		}
		if leader, err = dist.NewLeader(comm); err != nil {
			return fail(err)
		}
	} else if be, err = newBackend(spec); err != nil {
		return fail(err)
	}
	if cb, ok := be.(*cuda.Backend); ok {
		metrics.RegisterGraphs(reg, cfg.ModelName(), func() metrics.GraphCounts {
			g := cb.Graphs()
			return metrics.GraphCounts{Eager: g.Eager, Captures: g.Captures, Replays: g.Replays, Diverged: g.Diverged,
				Failed: g.Failed, Live: g.Live, ArenaBytes: g.TapeBytes, ReplayHostNs: g.ReplayHostNs}
		})
	}
	loaded, err := models.Load(cfg.Model, be, models.LoadOptions{})
	if err != nil {
		return fail(err)
	}
	defer loaded.Close()
	model := loaded.Model
	if leader != nil {
		leader.OnFail(func(err error) {
			log.Error("the world of processes broke: no request can be served; restart the world", zap.Error(err))
			hs.SetReady(false)
			if gapi != nil {
				gapi.SetServing(false)
			}
		})
		model, be = leader.Model(model), leader.Backend(be)
		defer func() {
			if err := leader.Stop(); err != nil {
				log.Warn("stopping the workers", zap.Error(err))
			}
		}()
	}
	eng, err := engine.New(model, be, tok, cfg.EngineConfig(), engine.Options{
		Name: cfg.ModelName(), EOS: stopIDs(loaded), Metrics: met, Logger: log,
	})
	if err != nil {
		return fail(err)
	}
	gen.engine.Store(eng)
	hs.SetReady(true)
	if gapi != nil {
		gapi.SetServing(true)
	}
	ec := eng.Config()
	info := httpapi.ModelInfo{Family: loaded.Config.ModelType}
	if wh, ok := be.(interface{ WeightBytes() backend.WeightBytes }); ok {
		wb := wh.WeightBytes()
		fields := []zap.Field{zap.Int64("bytes", wb.Total()), zap.Int64("fp4_bytes", wb.FP4), zap.Int64("q8_bytes", wb.Q8),
			zap.Int64("bf16_bytes", wb.BF16), zap.Int64("f32_bytes", wb.F32)}
		switch b := be.(type) {
		case *cpu.Backend:
			fields = append(fields, zap.String("cpu_weights", cfg.CPUWeights))
		case *cuda.Backend:
			fields = append(fields, zap.String("cuda_weights", cfg.CUDAWeights), zap.Int("fp4_matrices", b.FP4Weights()))
		}
		log.Info("weights held", fields...)
		metrics.RegisterWeights(reg, cfg.ModelName(), wb.Forms()) // (forms without bytes left out)
		info.Bytes, info.Parameters, info.Quantization = wb.Total(), wb.Values(), wb.Dominant()
	}
	hs.SetModelInfo(info)
	log.Info("ready", zap.String("version", version.Get().String()), zap.Duration("load_time", time.Since(start)), zap.String("architecture", loaded.Config.Architecture),
		zap.Int("max_model_len", ec.MaxModelLen), zap.Int("kv_blocks", eng.Stats().BlocksFree), zap.Int("block_size", ec.BlockSize),
		zap.Int("kv_tokens", eng.Stats().BlocksFree*ec.BlockSize),
		zap.Int("kv_values_per_token", loaded.Model.KVFloatsPerToken())) // all layers: MLA's latent cache shows here
	if ready != nil {
		ready(hl.Addr().String(), grpcAddr)
	}

	select {
	case <-ctx.Done():
	case err := <-httpErr:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("http server: %w", err)
		}
	}

	// Drain: refuse new work, let running requests finish within the timeout.
	log.Info("draining", zap.Duration("timeout", cfg.DrainTimeout))
	hs.SetDraining(true)
	if gapi != nil {
		gapi.SetServing(false)
	}
	dctx, cancel := context.WithTimeout(context.Background(), cfg.DrainTimeout)
	defer cancel()
	if err := eng.Shutdown(dctx); err != nil {
		log.Warn("drain timed out; remaining requests aborted", zap.Error(err))
	}
	_ = httpSrv.Shutdown(dctx)
	if gs != nil {
		stopped := make(chan struct{})
		go func() { gs.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-dctx.Done():
			gs.Stop()
		}
	}
	log.Info("stopped")
	return nil
}

// samplingDefaults turns generation_config.json's sampling settings into the
// servers' defaults for unset request parameters (nil: none).
func samplingDefaults(g *models.GenerationConfig) *engine.SamplingDefaults {
	if g == nil {
		return nil
	}
	f32 := func(v *float64) *float32 {
		if v == nil {
			return nil
		}
		x := float32(*v)
		return &x
	}
	return &engine.SamplingDefaults{
		Temperature: f32(g.Temperature), TopP: f32(g.TopP), MinP: f32(g.MinP),
		RepetitionPenalty: f32(g.RepetitionPenalty), TopK: g.TopK,
	}
}
