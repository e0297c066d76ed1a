package config

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// EnvPrefix starts the name of every environment variable ApplyEnv reads.
const EnvPrefix = "MKSERVE_"

// field is one setting: its YAML key and a value bound to the Config.
type field struct {
	key   string // YAML key; engine settings as "engine.max_num_seqs"
	usage string
	v     value
}

// value is a setting's storage, settable from a flag or environment string
// and from a YAML node. String gives back what Set accepts.
type value interface {
	flag.Value
	decode(n *yaml.Node) error
}

// name is the key without its section: "max_num_seqs".
func (f field) name() string {
	if i := strings.LastIndexByte(f.key, '.'); i >= 0 {
		return f.key[i+1:]
	}
	return f.key
}

// Flag is the command-line flag name of the setting: "max-num-seqs".
func (f field) flag() string { return strings.ReplaceAll(f.name(), "_", "-") }

// env is the environment variable of the setting: "MKSERVE_MAX_NUM_SEQS".
func (f field) env() string { return EnvPrefix + strings.ToUpper(f.name()) }

// fields lists every setting of c, bound to c's fields.
func (c *Config) fields() []field {
	e := &c.Engine
	return []field{
		{"model", "Hugging Face checkpoint directory", (*stringValue)(&c.Model)},
		{"backend", "compute backend: cpu or cuda", (*stringValue)(&c.Backend)},
		{"cuda_weights", "cuda: how an MXFP4 checkpoint's experts (gpt-oss) are held: auto (as FP4 — E2M1 codes with a power-of-two scale per 32 values, 4.25 bits a value, exact — when their bf16 form would take more than 60% of the GPU's memory, as for gpt-oss-120b on an H200; else bf16, faster beyond four tokens a step today), stored (bf16), or fp4 (always FP4)", (*stringValue)(&c.CUDAWeights)},
		{"cpu_weights", "cpu: how matrices are held: auto (the smallest exact form: FP4 groups for an MXFP4 checkpoint's experts, 5/16 of bf16's memory; int8 groups (Q8) where they are exact; the rest as stored), stored (bf16 as bf16), or q8 (every matrix but the routers in Q8: 9/16 of bf16's memory and bytes a decode step reads, each value within 1/254 of its group of 32's largest)", (*stringValue)(&c.CPUWeights)},
		{"kv_cache_dtype", "cpu: the paged KV cache's element type: auto (float32) or bf16 (half the memory: twice the tokens in kv_cache_bytes, and half the bytes long-context attention reads; keys and values rounded to bf16)", (*stringValue)(&c.KVCacheDtype)},
		{"precision", "cuda: exact (float32 activations into split bf16 GEMMs, float32 KV cache) or fast (bf16 activations and KV cache)", (*stringValue)(&c.Precision)},
		{"moe_tuning", "cuda, moe_path fused: JSON table of launch choices measured by `mkserve bench moe --tune` (empty: the kernel's defaults)", (*stringValue)(&c.MoETuning)},
		{"moe_path", "cuda, fast precision: grouped (routing, grouped expert GEMMs, combine as separate launches) or fused (one persistent kernel per MoE layer; needed for ep > 1)", (*stringValue)(&c.MoEPath)},
		{"http_addr", "OpenAI-compatible HTTP listen address (host:port)", (*stringValue)(&c.HTTPAddr)},
		{"grpc_addr", "gRPC listen address (host:port; empty disables gRPC)", (*stringValue)(&c.GRPCAddr)},
		{"api_key", "bearer token clients must send (empty: no authentication)", (*stringValue)(&c.APIKey)},
		{"cors_origins", "comma-separated origins allowed by CORS (* for any)", (*listValue)(&c.CORSOrigins)},
		{"log_format", "log format: json or console", (*stringValue)(&c.LogFormat)},
		{"log_level", "log level: debug, info, warn or error", (*stringValue)(&c.LogLevel)},
		{"log_prompts", "log prompt text with each request", (*boolValue)(&c.LogPrompts)},
		{"max_body_bytes", "largest accepted HTTP request body (bytes, or 8MiB style)", (*bytesValue)(&c.MaxBodyBytes)},
		{"drain_timeout", "how long shutdown waits for running requests (e.g. 30s)", (*durationValue)(&c.DrainTimeout)},
		{"served_model_name", "model name clients use (empty: the model directory's name)", (*stringValue)(&c.ServedModelName)},
		{"json_whitespace", "JSON-constrained output's layout: pretty (a newline and indentation allowed between tokens) or compact (at most one space: fewer tokens)", (*stringValue)(&c.JSONWhitespace)},
		{"responses_store", "finished /v1/responses responses kept in memory for previous_response_id and GET /v1/responses/{id} (least recently used dropped; 0: none)", (*intValue)(&c.ResponsesStore)},
		{"reasoning_parser", "chat completions' reasoning_content: auto (the chat template's format), none (all content), think (<think>…</think>) or harmony (gpt-oss's channels)", (*stringValue)(&c.ReasoningParser)},
		{"ep", "expert-parallel ranks", (*intValue)(&c.EP)},
		{"world_size", "processes serving the model: this one (rank 0) and world_size−1 `mkserve worker`s, experts split among them", (*intValue)(&c.WorldSize)},
		{"world_transport", "cuda world: how the processes sum their MoE outputs: ipc (our all-reduce kernel through CUDA IPC, in decode graphs) or nccl (the fallback; no decode graphs)", (*stringValue)(&c.WorldTransport)},
		{"coordinator", "host:port rank 0 listens on for the world's bootstrap (with world_size > 1)", (*stringValue)(&c.Coordinator)},
		{"engine.max_num_seqs", "running sequences per step at most", (*intValue)(&e.MaxNumSeqs)},
		{"engine.max_num_batched_tokens", "tokens per step at most", (*intValue)(&e.MaxNumBatchedTokens)},
		{"engine.block_size", "tokens per KV-cache block", (*intValue)(&e.BlockSize)},
		{"engine.kv_cache_bytes", "memory for the KV cache (bytes, or 1GiB style)", (*bytesValue)(&e.KVCacheBytes)},
		{"engine.max_queue", "waiting requests at most before 429", (*intValue)(&e.MaxQueue)},
		{"engine.max_model_len", "prompt + completion tokens at most (0: the model's limit)", (*intValue)(&e.MaxModelLen)},
		{"engine.prefix_caching", "share KV blocks among prompts with a common prefix", (*boolValue)(&e.PrefixCaching)},
		{"engine.host_sampling", "sample on the host even when the backend can sample on the device", (*boolValue)(&e.HostSampling)},
		{"engine.context_parallel", "context-parallel ranks for long prompts (ring attention; 1: off)", (*intValue)(&e.ContextParallel)},
		{"engine.context_parallel_min", "prompt tokens from which context parallelism applies", (*intValue)(&e.ContextParallelMin)},
		{"engine.rebalance_every", "re-place experts on the expert-parallel ranks every N steps from their loads (0: off)", (*intValue)(&e.RebalanceEvery)},
		{"engine.rebalance_spare", "extra expert slots per rank for replicas of hot experts (0: 1)", (*intValue)(&e.RebalanceSpare)},
		{"engine.graph_warmup", "capture the CUDA decode graphs of every batch size at start (fast profile)", (*boolValue)(&e.GraphWarmup)},
		{"engine.sync_steps", "wait for each step's sampled tokens before launching the next (turns overlapped decode off)", (*boolValue)(&e.SyncSteps)},
		{"engine.speculative_tokens", "prompt-lookup speculation: draft tokens verified a step (0: off; steps with requests that qualify then run synchronously)", (*intValue)(&e.SpeculativeTokens)},
		{"engine.speculative_ngram_max", "speculation: the longest suffix looked up earlier in the sequence (0: 4)", (*intValue)(&e.SpeculativeNgramMax)},
		{"engine.speculative_ngram_min", "speculation: the shortest suffix looked up (0: 2)", (*intValue)(&e.SpeculativeNgramMin)},
	}
}

// BindFlags registers one flag per setting on fs, bound to c: parsing fs
// overwrites exactly the settings whose flags are given. Flag defaults are
// c's values at the time of the call.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	for _, f := range c.fields() {
		fs.Var(f.v, f.flag(), f.usage+" (env "+f.env()+")")
	}
}

// ApplyEnv sets every setting whose MKSERVE_<NAME> variable lookup finds
// (os.LookupEnv in a program), e.g. MKSERVE_HTTP_ADDR, MKSERVE_MAX_NUM_SEQS.
// A set but empty variable sets an empty value. Errors name the variable.
func (c *Config) ApplyEnv(lookup func(string) (string, bool)) error {
	for _, f := range c.fields() {
		s, ok := lookup(f.env())
		if !ok {
			continue
		}
		if err := f.v.Set(s); err != nil {
			return fmt.Errorf("config: %s: %v", f.env(), err)
		}
	}
	return nil
}

// ConfigEnv names the YAML file when no --config flag is given.
const ConfigEnv = EnvPrefix + "CONFIG"

// Parse builds the configuration of a command line: defaults, then the YAML
// file named by --config (or MKSERVE_CONFIG), then MKSERVE_* variables from
// lookup, then the flags given in args; the result is validated. It
// registers --config and every setting's flag on fs (which should be
// flag.ContinueOnError); fs.Args() holds the arguments left after parsing.
func Parse(fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) (*Config, error) {
	path := fs.String("config", "", "YAML configuration file (env "+ConfigEnv+")")
	flags := Default()
	flags.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	p := *path
	if !given["config"] {
		p, _ = lookup(ConfigEnv)
	}
	c := Default()
	if p != "" {
		var err error
		if c, err = Load(p); err != nil {
			return nil, err
		}
	}
	if err := c.ApplyEnv(lookup); err != nil {
		return nil, err
	}
	// Copy the flags given on the command line over the file and environment.
	src := flags.fields()
	for i, f := range c.fields() {
		if given[f.flag()] {
			if err := f.v.Set(src[i].v.String()); err != nil {
				return nil, fmt.Errorf("config: --%s: %v", f.flag(), err)
			}
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ---- values ----

type stringValue string

func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }
func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) decode(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return fmt.Errorf("want a string")
	}
	*v = stringValue(n.Value)
	return nil
}

type intValue int

func (v *intValue) Set(s string) error {
	i, err := strconv.ParseInt(strings.TrimSpace(s), 10, 0)
	if err != nil {
		return fmt.Errorf("invalid integer %q", s)
	}
	*v = intValue(i)
	return nil
}
func (v *intValue) String() string { return strconv.Itoa(int(*v)) }
func (v *intValue) decode(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		return fmt.Errorf("want an integer, got %s", describe(n))
	}
	var i int
	if err := n.Decode(&i); err != nil {
		return fmt.Errorf("want an integer, got %s", describe(n))
	}
	*v = intValue(i)
	return nil
}

type boolValue bool

func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("invalid boolean %q (true or false)", s)
	}
	*v = boolValue(b)
	return nil
}
func (v *boolValue) String() string   { return strconv.FormatBool(bool(*v)) }
func (v *boolValue) IsBoolFlag() bool { return true }
func (v *boolValue) decode(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		return fmt.Errorf("want true or false, got %s", describe(n))
	}
	var b bool
	if err := n.Decode(&b); err != nil {
		return fmt.Errorf("want true or false, got %s", describe(n))
	}
	*v = boolValue(b)
	return nil
}

// listValue is a list of strings; as a flag or variable, comma-separated.
type listValue []string

func (v *listValue) Set(s string) error {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	*v = out
	return nil
}
func (v *listValue) String() string { return strings.Join(*v, ",") }
func (v *listValue) decode(n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode {
		return fmt.Errorf("want a list of strings, got %s", describe(n))
	}
	var out []string // nil when empty, as Default has it
	for _, it := range n.Content {
		if it.Kind != yaml.ScalarNode || it.ShortTag() != "!!str" {
			return fmt.Errorf("line %d: want a string, got %s", it.Line, describe(it))
		}
		if strings.Contains(it.Value, ",") {
			return fmt.Errorf("line %d: %q: an entry must not contain a comma", it.Line, it.Value)
		}
		out = append(out, it.Value)
	}
	*v = out
	return nil
}

// bytesValue is a byte count: an integer, or a number with a unit.
type bytesValue int64

func (v *bytesValue) Set(s string) error {
	b, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*v = bytesValue(b)
	return nil
}
func (v *bytesValue) String() string { return strconv.FormatInt(int64(*v), 10) }
func (v *bytesValue) decode(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!str" && n.ShortTag() != "!!float") {
		return fmt.Errorf("want a byte count such as 1073741824 or 1GiB, got %s", describe(n))
	}
	return v.Set(n.Value)
}

type durationValue time.Duration

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("invalid duration %q (e.g. 30s, 2m)", s)
	}
	*v = durationValue(d)
	return nil
}
func (v *durationValue) String() string { return time.Duration(*v).String() }
func (v *durationValue) decode(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return fmt.Errorf("want a duration such as 30s, got %s", describe(n))
	}
	return v.Set(n.Value)
}

// describe names what a YAML node holds, for errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	if n.ShortTag() == "!!null" {
		return "null"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	return strconv.Quote(v)
}

var byteUnits = []struct {
	suffix string
	mult   float64
}{
	// Longest first so "KiB" is not read as "B".
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
	{"b", 1},
}

// ParseBytes reads a byte count: a plain integer ("1073741824") or a number
// with a unit, binary (KiB, MiB, GiB, TiB) or decimal (KB, MB, GB, TB, B),
// case-insensitive, e.g. "1GiB", "1.5 GiB", "512MB". Fractions round down
// to whole bytes. Negative counts are errors.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if i, err := strconv.ParseInt(t, 10, 64); err == nil {
		if i < 0 {
			return 0, fmt.Errorf("byte count %q must not be negative", s)
		}
		return i, nil
	}
	low := strings.ToLower(t)
	for _, u := range byteUnits {
		num, ok := strings.CutSuffix(low, u.suffix)
		if !ok {
			continue
		}
		num = strings.TrimSpace(num)
		f, err := strconv.ParseFloat(num, 64)
		if err != nil || num == "" || strings.ContainsAny(num, "eEnNxXpP_+") {
			break
		}
		if f < 0 {
			return 0, fmt.Errorf("byte count %q must not be negative", s)
		}
		b := math.Floor(f * u.mult)
		if b >= math.MaxInt64 {
			return 0, fmt.Errorf("byte count %q is too large", s)
		}
		return int64(b), nil
	}
	return 0, errors.New("invalid byte count " + strconv.Quote(s) + " (an integer, or a number with KiB, MiB, GiB, TiB, KB, MB, GB, TB or B)")
}
