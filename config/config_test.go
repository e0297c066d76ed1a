package config

import (
	"flag"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mkserve/mkserve/engine"
	"gopkg.in/yaml.v3"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func newFS() *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrecedence: defaults < YAML < env < flags, setting by setting.
func TestPrecedence(t *testing.T) {
	yamlText := "model: /from/yaml\nhttp_addr: 10.0.0.1:1\napi_key: yamlkey\nlog_level: warn\n" +
		"engine:\n  max_num_seqs: 7\n  kv_cache_bytes: 2GiB\n  prefix_caching: false\n"
	path := writeFile(t, yamlText)
	cases := []struct {
		name  string
		env   map[string]string
		args  []string
		check func(t *testing.T, c *Config)
	}{
		{"defaults only", nil, []string{"--model", "m"}, func(t *testing.T, c *Config) {
			want := Default()
			want.Model = "m"
			if !reflect.DeepEqual(c, want) {
				t.Errorf("got %+v want %+v", c, want)
			}
		}},
		{"yaml over defaults", nil, []string{"--config", path}, func(t *testing.T, c *Config) {
			eq(t, c.Model, "/from/yaml")
			eq(t, c.HTTPAddr, "10.0.0.1:1")
			eq(t, c.GRPCAddr, DefaultGRPCAddr) // not in the file: default
			eq(t, c.Engine.MaxNumSeqs, 7)
			eq(t, c.Engine.KVCacheBytes, int64(2<<30))
			eq(t, c.Engine.PrefixCaching, false)
			eq(t, c.Engine.BlockSize, engine.DefaultConfig().BlockSize)
		}},
		{"env over yaml", map[string]string{"MKSERVE_HTTP_ADDR": "10.0.0.2:2", "MKSERVE_MAX_NUM_SEQS": "9",
			"MKSERVE_PREFIX_CACHING": "true", "MKSERVE_API_KEY": "envkey"}, []string{"--config", path}, func(t *testing.T, c *Config) {
			eq(t, c.HTTPAddr, "10.0.0.2:2")
			eq(t, c.APIKey, "envkey")
			eq(t, c.Engine.MaxNumSeqs, 9)
			eq(t, c.Engine.PrefixCaching, true)
			eq(t, c.LogLevel, "warn") // only in YAML
		}},
		{"flags over env", map[string]string{"MKSERVE_HTTP_ADDR": "10.0.0.2:2", "MKSERVE_MAX_NUM_SEQS": "9", "MKSERVE_LOG_LEVEL": "error"},
			[]string{"--config", path, "--http-addr", "10.0.0.3:3", "--max-num-seqs=11", "--prefix-caching=true", "--graph-warmup=false", "serve-arg"},
			func(t *testing.T, c *Config) {
				eq(t, c.Engine.GraphWarmup, false) // default true
				eq(t, c.HTTPAddr, "10.0.0.3:3")
				eq(t, c.Engine.MaxNumSeqs, 11)
				eq(t, c.Engine.PrefixCaching, true)
				eq(t, c.LogLevel, "error") // env, no flag
				eq(t, c.APIKey, "yamlkey")
			}},
		{"config from env", map[string]string{ConfigEnv: path}, nil, func(t *testing.T, c *Config) {
			eq(t, c.Model, "/from/yaml")
		}},
		{"config flag over config env", map[string]string{ConfigEnv: "/does/not/exist.yaml"}, []string{"--config", path},
			func(t *testing.T, c *Config) { eq(t, c.Model, "/from/yaml") }},
		{"flag equal to default still wins", map[string]string{"MKSERVE_BLOCK_SIZE": "32"},
			[]string{"--model", "m", "--block-size", strconv.Itoa(engine.DefaultConfig().BlockSize)},
			func(t *testing.T, c *Config) { eq(t, c.Engine.BlockSize, engine.DefaultConfig().BlockSize) }},
		{"list and bytes and duration", map[string]string{"MKSERVE_CORS_ORIGINS": "http://a.example, https://b.example:8443"},
			[]string{"--model", "m", "--max-body-bytes", "1.5KiB", "--drain-timeout", "2m"}, func(t *testing.T, c *Config) {
				eq(t, strings.Join(c.CORSOrigins, "|"), "http://a.example|https://b.example:8443")
				eq(t, c.MaxBodyBytes, int64(1536))
				eq(t, c.DrainTimeout, 2*time.Minute)
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFS()
			c, err := Parse(fs, tc.args, env(tc.env))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
			if tc.name == "flags over env" && strings.Join(fs.Args(), " ") != "serve-arg" {
				t.Errorf("fs.Args() = %q", fs.Args())
			}
		})
	}
}

func eq[T comparable](t *testing.T, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestEveryFieldHasFlagAndEnv sets each setting through its flag and its
// variable to a random valid value and checks it lands in that field only.
func TestEveryFieldHasFlagAndEnv(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	for _, f := range Default().fields() {
		var s string
		switch f.v.(type) {
		case *stringValue:
			s = "s" + strconv.Itoa(rng.IntN(1e6))
		case *intValue, *bytesValue:
			s = strconv.Itoa(2 + rng.IntN(1e6))
		case *boolValue:
			s = strconv.FormatBool(f.v.String() != "true") // the opposite of the default
		case *listValue:
			s = "http://h" + strconv.Itoa(rng.IntN(1e6))
		case *durationValue:
			s = (time.Duration(1+rng.IntN(1e6)) * time.Millisecond).String()
		default:
			t.Fatalf("%s: untested value type %T", f.key, f.v)
		}
		for _, via := range []string{"flag", "env"} {
			c := Default()
			var err error
			if via == "flag" {
				fs := newFS()
				c.BindFlags(fs)
				err = fs.Parse([]string{"--" + f.flag() + "=" + s})
			} else {
				err = c.ApplyEnv(env(map[string]string{f.env(): s}))
			}
			if err != nil {
				t.Fatalf("%s via %s: %v", f.key, via, err)
			}
			// Exactly this field changed, to s.
			d := Default()
			df, cf := d.fields(), c.fields()
			for i := range cf {
				if cf[i].key == f.key {
					eq(t, cf[i].v.String(), s)
				} else if cf[i].v.String() != df[i].v.String() {
					t.Errorf("setting %s via %s changed %s", f.key, via, cf[i].key)
				}
			}
		}
	}
	// The names the brief and the README promise.
	fs := newFS()
	Default().BindFlags(fs)
	for _, name := range []string{"http-addr", "grpc-addr", "max-num-seqs", "model", "api-key", "backend", "ep",
		"kv-cache-bytes", "max-model-len", "prefix-caching", "served-model-name", "cors-origins", "log-prompts", "precision", "context-parallel", "rebalance-every"} {
		if fs.Lookup(name) == nil {
			t.Errorf("no flag --%s", name)
		}
	}
}

func TestDefaultsMatchEngine(t *testing.T) {
	d := Default()
	if got, want := d.EngineConfig(), engine.DefaultConfig(); got != want {
		t.Errorf("EngineConfig() = %+v, engine.DefaultConfig() = %+v", got, want)
	}
	eq(t, d.HTTPAddr, "127.0.0.1:8000")
	eq(t, d.GRPCAddr, "127.0.0.1:50051")
	d.Model = "x"
	if err := d.Validate(); err != nil {
		t.Errorf("defaults with a model: %v", err)
	}
}

func TestEngineConfigMapping(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	c := Default()
	c.Engine = Engine{
		MaxNumSeqs: 1 + rng.IntN(100), MaxNumBatchedTokens: 200 + rng.IntN(100), BlockSize: 1 + rng.IntN(64),
		KVCacheBytes: 1 + rng.Int64N(1<<40), MaxQueue: 1 + rng.IntN(100), MaxModelLen: rng.IntN(1 << 20), PrefixCaching: rng.IntN(2) == 0,
		HostSampling: rng.IntN(2) == 0, ContextParallel: 1 + rng.IntN(8), ContextParallelMin: rng.IntN(100000),
		RebalanceEvery: rng.IntN(100), RebalanceSpare: rng.IntN(4), GraphWarmup: rng.IntN(2) == 0,
		SyncSteps: rng.IntN(2) == 0,
	}
	e := c.EngineConfig()
	want := engine.Config{MaxNumSeqs: c.Engine.MaxNumSeqs, MaxNumBatchedTokens: c.Engine.MaxNumBatchedTokens,
		BlockSize: c.Engine.BlockSize, KVCacheBytes: c.Engine.KVCacheBytes, MaxQueue: c.Engine.MaxQueue,
		MaxModelLen: c.Engine.MaxModelLen, PrefixCaching: c.Engine.PrefixCaching, HostSampling: c.Engine.HostSampling,
		ContextParallel: c.Engine.ContextParallel, ContextParallelMin: c.Engine.ContextParallelMin,
		RebalanceEvery: c.Engine.RebalanceEvery, RebalanceSpare: c.Engine.RebalanceSpare,
		GraphWarmup: c.Engine.GraphWarmup, SyncSteps: c.Engine.SyncSteps}
	if e != want {
		t.Errorf("got %+v want %+v", e, want)
	}
}

func TestLoadErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string // substrings of the error
	}{
		{"unknown top key", "model: m\nhttp_adr: x:1\n", []string{"line 2", `unknown key "http_adr"`}},
		{"unknown engine key", "engine:\n  block_size: 16\n  max_seqs: 3\n", []string{"line 3", `"engine.max_seqs"`}},
		{"engine scalar", "engine: 5\n", []string{"line 1", "engine must be a mapping"}},
		{"top level list", "- a\n- b\n", []string{"line 1", "top level must be a mapping"}},
		{"wrong int", "ep: two\n", []string{"line 1", "ep", "integer", `"two"`}},
		{"float int", "engine:\n  max_queue: 1.5\n", []string{"line 2", "engine.max_queue", "integer"}},
		{"wrong bool", "log_prompts: maybe\n", []string{"log_prompts", "true or false"}},
		{"string as list", "cors_origins: http://a\n", []string{"cors_origins", "list"}},
		{"list item mapping", "cors_origins:\n  - {a: 1}\n", []string{"cors_origins", "line 2"}},
		{"bad bytes", "engine:\n  kv_cache_bytes: 1 GB please\n", []string{"engine.kv_cache_bytes", "invalid byte count"}},
		{"negative bytes", "max_body_bytes: -5\n", []string{"max_body_bytes", "negative"}},
		{"bare int duration", "drain_timeout: 30\n", []string{"drain_timeout", "duration"}},
		{"string as mapping", "model: {a: b}\n", []string{"model", "string"}},
		{"null string", "model: null\n", []string{"model", "string"}},
		{"duplicate key", "model: a\nmodel: b\n", []string{"line 2", `"model" repeats`, "line 1"}},
		{"two documents", "model: a\n---\nmodel: b\n", []string{"more than one YAML document"}},
		{"syntax", "model: [\n", []string{"yaml"}},
		{"tab indentation", "engine:\n\tblock_size: 3\n", []string{"yaml"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := LoadBytes("x.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range append(tc.want, "x.yaml") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
	for _, empty := range []string{"", "# only a comment\n", "---\n", "engine:\n"} {
		c, err := LoadBytes("e.yaml", []byte(empty))
		if err != nil {
			t.Errorf("%q: %v", empty, err)
		} else if !reflect.DeepEqual(c, Default()) {
			t.Errorf("%q: not the defaults", empty)
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		key string
		mut func(c *Config)
	}{
		{"model", func(c *Config) { c.Model = " " }},
		{"backend", func(c *Config) { c.Backend = "rocm" }},
		{"http_addr", func(c *Config) { c.HTTPAddr = "localhost" }},
		{"http_addr", func(c *Config) { c.HTTPAddr = "" }},
		{"http_addr", func(c *Config) { c.HTTPAddr = "h:99999" }},
		{"grpc_addr", func(c *Config) { c.GRPCAddr = "h:port" }},
		{"api_key", func(c *Config) { c.APIKey = "a b" }},
		{"cors_origins[1]", func(c *Config) { c.CORSOrigins = []string{"*", "example.com"} }},
		{"cors_origins[0]", func(c *Config) { c.CORSOrigins = []string{"http://a/path"} }},
		{"log_format", func(c *Config) { c.LogFormat = "xml" }},
		{"reasoning_parser", func(c *Config) { c.ReasoningParser = "qwen3" }},
		{"json_whitespace", func(c *Config) { c.JSONWhitespace = "tight" }},
		{"cpu_weights", func(c *Config) { c.CPUWeights = "int4" }},
		{"kv_cache_dtype", func(c *Config) { c.KVCacheDtype = "fp8" }},
		{"kv_cache_dtype", func(c *Config) { c.KVCacheDtype, c.Backend = "bf16", "cuda" }},
		{"cpu_weights", func(c *Config) { c.CPUWeights, c.Backend = "q8", "cuda" }},
		{"cuda_weights", func(c *Config) { c.CUDAWeights, c.Backend = "int4", "cuda" }},
		{"cuda_weights", func(c *Config) { c.CUDAWeights = "fp4" }},
		{"responses_store", func(c *Config) { c.ResponsesStore = -1 }},
		{"log_level", func(c *Config) { c.LogLevel = "loud" }},
		{"log_level", func(c *Config) { c.LogLevel = "" }},
		{"max_body_bytes", func(c *Config) { c.MaxBodyBytes = 0 }},
		{"drain_timeout", func(c *Config) { c.DrainTimeout = -time.Second }},
		{"served_model_name", func(c *Config) { c.ServedModelName = "a\nb" }},
		{"ep", func(c *Config) { c.EP = 0 }},
		{"engine.max_num_seqs", func(c *Config) { c.Engine.MaxNumSeqs = 0 }},
		{"engine.max_num_batched_tokens", func(c *Config) { c.Engine.MaxNumBatchedTokens = -1 }},
		{"engine.max_num_batched_tokens", func(c *Config) { c.Engine.MaxNumSeqs = 64; c.Engine.MaxNumBatchedTokens = 32 }},
		{"engine.block_size", func(c *Config) { c.Engine.BlockSize = 2048 }},
		{"engine.kv_cache_bytes", func(c *Config) { c.Engine.KVCacheBytes = 0 }},
		{"engine.max_queue", func(c *Config) { c.Engine.MaxQueue = 0 }},
		{"engine.max_model_len", func(c *Config) { c.Engine.MaxModelLen = -1 }},
	}
	for _, tc := range cases {
		c := Default()
		c.Model = "m"
		tc.mut(c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.key+":") {
			t.Errorf("%s: error %v does not name it", tc.key, err)
		}
	}
	// And through Parse: a bad flag value or variable names the flag or variable.
	if _, err := Parse(newFS(), []string{"--model", "m", "--max-num-seqs", "x"}, env(nil)); err == nil || !strings.Contains(err.Error(), "max-num-seqs") {
		t.Errorf("bad flag: %v", err)
	}
	if _, err := Parse(newFS(), []string{"--model", "m"}, env(map[string]string{"MKSERVE_EP": "many"})); err == nil || !strings.Contains(err.Error(), "MKSERVE_EP") {
		t.Errorf("bad env: %v", err)
	}
	if _, err := Parse(newFS(), []string{"--model", "m", "--backend", "tpu"}, env(nil)); err == nil || !strings.Contains(err.Error(), "backend") {
		t.Errorf("bad backend: %v", err)
	}
	if c, err := Parse(newFS(), nil, env(nil)); err != nil || c.Model != DefaultModel {
		t.Errorf("no flags: model %v, %v; want the default model", c, err)
	}
	if _, err := Parse(newFS(), []string{"--model", ""}, env(nil)); err == nil || !strings.Contains(err.Error(), "model") {
		t.Errorf("empty model: %v", err)
	}
}

func TestParseBytes(t *testing.T) {
	cases := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"1073741824", 1 << 30, true}, {"1GiB", 1 << 30, true}, {"1gib", 1 << 30, true},
		{"1.5 GiB", 3 << 29, true}, {"512MiB", 512 << 20, true}, {"2KiB", 2048, true}, {"1TiB", 1 << 40, true},
		{"1GB", 1e9, true}, {"3kb", 3000, true}, {"7MB", 7e6, true}, {"2TB", 2e12, true}, {"10B", 10, true},
		{" 8 ", 8, true}, {"0.5B", 0, true},
		{"", 0, false}, {"GiB", 0, false}, {"1.5", 0, false}, {"-1", 0, false}, {"-1GiB", 0, false},
		{"1e3B", 0, false}, {"NaNGiB", 0, false}, {"infGiB", 0, false}, {"1 GB extra", 0, false},
		{"1G", 0, false}, {"99999999TiB", 0, false}, {"0x10", 0, false}, {"1_000B", 0, false},
	}
	for _, tc := range cases {
		got, err := ParseBytes(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// TestPresets: every YAML file in configs/ loads and validates, sets every
// key explicitly or by design, and the presets differ where they should.
func TestPresets(t *testing.T) {
	paths, err := filepath.Glob("../configs/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 3 {
		t.Fatalf("found %d presets in ../configs, want demo, h200 and multi-gpu", len(paths))
	}
	got := map[string]*Config{}
	for _, p := range paths {
		c, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", p, err)
		}
		got[filepath.Base(p)] = c
	}
	demo, h200, multi := got["demo.yaml"], got["h200.yaml"], got["multi-gpu.yaml"]
	if demo == nil || h200 == nil || multi == nil {
		t.Fatalf("presets found: %v", paths)
	}
	eq(t, demo.Backend, "cpu")
	eq(t, h200.Backend, "cuda")
	eq(t, multi.Backend, "cuda")
	eq(t, demo.EP, 1)
	eq(t, h200.EP, 1)
	eq(t, multi.EP, 8)
	// The demo's model is in the repository.
	if _, err := os.Stat(filepath.Join("..", demo.Model, "config.json")); err != nil {
		t.Errorf("demo model: %v", err)
	}
	// A flag overrides a preset's model.
	c, err := Parse(newFS(), []string{"--config", "../configs/h200.yaml", "--model", "/other"}, env(nil))
	if err != nil {
		t.Fatal(err)
	}
	eq(t, c.Model, "/other")
	eq(t, c.ModelName(), "other")
}

func TestModelName(t *testing.T) {
	c := Default()
	eq(t, c.ModelName(), "default")
	c.Model = ""
	eq(t, c.ModelName(), "")
	c.Model = "/models/Qwen3-30B-A3B/"
	eq(t, c.ModelName(), "Qwen3-30B-A3B")
	c.ServedModelName = "served"
	eq(t, c.ModelName(), "served")
}

func TestNewLogger(t *testing.T) {
	for _, f := range []string{"json", "console"} {
		c := Default()
		c.LogFormat = f
		c.LogLevel = "warn"
		l, err := c.NewLogger()
		if err != nil {
			t.Fatal(err)
		}
		if l.Core().Enabled(-1) || !l.Core().Enabled(1) { // debug off, warn on
			t.Errorf("%s: wrong level", f)
		}
	}
	c := Default()
	c.LogFormat = "xml"
	if _, err := c.NewLogger(); err == nil {
		t.Error("log_format xml accepted")
	}
}

// TestRoundTrip: a random valid Config marshalled to YAML by its keys loads
// back equal.
func TestRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 9))
	for range 50 {
		c := randomConfig(rng)
		back, err := LoadBytes("rt.yaml", marshal(t, c))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", back, c)
		}
	}
}

func randomConfig(rng *rand.Rand) *Config {
	c := Default()
	c.Model = "/m/" + strconv.Itoa(rng.IntN(1000))
	c.Backend = []string{"cpu", "cuda"}[rng.IntN(2)]
	c.HTTPAddr = "127.0.0.1:" + strconv.Itoa(rng.IntN(65536))
	c.GRPCAddr = []string{"", ":" + strconv.Itoa(rng.IntN(65536))}[rng.IntN(2)]
	c.APIKey = strconv.FormatUint(rng.Uint64(), 36)
	c.CORSOrigins = []string{"https://x" + strconv.Itoa(rng.IntN(100)) + ".example"}
	c.LogFormat = []string{"json", "console"}[rng.IntN(2)]
	c.LogLevel = []string{"debug", "info", "warn", "error"}[rng.IntN(4)]
	c.LogPrompts = rng.IntN(2) == 0
	c.MaxBodyBytes = 1 + rng.Int64N(1<<30)
	c.DrainTimeout = time.Duration(rng.Int64N(int64(time.Hour)))
	c.ServedModelName = "n" + strconv.Itoa(rng.IntN(100))
	c.EP = 1 + rng.IntN(16)
	c.Engine.MaxNumSeqs = 1 + rng.IntN(512)
	c.Engine.MaxNumBatchedTokens = 512 + rng.IntN(1<<16)
	c.Engine.BlockSize = 1 + rng.IntN(1024)
	c.Engine.KVCacheBytes = 1 + rng.Int64N(1<<40)
	c.Engine.MaxQueue = 1 + rng.IntN(1<<16)
	c.Engine.MaxModelLen = rng.IntN(1 << 20)
	c.Engine.PrefixCaching = rng.IntN(2) == 0
	return c
}

// marshal writes c as YAML through the field table (strings for every
// scalar, so the decoder's typing is exercised by the types it expects).
func marshal(t *testing.T, c *Config) []byte {
	top := map[string]any{}
	eng := map[string]any{}
	for _, f := range c.fields() {
		var v any = f.v.String()
		switch x := f.v.(type) {
		case *intValue:
			v = int(*x)
		case *boolValue:
			v = bool(*x)
		case *listValue:
			v = []string(*x)
		}
		if n, ok := strings.CutPrefix(f.key, "engine."); ok {
			eng[n] = v
		} else {
			top[f.key] = v
		}
	}
	top["engine"] = eng
	out, err := yaml.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// FuzzLoad: no YAML input panics; whatever loads marshals back to the same
// Config, and Validate never panics.
func FuzzLoad(f *testing.F) {
	for _, p := range []string{"../configs/demo.yaml", "../configs/h200.yaml", "../configs/multi-gpu.yaml"} {
		if b, err := os.ReadFile(p); err == nil {
			f.Add(b)
		}
	}
	for _, s := range []string{"", "engine:\n  kv_cache_bytes: 1.5GiB\n", "model: [\n", "a: &x 1\nb: *x\n",
		"cors_origins: [a, b]\n", "drain_timeout: 1h\nep: 0x10\n", "engine: {max_num_seqs: 1e3}\n", "? [a]\n: b\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := LoadBytes("fuzz.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config: fuzz.yaml: ") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		_ = c.Validate()
		back, err := LoadBytes("again.yaml", marshal(t, c))
		if err != nil {
			t.Fatalf("re-loading %+v: %v", c, err)
		}
		if !reflect.DeepEqual(back, c) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", back, c)
		}
	})
}

// TestCUDARebalance: expert rebalancing on the cuda backend is a valid
// configuration with its expert-parallel prerequisites (ep ≥ 2 through the
// fused MoE path in the fast profile) and reaches the engine; without them
// it names the missing setting.
func TestCUDARebalance(t *testing.T) {
	base := []string{"--model", "m", "--backend", "cuda", "--rebalance-every", "8"}
	for _, tc := range []struct {
		args []string
		want string // "": valid
	}{
		{[]string{"--ep", "4", "--moe-path", "fused", "--precision", "fast"}, ""},
		{[]string{"--ep", "4", "--moe-path", "fused", "--precision", "fast", "--rebalance-spare", "2"}, ""},
		{[]string{"--moe-path", "fused", "--precision", "fast"}, "engine.rebalance_every"},
		{[]string{"--ep", "4", "--precision", "fast"}, "moe_path fused"},
		{[]string{"--ep", "4", "--moe-path", "fused"}, "precision fast"},
	} {
		c, err := Parse(newFS(), append(slices.Clone(base), tc.args...), env(nil))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%v: %v, want a valid config", tc.args, err)
		case tc.want == "" && c.EngineConfig().RebalanceEvery != 8:
			t.Errorf("%v: engine rebalance_every %d, want 8", tc.args, c.EngineConfig().RebalanceEvery)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%v: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}
