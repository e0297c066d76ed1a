package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fuzzServer is one server over a fake with a short context, so fuzzed
// requests stay cheap.
func fuzzServer(f *testing.F) (http.Handler, *fakeGen) {
	tok, tmpl := loadTok(f)
	fake := newFake(48)
	fake.noRecord = true
	s := New(fake, tok, tmpl, Options{MaxBodyBytes: 1 << 16, ToolFormat: ToolFormatHermes})
	s.SetReady(true)
	return s.Handler(), fake
}

// checkResponse asserts what every response to any body must satisfy:
// no 5xx; an error is a 4xx in OpenAI's shape; a success is a well-formed
// JSON body or SSE stream whose choices are numbered and finished.
func checkResponse(t *testing.T, rec *httptest.ResponseRecorder, object string) {
	t.Helper()
	body := rec.Body.Bytes()
	if rec.Code != http.StatusOK {
		if rec.Code < 400 || rec.Code >= 500 {
			t.Fatalf("status %d: %s", rec.Code, body)
		}
		checkError(t, body)
		return
	}
	if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
		for _, ev := range readSSE(t, bytes.NewReader(body)) {
			if bytes.HasPrefix(ev, []byte(`{"error"`)) {
				t.Fatalf("error event in a stream: %s", ev)
			}
			var ch struct{ Object string }
			if err := json.Unmarshal(ev, &ch); err != nil || ch.Object != object+".chunk" && ch.Object != object {
				t.Fatalf("chunk %s", ev)
			}
		}
		return
	}
	var resp struct {
		Object  string
		Choices []struct {
			Index        int
			FinishReason string `json:"finish_reason"`
		}
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
			TotalTokens      int `json:"total_tokens"`
		}
	}
	if err := json.Unmarshal(body, &resp); err != nil || resp.Object != object || len(resp.Choices) == 0 {
		t.Fatalf("response %s (%v)", body, err)
	}
	for i, c := range resp.Choices {
		if c.Index != i || c.FinishReason == "" {
			t.Fatalf("choice %d: %+v", i, c)
		}
	}
	u := resp.Usage
	if u.PromptTokens < 1 || u.CompletionTokens < len(resp.Choices) || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("usage %+v", u)
	}
}

func fuzzPost(h http.Handler, path string, body []byte) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func FuzzCompletionRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hello","max_tokens":3}`,
		`{"prompt":"hello","max_tokens":3,"guided_choice":["yes","no"],"echo":true,"logprobs":1}`,
		`{"prompt":"hello","max_tokens":3,"guided_regex":"[0-9]{3}-(a|b)+"}`,
		`{"prompt":"hello","max_tokens":3,"guided_grammar":"root ::= item (\",\" item)*\nitem ::= [a-z]+ | \"(\" root \")\""}`,
		`{"prompt":[1,2],"max_tokens":3,"guided_json":{"type":"object","properties":{"a":{"type":"object","additionalProperties":{"type":"integer"}}}},"min_tokens":1}`,
		`{"model":"fake-moe","prompt":["a","b"],"n":2,"max_tokens":4,"stop":["x"],"logprobs":2}`,
		`{"prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true},"max_tokens":2}`,
		`{"prompt":[[5,6],[7]],"temperature":0.5,"top_p":0.9,"top_k":3,"min_p":0.1,"seed":-5}`,
		`{"prompt":"x","presence_penalty":1,"frequency_penalty":-1,"repetition_penalty":1.2,"stop_token_ids":[4],"ignore_eos":true}`,
		`{"prompt":"x","echo":true}`, `{"prompt":"x","max_tokens":1e9}`, `{"prompt":null}`, `[]`, `{`, ``,
		`{"prompt":"x","max_completion_tokens":5,"best_of":1,"suffix":null,"user":"u","priority":-3}`,
		`{"prompt":"` + strings.Repeat("word ", 60) + `"}`,
	} {
		f.Add([]byte(s))
	}
	h, _ := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		checkResponse(t, fuzzPost(h, "/v1/completions", body), "text_completion")
	})
}

func FuzzChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		`{"model":"fake-moe","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"}]}],"n":2,"max_completion_tokens":4,"logprobs":true,"top_logprobs":3}`,
		`{"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":2,"stop":"a"}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","content":"r","tool_call_id":"1"}],"max_tokens":2}`,
		`{"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"enable_thinking":false,"n":[1,{"a":null}]},"add_generation_prompt":false,"max_tokens":2}`,
		`{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`, `{"messages":[]}`, `{"messages":[{}]}`,
		`{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"},"tool_choice":"none","seed":1}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"min_tokens":2,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"a":{"anyOf":[{"type":"integer"},{"type":"null"}]},"b":{"type":"array","items":{"type":"string","maxLength":3},"maxItems":2}},"required":["a"]}}}}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"string"}},"required":["x"]}}}],"tool_choice":"required","parallel_tool_calls":false}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],"tool_choice":{"type":"function","function":{"name":"g"}},"stream":true}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"reasoning_effort":"low","skip_special_tokens":false,"guided_regex":"[a-z]{2,3}"}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"prediction":{"type":"content","content":[{"type":"text","text":"ab"},{"type":"text","text":"c"}]},"n":2}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"prediction":{"type":"content","content":"abc"},"frequency_penalty":0.1}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":4,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer","multipleOf":3}}}}},{"type":"function","function":{"name":"g","parameters":{"type":"object","properties":{"b":{"type":"array","prefixItems":[{"type":"number","minimum":0}]}}}}}],"tool_choice":"required"}`,
	} {
		f.Add([]byte(s))
	}
	h, _ := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		checkResponse(t, fuzzPost(h, "/v1/chat/completions", body), "chat.completion")
	})
}

// FuzzTokenizeRequest: any body to /tokenize or /detokenize gets a 200 with
// the endpoint's shape or a 4xx in OpenAI's error shape, never a 5xx.
func FuzzTokenizeRequest(f *testing.F) {
	h, _ := fuzzServer(f)
	for _, s := range []string{`{"prompt": "hello"}`, `{"messages": [{"role": "user", "content": "x"}], "return_token_strs": true}`,
		`{"tokens": [1, 2, 3]}`, `{"prompt": null}`, `{"tokens": [-1]}`, `[]`} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, body string, detok bool) {
		path := "/tokenize"
		if detok {
			path = "/detokenize"
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			if rec.Code < 400 || rec.Code >= 500 {
				t.Fatalf("%s %q: status %d: %s", path, body, rec.Code, rec.Body.Bytes())
			}
			checkError(t, rec.Body.Bytes())
			return
		}
		var v map[string]json.RawMessage
		if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
			t.Fatalf("%s %q: body %s", path, body, rec.Body.Bytes())
		}
		if _, ok := v[map[bool]string{true: "prompt", false: "tokens"}[detok]]; !ok {
			t.Fatalf("%s %q: body %s lacks its field", path, body, rec.Body.Bytes())
		}
	})
}

// FuzzResponsesRequest: any body to /v1/responses gets a 4xx in OpenAI's
// error shape, or a response object whose output holds items, or a stream
// of typed events numbered from 0 that ends in completed or incomplete.
func FuzzResponsesRequest(f *testing.F) {
	for _, s := range []string{
		`{"input":"hi","max_output_tokens":3}`,
		`{"input":"hi","instructions":"be brief","max_output_tokens":3,"stream":true}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"role":"assistant","content":"b"}],"max_output_tokens":2,"temperature":0.5,"top_p":0.9}`,
		`{"input":[{"role":"user","content":"x"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}],"max_output_tokens":2,"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{}}}]}`,
		`{"input":"x","max_output_tokens":4,"tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}}],"tool_choice":"required","stream":true}`,
		`{"input":"x","max_output_tokens":4,"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}}}}`,
		`{"input":"x","max_output_tokens":3,"include":["message.output_text.logprobs"],"top_logprobs":2,"stream":true}`,
		`{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"t"}]},{"role":"assistant","content":[{"type":"output_text","text":"a"}]}],"reasoning":{"effort":"low"}}`,
		`{"input":"x","previous_response_id":"r"}`, `{"input":null}`, `{"input":[{}]}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	h, _ := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := fuzzPost(h, "/v1/responses", body)
		raw := rec.Body.Bytes()
		if rec.Code != http.StatusOK {
			if rec.Code < 400 || rec.Code >= 500 {
				t.Fatalf("status %d: %s", rec.Code, raw)
			}
			checkError(t, raw)
			return
		}
		if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
			evs := respEvents(t, raw)
			for i, ev := range evs {
				if n, _ := ev["sequence_number"].(float64); int(n) != i || ev["type"] == "error" {
					t.Fatalf("event %d: %v", i, ev)
				}
			}
			if last := evs[len(evs)-1]["type"]; last != "response.completed" && last != "response.incomplete" {
				t.Fatalf("stream ends with %v", last)
			}
			return
		}
		var r struct {
			Object, Status string
			Output         []struct{ Type string }
		}
		if err := json.Unmarshal(raw, &r); err != nil || r.Object != "response" || len(r.Output) == 0 || (r.Status != "completed" && r.Status != "incomplete") {
			t.Fatalf("response %s (%v)", raw, err)
		}
	})
}

// FuzzOllamaRequest: any body to /api/chat or /api/generate gets a 200
// whose body is NDJSON objects, each with a model, the last one done, or
// a 4xx with ollama's {"error": "…"}; never a 5xx.
func FuzzOllamaRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"fake-moe","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":3}}`,
		`{"messages":[{"role":"user","content":"hi"}],"stream":false,"format":"json","options":{"num_predict":4,"temperature":0.5,"stop":["x"],"seed":3}}`,
		`{"messages":[{"role":"user","content":"hi"}],"format":{"type":"object","properties":{"a":{"type":"integer"}}},"think":false}`,
		`{"messages":[{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{"x":1}}}]},{"role":"tool","content":"r","tool_name":"f"}],"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"prompt":"hello","raw":true,"options":{"num_predict":2,"repeat_penalty":1.1}}`,
		`{"prompt":"hello","system":"s","suffix":"x","stream":false}`,
		`{"messages":[{"role":"user","content":"x","images":["aGk="]}]}`, `{"options":{"num_predict":-7}}`, `{`, ``, `[]`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	h, _ := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		path := "/api/generate"
		if chat {
			path = "/api/chat"
		}
		rec := fuzzPost(h, path, body)
		b := rec.Body.Bytes()
		if rec.Code != http.StatusOK {
			var e struct{ Error string }
			if rec.Code < 400 || rec.Code >= 500 || json.Unmarshal(b, &e) != nil || e.Error == "" {
				t.Fatalf("status %d: %s", rec.Code, b)
			}
			return
		}
		objs := bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
		for i, o := range objs {
			var r struct {
				Model string
				Done  bool
			}
			if err := json.Unmarshal(o, &r); err != nil || r.Model == "" || r.Done != (i == len(objs)-1) {
				t.Fatalf("object %d of %d: %s", i, len(objs), o)
			}
		}
	})
}

// FuzzAnthropicRequest: any body to /v1/messages gets a 200 (a message,
// or an event stream ending in message_stop) or a 4xx in Anthropic's
// error shape; never a 5xx.
func FuzzAnthropicRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"fake-moe","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`,
		`{"max_tokens":4,"stream":true,"system":"s","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stop_sequences":["x"],"top_k":3}`,
		`{"max_tokens":4,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"a","name":"f","input":{"x":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"r"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any"}}`,
		`{"max_tokens":4,"messages":[{"role":"user","content":[{"type":"image"}]}]}`, `{"messages":[]}`, `{`, ``,
		`{"max_tokens":4,"thinking":{"type":"enabled","budget_tokens":10},"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"tool","name":"f"}}`,
	} {
		f.Add([]byte(s))
	}
	h, _ := fuzzServer(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := fuzzPost(h, "/v1/messages", body)
		b := rec.Body.Bytes()
		if rec.Code != http.StatusOK {
			var e struct {
				Type  string
				Error struct{ Type, Message string }
			}
			if rec.Code < 400 || rec.Code >= 500 || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
				t.Fatalf("status %d: %s", rec.Code, b)
			}
			return
		}
		if strings.HasPrefix(rec.Header().Get("Content-Type"), "text/event-stream") {
			if !bytes.Contains(b, []byte("event: message_start\n")) || !bytes.HasSuffix(b, []byte("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")) {
				t.Fatalf("stream: %s", b)
			}
			return
		}
		var m struct {
			Type, Role string
			Content    []struct{ Type string }
		}
		if err := json.Unmarshal(b, &m); err != nil || m.Type != "message" || m.Role != "assistant" || len(m.Content) == 0 {
			t.Fatalf("message: %s", b)
		}
	})
}
