package httpapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestOllamaAPI: ollama's endpoints over the real engine (the default
// model, greedy) give the replies the OpenAI endpoints give — /api/chat
// streamed (NDJSON pieces, then a done object with the counts) and whole,
// /api/generate through the chat template and raw — list the model and
// the version, and answer bad requests with ollama's {"error": …}.
func TestOllamaAPI(t *testing.T) {
	tok, tmpl, be, l, eos := defaultModel(t)
	ts := serveEngine(t, tok, tmpl, be, l, eos)
	post := func(path, body string) (int, []byte) {
		t.Helper()
		resp, err := http.Post(ts.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	openai := func(path, body, field string) string {
		t.Helper()
		code, b := post(path, body)
		var r struct {
			Choices []struct {
				Text    string `json:"text"`
				Message struct {
					Content string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
		}
		if code != 200 || json.Unmarshal(b, &r) != nil || len(r.Choices) != 1 {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		if field == "text" {
			return r.Choices[0].Text
		}
		return r.Choices[0].Message.Content
	}
	type reply struct {
		Model   string `json:"model"`
		Message *struct {
			Role, Content string
		} `json:"message"`
		Response        *string `json:"response"`
		Done            bool    `json:"done"`
		DoneReason      string  `json:"done_reason"`
		PromptEvalCount int     `json:"prompt_eval_count"`
		EvalCount       int     `json:"eval_count"`
		TotalDuration   int64   `json:"total_duration"`
	}
	lines := func(b []byte) []reply {
		t.Helper()
		var out []reply
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			var r reply
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("line %q: %v", sc.Text(), err)
			}
			out = append(out, r)
		}
		return out
	}
	const msgs = `[{"role":"system","content":"Answer briefly."},{"role":"user","content":"Who made the light?"}]`
	want := openai("/v1/chat/completions", `{"model":"default","messages":`+msgs+`,"max_tokens":12,"temperature":0}`, "message")

	code, b := post("/api/chat", `{"model":"default","messages":`+msgs+`,"options":{"num_predict":12,"temperature":0}}`)
	rs := lines(b)
	if code != 200 || len(rs) < 2 {
		t.Fatalf("streamed chat: %d %s", code, b)
	}
	var text strings.Builder
	for i, r := range rs {
		if r.Message == nil || r.Message.Role != "assistant" || r.Done != (i == len(rs)-1) || r.Model != "default" {
			t.Fatalf("streamed chat object %d: %+v", i, r)
		}
		text.WriteString(r.Message.Content)
	}
	last := rs[len(rs)-1]
	if text.String() != want || last.DoneReason != "length" || last.EvalCount != 12 || last.PromptEvalCount == 0 || last.TotalDuration <= 0 {
		t.Errorf("streamed chat %q, last %+v; OpenAI's reply %q", text.String(), last, want)
	}

	code, b = post("/api/chat", `{"model":"default","stream":false,"messages":`+msgs+`,"options":{"num_predict":12,"temperature":0}}`)
	if rs := lines(b); code != 200 || len(rs) != 1 || !rs[0].Done || rs[0].Message.Content != want {
		t.Errorf("whole chat: %d %s; want %q", code, b, want)
	}

	// /api/generate: the prompt as a user message under the template, and raw.
	gen := openai("/v1/chat/completions", `{"model":"default","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"In the beginning"}],"max_tokens":10,"temperature":0}`, "message")
	code, b = post("/api/generate", `{"model":"default","system":"Be brief.","prompt":"In the beginning","stream":false,"options":{"num_predict":10,"temperature":0}}`)
	if rs := lines(b); code != 200 || len(rs) != 1 || rs[0].Response == nil || *rs[0].Response != gen {
		t.Errorf("generate: %d %s; want %q", code, b, gen)
	}
	raw := openai("/v1/completions", `{"model":"default","prompt":"In the beginning","max_tokens":10,"temperature":0}`, "text")
	code, b = post("/api/generate", `{"model":"default","prompt":"In the beginning","raw":true,"options":{"num_predict":10,"temperature":0}}`)
	var rawText strings.Builder
	for _, r := range lines(b) {
		if r.Response != nil {
			rawText.WriteString(*r.Response)
		}
	}
	if code != 200 || rawText.String() != raw {
		t.Errorf("raw generate: %d %q; /v1/completions %q", code, rawText.String(), raw)
	}

	// format: JSON mode, and a schema (the reply starts its object).
	for _, format := range []string{`"json"`, `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`} {
		code, b := post("/api/chat", `{"model":"default","stream":false,"messages":`+msgs+`,"format":`+format+`,"options":{"num_predict":40}}`)
		if rs := lines(b); code != 200 || len(rs) != 1 || !strings.HasPrefix(strings.TrimSpace(rs[0].Message.Content), "{") {
			t.Errorf("format %s: %d %s", format, code, b)
		} else if format != `"json"` && rs[0].DoneReason == "stop" {
			var v struct{ A *int }
			if err := json.Unmarshal([]byte(rs[0].Message.Content), &v); err != nil || v.A == nil {
				t.Errorf("format %s: %q is not the schema's object (%v)", format, rs[0].Message.Content, err)
			}
		}
	}

	for _, c := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"GET", "/api/tags", "", 200, `"name":"default"`},
		{"GET", "/api/version", "", 200, `"version":`},
		{"GET", "/api/ps", "", 200, `"context_length":`},
		{"POST", "/api/show", `{"model":"default"}`, 200, `"capabilities":["completion"`},
		{"POST", "/api/show", `{"model":"llama3"}`, 404, `{"error":"model \"llama3\" not found"}`},
		{"POST", "/api/show", `{`, 400, `"error":`},
		{"POST", "/api/chat", `{"model":"llama3","messages":[{"role":"user","content":"x"}]}`, 404, `{"error":"model \"llama3\" not found"}`},
		{"POST", "/api/chat", `{"model":"default","messages":[{"role":"user","content":"x","images":["aGk="]}]}`, 400, `"error":"messages[0].images`},
		{"POST", "/api/chat", `{"model":"default","messages":[{"role":"user","content":"x"}],"format":"yaml"}`, 400, `"error":"format must be`},
		{"POST", "/api/chat", `{"model":"default","messages":[{"role":"user","content":"x"}],"options":{"num_predict":0}}`, 400, `options.num_predict`},
		{"POST", "/api/chat", `{"model":"default","messages":[{"role":"wizard","content":"x"}]}`, 400, `"error":"messages[0].role`},
		{"POST", "/api/generate", `{"model":"default","prompt":"","raw":true}`, 400, `"error":`},
		{"POST", "/api/chat", `{"model":`, 400, `"error":`},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || !strings.Contains(string(b), c.want) {
			t.Errorf("%s %s %s: %d %s, want %d with %s", c.method, c.path, c.body, resp.StatusCode, b, c.code, c.want)
		}
	}
}
