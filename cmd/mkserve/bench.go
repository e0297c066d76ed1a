package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/mkserve/mkserve/loadgen"
)

// benches are the `mkserve bench` subcommands by name; files that add one
// register it from init.
var benches = map[string]func([]string, io.Writer) error{
	"serve": benchServe,
}

// benchNames lists the registered benchmarks, sorted.
func benchNames() string {
	names := make([]string, 0, len(benches))
	for n := range benches {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// cmdBench dispatches `mkserve bench <what>`.
func cmdBench(args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: mkserve bench <%s> [flags]", strings.ReplaceAll(benchNames(), ", ", "|"))
	}
	f, ok := benches[args[0]]
	if !ok {
		return fmt.Errorf("unknown benchmark %q (available: %s)", args[0], benchNames())
	}
	return f(args[1:], stdout)
}

// benchServe is a serving load test in the manner of vLLM's
// benchmark_serving: a table on stdout, or JSON with --json.
func benchServe(args []string, stdout io.Writer) error {
	fs := newFlags("bench serve")
	o := loadgen.Options{}
	fs.StringVar(&o.BaseURL, "base-url", "http://127.0.0.1:8000", "server root URL")
	fs.StringVar(&o.Model, "model", "", "model name sent with each request")
	fs.StringVar(&o.APIKey, "api-key", os.Getenv("OPENAI_API_KEY"), "bearer token (default $OPENAI_API_KEY)")
	fs.StringVar(&o.Endpoint, "endpoint", "completions", "completions or chat")
	fs.IntVar(&o.NumPrompts, "num-prompts", 200, "requests to send")
	rate := fs.String("request-rate", "inf", "mean requests per second (Poisson arrivals); inf sends all at once")
	fs.IntVar(&o.MaxConcurrency, "max-concurrency", 0, "requests in flight at most (0: no cap)")
	in := fs.String("random-input-len", "128", "prompt length: N, LO:HI, uniform:LO:HI or normal:MEAN:STD")
	out := fs.String("random-output-len", "64", "output length, same forms")
	fs.Int64Var(&o.Seed, "seed", 0, "random seed")
	fs.DurationVar(&o.Timeout, "timeout", 0, "per-request timeout (0: none)")
	asJSON := fs.Bool("json", false, "print the result as JSON instead of a table")
	temp := fs.Float64("temperature", -1, "sampling temperature sent with every request (unset: the server's default)")
	topP := fs.Float64("top-p", -1, "top-p sent with every request (unset: the server's default)")
	topK := fs.Int("top-k", -1, "top-k sent with every request (0: off; unset: the server's default)")
	fs.BoolVar(&o.JSONObject, "json-object", false, "send response_format json_object (without ignore_eos: the output length is then an upper bound)")
	schemaFile := fs.String("json-schema", "", "send response_format json_schema with the JSON Schema in this file (without ignore_eos)")
	grammarFile := fs.String("grammar", "", "send guided_grammar with the GBNF grammar in this file (without ignore_eos)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// Sampling flags are sent only when given (the defaults mark "unset").
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "temperature":
			o.Temperature = temp
		case "top-p":
			o.TopP = topP
		case "top-k":
			o.TopK = topK
		}
	})
	switch o.Endpoint {
	case "completions", "/v1/completions":
		o.Endpoint = loadgen.EndpointCompletions
	case "chat", "/v1/chat/completions":
		o.Endpoint = loadgen.EndpointChat
	default:
		return fmt.Errorf("--endpoint must be completions or chat, got %q", o.Endpoint)
	}
	r, err := strconv.ParseFloat(*rate, 64)
	if err != nil || r < 0 || math.IsNaN(r) {
		return fmt.Errorf("--request-rate must be a non-negative number or inf, got %q", *rate)
	}
	o.RequestRate = r
	if o.PromptLen, err = loadgen.ParseDist(*in); err != nil {
		return fmt.Errorf("--random-input-len: %w", err)
	}
	if o.OutputLen, err = loadgen.ParseDist(*out); err != nil {
		return fmt.Errorf("--random-output-len: %w", err)
	}
	if *schemaFile != "" {
		b, err := os.ReadFile(*schemaFile)
		if err != nil {
			return fmt.Errorf("--json-schema: %w", err)
		}
		o.JSONSchema = b
	}
	if *grammarFile != "" {
		b, err := os.ReadFile(*grammarFile)
		if err != nil {
			return fmt.Errorf("--grammar: %w", err)
		}
		o.Grammar = string(b)
	}
	ctx, stop := signal.NotifyContext(context.Background(), serveSignals...)
	defer stop()
	start := time.Now()
	res, err := loadgen.Run(ctx, o)
	if err != nil && res == nil {
		return err
	}
	if *asJSON {
		b, jerr := res.JSON()
		if jerr != nil {
			return jerr
		}
		_, werr := fmt.Fprintf(stdout, "%s\n", b)
		if werr != nil {
			return werr
		}
	} else if terr := res.Table(stdout); terr != nil {
		return terr
	}
	if err != nil {
		return fmt.Errorf("stopped after %s: %w", time.Since(start).Round(time.Millisecond), err)
	}
	return nil
}

// printJSONArray writes res as one JSON array ([] when empty) and a newline:
// the --json form of the kernel benchmarks.
func printJSONArray[T any](w io.Writer, res []T) error {
	if res == nil {
		res = []T{}
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// attnShape holds the flags the attention and ring benchmarks share: the
// attention's shape, the output form and the device.
type attnShape struct {
	heads, kvHeads, headDim, vHeadDim, window, device int
	causal, json                                      bool
}

// register adds the shape's flags to fs; finish completes them after parsing.
func (a *attnShape) register(fs *flag.FlagSet) {
	fs.IntVar(&a.heads, "heads", 32, "query heads")
	fs.IntVar(&a.kvHeads, "kv-heads", 8, "key/value heads (GQA)")
	fs.IntVar(&a.headDim, "head-dim", 128, "query/key head dim")
	fs.IntVar(&a.vHeadDim, "v-head-dim", 0, "value head dim (default: --head-dim)")
	fs.BoolVar(&a.causal, "causal", false, "causal mask")
	fs.IntVar(&a.window, "window", 0, "sliding window in keys (needs --causal; 0: none)")
	fs.BoolVar(&a.json, "json", false, "print one JSON array instead of a table")
	fs.IntVar(&a.device, "device", 0, "CUDA device ordinal")
}

// finish gives vHeadDim its default, headDim.
func (a *attnShape) finish() {
	if a.vHeadDim == 0 {
		a.vHeadDim = a.headDim
	}
}
