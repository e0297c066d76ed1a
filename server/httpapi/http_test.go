package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
	"github.com/mkserve/mkserve/internal/version"
	"github.com/mkserve/mkserve/tokenizer"
)

func post(t *testing.T, url, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// checkError asserts body is exactly OpenAI's error shape and returns it.
func checkError(t *testing.T, body []byte) errorBody {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || len(raw) != 1 || raw["error"] == nil {
		t.Fatalf("not an error body: %s", body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error body lacks %q: %s", k, body)
		}
	}
	var e errorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatal(err)
	}
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("empty message or type: %s", body)
	}
	return e
}

func TestInvalidParams(t *testing.T) {
	f := newFake(64)
	_, url := serve(t, f, Options{})
	cases := []struct {
		path, body, param string
	}{
		{"/v1/completions", ``, ""},
		{"/v1/completions", `{`, ""},
		{"/v1/completions", `[]`, ""},
		{"/v1/completions", `{"prompt":"x"} {}`, ""},
		{"/v1/completions", `{"model":5,"prompt":"x"}`, "model"},
		{"/v1/completions", `{}`, "prompt"},
		{"/v1/completions", `{"prompt":null}`, "prompt"},
		{"/v1/completions", `{"prompt":[]}`, "prompt"},
		{"/v1/completions", `{"prompt":[[]]}`, "prompt"},
		{"/v1/completions", `{"prompt":[1,"a"]}`, "prompt"},
		{"/v1/completions", `{"prompt":["a",1]}`, "prompt"},
		{"/v1/completions", `{"prompt":[[1],2]}`, "prompt"},
		{"/v1/completions", `{"prompt":[99999]}`, "prompt"},
		{"/v1/completions", `{"prompt":[-1]}`, "prompt"},
		{"/v1/completions", `{"prompt":[1.5]}`, "prompt"},
		{"/v1/completions", `{"prompt":{}}`, "prompt"},
		{"/v1/completions", `{"prompt":""}`, "prompt"},
		{"/v1/completions", `{"prompt":"x","max_tokens":"5"}`, "max_tokens"},
		{"/v1/completions", `{"prompt":"x","max_tokens":0}`, "max_tokens"},
		{"/v1/completions", `{"prompt":"x","max_tokens":1000}`, "max_tokens"},
		{"/v1/completions", `{"prompt":"x","max_completion_tokens":-1}`, "max_completion_tokens"},
		{"/v1/completions", `{"prompt":"x","n":0}`, "n"},
		{"/v1/completions", `{"prompt":"x","n":129}`, "n"},
		{"/v1/completions", `{"prompt":"x","temperature":-0.1}`, "temperature"},
		{"/v1/completions", `{"prompt":"x","temperature":"hot"}`, "temperature"},
		{"/v1/completions", `{"prompt":"x","top_p":0}`, "top_p"},
		{"/v1/completions", `{"prompt":"x","top_p":1.01}`, "top_p"},
		{"/v1/completions", `{"prompt":"x","top_k":-2}`, "top_k"},
		{"/v1/completions", `{"prompt":"x","top_k":1.5}`, "top_k"},
		{"/v1/completions", `{"prompt":"x","min_p":1.5}`, "min_p"},
		{"/v1/completions", `{"prompt":"x","presence_penalty":2.5}`, "presence_penalty"},
		{"/v1/completions", `{"prompt":"x","frequency_penalty":-3}`, "frequency_penalty"},
		{"/v1/completions", `{"prompt":"x","repetition_penalty":0}`, "repetition_penalty"},
		{"/v1/completions", `{"prompt":"x","repetition_penalty":11}`, "repetition_penalty"},
		{"/v1/completions", `{"prompt":"x","seed":"x"}`, "seed"},
		{"/v1/completions", `{"prompt":"x","seed":1.5}`, "seed"},
		{"/v1/completions", `{"prompt":"x","stop":["a","b","c","d","e"]}`, "stop"},
		{"/v1/completions", `{"prompt":"x","stop":""}`, "stop"},
		{"/v1/completions", `{"prompt":"x","stop":["a",""]}`, "stop"},
		{"/v1/completions", `{"prompt":"x","stop":123}`, "stop"},
		{"/v1/completions", `{"prompt":"x","stop":"` + strings.Repeat("s", 257) + `"}`, "stop"},
		{"/v1/completions", `{"prompt":"x","stop_token_ids":[-1]}`, "stop_token_ids"},
		{"/v1/completions", `{"prompt":"x","stop_token_ids":[99999]}`, "stop_token_ids"},
		{"/v1/completions", `{"prompt":"x","stop_token_ids":"1"}`, "stop_token_ids"},
		{"/v1/completions", `{"prompt":"x","ignore_eos":1}`, "ignore_eos"},
		{"/v1/completions", `{"prompt":"x","logprobs":6}`, "logprobs"},
		{"/v1/completions", `{"prompt":"x","logprobs":true}`, "logprobs"},
		{"/v1/completions", `{"prompt":"x","suffix":"end"}`, "suffix"},
		{"/v1/completions", `{"prompt":"x","best_of":3}`, "best_of"},
		{"/v1/completions", `{"prompt":"x","logit_bias":{"five":10}}`, "logit_bias"},
		{"/v1/completions", `{"prompt":"x","logit_bias":{"5":101}}`, "logit_bias"},
		{"/v1/completions", `{"prompt":"x","logit_bias":{"5":"up"}}`, "logit_bias"},
		{"/v1/completions", `{"prompt":"x","logit_bias":{"99999999":1}}`, "logit_bias"},
		{"/v1/completions", `{"prompt":"x","logit_bias":{"-3":1}}`, "logit_bias"},
		{"/v1/completions", `{"prompt":"x","logit_bias":[1]}`, "logit_bias"},
		{"/v1/completions", `{"prompt":"x","stream_options":{"include_usage":true}}`, "stream_options"},
		{"/v1/completions", `{"prompt":"x","stream":"yes"}`, "stream"},
		{"/v1/completions", `{"prompt":"x","stream":true,"stream_options":{"include_usage":"y"}}`, "stream_options.include_usage"},
		{"/v1/completions", `{"prompt":"x","priority":"high"}`, "priority"},
		{"/v1/chat/completions", `{}`, "messages"},
		{"/v1/chat/completions", `{"messages":[]}`, "messages"},
		{"/v1/chat/completions", `{"messages":"hi"}`, "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":"wizard","content":"x"}]}`, "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":"user"}]}`, "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x","tool_calls":[{"function":{"name":"f"}}]}]}`, "messages"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":"yes"}`, "logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_logprobs":21,"logprobs":true}`, "top_logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, "top_logprobs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`, "tools"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tool_choice":"auto"}`, "tool_choice"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a"}}}`, "response_format"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"type":"string","pattern":"(a"}},"required":["a"]}}}}`, "response_format"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"string"}}}}`, "response_format"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}`, "response_format"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"response_format":"json"}`, "response_format"},
		{"/v1/completions", `{"prompt":"x","response_format":{"type":"json_object"},"ignore_eos":true}`, "response_format"},
		{"/v1/completions", `{"prompt":"x","max_tokens":4,"min_tokens":5}`, "min_tokens"},
		{"/v1/completions", `{"prompt":"x","guided_choice":["yes","yes!"]}`, "guided_choice"},
		{"/v1/completions", `{"prompt":"x","guided_choice":[]}`, "guided_choice"},
		{"/v1/completions", `{"prompt":"x","guided_regex":"("}`, "guided_regex"},
		{"/v1/completions", `{"prompt":"x","guided_regex":"\\bword"}`, "guided_regex"},
		{"/v1/completions", `{"prompt":"x","guided_regex":"a","guided_choice":["a"]}`, "guided_regex"},
		{"/v1/completions", `{"prompt":"x","guided_grammar":"root ::= root \"a\" | \"b\""}`, "guided_grammar"},
		{"/v1/completions", `{"prompt":"x","guided_grammar":"start ::= [a-"}`, "guided_grammar"},
		{"/v1/completions", `{"prompt":"x","guided_grammar":"root ::= \"a\"","guided_regex":"a"}`, "guided_grammar"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"guided_regex":"a+","ignore_eos":true}`, "guided_regex"},
		{"/v1/completions", `{"prompt":"x","guided_choice":["a"],"response_format":{"type":"json_object"}}`, "guided_choice"},
		{"/v1/completions", `{"prompt":"x","guided_json":{"type":"object","properties":{"a":{"type":"string","pattern":"(x"}}}}`, "guided_json"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"guided_choice":["a"],"guided_json":{"type":"object"}}`, "guided_choice"},
		{"/v1/completions", `{"prompt":"x","min_tokens":-1}`, "min_tokens"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"min_tokens":3}`, "min_tokens"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":1}}`, "chat_template_kwargs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}`, "chat_template_kwargs"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":64}`, "max_tokens"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + strings.Repeat("x ", 80) + `"}]}`, "messages"},
	}
	for _, tc := range cases {
		resp, body := post(t, url, tc.path, tc.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s %s: status %d, want 400: %s", tc.path, tc.body, resp.StatusCode, body)
			continue
		}
		e := checkError(t, body)
		got := ""
		if e.Error.Param != nil {
			got = *e.Error.Param
		}
		if got != tc.param || e.Error.Type != "invalid_request_error" {
			t.Errorf("%s %.80s: param %q type %q, want %q (%s)", tc.path, tc.body, got, e.Error.Type, tc.param, e.Error.Message)
		}
		if tc.param != "" && !strings.Contains(e.Error.Message, strings.Split(tc.param, ".")[0]) {
			t.Errorf("%s %.80s: message %q does not name %s", tc.path, tc.body, e.Error.Message, tc.param)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("%d invalid requests reached the engine", n)
	}
	// Accepted: null for optional fields, unknown fields, top_k -1, echo false,
	// best_of = n, tool_choice none, text response format, text parts.
	for _, tc := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"x","max_tokens":2,"temperature":null,"stop":null,"echo":false,"suffix":"","best_of":2,"n":2,"top_k":-1,"future":{"a":[1]},"user":"u","logprobs":null}`},
		{"/v1/chat/completions", `{"model":"fake-moe","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":null}],"max_tokens":2,"tool_choice":"none","tools":[],"response_format":{"type":"text"},"parallel_tool_calls":false,"store":false,"metadata":{"k":"v"}}`},
	} {
		resp, body := post(t, url, tc.path, tc.body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, body)
		}
	}
	// The text parts joined by a newline, the null assistant content kept.
	reqs := f.requests()
	want := encode(t, "<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n<|im_start|>assistant\n", false)
	if len(reqs) != 2 || !reflect.DeepEqual(reqs[1].Prompt, want) {
		t.Errorf("chat prompt %v, want %v", reqs[len(reqs)-1].Prompt, want)
	}
	// logit_bias reaches the engine as token ids and float biases.
	if resp, body := post(t, url, "/v1/completions", `{"prompt":"x","max_tokens":2,"logit_bias":{"5":-100,"17":2.5}}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("logit_bias: %d %s", resp.StatusCode, body)
	}
	reqs = f.requests()
	if got := reqs[len(reqs)-1].Sampling.LogitBias; !reflect.DeepEqual(got, map[int32]float32{5: -100, 17: 2.5}) {
		t.Errorf("logit_bias reached the engine as %v", got)
	}
	// skip_special_tokens reaches the engine (false: keep their text).
	for _, c := range []struct {
		body string
		keep bool
	}{{`{"prompt":"x","max_tokens":2}`, false}, {`{"prompt":"x","max_tokens":2,"skip_special_tokens":true}`, false},
		{`{"prompt":"x","max_tokens":2,"skip_special_tokens":false}`, true}} {
		if resp, body := post(t, url, "/v1/completions", c.body); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", c.body, resp.StatusCode, body)
		}
		reqs = f.requests()
		if got := reqs[len(reqs)-1].Sampling.KeepSpecialTokens; got != c.keep {
			t.Errorf("%s: KeepSpecialTokens %v, want %v", c.body, got, c.keep)
		}
	}
	// echo: the prompt before each choice's text (a text prompt as given,
	// token ids decoded), streamed or not.
	tok, _ := loadTok(t)
	decoded, _ := tok.Decode([]int32{5, 6, 7}, false)
	for _, c := range []struct {
		prompt string
		want   [2]string
		stream bool
	}{
		{`["say it", "and again"]`, [2]string{"say it", "and again"}, false},
		{`["say it", "and again"]`, [2]string{"say it", "and again"}, true},
		{`[[5, 6, 7], [5, 6, 7]]`, [2]string{decoded, decoded}, true},
	} {
		stream := c.stream
		body := fmt.Sprintf(`{"prompt":%s,"max_tokens":3,"n":2,"echo":true,"stream":%v}`, c.prompt, stream)
		resp, raw := post(t, url, "/v1/completions", body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("echo: %d %s", resp.StatusCode, raw)
		}
		texts := map[int]string{}
		if stream {
			for _, ev := range readSSE(t, bytes.NewReader(raw)) {
				var ch struct {
					Choices []struct {
						Index int
						Text  string
					}
				}
				if json.Unmarshal(ev, &ch) == nil {
					for _, c := range ch.Choices {
						texts[c.Index] += c.Text
					}
				}
			}
		} else {
			var r struct {
				Choices []struct {
					Index int
					Text  string
				}
			}
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			for _, c := range r.Choices {
				texts[c.Index] = c.Text
			}
		}
		for i := range 4 {
			want := c.want[i/2]
			if !strings.HasPrefix(texts[i], want) || len(texts[i]) == len(want) {
				t.Errorf("echo (stream %v), choice %d: %q does not start with %q and go on", stream, i, texts[i], want)
			}
		}
	}
	// echo with logprobs: the prompt's tokens first (the first one's
	// log-probability null), then the completion's; offsets run on.
	resp, raw := post(t, url, "/v1/completions", `{"prompt":[[5, 6, 7]],"max_tokens":2,"echo":true,"logprobs":0}`)
	var el struct {
		Choices []struct {
			Text     string
			Logprobs struct {
				Tokens        []string   `json:"tokens"`
				TokenLogprobs []*float32 `json:"token_logprobs"`
				TextOffset    []int      `json:"text_offset"`
			}
		}
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &el) != nil || len(el.Choices) != 1 {
		t.Fatalf("echo with logprobs: %d %s", resp.StatusCode, raw)
	}
	lp := el.Choices[0].Logprobs
	if len(lp.Tokens) != 5 || lp.TokenLogprobs[0] != nil || lp.TokenLogprobs[1] == nil || *lp.TokenLogprobs[2] != -0.25 ||
		lp.TextOffset[0] != 0 || strings.Join(lp.Tokens, "") != el.Choices[0].Text {
		t.Errorf("echo with logprobs: %s", raw)
	}
	if reqs = f.requests(); !reqs[len(reqs)-1].Sampling.PromptLogprobs {
		t.Error("echo with logprobs did not ask the engine for the prompt's")
	}
	// guided_choice: a grammar of exactly those strings.
	if resp, body := post(t, url, "/v1/completions", `{"prompt":"x","max_tokens":4,"guided_choice":["positive","negative"]}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("guided_choice: %d %s", resp.StatusCode, body)
	}
	reqs = f.requests()
	if g := reqs[len(reqs)-1].Sampling.Grammar; g == nil || !g().Advance([]byte("negative")) || g().Advance([]byte("neutral")) {
		t.Error("guided_choice: no grammar, or one that does not take exactly the choices")
	} else if v := g(); !v.Advance([]byte("pos")) || v.Complete() || !v.Advance([]byte("itive")) || !v.Complete() {
		t.Error("guided_choice: the grammar's completion is wrong")
	}
	// guided_grammar: a GBNF grammar matched in full.
	if resp, body := post(t, url, "/v1/completions", `{"prompt":"x","max_tokens":8,"guided_grammar":"root ::= (\"ab\" | [0-9])+ \"!\""}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("guided_grammar: %d %s", resp.StatusCode, body)
	}
	reqs = f.requests()
	if g := reqs[len(reqs)-1].Sampling.Grammar; g == nil {
		t.Error("guided_grammar: no grammar")
	} else if v := g(); !v.Advance([]byte("ab7")) || v.Complete() || !v.Advance([]byte("!")) || !v.Complete() || g().Advance([]byte("a!")) {
		t.Error("guided_grammar: the grammar does not match its language")
	}
	// min_tokens reaches the engine.
	if resp, body := post(t, url, "/v1/completions", `{"prompt":"x","max_tokens":4,"min_tokens":3}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("min_tokens: %d %s", resp.StatusCode, body)
	}
	if reqs = f.requests(); reqs[len(reqs)-1].Sampling.MinTokens != 3 {
		t.Errorf("min_tokens reached the engine as %d", reqs[len(reqs)-1].Sampling.MinTokens)
	}
	// response_format json_object / json_schema reach the engine as a Grammar, on
	// both endpoints; text leaves it off.
	for _, tc := range []struct {
		path, body string
		json       bool
	}{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"response_format":{"type":"json_object"}}`, true},
		{"/v1/completions", `{"prompt":"x","max_tokens":2,"response_format":{"type":"json_object"}}`, true},
		{"/v1/completions", `{"prompt":"x","max_tokens":2,"response_format":{"type":"text"}}`, false},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":2,"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false}}}}`, true},
		{"/v1/completions", `{"prompt":"x","max_tokens":2,"guided_json":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}`, true},
		{"/v1/completions", `{"prompt":"x","max_tokens":2,"guided_json":"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}"}`, true},
	} {
		if resp, body := post(t, url, tc.path, tc.body); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", tc.path, tc.body, resp.StatusCode, body)
		}
		reqs = f.requests()
		sp := reqs[len(reqs)-1].Sampling
		if (sp.Grammar != nil) != tc.json {
			t.Errorf("%s %s: a grammar %v, want %v", tc.path, tc.body, sp.Grammar != nil, tc.json)
		}
		if sp.Grammar == nil {
			continue
		}
		// json_object takes any object; the schema's grammar only {"a": integer}.
		schema := strings.Contains(tc.body, "json_schema") || strings.Contains(tc.body, "guided_json")
		if g := sp.Grammar(); !g.Advance([]byte(`{"a": 12}`)) || !g.Complete() {
			t.Errorf("%s: the grammar refuses {\"a\": 12}", tc.body)
		}
		if ok := sp.Grammar().Advance([]byte(`{"b": 1}`)); ok == schema {
			t.Errorf("%s: the grammar takes {\"b\": 1}: %v", tc.body, ok)
		}
	}
}

func TestStatusPaths(t *testing.T) {
	f := newFake(64)
	s, url := serve(t, f, Options{APIKey: testKey, MaxBodyBytes: 1000})
	auth := []string{"Authorization", "Bearer " + testKey}
	good := `{"prompt":"hi","max_tokens":2}`
	cases := []struct {
		name   string
		setup  func()
		method string
		path   string
		body   string
		hdr    []string
		status int
		code   string
	}{
		{"ok", nil, "POST", "/v1/completions", good, auth, 200, ""},
		{"no auth header", nil, "POST", "/v1/completions", good, nil, 401, "invalid_api_key"},
		{"wrong key", nil, "POST", "/v1/completions", good, []string{"Authorization", "Bearer nope"}, 401, "invalid_api_key"},
		{"basic scheme", nil, "POST", "/v1/completions", good, []string{"Authorization", "Basic " + testKey}, 401, "invalid_api_key"},
		{"models need auth", nil, "GET", "/v1/models", "", nil, 401, "invalid_api_key"},
		{"lower-case bearer", nil, "POST", "/v1/completions", good, []string{"Authorization", "bearer " + testKey}, 200, ""},
		{"unknown route", nil, "GET", "/v2/nothing", "", auth, 404, "not_found"},
		{"wrong method", nil, "GET", "/v1/completions", "", auth, 405, "method_not_allowed"},
		{"unknown model", nil, "POST", "/v1/chat/completions", `{"model":"x","messages":[{"role":"user","content":"a"}]}`, auth, 404, "model_not_found"},
		{"too large", nil, "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("a", 1000) + `"}`, auth, 413, "request_too_large"},
		{"queue full", func() { f.err = engine.ErrQueueFull }, "POST", "/v1/completions", good, auth, 429, "queue_full"},
		{"engine draining", func() { f.err = engine.ErrDraining }, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}],"max_tokens":3}`, auth, 503, "draining"},
		{"draining", func() { s.SetDraining(true) }, "POST", "/v1/completions", good, auth, 503, "draining"},
		{"loading", func() { s.SetReady(false) }, "POST", "/v1/completions", good, auth, 503, "not_ready"},
		{"engine too long", func() { f.err = engine.ErrTooLong }, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"a"}]}`, auth, 400, ""},
		{"metrics absent", nil, "GET", "/metrics", "", nil, 404, "not_found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.err = nil
			s.SetDraining(false)
			s.SetReady(true)
			if tc.setup != nil {
				tc.setup()
			}
			req, _ := http.NewRequest(tc.method, url+tc.path, strings.NewReader(tc.body))
			for i := 0; i+1 < len(tc.hdr); i += 2 {
				req.Header.Set(tc.hdr[i], tc.hdr[i+1])
			}
			resp, body := do(t, req)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
			if tc.status == 200 {
				return
			}
			e := checkError(t, body)
			if got := deref(e.Error.Code); got != tc.code {
				t.Errorf("code %q, want %q: %s", got, tc.code, body)
			}
			if tc.status == 401 && resp.Header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if tc.name == "engine too long" && deref(e.Error.Param) != "messages" {
				t.Errorf("ErrTooLong param %q, want messages", deref(e.Error.Param))
			}
		})
	}
	// A body without Content-Length (chunked) is cut at the limit too.
	req, _ := http.NewRequest("POST", url+"/v1/completions", io.MultiReader(strings.NewReader(`{"prompt":"`), strings.NewReader(strings.Repeat("b", 2000)+`"}`)))
	req.ContentLength = -1
	req.Header.Set("Authorization", "Bearer "+testKey)
	if resp, body := do(t, req); resp.StatusCode != 413 {
		t.Errorf("chunked body: %d %s", resp.StatusCode, body)
	}
	f.err = nil
	s.SetDraining(false)
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func TestHealthAndMetrics(t *testing.T) {
	f := newFake(64)
	tok, tmpl := loadTok(t)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "mkserve_requests_total 7\n")
	})
	s := New(f, tok, tmpl, Options{APIKey: testKey, Metrics: metrics,
		Version: version.Info{Version: "v1.2.3", Revision: "abc123+dirty", Time: "2026-12-01T00:00:00Z", Go: "go1.26.8"}})
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, _ := get("/health"); st != 503 {
		t.Errorf("health before SetReady: %d", st)
	}
	s.SetReady(true)
	if st, _ := get("/health"); st != 200 {
		t.Errorf("health when ready: %d", st)
	}
	s.SetDraining(true)
	if st, body := get("/health"); st != 503 || !strings.Contains(body, "draining") {
		t.Errorf("health when draining: %d %s", st, body)
	}
	if st, body := get("/metrics"); st != 200 || body != "mkserve_requests_total 7\n" {
		t.Errorf("metrics (no auth needed): %d %q", st, body)
	}
	if st, body := get("/version"); st != 200 || strings.TrimSpace(body) != `{"version":"v1.2.3","revision":"abc123+dirty","time":"2026-12-01T00:00:00Z","go":"go1.26.8"}` {
		t.Errorf("version (no auth needed): %d %s", st, body)
	}
	bare := httptest.NewServer(New(f, tok, tmpl, Options{}).Handler())
	defer bare.Close()
	if resp, err := http.Get(bare.URL + "/version"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.TrimSpace(string(b)) != `{"version":"unknown"}` {
			t.Errorf("version without build information: %s", b)
		}
	}
}

// readSSE reads a whole event stream and checks its framing: every event
// is one "data: " line followed by a blank line, every payload but the
// last is JSON, the last is [DONE] and nothing follows it.
func readSSE(t *testing.T, r io.Reader) []json.RawMessage {
	t.Helper()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasSuffix(data, []byte("data: [DONE]\n\n")) {
		t.Fatalf("stream does not end with [DONE]: %q", tail(data))
	}
	var events []json.RawMessage
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	expectBlank := false
	done := false
	for sc.Scan() {
		line := sc.Text()
		if expectBlank {
			if line != "" {
				t.Fatalf("event not followed by a blank line: %q", line)
			}
			expectBlank = false
			continue
		}
		if done {
			t.Fatalf("data after [DONE]: %q", line)
		}
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line without data: %q", line)
		}
		expectBlank = true
		if payload == "[DONE]" {
			done = true
			continue
		}
		if !json.Valid([]byte(payload)) {
			t.Fatalf("event is not JSON: %q", payload)
		}
		events = append(events, json.RawMessage(payload))
	}
	if !done || expectBlank {
		t.Fatal("stream ended early")
	}
	return events
}

func tail(b []byte) []byte { return b[max(0, len(b)-200):] }

func TestSSEFraming(t *testing.T) {
	f := newFake(128)
	_, url := serve(t, f, Options{})
	for _, tc := range []struct{ path, body, object string }{
		{"/v1/completions", `{"prompt":["a b","c"],"n":2,"max_tokens":7,"stream":true,"stream_options":{"include_usage":true},"logprobs":1}`, "text_completion"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"<a&b>"}],"n":3,"max_tokens":5,"stream":true,"logprobs":true,"top_logprobs":2}`, "chat.completion.chunk"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"stream":true,"stream_options":{"include_usage":false}}`, "chat.completion.chunk"},
	} {
		req, _ := http.NewRequest("POST", url+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("%s: status %d content type %q", tc.path, resp.StatusCode, ct)
		}
		events := readSSE(t, resp.Body)
		resp.Body.Close()
		usageSeen := false
		finished := map[int]bool{}
		var id string
		for i, ev := range events {
			var ch struct {
				ID      string
				Object  string
				Choices []struct {
					Index        int
					FinishReason *string `json:"finish_reason"`
				}
				Usage *json.RawMessage
			}
			if err := json.Unmarshal(ev, &ch); err != nil {
				t.Fatal(err)
			}
			if ch.Object != tc.object || (id != "" && ch.ID != id) {
				t.Errorf("%s event %d: object %q id %q", tc.path, i, ch.Object, ch.ID)
			}
			id = ch.ID
			withUsage := strings.Contains(tc.body, `"include_usage":true`)
			if hasUsage := bytes.Contains(ev, []byte(`"usage":`)); hasUsage != withUsage {
				t.Errorf("%s event %d: usage field present=%v, include_usage=%v", tc.path, i, hasUsage, withUsage)
			}
			if len(ch.Choices) == 0 {
				if i != len(events)-1 || ch.Usage == nil || string(*ch.Usage) == "null" {
					t.Errorf("%s: empty-choices event %d of %d is not the usage chunk: %s", tc.path, i, len(events), ev)
				}
				usageSeen = true
				continue
			}
			for _, c := range ch.Choices {
				if finished[c.Index] {
					t.Errorf("%s: choice %d continues after its finish", tc.path, c.Index)
				}
				if c.FinishReason != nil {
					finished[c.Index] = true
				}
			}
		}
		if usageSeen != strings.Contains(tc.body, `"include_usage":true`) {
			t.Errorf("%s: usage chunk %v", tc.path, usageSeen)
		}
		if len(finished) != countChoices(tc.body) {
			t.Errorf("%s: %d choices finished", tc.path, len(finished))
		}
	}
}

// countChoices is n times the number of prompts of a test body.
func countChoices(body string) int {
	var b struct {
		N      int
		Prompt json.RawMessage
	}
	_ = json.Unmarshal([]byte(body), &b)
	n := max(b.N, 1)
	var list []string
	if json.Unmarshal(b.Prompt, &list) == nil {
		return n * len(list)
	}
	return n
}

// TestDisconnectCancels: a client leaving mid-stream (or mid-request)
// cancels the engine request's context.
func TestDisconnectCancels(t *testing.T) {
	for _, stream := range []bool{true, false} {
		f := newFake(128)
		f.hold = true
		_, url := serve(t, f, Options{})
		ctx, cancel := context.WithCancel(context.Background())
		body := `{"prompt":"tell me","max_tokens":50,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", strings.NewReader(body))
		if !stream { // give up while the server waits for the engine
			go func() { time.Sleep(100 * time.Millisecond); cancel() }()
		}
		resp, err := http.DefaultClient.Do(req)
		if stream {
			if err != nil {
				t.Fatal(err)
			}
			// Read the first event, then leave.
			br := bufio.NewReader(resp.Body)
			line, err := br.ReadString('\n')
			if err != nil || !strings.HasPrefix(line, "data: {") {
				t.Fatalf("first line %q %v", line, err)
			}
			cancel()
			resp.Body.Close()
		} else if err == nil {
			t.Fatalf("non-streaming request returned %d instead of being cancelled", resp.StatusCode)
		}
		select {
		case id := <-f.cancelled:
			if !strings.HasPrefix(id, "cmpl-") {
				t.Errorf("cancelled %q", id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("stream=%v: the engine request's context was not cancelled", stream)
		}
		cancel()
	}
}

func TestPanicAndEngineFailure(t *testing.T) {
	f := newFake(128)
	core, logs := observer.New(zap.InfoLevel)
	_, url := serve(t, f, Options{Logger: zap.New(core)})
	f.panics = true
	resp, body := post(t, url, "/v1/completions", `{"prompt":"x"}`)
	if resp.StatusCode != 500 || bytes.Contains(body, []byte("secret")) {
		t.Errorf("panic: %d %s", resp.StatusCode, body)
	}
	checkError(t, body)
	if logs.FilterMessage("panic serving request").Len() != 1 {
		t.Error("panic not logged")
	}
	f.panics = false
	f.failAt = 3
	resp, body = post(t, url, "/v1/completions", `{"prompt":"x","max_tokens":10}`)
	if resp.StatusCode != 500 || bytes.Contains(body, []byte("secret")) {
		t.Errorf("engine failure: %d %s", resp.StatusCode, body)
	}
	checkError(t, body)
	// Streamed: the tokens before the failure, an error event, [DONE].
	resp2, err := http.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"messages":[{"role":"user","content":"x"}],"max_tokens":10,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	events := readSSE(t, resp2.Body)
	resp2.Body.Close()
	last := events[len(events)-1]
	if !bytes.HasPrefix(last, []byte(`{"error":`)) || bytes.Contains(last, []byte("secret")) {
		t.Errorf("last event %s", last)
	}
	var failed int
	for _, e := range logs.FilterMessage("request").All() {
		if e.ContextMap()["status"] == int64(500) {
			failed++
			if c, _ := e.ContextMap()["cause"].(string); !strings.Contains(c, "secret-internal-detail") {
				t.Errorf("the log lacks the cause: %v", e.ContextMap())
			}
		}
	}
	if failed != 2 {
		t.Errorf("%d failed requests logged, want 2", failed)
	}
}

// TestGrammarGaveUp: a choice whose grammar gave up mid-text (too costly
// to follow) is the client's 400 with the reason, whole or streamed, on
// every generation endpoint — not a 500.
func TestGrammarGaveUp(t *testing.T) {
	f := newFake(4096)
	f.failAt, f.failErr = 3, fmt.Errorf("engine: %w", grammar.ErrGrammarTooComplex)
	_, url := serve(t, f, Options{})
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt": "x", "max_tokens": 10, "guided_grammar": "root ::= [a-z]+"}`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "x"}], "max_tokens": 10, "guided_grammar": "root ::= [a-z]+"}`},
		{"/v1/responses", `{"input": "x", "max_output_tokens": 10, "guided_grammar": "root ::= [a-z]+"}`},
	} {
		resp, raw := post(t, url, c.path, c.body)
		e := checkError(t, raw)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(e.Error.Message, "too costly to follow") {
			t.Errorf("%s: %d %s", c.path, resp.StatusCode, raw)
		}
		resp, raw = post(t, url, c.path, strings.TrimSuffix(c.body, "}")+`, "stream": true}`)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), "too costly to follow") {
			t.Errorf("%s streamed: %d %s", c.path, resp.StatusCode, raw)
		}
	}
}

func TestCORS(t *testing.T) {
	f := newFake(64)
	_, url := serve(t, f, Options{CORSOrigins: []string{"https://app.example"}, APIKey: testKey})
	pre := func(origin string) *http.Response {
		req, _ := http.NewRequest("OPTIONS", url+"/v1/chat/completions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		resp, _ := do(t, req)
		return resp
	}
	if r := pre("https://app.example"); r.StatusCode != 204 || r.Header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Methods"), "POST") || r.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
		t.Errorf("allowed preflight: %d %v", r.StatusCode, r.Header)
	}
	if r := pre("https://evil.example"); r.StatusCode != 403 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("refused preflight: %d %v", r.StatusCode, r.Header)
	}
	resp, _ := post(t, url, "/v1/completions", `{"prompt":"a","max_tokens":1}`, "Origin", "https://app.example", "Authorization", "Bearer "+testKey)
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Errorf("simple request: %d %v", resp.StatusCode, resp.Header)
	}
	// Any origin.
	_, url2 := serve(t, newFake(64), Options{CORSOrigins: []string{"*"}})
	resp, _ = post(t, url2, "/v1/completions", `{"prompt":"a","max_tokens":1}`, "Origin", "http://x.example")
	if resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("wildcard: %v", resp.Header)
	}
}

func TestRequestLog(t *testing.T) {
	for _, logPrompts := range []bool{false, true} {
		f := newFake(128)
		core, logs := observer.New(zap.InfoLevel)
		_, url := serve(t, f, Options{Logger: zap.New(core), LogPrompts: logPrompts})
		resp, body := post(t, url, "/v1/completions", `{"prompt":"secret plans","max_tokens":5}`)
		if resp.StatusCode != 200 {
			t.Fatal(string(body))
		}
		post(t, url, "/v1/completions", `{"prompt":"x","n":0}`)
		entries := logs.FilterMessage("request").All()
		if len(entries) != 2 {
			t.Fatalf("%d log lines for 2 requests", len(entries))
		}
		m := entries[0].ContextMap()
		ids := encode(t, "secret plans", true)
		if m["id"] != resp.Header.Get("X-Request-Id") || m["model"] != "fake-moe" || m["status"] != int64(200) ||
			m["prompt_tokens"] != int64(len(ids)) || m["completion_tokens"] != int64(5) || m["ttft"] == nil || m["latency"] == nil ||
			!reflect.DeepEqual(m["finish_reasons"], []any{"length"}) {
			t.Errorf("log line %v", m)
		}
		if _, has := m["prompt"]; has != logPrompts {
			t.Errorf("LogPrompts=%v but prompt logged=%v", logPrompts, has)
		}
		if m2 := entries[1].ContextMap(); m2["status"] != int64(400) || !strings.Contains(m2["error"].(string), "n must") {
			t.Errorf("error log line %v", m2)
		}
	}
}

// TestGPT2Tokenizer runs completions with the shared GPT-2 tokenizer (no
// chat template: chat answers 400).
func TestGPT2Tokenizer(t *testing.T) {
	if _, err := os.Stat(gpt2Path); err != nil {
		t.Skipf("GPT-2 tokenizer not found at %s (the shared folder beside the checkout): %v", gpt2Path, err)
	}
	loadTok(t) // the fake's token texts
	tok, err := tokenizer.Load(gpt2Path)
	if err != nil {
		t.Fatal(err)
	}
	f := newFake(1024)
	f.vocab = tok.VocabSize()
	s := New(f, tok, nil, Options{})
	s.SetReady(true)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	defer f.running.Wait()
	// HF tokenizers' ids for texts (recorded by the tokenizer package's
	// generator): the server must send exactly these.
	data, err := os.ReadFile(filepath.Join("..", "..", "tokenizer", "testdata", "gpt2", "expected.json"))
	if err != nil {
		t.Fatal(err)
	}
	var exp struct {
		Cases []struct {
			Text       string  `json:"text"`
			IDsSpecial []int32 `json:"ids_special"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &exp); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, c := range exp.Cases {
		if len(c.IDsSpecial) == 0 || len(c.IDsSpecial) > 200 {
			continue
		}
		body, _ := json.Marshal(map[string]any{"prompt": c.Text, "max_tokens": 2})
		resp, out := post(t, ts.URL, "/v1/completions", string(body))
		if resp.StatusCode != 200 {
			t.Fatalf("%q: %d %s", c.Text, resp.StatusCode, out)
		}
		reqs := f.requests()
		if got := reqs[len(reqs)-1].Prompt; !reflect.DeepEqual(got, c.IDsSpecial) {
			t.Errorf("%q: prompt ids %v, want %v", c.Text, got, c.IDsSpecial)
		}
		checked++
	}
	if checked < 10 {
		t.Errorf("only %d GPT-2 cases checked", checked)
	}
	resp, body := post(t, ts.URL, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != 400 || !strings.Contains(string(body), "chat template") {
		t.Errorf("chat without template: %d %s", resp.StatusCode, body)
	}
}
