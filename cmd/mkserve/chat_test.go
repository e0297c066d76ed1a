package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
)

// TestChatCommandProtocol: against a recording server, each line is a
// turn sent with the whole conversation so far (the system message first,
// the replies as assistant turns), /reset starts over, the streamed
// content reaches stdout and the reasoning does not; a server error ends
// the command with its message.
func TestChatCommandProtocol(t *testing.T) {
	var mu sync.Mutex
	var got [][]chatTurn
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Messages  []chatTurn
			Stream    bool
			MaxTokens int `json:"max_tokens"`
		}
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&body) != nil || !body.Stream || body.MaxTokens != 7 {
			http.Error(w, `{"error": {"message": "bad request"}}`, http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, body.Messages)
		mu.Unlock()
		last := body.Messages[len(body.Messages)-1].Content
		if last == "fail" {
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"error": {"message": "too many requests are waiting"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, d := range []string{`{"reasoning_content": "hmm"}`, `{"content": "re: "}`, fmt.Sprintf(`{"content": %q}`, last)} {
			fmt.Fprintf(w, "data: {\"choices\": [{\"index\": 0, \"delta\": %s}]}\n\n", d)
		}
		fmt.Fprint(w, "data: {\"choices\": [{\"index\": 0, \"delta\": {}, \"finish_reason\": \"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer ts.Close()
	var out strings.Builder
	err := cmdChat([]string{"--base-url", ts.URL, "--system", "Be kind.", "--max-tokens", "7", "--reasoning=false"},
		strings.NewReader("hello\n\nsecond\n/reset\nthird\nfail\nnever sent\n"), &out)
	if err == nil || !strings.Contains(err.Error(), "429 too many requests are waiting") {
		t.Fatalf("error %v", err)
	}
	if out.String() != "re: hello\nre: second\nre: third\n" {
		t.Errorf("stdout %q", out.String())
	}
	want := [][]chatTurn{
		{{"system", "Be kind."}, {"user", "hello"}},
		{{"system", "Be kind."}, {"user", "hello"}, {"assistant", "re: hello"}, {"user", "second"}},
		{{"system", "Be kind."}, {"user", "third"}},
		{{"system", "Be kind."}, {"user", "third"}, {"assistant", "re: third"}, {"user", "fail"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("requests\n%v\nwant\n%v", got, want)
	}
}

// TestChatCommand: two turns with the bundled model served in process
// (the serving tests' backend), then /exit.
func TestChatCommand(t *testing.T) {
	h, _, stop := startServe(t, "--model", "../../models/default")
	defer stop()
	var out strings.Builder
	if err := cmdChat([]string{"--base-url", "http://" + h, "--max-tokens", "12", "--temperature", "0"},
		strings.NewReader("Who made the light?\nAnd the darkness?\n/exit\nnot read\n"), &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 || strings.TrimSpace(lines[0]) == "" || strings.TrimSpace(lines[1]) == "" {
		t.Errorf("replies %q", out.String())
	}
	if err := cmdChat([]string{"--base-url", "http://127.0.0.1:1"}, strings.NewReader("hi\n"), &out); err == nil || !strings.Contains(err.Error(), "is the server running") {
		t.Errorf("no server: %v", err)
	}
	// --model: the checkpoint served in this process.
	out.Reset()
	args := []string{"--model", "../../models/default", "--max-tokens", "8", "--temperature", "0"}
	if b := os.Getenv(testBackendEnv); b != "" {
		args = append(args, "--backend", b)
	}
	if err := cmdChat(args, strings.NewReader("Who made the light?\n"), &out); err != nil || strings.TrimSpace(out.String()) == "" {
		t.Errorf("in process: %q, %v", out.String(), err)
	}
	if err := cmdChat([]string{"--model", "/nonexistent"}, strings.NewReader("hi\n"), &out); err == nil {
		t.Error("a missing checkpoint: no error")
	}
}
