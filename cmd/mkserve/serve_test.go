package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mkserve/mkserve/backend/cuda"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/loadgen"
	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
	"github.com/mkserve/mkserve/transport"
)

// testBackendEnv names the environment variable that picks the backend of
// the serving tests: unset runs them on the CPU backend; "cuda" runs the
// same tests on the GPU (scripts/device.sh does, with MKSERVE_KERNEL_LIB).
const testBackendEnv = "MKSERVE_TEST_BACKEND"

// startServe runs `mkserve serve` in process on loopback ports and returns
// its addresses and a stop function that waits for a clean exit.
func startServe(t *testing.T, args ...string) (httpAddr, grpcAddr string, stop func()) {
	t.Helper()
	if b := os.Getenv(testBackendEnv); b != "" {
		t.Logf("serving on backend %s (%s)", b, testBackendEnv)
		args = append([]string{"--backend", b}, args...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	errc := make(chan error, 1)
	env := func(string) (string, bool) { return "", false }
	go func() {
		errc <- serve(ctx, append([]string{"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-level", "error"}, args...), env,
			func(h, g string) { ready <- [2]string{h, g} })
	}()
	select {
	case a := <-ready:
		return a[0], a[1], func() {
			cancel()
			select {
			case err := <-errc:
				if err != nil {
					t.Errorf("serve returned %v after shutdown", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("serve did not stop within 30s")
			}
		}
	case err := <-errc:
		cancel()
		t.Fatalf("serve failed to start: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("serve not ready after 60s")
	}
	return "", "", nil
}

// TestServeEndToEnd: the default model served over HTTP (a streaming chat
// completion, read as curl would), gRPC (health and Generate) and metrics,
// then a short load test, then a clean shutdown.
func TestServeEndToEnd(t *testing.T) {
	h, g, stop := startServe(t, "--model", "../../models/default")
	defer stop()

	// Streaming chat, as the README's curl does.
	body := `{"model":"default","messages":[{"role":"user","content":"Quote a verse about light."}],"max_tokens":12,"stream":true}`
	resp, err := http.Post("http://"+h+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	chunks, done := 0, false
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			done = true
			break
		}
		if rest, ok := strings.CutPrefix(line, "data: "); ok {
			var v map[string]any
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				t.Fatalf("bad SSE chunk %q: %v", rest, err)
			}
			chunks++
		}
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !done || chunks < 2 {
		t.Fatalf("chat stream: status %d, %d chunks, done %v", resp.StatusCode, chunks, done)
	}

	// gRPC: health and a unary Generate.
	conn, err := grpc.NewClient(g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "mkserve.v1.Inference"})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("gRPC health: %v %v", hr, err)
	}
	maxTok := int32(8)
	gr, err := pb.NewInferenceClient(conn).Generate(ctx, &pb.GenerateRequest{
		Prompt:   &pb.GenerateRequest_Text{Text: "In the beginning"},
		Sampling: &pb.SamplingParams{MaxTokens: &maxTok},
	})
	if err != nil {
		t.Fatalf("gRPC Generate: %v", err)
	}
	if len(gr.GetChoices()) != 1 {
		t.Fatalf("gRPC Generate returned %d choices", len(gr.GetChoices()))
	}
	// gRPC with a conversation, rendered by the model's chat template.
	cr, err := pb.NewInferenceClient(conn).Generate(ctx, &pb.GenerateRequest{
		Prompt:   &pb.GenerateRequest_Chat{Chat: &pb.Chat{Messages: []*pb.ChatMessage{{Role: "user", Content: "Quote a verse about light."}}}},
		Sampling: &pb.SamplingParams{MaxTokens: &maxTok},
	})
	if err != nil || len(cr.GetChoices()) != 1 || cr.GetUsage().GetPromptTokens() < 5 {
		t.Fatalf("gRPC Generate with a chat: %v %v", cr, err)
	}

	// A short load test through loadgen.
	res, err := loadgen.Run(ctx, loadgen.Options{BaseURL: "http://" + h, NumPrompts: 16, MaxConcurrency: 8,
		PromptLen: loadgen.Fixed(16), OutputLen: loadgen.Fixed(8), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 16 || res.Failed != 0 {
		t.Fatalf("load test: %d completed, %d failed: %v", res.Completed, res.Failed, res.Errors)
	}

	// Requests whose logits change before sampling (JSON mode, logit_bias:
	// on a GPU backend their mask and bias go with the rows to the device
	// sampler; with log-probabilities they sample on the host), a fork, and
	// plain ones side by side: each gets what it asked for.
	mixed := []struct {
		path, body string
		check      func(body []byte) error
	}{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"JSON please"}],"max_tokens":24,"response_format":{"type":"json_object"}}`, func(b []byte) error {
			var r struct {
				Choices []struct {
					Message      struct{ Content string }
					FinishReason string `json:"finish_reason"`
				}
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
				return fmt.Errorf("response %s: %v", b, err)
			}
			c := r.Choices[0]
			if !strings.HasPrefix(c.Message.Content, "{") || (c.FinishReason == "stop" && !json.Valid([]byte(c.Message.Content))) {
				return fmt.Errorf("json_object content %q (%s)", c.Message.Content, c.FinishReason)
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"In the beginning","max_tokens":16,"temperature":0.8,"seed":5,"guided_regex":"[0-9]{3}-(yes|no)!?"}`, func(b []byte) error {
			var r struct {
				Choices []struct {
					Text         string
					FinishReason string `json:"finish_reason"`
				}
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
				return fmt.Errorf("guided_regex: %s (%v)", b, err)
			}
			if c := r.Choices[0]; c.FinishReason != "stop" || !regexp.MustCompile(`^[0-9]{3}-(yes|no)!?$`).MatchString(c.Text) {
				return fmt.Errorf("guided_regex: %q (%s), want a whole match", c.Text, c.FinishReason)
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"In the beginning","max_tokens":40,"temperature":0.8,"seed":5,
			"guided_grammar":"root ::= name (\", \" name){1,2} \".\"\nname ::= [A-Z] [a-z]{1,8}"}`, func(b []byte) error {
			var r struct {
				Choices []struct {
					Text         string
					FinishReason string `json:"finish_reason"`
				}
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
				return fmt.Errorf("guided_grammar: %s (%v)", b, err)
			}
			if c := r.Choices[0]; c.FinishReason != "stop" || !regexp.MustCompile(`^[A-Z][a-z]{1,8}(, [A-Z][a-z]{1,8}){1,2}\.$`).MatchString(c.Text) {
				return fmt.Errorf("guided_grammar: %q (%s), want a whole match", c.Text, c.FinishReason)
			}
			return nil
		}},
		{"/v1/responses", `{"instructions":"Answer in the words of scripture.","input":"Who made the light?","max_output_tokens":12,"temperature":0}`, func(b []byte) error {
			var r struct {
				Object, Status string
				Output         []struct {
					Type    string
					Content []struct{ Text string }
				}
				Usage struct {
					InputTokens  int `json:"input_tokens"`
					OutputTokens int `json:"output_tokens"`
				}
			}
			if err := json.Unmarshal(b, &r); err != nil || r.Object != "response" || len(r.Output) == 0 {
				return fmt.Errorf("responses: %s (%v)", b, err)
			}
			m := r.Output[len(r.Output)-1]
			if m.Type != "message" || len(m.Content) != 1 || m.Content[0].Text == "" || r.Usage.InputTokens < 5 ||
				r.Usage.OutputTokens < 1 || r.Usage.OutputTokens > 12 || (r.Status != "completed" && r.Status != "incomplete") {
				return fmt.Errorf("responses: %s", b)
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"In the beginning","max_tokens":6,"n":2,"temperature":0.8,"seed":3}`, func(b []byte) error {
			var r struct{ Choices []struct{ Text string } }
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 2 {
				return fmt.Errorf("n=2: %s (%v)", b, err)
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"In the beginning","max_tokens":4,"temperature":0,"logit_bias":{"92":100},"ignore_eos":true}`, func(b []byte) error {
			var r struct {
				Choices []struct{ Text string }
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
				return fmt.Errorf("logit_bias: %s (%v)", b, err)
			}
			if t := r.Choices[0].Text; t == "" || strings.Repeat(t[:len(t)/4], 4) != t {
				return fmt.Errorf("logit_bias +100 on token 92: %q is not one token's text four times", t)
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"In the beginning","max_tokens":4,"temperature":0,"logit_bias":{"92":100},"ignore_eos":true,"logprobs":1}`, func(b []byte) error {
			var r struct {
				Choices []struct {
					Text     string
					Logprobs struct {
						TokenLogprobs []float64 `json:"token_logprobs"`
					}
				}
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 || len(r.Choices[0].Logprobs.TokenLogprobs) != 4 {
				return fmt.Errorf("logit_bias with logprobs: %s (%v)", b, err)
			}
			if t := r.Choices[0].Text; t == "" || strings.Repeat(t[:len(t)/4], 4) != t {
				return fmt.Errorf("logit_bias +100 on token 92 with logprobs: %q is not one token's text four times", t)
			}
			for _, lp := range r.Choices[0].Logprobs.TokenLogprobs { // of the raw logits: not the biased certainty
				if lp > -0.01 {
					return fmt.Errorf("logit_bias with logprobs: log-probability %v, want the unbiased model's", lp)
				}
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"In the beginning God created","max_tokens":1,"temperature":0,"echo":true,"logprobs":1}`, func(b []byte) error {
			// As lm-evaluation-harness asks for a loglikelihood.
			var r struct {
				Choices []struct {
					Text     string
					Logprobs struct {
						Tokens        []string   `json:"tokens"`
						TokenLogprobs []*float64 `json:"token_logprobs"`
					}
				}
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
				return fmt.Errorf("echo with logprobs: %s (%v)", b, err)
			}
			lp := r.Choices[0].Logprobs
			if len(lp.Tokens) < 3 || lp.TokenLogprobs[0] != nil || !strings.HasPrefix(r.Choices[0].Text, "In the beginning God created") {
				return fmt.Errorf("echo with logprobs: %s", b)
			}
			for _, v := range lp.TokenLogprobs[1:] {
				if v == nil || *v > 0 {
					return fmt.Errorf("echo with logprobs: a log-probability %v in %s", v, b)
				}
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"Is the light good? Answer:","max_tokens":8,"guided_choice":["yes","no","maybe"]}`, func(b []byte) error {
			var r struct {
				Choices []struct {
					Text         string
					FinishReason string `json:"finish_reason"`
				}
			}
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
				return fmt.Errorf("guided_choice: %s (%v)", b, err)
			}
			if c := r.Choices[0]; !slices.Contains([]string{"yes", "no", "maybe"}, c.Text) || c.FinishReason != "stop" {
				return fmt.Errorf("guided_choice: %q (%s)", c.Text, c.FinishReason)
			}
			return nil
		}},
		{"/v1/completions", `{"prompt":"And God said","max_tokens":8,"temperature":0}`, func(b []byte) error {
			var r struct{ Choices []struct{ Text string } }
			if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
				return fmt.Errorf("plain: %s (%v)", b, err)
			}
			return nil
		}},
	}
	errs := make(chan error, 2*len(mixed))
	var wg sync.WaitGroup
	for range 2 {
		for _, m := range mixed {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := http.Post("http://"+h+m.path, "application/json", strings.NewReader(m.body))
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("%s %s: %d %s", m.path, m.body, resp.StatusCode, b)
					return
				}
				errs <- m.check(b)
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	// Metrics moved.
	mresp, err := http.Get("http://" + h + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	for _, want := range []string{`mkserve:generation_tokens_total{model_name="default"}`, "mkserve:time_to_first_token_seconds_bucket", "go_goroutines", "mkserve:moe_expert_tokens_total", "mkserve:moe_load_imbalance"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestServeBadConfig(t *testing.T) {
	env := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--model", t.TempDir()}, "tokenizer"},
		{[]string{"--model", "../../models/default", "--max-num-seqs", "-3"}, "max_num_seqs"},
		{[]string{"--model", "../../models/default", "--precision", "sloppy"}, "precision"},
		{[]string{"--model", "../../models/default", "--backend", "cuda", "--context-parallel", "4"}, "context_parallel"},
		{[]string{"--model", "../../models/default", "--backend", "cuda", "--precision", "fast", "--context-parallel", "9"}, "at most 8"},
		{[]string{"--model", "../../models/default", "--moe-path", "sideways"}, "moe_path"},
		{[]string{"--model", "../../models/default", "--backend", "cuda", "--precision", "fast", "--ep", "2"}, "moe_path fused"},
		{[]string{"--model", "../../models/default", "--backend", "cuda", "--moe-path", "fused", "--ep", "2"}, "precision fast"},
		{[]string{"--model", "../../models/default", "--context-parallel", "-2"}, "context_parallel"},
		{[]string{"--model", "../../models/default", "--rebalance-every", "8"}, "rebalance_every"},
		{[]string{"--model", "../../models/default", "--world-size", "2", "--coordinator", "127.0.0.1:1", "--backend", "cuda", "--moe-path", "fused"}, "grouped"},
		{[]string{"--model", "../../models/default", "--world-size", "9", "--coordinator", "127.0.0.1:1", "--backend", "cuda"}, "at most 8"},
		{[]string{"--model", "../../models/default", "--world-size", "2", "--coordinator", "127.0.0.1:1", "--world-transport", "nccl"}, "world_transport"},
		{[]string{"--model", "../../models/default", "--world-size", "2", "--coordinator", "127.0.0.1:1", "--backend", "cuda", "--world-transport", "mpi"}, "ipc or nccl"},
		{[]string{"--model", "../../models/default", "--world-size", "2", "--coordinator", "127.0.0.1:1", "--ep", "2"}, "ep must be 1"},
		{[]string{"--model", "../../models/default", "--world-size", "0"}, "world_size"},
		{[]string{"--model", "../../models/default", "--backend", "tpu"}, "backend"},
		{[]string{"--config", "/nonexistent.yaml"}, "nonexistent"},
	} {
		err := serve(context.Background(), append([]string{"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, tc.args...), env, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

// metricValue reads one unlabelled-by-anything-but-model series from /metrics.
func metricValue(t *testing.T, c *http.Client, h, name string) float64 {
	t.Helper()
	resp, err := c.Get("http://" + h + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s", name)
	return 0
}

// streamCompletion posts a streaming completion and reads it to the end; it
// returns the HTTP status and the completion tokens the final usage chunk
// reports (-1 when the stream did not end with a usage chunk and [DONE]).
func streamCompletion(c *http.Client, h string, maxTokens int) (int, int, error) {
	body := fmt.Sprintf(`{"model":"default","prompt":"And God said","max_tokens":%d,"stream":true,"ignore_eos":true,"stream_options":{"include_usage":true}}`, maxTokens)
	resp, err := c.Post("http://"+h+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	tokens, done := -1, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			done = true
		}
		if rest, ok := strings.CutPrefix(line, "data: {"); ok {
			var v struct {
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte("{"+rest), &v); err != nil {
				return resp.StatusCode, -1, err
			}
			if v.Usage != nil {
				tokens = v.Usage.CompletionTokens
			}
		}
	}
	if !done {
		tokens = -1
	}
	return resp.StatusCode, tokens, sc.Err()
}

// TestServeUnderLoad: 200 concurrent streaming requests on the default model
// all complete; afterwards no KV block is in use and, once the server has
// stopped, no goroutine is left over. A client that disconnects mid-stream
// frees its blocks.
func TestServeUnderLoad(t *testing.T) {
	if os.Getenv(testBackendEnv) == "cuda" {
		// The GPU's owning goroutine lives as long as the process: start
		// it before counting.
		if _, err := cuda.New(cuda.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	before := runtime.NumGoroutine()
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	c := &http.Client{Transport: tr}
	h, _, stop := startServe(t, "--model", "../../models/default", "--max-num-seqs", "64")
	var wg sync.WaitGroup
	var ok atomic.Int32
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, tokens, err := streamCompletion(c, h, 8)
			if err == nil && status == 200 && tokens == 8 {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 200 {
		t.Errorf("%d of 200 concurrent streams completed", ok.Load())
	}
	// Disconnect mid-stream.
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+h+"/v1/completions",
		strings.NewReader(`{"model":"default","prompt":"And God said","max_tokens":900,"stream":true,"ignore_eos":true}`))
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 6; i++ { // a few chunks in
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if u := metricValue(t, c, h, "mkserve:kv_cache_usage_perc"); u == 0 {
		t.Errorf("a running stream holds no KV blocks")
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for metricValue(t, c, h, "mkserve:kv_cache_usage_perc") != 0 || metricValue(t, c, h, "mkserve:num_requests_running") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("blocks still in use 10s after the client went away")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	tr.CloseIdleConnections()
	deadline = time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines before the server, %d after it stopped", before, n)
	}
}

// TestServeQueueFull: with room for one waiting request, a burst gets 429s
// while the accepted requests are still served in full.
func TestServeQueueFull(t *testing.T) {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	h, _, stop := startServe(t, "--model", "../../models/default", "--max-queue", "1", "--max-num-seqs", "1")
	defer stop()
	var wg sync.WaitGroup
	var served, rejected, other atomic.Int32
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, tokens, err := streamCompletion(c, h, 24)
			switch {
			case err == nil && status == 200 && tokens == 24:
				served.Add(1)
			case status == 429:
				rejected.Add(1)
			default:
				other.Add(1)
				t.Logf("unexpected: status %d, %d tokens, err %v", status, tokens, err)
			}
		}()
	}
	wg.Wait()
	if rejected.Load() == 0 || served.Load() == 0 || other.Load() != 0 {
		t.Errorf("served %d, rejected %d, other %d", served.Load(), rejected.Load(), other.Load())
	}
}

// TestBenchServeCommand: `mkserve bench serve` against a running server
// (with sampling flags, which the server must accept) prints its JSON
// result; bad flags are one-line errors.
func TestBenchServeCommand(t *testing.T) {
	h, _, stop := startServe(t, "--model", "../../models/default")
	defer stop()
	code, out, errOut := runCLI([]string{"bench", "serve", "--base-url", "http://" + h, "--num-prompts", "6",
		"--max-concurrency", "3", "--random-input-len", "8", "--random-output-len", "4",
		"--temperature", "0.7", "--top-k", "20", "--top-p", "0.9", "--json"}, "")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var res struct {
		Completed, Failed int
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil || res.Completed != 6 || res.Failed != 0 {
		t.Fatalf("result %q: %+v %v", out, res, err)
	}
	for _, args := range [][]string{
		{"bench", "serve", "--endpoint", "embeddings"},
		{"bench", "serve", "--request-rate", "fast"},
		{"bench", "serve", "--random-input-len", "x"},
		{"bench", "serve", "--temperature", "3"},
		{"bench", "serve", "--top-p", "0"},
		{"bench", "serve", "--top-k", "-3"},
		{"bench", "nothing"},
	} {
		if code, _, errOut := runCLI(args, ""); code == 0 || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
}

// TestServeWorld: `mkserve serve --world-size 2` with one `mkserve worker`
// serves completions (the experts split over the two processes) with the
// greedy tokens of a single process, and stopping the server stops the
// worker cleanly.
func TestServeWorld(t *testing.T) {
	if b := os.Getenv(testBackendEnv); b != "" {
		t.Skipf("the worker runs in this process, and one process owns one GPU (%s=%s): TestServeWorldProcesses covers it", testBackendEnv, b)
	}
	const model = "../../models/testdata/golden/qwen3_moe"
	coord := freeLoopback(t)
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	workerDone := make(chan error, 1)
	var wout strings.Builder
	go func() {
		workerDone <- runWorker(wctx, []string{"--model", model, "--world-size", "2", "--rank", "1", "--coordinator", coord}, &wout)
	}()
	body := `{"model":"qwen3_moe","prompt":"a b c d","max_tokens":6,"temperature":0,"ignore_eos":true}`
	complete := func(h string) string {
		resp, err := http.Post("http://"+h+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var r struct {
			Choices []struct{ Text string }
		}
		if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("response %s: %v", b, err)
		}
		return r.Choices[0].Text
	}
	h, _, stop := startServe(t, "--model", model, "--world-size", "2", "--coordinator", coord)
	got := complete(h)
	stop()
	select {
	case err := <-workerDone:
		if err != nil {
			t.Fatalf("worker: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not stop with the server")
	}
	if !strings.Contains(wout.String(), "stopped by rank 0") {
		t.Errorf("worker output %q", wout.String())
	}
	h1, _, stop1 := startServe(t, "--model", model)
	defer stop1()
	if want := complete(h1); got != want || got == "" {
		t.Errorf("world of 2 completed %q, one process %q", got, want)
	}
}

// freeLoopback returns a loopback host:port that was free a moment ago.
func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestWorkerFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"worker"}, "--model"},
		{[]string{"worker", "--model", "m", "--world-size", "2", "--rank", "0", "--coordinator", "127.0.0.1:1"}, "rank 1"},
		{[]string{"worker", "--model", "m", "--world-size", "2", "--rank", "1"}, "--coordinator"},
		{[]string{"worker", "--model", "m", "--world-size", "2", "--rank", "1", "--coordinator", "x", "--backend", "tpu"}, "cpu or cuda"},
	} {
		code, _, errOut := runCLI(tc.args, "")
		if code == 0 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want one line containing %q", tc.args, code, errOut, tc.want)
		}
	}
}

// workerProcessEnv, when set, makes TestHelperWorkerProcess run `mkserve
// worker` with the arguments in it (one per line): the test binary re-run
// as a separate OS process.
const workerProcessEnv = "MKSERVE_TEST_WORKER_ARGS"

func TestHelperWorkerProcess(t *testing.T) {
	args := os.Getenv(workerProcessEnv)
	if args == "" {
		t.Skip("helper for TestServeWorldProcesses: runs only as its child process")
	}
	if err := runWorker(context.Background(), strings.Split(args, "\n"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(3)
	}
}

// TestServeWorldProcesses: the same world as TestServeWorld, with the
// worker a separate OS process (this test binary re-run), so nothing is
// shared but the gRPC connections.
//
// With MKSERVE_TEST_BACKEND=cuda both processes run the cuda backend (the
// worker on GPU 1 when there are two, else sharing GPU 0), their MoE
// outputs summed through CUDA IPC, and the greedy text must match a single
// process's on the same backend.
func TestServeWorldProcesses(t *testing.T) {
	backendName := os.Getenv(testBackendEnv)
	switch backendName {
	case "", "cpu", "cuda":
	default:
		t.Skipf("a world of processes runs on the cpu or cuda backend (%s=%s)", testBackendEnv, backendName)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Skipf("no path to re-run the test binary: %v", err)
	}
	// precision/transport: fast runs the grouped MoE path with decode graphs
	// and context parallelism, exact the host MoE path.
	runs := []string{"fast/ipc"}
	if backendName == "cuda" {
		runs = append(runs, "exact/ipc")
		if n, err := kernels.DeviceCount(); err == nil && n >= 2 {
			runs = append(runs, "fast/nccl") // NCCL takes one GPU per rank
		}
	}
	for _, run := range runs {
		prec, tr, _ := strings.Cut(run, "/")
		t.Run(prec+"_"+tr, func(t *testing.T) { testServeWorldProcesses(t, exe, backendName, prec, tr) })
	}
}

func testServeWorldProcesses(t *testing.T, exe, backendName, precision, worldTransport string) {
	const model = "../../models/testdata/golden/qwen3_moe"
	coord := freeLoopback(t)
	wargs := []string{"--model", model, "--world-size", "2", "--rank", "1", "--coordinator", coord}
	var sargs, cp []string
	if backendName == "cuda" {
		wargs = append(wargs, "--backend", "cuda", "--precision", precision, "--world-transport", worldTransport)
		sargs = []string{"--precision", precision}
		cp = []string{"--world-transport", worldTransport}
		if precision == "fast" { // long prompts' attention split over the two processes (world CP)
			cp = append(cp, "--context-parallel", "2", "--context-parallel-min", "16")
		}
	}
	cmd := exec.Command(exe, "-test.run", "^TestHelperWorkerProcess$", "-test.v")
	cmd.Env = append(os.Environ(), workerProcessEnv+"="+strings.Join(wargs, "\n"))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h, _, stop := startServe(t, append(append([]string{"--model", model, "--world-size", "2", "--coordinator", coord}, sargs...), cp...)...)
	long := strings.Repeat("w x y z ", 12)
	complete := func(h, prompt string) string {
		resp, err := http.Post("http://"+h+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"qwen3_moe","prompt":"`+prompt+`","max_tokens":8,"temperature":0,"ignore_eos":true}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var r struct {
			Choices []struct{ Text string }
			Usage   struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if resp.StatusCode != 200 || json.Unmarshal(b, &r) != nil || len(r.Choices) != 1 || r.Usage.CompletionTokens != 8 {
			t.Errorf("status %d: %s", resp.StatusCode, b)
			return ""
		}
		return r.Choices[0].Text
	}
	// The second mostly replays graphs on cuda; the third's prompt is long
	// enough for context parallelism when cp is set.
	prompts := []string{"a b c", "a b c", long}
	var got []string
	for _, p := range prompts {
		got = append(got, complete(h, p))
	}
	// Rank 0's expert counters see the whole world's routing: rank 1's
	// experts (8..15 of 16) got tokens too. (Until 2026-11-29 the grouped
	// path counted only the leader's own block.)
	{
		resp, err := http.Get("http://" + h + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var upper float64
		re := regexp.MustCompile(`(?m)^mkserve:moe_expert_tokens_total\{[^}]*expert="(\d+)"[^}]*\} (\S+)$`)
		for _, m := range re.FindAllSubmatch(b, -1) {
			e, _ := strconv.Atoi(string(m[1]))
			v, _ := strconv.ParseFloat(string(m[2]), 64)
			if e >= 8 {
				upper += v
			}
		}
		if upper == 0 {
			t.Errorf("no tokens counted for rank 1's experts 8..15:\n%s", re.FindAll(b, 40))
		}
	}
	if slices.Contains(cp, "--context-parallel") { // the long prompt did take the context-parallel path
		resp, err := http.Get("http://" + h + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !regexp.MustCompile(`(?m)^mkserve:context_parallel_tokens_total\{[^}]*\} [1-9]`).Match(b) {
			t.Errorf("no context-parallel prompt tokens counted:\n%s", regexp.MustCompile(`(?m)^mkserve:context_parallel.*$`).FindAll(b, -1))
		}
	}
	stop()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "stopped by rank 0") {
			t.Errorf("worker process: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("the worker process did not stop with the server\n%s", out.String())
	}
	h1, _, stop1 := startServe(t, append([]string{"--model", model}, sargs...)...)
	defer stop1()
	for i, g := range got {
		if want := complete(h1, prompts[i]); g != want || g == "" {
			t.Errorf("request %d: the world of 2 completed %q, one process %q", i, g, want)
		}
	}
}

// TestServeWorldLosesWorker: when a worker goes away the server answers the
// next request with an error instead of hanging, and /health turns 503 so
// that load balancers stop sending it requests.
func TestServeWorldLosesWorker(t *testing.T) {
	if os.Getenv(testBackendEnv) != "" {
		t.Skipf("a world of processes runs on the cpu backend (%s=%s)", testBackendEnv, os.Getenv(testBackendEnv))
	}
	const model = "../../models/testdata/golden/qwen3_moe"
	coord := freeLoopback(t)
	wctx, wcancel := context.WithCancel(context.Background())
	workerDone := make(chan error, 1)
	go func() {
		workerDone <- runWorker(wctx, []string{"--model", model, "--world-size", "2", "--rank", "1", "--coordinator", coord}, io.Discard)
	}()
	h, _, stop := startServe(t, "--model", model, "--world-size", "2", "--coordinator", coord)
	defer stop()
	post := func() int {
		resp, err := http.Post("http://"+h+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"qwen3_moe","prompt":"a b","max_tokens":3,"temperature":0}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if st := post(); st != 200 {
		t.Fatalf("with the worker: status %d", st)
	}
	wcancel()
	<-workerDone
	if st := post(); st == 200 {
		t.Errorf("after the worker went away: status 200")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + h + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 503 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health still %d after the world broke", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestWorldAgree: ranks with different profiles both fail at start, naming
// the other's; equal profiles (of lengths not a multiple of 4) pass.
func TestWorldAgree(t *testing.T) {
	for _, c := range []struct {
		profiles [2]string
		fail     bool
	}{
		{[2]string{worldProfile(backendSpec{name: "cuda", precision: "fast", moePath: "grouped"}),
			worldProfile(backendSpec{name: "cuda", precision: "fast", worldTransport: "ipc"})}, false},
		{[2]string{worldProfile(backendSpec{name: "cpu"}), worldProfile(backendSpec{name: "cpu", precision: "fast", moePath: "x", cpuWeights: "auto"})}, false},
		{[2]string{worldProfile(backendSpec{name: "cpu", cpuWeights: "q8"}), worldProfile(backendSpec{name: "cpu"})}, true},
		{[2]string{worldProfile(backendSpec{name: "cpu", kvDtype: "bf16"}), worldProfile(backendSpec{name: "cpu", kvDtype: "auto"})}, true},
		{[2]string{worldProfile(backendSpec{name: "cuda"}), worldProfile(backendSpec{name: "cuda", precision: "fast"})}, true},
		{[2]string{worldProfile(backendSpec{name: "cuda", precision: "exact"}), worldProfile(backendSpec{name: "cpu", precision: "exact"})}, true},
		{[2]string{worldProfile(backendSpec{name: "cuda", precision: "fast", cudaWeights: "fp4"}), worldProfile(backendSpec{name: "cuda", precision: "fast"})}, true},
		{[2]string{worldProfile(backendSpec{name: "cuda", cudaWeights: "auto"}), worldProfile(backendSpec{name: "cuda"})}, false},
		{[2]string{worldProfile(backendSpec{name: "cuda", precision: "fast", worldTransport: "nccl"}),
			worldProfile(backendSpec{name: "cuda", precision: "fast", worldTransport: "ipc"})}, true},
	} {
		comms := transport.LoopbackForTest(t, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for r := range 2 {
			wg.Go(func() { errs[r] = worldAgree(context.Background(), comms[r], c.profiles[r]) })
		}
		wg.Wait()
		for r, err := range errs {
			if (err != nil) != c.fail {
				t.Errorf("%q: rank %d: %v", c.profiles, r, err)
			} else if err != nil && !strings.Contains(err.Error(), c.profiles[1-r]) {
				t.Errorf("rank %d's error %q does not name the other profile %q", r, err, c.profiles[1-r])
			}
		}
	}
}

// TestServeWorldLocal: `mkserve serve --world-size 2` with no coordinator
// starts its worker itself (this test binary acting as mkserve), serves the
// greedy text of one process, and the worker exits when the server stops.
func TestServeWorldLocal(t *testing.T) {
	if b := os.Getenv(testBackendEnv); b != "" && b != "cpu" {
		t.Skipf("TestServeWorldProcesses covers worlds on %s", b)
	}
	t.Setenv(worldChildEnv, "1")
	const model = "../../models/testdata/golden/qwen3_moe"
	complete := func(h string) string {
		resp, err := http.Post("http://"+h+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"qwen3_moe","prompt":"a b c d","max_tokens":6,"temperature":0,"ignore_eos":true}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var r struct{ Choices []struct{ Text string } }
		if resp.StatusCode != 200 || json.Unmarshal(b, &r) != nil || len(r.Choices) != 1 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		return r.Choices[0].Text
	}
	// (q8: the workers get serve's cpu_weights, or the world's profiles
	// would differ and it would not form.)
	for _, weights := range []string{"auto", "q8"} {
		h, _, stop := startServe(t, "--model", model, "--world-size", "2", "--cpu-weights", weights)
		got := complete(h)
		stop() // waits for serve, which waits for its worker
		h1, _, stop1 := startServe(t, "--model", model, "--cpu-weights", weights)
		want := complete(h1)
		stop1()
		if got != want || got == "" {
			t.Errorf("cpu weights %s: a local world of 2 completed %q, one process %q", weights, got, want)
		}
	}
}

// TestServeWorldLocalWorkerDies: when a worker that serve started itself
// exits before the world forms, serve fails at once naming it, instead of
// waiting out the join timeout.
func TestServeWorldLocalWorkerDies(t *testing.T) {
	t.Setenv(worldChildEnv, "1")
	t.Setenv(workerExitEnv, "1")
	start := time.Now()
	err := serve(context.Background(), []string{"--model", "../../models/testdata/golden/qwen3_moe", "--world-size", "2",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--log-level", "error"},
		func(string) (string, bool) { return "", false }, nil)
	if err == nil || !strings.Contains(err.Error(), "worker 1 exited") || !strings.Contains(err.Error(), "on purpose") {
		t.Fatalf("serve returned %v, want the worker's exit", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("serve took %v to notice", d)
	}
}

// TestServeModelInfo: the loaded model's weights reach ollama's model
// list (size, parameter count, quantization level) and /metrics
// (mkserve:weights_bytes by form), as held by cpu_weights.
func TestServeModelInfo(t *testing.T) {
	if b := os.Getenv(testBackendEnv); b != "" && b != "cpu" {
		t.Skipf("cpu_weights is the cpu backend's (%s=%s)", testBackendEnv, b)
	}
	for _, c := range []struct{ weights, level string }{{"auto", "BF16"}, {"q8", "Q8"}} {
		h, _, stop := startServe(t, "--model", "../../models/default", "--cpu-weights", c.weights)
		resp, err := http.Get("http://" + h + "/api/tags")
		if err != nil {
			t.Fatal(err)
		}
		var tags struct {
			Models []struct {
				Size    int64
				Details struct {
					Family            string
					ParameterSize     string `json:"parameter_size"`
					QuantizationLevel string `json:"quantization_level"`
				}
			}
		}
		err = json.NewDecoder(resp.Body).Decode(&tags)
		resp.Body.Close()
		if err != nil || len(tags.Models) != 1 {
			t.Fatalf("%s: /api/tags: %v", c.weights, err)
		}
		m := tags.Models[0]
		// The bundled model: 11.5M parameters (models/default/README.md).
		if m.Details.ParameterSize != "11.5M" || m.Details.QuantizationLevel != c.level || m.Details.Family != "qwen3_moe" || m.Size <= 0 {
			t.Errorf("%s: /api/tags model %+v", c.weights, m)
		}
		resp, err = http.Get("http://" + h + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := `mkserve:weights_bytes{form="` + strings.ToLower(c.level) + `",model_name="default"}`
		if !strings.Contains(string(body), want) {
			t.Errorf("%s: /metrics has no %s", c.weights, want)
		}
		stop()
	}
}
