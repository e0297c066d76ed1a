package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunBatch: an OpenAI batch file through the bundled model (on the
// serving tests' backend): one output line per input line, in order, with
// the custom ids; a good line's response is the endpoint's 200 body, a bad
// request's its 4xx body, and a line that is not a request an error.
func TestRunBatch(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	lines := []string{
		`{"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Quote a verse about light."}], "max_tokens": 12, "temperature": 0}}`,
		`{"custom_id": "text", "url": "/v1/completions", "body": {"prompt": "In the beginning", "max_tokens": 8, "temperature": 0}}`,
		``,
		`not json`,
		`{"custom_id": "bad", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 0}}`,
		`{"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {}}`,
		`{"custom_id": "stream", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "stream": true}}`,
		`{"custom_id": "resp", "method": "POST", "url": "/v1/responses", "body": {"input": "Who made the light?", "max_output_tokens": 8}}`,
	}
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-i", in, "-o", "-", "--max-concurrency", "3", "--model", "../../models/default"}
	if b := os.Getenv(testBackendEnv); b != "" {
		args = append(args, "--backend", b)
	}
	var out bytes.Buffer
	if err := cmdRunBatch(args, nil, &out); err != nil {
		t.Fatal(err)
	}
	var got []batchOutput
	dec := json.NewDecoder(&out)
	for dec.More() {
		var o batchOutput
		if err := dec.Decode(&o); err != nil {
			t.Fatal(err)
		}
		got = append(got, o)
	}
	want := []struct {
		id     string
		status int    // 0: an error, no response
		code   string // the error's code
	}{{"chat", 200, ""}, {"text", 200, ""}, {"", 0, "invalid_json_line"}, {"bad", 400, ""}, {"embed", 0, "invalid_url"},
		{"stream", 0, "invalid_body"}, {"resp", 200, ""}}
	if len(got) != len(want) {
		t.Fatalf("%d output lines, want %d:\n%s", len(got), len(want), out.String())
	}
	for i, w := range want {
		o := got[i]
		if o.CustomID != w.id || !strings.HasPrefix(o.ID, "batch_req_") {
			t.Errorf("line %d: id %q custom_id %q, want %q", i, o.ID, o.CustomID, w.id)
		}
		switch {
		case w.status == 0 && (o.Error == nil || o.Error.Code != w.code || o.Response != nil):
			t.Errorf("line %d: %+v, want error %s", i, o, w.code)
		case w.status != 0 && (o.Error != nil || o.Response == nil || o.Response.StatusCode != w.status || o.Response.RequestID == ""):
			t.Errorf("line %d: %+v, want status %d", i, o, w.status)
		}
	}
	var chat struct {
		Object  string
		Choices []struct{ Message struct{ Content string } }
	}
	if json.Unmarshal(got[0].Response.Body, &chat) != nil || chat.Object != "chat.completion" || len(chat.Choices) != 1 || chat.Choices[0].Message.Content == "" {
		t.Errorf("chat body %s", got[0].Response.Body)
	}
	if !bytes.Contains(got[3].Response.Body, []byte(`"param":"max_tokens"`)) {
		t.Errorf("the bad request's body %s", got[3].Response.Body)
	}
}

func TestRunBatchFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--model", "m"},
		{"-i", "a.jsonl", "--model", "m"},
		{"-i", "a", "-o", "b", "--max-concurrency", "0"},
		{"-i", "a", "-o"},
	} {
		if _, _, _, _, err := runBatchFlags(args); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	in, out, conc, rest, err := runBatchFlags([]string{"--model", "m", "--input=a", "-o", "b", "--max-concurrency", "5", "--precision", "fast"})
	if err != nil || in != "a" || out != "b" || conc != 5 || strings.Join(rest, " ") != "--model m --precision fast" {
		t.Errorf("%q %q %d %q %v", in, out, conc, rest, err)
	}
	if err := cmdRunBatch([]string{"-i", "/nonexistent/x.jsonl", "-o", "-"}, nil, &bytes.Buffer{}); err == nil {
		t.Error("a missing input file: no error")
	}
}
