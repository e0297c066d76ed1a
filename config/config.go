// Package config holds the settings of `mkserve serve`: where they come
// from (defaults, a YAML file, MKSERVE_* environment variables, command-line
// flags, in that order of precedence, later ones winning), what they mean
// and which values are valid.
//
// Every setting has one name, its YAML key, from which the other spellings
// follow:
//
//	YAML      http_addr            engine: {max_num_seqs: 64}
//	env       MKSERVE_HTTP_ADDR    MKSERVE_MAX_NUM_SEQS
//	flag      --http-addr          --max-num-seqs
//
// The keys of the engine block drop their "engine." prefix in flag and
// environment names. Parse does the whole layering for a command line;
// Load, ApplyEnv and BindFlags are its steps.
package config

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/mkserve/mkserve/engine"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Config is everything `mkserve serve` needs to start.
type Config struct {
	Model           string        // Hugging Face checkpoint directory (model)
	Backend         string        // compute backend: "cpu" or "cuda" (backend)
	Precision       string        // cuda: "exact" or "fast" (precision)
	MoEPath         string        // cuda: "grouped" or "fused" (moe_path)
	MoETuning       string        // cuda: fused MoE launch table, a JSON file (moe_tuning)
	CPUWeights      string        // cpu: how matrices are held: "auto", "stored" or "q8" (cpu_weights; cpu.WeightFormat)
	CUDAWeights     string        // cuda: how expert matrices are held: "auto", "stored" or "fp4" (cuda_weights; cuda.Options.Weights)
	KVCacheDtype    string        // cpu: the paged KV cache's element type, "auto" (float32) or "bf16" (kv_cache_dtype)
	HTTPAddr        string        // OpenAI-compatible HTTP listen address (http_addr)
	GRPCAddr        string        // gRPC listen address; "" disables gRPC (grpc_addr)
	APIKey          string        // bearer token clients must send; "" allows all (api_key)
	CORSOrigins     []string      // origins allowed by CORS; "*" allows any (cors_origins)
	LogFormat       string        // "json" or "console" (log_format)
	LogLevel        string        // "debug", "info", "warn" or "error" (log_level)
	LogPrompts      bool          // log prompt text with each request (log_prompts)
	MaxBodyBytes    int64         // largest accepted HTTP request body (max_body_bytes)
	DrainTimeout    time.Duration // how long shutdown waits for running requests (drain_timeout)
	ServedModelName string        // model name clients use; "" is the model directory's base name (served_model_name)
	ReasoningParser string        // chat output's reasoning: "auto" (from the chat template), "none", "think" or "harmony" (reasoning_parser)
	JSONWhitespace  string        // JSON-constrained output's layout: "pretty" (newlines and indentation allowed) or "compact" (json_whitespace)
	ResponsesStore  int           // finished /v1/responses responses kept in memory for previous_response_id (responses_store; 0: none)
	EP              int           // expert-parallel ranks (ep)
	WorldSize       int           // processes serving one model (world_size); rank 0 serves, `mkserve worker` runs the others
	WorldTransport  string        // cuda world: "ipc" or "nccl" (world_transport)
	Coordinator     string        // rank 0's host:port for the world's bootstrap (coordinator); empty: rank 0 starts the workers locally
	Engine          Engine        // the engine block
}

// Engine is the YAML engine block; it maps one to one onto engine.Config.
type Engine struct {
	MaxNumSeqs          int   // engine.max_num_seqs
	MaxNumBatchedTokens int   // engine.max_num_batched_tokens
	BlockSize           int   // engine.block_size
	KVCacheBytes        int64 // engine.kv_cache_bytes; "1GiB" style accepted
	MaxQueue            int   // engine.max_queue
	MaxModelLen         int   // engine.max_model_len; 0: the model's max_position_embeddings
	PrefixCaching       bool  // engine.prefix_caching
	HostSampling        bool  // engine.host_sampling
	ContextParallel     int   // engine.context_parallel (ranks; 1: off)
	ContextParallelMin  int   // engine.context_parallel_min (prompt tokens)
	RebalanceEvery      int   // engine.rebalance_every (steps; 0: off)
	RebalanceSpare      int   // engine.rebalance_spare (extra expert slots per rank)
	GraphWarmup         bool  // engine.graph_warmup (capture decode graphs at start)
	SyncSteps           bool  // engine.sync_steps (overlapped decode off)
	SpeculativeTokens   int   // engine.speculative_tokens (prompt-lookup draft tokens a step; 0: off)
	SpeculativeNgramMax int   // engine.speculative_ngram_max (0: 4)
	SpeculativeNgramMin int   // engine.speculative_ngram_min (0: 2)
}

// Defaults of the settings engine.DefaultConfig does not cover.
const (
	// DefaultModel is the small trained checkpoint committed to the
	// repository, relative to its root (where `make run` starts the server).
	DefaultModel        = "models/default"
	DefaultHTTPAddr     = "127.0.0.1:8000"
	DefaultGRPCAddr     = "127.0.0.1:50051"
	DefaultMaxBodyBytes = 8 << 20
	DefaultDrainTimeout = 30 * time.Second
)

// Default returns the settings used where nothing else sets a value: the
// bundled default model on the CPU.
func Default() *Config {
	e := engine.DefaultConfig()
	return &Config{
		Model:           DefaultModel,
		Backend:         "cpu",
		Precision:       "exact",
		MoEPath:         "grouped",
		CPUWeights:      "auto",
		CUDAWeights:     "auto",
		KVCacheDtype:    "auto",
		HTTPAddr:        DefaultHTTPAddr,
		GRPCAddr:        DefaultGRPCAddr,
		LogFormat:       "json",
		ReasoningParser: "auto",
		JSONWhitespace:  "pretty",
		ResponsesStore:  256,
		LogLevel:        "info",
		MaxBodyBytes:    DefaultMaxBodyBytes,
		DrainTimeout:    DefaultDrainTimeout,
		EP:              1,
		WorldSize:       1,
		WorldTransport:  "ipc",
		Engine: Engine{
			MaxNumSeqs:          e.MaxNumSeqs,
			MaxNumBatchedTokens: e.MaxNumBatchedTokens,
			BlockSize:           e.BlockSize,
			KVCacheBytes:        e.KVCacheBytes,
			MaxQueue:            e.MaxQueue,
			MaxModelLen:         e.MaxModelLen,
			PrefixCaching:       e.PrefixCaching,
			HostSampling:        e.HostSampling,
			GraphWarmup:         e.GraphWarmup,
			ContextParallel:     1,
			ContextParallelMin:  engine.DefaultContextParallelMin,
		},
	}
}

// EngineConfig returns the engine block as engine.Config.
func (c *Config) EngineConfig() engine.Config {
	e := c.Engine
	return engine.Config{
		MaxNumSeqs:          e.MaxNumSeqs,
		MaxNumBatchedTokens: e.MaxNumBatchedTokens,
		BlockSize:           e.BlockSize,
		KVCacheBytes:        e.KVCacheBytes,
		MaxQueue:            e.MaxQueue,
		MaxModelLen:         e.MaxModelLen,
		PrefixCaching:       e.PrefixCaching,
		HostSampling:        e.HostSampling,
		ContextParallel:     e.ContextParallel,
		ContextParallelMin:  e.ContextParallelMin,
		RebalanceEvery:      e.RebalanceEvery,
		RebalanceSpare:      e.RebalanceSpare,
		GraphWarmup:         e.GraphWarmup,
		SyncSteps:           e.SyncSteps,
		SpeculativeTokens:   e.SpeculativeTokens,
		SpeculativeNgramMax: e.SpeculativeNgramMax,
		SpeculativeNgramMin: e.SpeculativeNgramMin,
	}
}

// ModelName is the name clients use for the model: ServedModelName, or the
// base name of the model directory when that is empty.
func (c *Config) ModelName() string {
	if c.ServedModelName != "" {
		return c.ServedModelName
	}
	if c.Model == "" {
		return ""
	}
	return filepath.Base(filepath.Clean(c.Model))
}

// Validate checks every setting and names the first bad one by its YAML key.
func (c *Config) Validate() error {
	bad := func(key, format string, args ...any) error {
		return fmt.Errorf("config: %s: %s", key, fmt.Sprintf(format, args...))
	}
	if strings.TrimSpace(c.Model) == "" {
		return bad("model", "required (a Hugging Face checkpoint directory)")
	}
	switch c.Backend {
	case "cpu", "cuda":
	default:
		return bad("backend", "must be cpu or cuda, got %q", c.Backend)
	}
	if c.Engine.RebalanceEvery > 0 && c.EP < 2 {
		return bad("engine.rebalance_every", "rebalancing experts needs expert parallelism (ep ≥ 2), ep is %d", c.EP)
	}
	if cp := c.Engine.ContextParallel; cp > 1 && c.Backend == "cuda" {
		// The ring kernel reads the bf16 KV cache and takes up to 8 ranks
		// (kernels.RingMaxRanks), emulated on the one GPU.
		if c.Precision != "fast" {
			return bad("engine.context_parallel", "on the cuda backend ring attention needs the bf16 KV cache of precision fast (precision is %q)", c.Precision)
		}
		if cp > 8 {
			return bad("engine.context_parallel", "the cuda ring kernel takes at most 8 ranks, got %d", cp)
		}
	}
	switch c.MoEPath {
	case "grouped", "fused":
	default:
		return bad("moe_path", "must be grouped or fused, got %q", c.MoEPath)
	}
	if c.Backend == "cuda" && c.EP > 1 && (c.MoEPath != "fused" || c.Precision != "fast") {
		return bad("ep", "on the cuda backend %d expert-parallel ranks run through the fused MoE kernel: set moe_path fused and precision fast", c.EP)
	}
	switch c.Precision {
	case "exact", "fast":
	default:
		return bad("precision", "must be exact or fast, got %q", c.Precision)
	}
	for _, s := range []struct {
		field, v, only, note string
		values               []string // "auto" first: the one value every backend takes
	}{
		{"cpu_weights", c.CPUWeights, "cpu", "", []string{"auto", "stored", "q8"}},
		{"cuda_weights", c.CUDAWeights, "cuda", "", []string{"auto", "stored", "fp4"}},
		{"kv_cache_dtype", c.KVCacheDtype, "cpu", " (on cuda, precision fast keeps the cache in bf16)", []string{"auto", "bf16"}},
	} {
		if !slices.Contains(s.values, s.v) {
			return bad(s.field, "must be %s or %s, got %q", strings.Join(s.values[:len(s.values)-1], ", "), s.values[len(s.values)-1], s.v)
		}
		if s.v != "auto" && c.Backend != s.only {
			return bad(s.field, "%s applies to the %s backend%s; backend is %s", s.v, s.only, s.note, c.Backend)
		}
	}
	if err := checkAddr(c.HTTPAddr); err != nil {
		return bad("http_addr", "%v", err)
	}
	if c.GRPCAddr != "" {
		if err := checkAddr(c.GRPCAddr); err != nil {
			return bad("grpc_addr", "%v", err)
		}
	}
	if strings.ContainsAny(c.APIKey, " \t\r\n") {
		return bad("api_key", "must not contain whitespace")
	}
	for i, o := range c.CORSOrigins {
		if err := checkOrigin(o); err != nil {
			return bad(fmt.Sprintf("cors_origins[%d]", i), "%v", err)
		}
	}
	switch c.LogFormat {
	case "json", "console":
	default:
		return bad("log_format", "must be json or console, got %q", c.LogFormat)
	}
	switch c.JSONWhitespace {
	case "pretty", "compact":
	default:
		return bad("json_whitespace", "must be pretty or compact, got %q", c.JSONWhitespace)
	}
	switch c.ReasoningParser {
	case "auto", "none", "think", "harmony":
	default:
		return bad("reasoning_parser", "must be auto, none, think or harmony, got %q", c.ReasoningParser)
	}
	if _, err := zapcore.ParseLevel(c.LogLevel); err != nil || c.LogLevel == "" {
		return bad("log_level", "must be debug, info, warn or error, got %q", c.LogLevel)
	}
	if c.ResponsesStore < 0 {
		return bad("responses_store", "must be at least 0, got %d", c.ResponsesStore)
	}
	if c.MaxBodyBytes < 1 {
		return bad("max_body_bytes", "must be positive, got %d", c.MaxBodyBytes)
	}
	if c.DrainTimeout < 0 {
		return bad("drain_timeout", "must not be negative, got %v", c.DrainTimeout)
	}
	for _, r := range c.ServedModelName {
		if r < 0x20 || r == 0x7f {
			return bad("served_model_name", "must not contain control characters")
		}
	}
	if c.WorldSize < 1 || c.WorldSize > 1024 {
		return bad("world_size", "must be in [1, 1024], got %d", c.WorldSize)
	}
	if c.WorldSize > 1 {
		switch {
		case c.Backend != "cpu" && c.Backend != "cuda":
			return bad("world_size", "a world of processes runs on the cpu or cuda backend, not %q", c.Backend)
		case c.Backend == "cuda" && c.WorldSize > 8:
			return bad("world_size", "a world on the cuda backend has at most 8 processes (one per GPU of a host), got %d", c.WorldSize)
		case c.WorldTransport != "ipc" && c.WorldTransport != "nccl":
			return bad("world_transport", "must be ipc or nccl, got %q", c.WorldTransport)
		case c.WorldTransport == "nccl" && c.Backend != "cuda":
			return bad("world_transport", "nccl sums the MoE outputs of a world on the cuda backend, not %s", c.Backend)
		case c.Backend == "cuda" && c.MoEPath == "fused":
			return bad("world_size", "a world on the cuda backend runs the MoE layers on the grouped path (moe_path grouped), not fused")
		case c.EP > 1:
			return bad("world_size", "experts are already split over the world's %d processes; ep must be 1", c.WorldSize)
		}
		if c.Coordinator != "" { // empty: rank 0 starts its workers on this machine
			if err := checkAddr(c.Coordinator); err != nil {
				return bad("coordinator", "%v", err)
			}
		}
	}
	if c.EP < 1 {
		return bad("ep", "must be at least 1, got %d", c.EP)
	}
	e := c.Engine
	switch {
	case e.MaxNumSeqs < 1:
		return bad("engine.max_num_seqs", "must be at least 1, got %d", e.MaxNumSeqs)
	case e.MaxNumBatchedTokens < 1:
		return bad("engine.max_num_batched_tokens", "must be at least 1, got %d", e.MaxNumBatchedTokens)
	case e.MaxNumBatchedTokens < e.MaxNumSeqs:
		return bad("engine.max_num_batched_tokens", "(%d) must be at least engine.max_num_seqs (%d)", e.MaxNumBatchedTokens, e.MaxNumSeqs)
	case e.BlockSize < 1 || e.BlockSize > 1024:
		return bad("engine.block_size", "must be in [1, 1024], got %d", e.BlockSize)
	case e.KVCacheBytes < 1:
		return bad("engine.kv_cache_bytes", "must be positive, got %d", e.KVCacheBytes)
	case e.MaxQueue < 1:
		return bad("engine.max_queue", "must be at least 1, got %d", e.MaxQueue)
	case e.MaxModelLen < 0:
		return bad("engine.max_model_len", "must not be negative, got %d", e.MaxModelLen)
	}
	if err := c.EngineConfig().Validate(); err != nil {
		return fmt.Errorf("config: engine: %w", err)
	}
	return nil
}

// checkAddr accepts host:port with a numeric port (the host may be empty).
func checkAddr(a string) error {
	if a == "" {
		return fmt.Errorf("required (host:port)")
	}
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q is not host:port", a)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%q: port must be a number in [0, 65535]", a)
	}
	return nil
}

// checkOrigin accepts "*" or scheme://host[:port] with nothing after it.
func checkOrigin(o string) error {
	if o == "*" {
		return nil
	}
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%q is not an origin (http[s]://host[:port], or *)", o)
	}
	return nil
}

// NewLogger builds the zap logger LogFormat and LogLevel describe, writing
// to stderr.
func (c *Config) NewLogger() (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(c.LogLevel)
	if err != nil {
		return nil, fmt.Errorf("config: log_level: %w", err)
	}
	var zc zap.Config
	switch c.LogFormat {
	case "json":
		zc = zap.NewProductionConfig()
	case "console":
		zc = zap.NewDevelopmentConfig()
	default:
		return nil, fmt.Errorf("config: log_format: must be json or console, got %q", c.LogFormat)
	}
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	return zc.Build()
}
