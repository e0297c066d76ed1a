package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/mkserve/mkserve/loadgen"
	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
)

// startServe runs `mkserve serve` in process on loopback ports and returns
// its addresses and a stop function that waits for a clean exit.
func startServe(t *testing.T, args ...string) (httpAddr, grpcAddr string, stop func()) {
	t.Helper()
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

	// A short load test through loadgen.
	res, err := loadgen.Run(ctx, loadgen.Options{BaseURL: "http://" + h, NumPrompts: 16, MaxConcurrency: 8,
		PromptLen: loadgen.Fixed(16), OutputLen: loadgen.Fixed(8), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Completed != 16 || res.Failed != 0 {
		t.Fatalf("load test: %d completed, %d failed: %v", res.Completed, res.Failed, res.Errors)
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
		{[]string{"--model", "../../models/default", "--backend", "tpu"}, "backend"},
		{[]string{"--config", "/nonexistent.yaml"}, "nonexistent"},
	} {
		err := serve(context.Background(), append([]string{"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, tc.args...), env, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serve %v = %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}
