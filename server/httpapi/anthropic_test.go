package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// TestAnthropicMessages: POST /v1/messages through Anthropic's official
// Go SDK, over the real engine (the default model, greedy): the reply is
// the OpenAI chat endpoint's, whole and streamed (the SDK accumulating the
// events), with usage and stop reasons; the key may come as x-api-key;
// bad requests get Anthropic's error shape.
func TestAnthropicMessages(t *testing.T) {
	tok, tmpl, be, l, eos := defaultModel(t)
	ts := serveEngine(t, tok, tmpl, be, l, eos)
	want := func(maxTok int) string {
		t.Helper()
		resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(
			`{"model":"default","messages":[{"role":"system","content":"Answer briefly."},{"role":"user","content":"Who made the light?"}],"temperature":0,"max_tokens":`+
				map[int]string{12: "12", 200: "200"}[maxTok]+`}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r struct {
			Choices []struct {
				Message      struct{ Content string }
				FinishReason string `json:"finish_reason"`
			}
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("chat: %v", err)
		}
		return r.Choices[0].Message.Content
	}
	client := anthropic.NewClient(option.WithBaseURL(ts.URL), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	params := func(maxTok int64) anthropic.MessageNewParams {
		return anthropic.MessageNewParams{Model: "default", MaxTokens: maxTok,
			System:   []anthropic.TextBlockParam{{Text: "Answer briefly."}},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Who made the light?"))}}
	}
	ctx := context.Background()
	for _, maxTok := range []int64{12, 200} {
		w := want(int(maxTok))
		greedy := option.WithJSONSet("temperature", 0) // (this SDK's params no longer carry it)
		msg, err := client.Messages.New(ctx, params(maxTok), greedy)
		if err != nil {
			t.Fatal(err)
		}
		if len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text != w || msg.Role != "assistant" ||
			msg.Usage.InputTokens == 0 || msg.Usage.OutputTokens == 0 {
			t.Errorf("max_tokens %d: %+v; want the text %q", maxTok, msg, w)
		}
		wantStop := anthropic.StopReasonEndTurn
		if maxTok == 12 {
			wantStop = anthropic.StopReasonMaxTokens
		}
		if msg.StopReason != wantStop {
			t.Errorf("max_tokens %d: stop reason %q, want %q", maxTok, msg.StopReason, wantStop)
		}
		stream := client.Messages.NewStreaming(ctx, params(maxTok), greedy)
		var acc anthropic.Message
		events := 0
		for stream.Next() {
			if err := acc.Accumulate(stream.Current()); err != nil {
				t.Fatal(err)
			}
			events++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(acc.Content) != 1 || acc.Content[0].Text != w || acc.StopReason != wantStop || acc.Usage.OutputTokens != msg.Usage.OutputTokens || events < 5 {
			t.Errorf("max_tokens %d streamed (%d events): %+v; want %q", maxTok, events, acc, w)
		}
	}

	// output_config.format: the reply is the schema's JSON.
	js, err := client.Messages.New(ctx, anthropic.MessageNewParams{Model: "default", MaxTokens: 60,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Give a number."))},
		OutputConfig: anthropic.OutputConfigParam{Format: anthropic.JSONOutputFormatParam{Schema: map[string]any{
			"type": "object", "properties": map[string]any{"n": map[string]any{"type": "integer"}}, "required": []string{"n"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(js.Content) != 1 || !strings.HasPrefix(strings.TrimSpace(js.Content[0].Text), "{") {
		t.Errorf("output_config.format: %+v", js.Content)
	} else if js.StopReason == anthropic.StopReasonEndTurn {
		var v struct{ N *int }
		if err := json.Unmarshal([]byte(js.Content[0].Text), &v); err != nil || v.N == nil {
			t.Errorf("output_config.format: %q is not the schema's object (%v)", js.Content[0].Text, err)
		}
	}

	for _, c := range []struct {
		body, typ, msg string
		code           int
	}{
		{`{"model":"default","max_tokens":4,"messages":[{"role":"user","content":"x"}],"output_config":{"format":{"type":"text"}}}`, "invalid_request_error", "output_config.format", 400},
		{`{"model":"default","max_tokens":4,"messages":[{"role":"user","content":"x"}],"output_config":{"effort":"huge"}}`, "invalid_request_error", "effort", 400},
		{`{"model":"claude-x","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "not_found_error", "claude-x", 404},
		{`{"model":"default","max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{}}]}]}`, "invalid_request_error", `"image"`, 400},
		{`{"model":"default","max_tokens":4,"messages":[{"role":"system","content":"x"}]}`, "invalid_request_error", "user or assistant", 400},
		{`{"model":"default","max_tokens":4,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"maybe"}}`, "invalid_request_error", "tool_choice", 400},
		{`{"model":"default","max_tokens":4,"messages":[{"role":"user","content":5}]}`, "invalid_request_error", "", 400},
	} {
		resp, err := http.Post(ts.URL+"/v1/messages", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if resp.StatusCode != c.code || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != c.typ || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%s: %d %s, want %d %s mentioning %q", c.body, resp.StatusCode, b, c.code, c.typ, c.msg)
		}
	}
}

// TestAnthropicKey: with an API key set, x-api-key (Anthropic's header)
// is accepted as the bearer token is, and a wrong one is refused.
func TestAnthropicKey(t *testing.T) {
	f := newFake(64)
	tok, tmpl := loadTok(t)
	s := New(f, tok, tmpl, Options{APIKey: testKey})
	s.SetReady(true)
	h := s.Handler()
	for _, c := range []struct {
		header, value string
		code          int
	}{
		{"X-Api-Key", testKey, 200},
		{"X-Api-Key", "wrong", 401},
		{"Authorization", "Bearer " + testKey, 200},
		{"", "", 401},
	} {
		req, _ := http.NewRequest(http.MethodPost, "/v1/messages", strings.NewReader(`{"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
		if c.header != "" {
			req.Header.Set(c.header, c.value)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.code {
			t.Errorf("%s %q: %d %s, want %d", c.header, c.value, rec.Code, rec.Body, c.code)
		}
	}
}

// TestAnthropicChatRequest: a Messages request's system, text, thinking,
// tool_use and tool_result blocks, tools and tool_choice become the chat
// completion's messages, tools and tool_choice.
func TestAnthropicChatRequest(t *testing.T) {
	body := `{"model":"m","max_tokens":9,"stop_sequences":["END"],"thinking":{"type":"enabled","budget_tokens":100},
	  "system":[{"type":"text","text":"Be kind."}],
	  "messages":[
	    {"role":"user","content":"What is the weather in Paris?"},
	    {"role":"assistant","content":[{"type":"thinking","thinking":"I should call it.","signature":""},{"type":"text","text":"Let me look."},{"type":"tool_use","id":"toolu_1","name":"weather","input":{"city":"Paris"}}]},
	    {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"sunny"}]},{"type":"text","text":"And tomorrow?"}]}],
	  "tools":[{"name":"weather","description":"the weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
	  "tool_choice":{"type":"tool","name":"weather"}}`
	var r anthropicRequest
	if e := decodeBody([]byte(body), &r); e != nil {
		t.Fatal(e)
	}
	req, e := r.chatRequest()
	if e != nil {
		t.Fatal(e)
	}
	type msg struct {
		Role, Content, Reasoning, CallID string
		Calls                            []string
	}
	var got []msg
	for _, m := range req.Messages {
		g := msg{Role: m.Role, Content: string(m.Content), Reasoning: m.ReasoningContent, CallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			g.Calls = append(g.Calls, c.ID+" "+c.Function.Name+" "+string(c.Function.Arguments))
		}
		got = append(got, g)
	}
	want := []msg{
		{Role: "system", Content: `"Be kind."`},
		{Role: "user", Content: `"What is the weather in Paris?"`},
		{Role: "assistant", Content: `"Let me look."`, Reasoning: "I should call it.", Calls: []string{`toolu_1 weather {"city":"Paris"}`}},
		{Role: "tool", Content: `"sunny"`, CallID: "toolu_1"},
		{Role: "user", Content: `"And tomorrow?"`},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("messages\n%v\nwant\n%v", got, want)
	}
	if string(req.Tools) != `[{"function":{"description":"the weather","name":"weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}},"type":"function"}]` ||
		string(req.ToolChoice) != `{"function":{"name":"weather"},"type":"function"}` || string(req.Stop) != `["END"]` || *req.MaxTokens != 9 ||
		req.ChatTemplateKwargs["enable_thinking"] != true || req.IncludeReasoning == nil || !*req.IncludeReasoning {
		t.Errorf("tools %s, tool_choice %s, stop %s, max_tokens %v, kwargs %v", req.Tools, req.ToolChoice, req.Stop, *req.MaxTokens, req.ChatTemplateKwargs)
	}
	for tc, want := range map[string]string{`{"type":"auto"}`: `"auto"`, `{"type":"any"}`: `"required"`, `{"type":"none"}`: `"none"`} {
		var r anthropicRequest
		if e := decodeBody([]byte(`{"messages":[{"role":"user","content":"x"}],"tool_choice":`+tc+`}`), &r); e != nil {
			t.Fatal(e)
		}
		if req, e := r.chatRequest(); e != nil || string(req.ToolChoice) != want {
			t.Errorf("tool_choice %s: %s (%v), want %s", tc, req.ToolChoice, e, want)
		}
	}
}

// TestAnthropicAndOllamaToolUse: a reply that calls a tool comes back as
// a tool_use block (whole and streamed as input_json_delta) from
// /v1/messages, with stop_reason tool_use, and as message.tool_calls from
// ollama's /api/chat.
func TestAnthropicAndOllamaToolUse(t *testing.T) {
	f := newFake(4096)
	f.reply = "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	url := serveTools(t, f)
	tools := `[{"name":"get_weather","description":"Weather now","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]`
	body := `{"model":"fake-moe","max_tokens":64,"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":` + tools
	resp, raw := post(t, url, "/v1/messages", body+`}`)
	var msg struct {
		Content []struct {
			Type, Text, ID, Name string
			Input                json.RawMessage
		}
		StopReason string `json:"stop_reason"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(raw, &msg) != nil || len(msg.Content) != 2 || msg.Content[0].Text != "I will look." ||
		msg.Content[1].Type != "tool_use" || msg.Content[1].Name != "get_weather" || string(msg.Content[1].Input) != `{"city":"Paris"}` ||
		msg.StopReason != "tool_use" || msg.Content[1].ID == "" {
		t.Fatalf("messages: %d %s", resp.StatusCode, raw)
	}
	client := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	stream := client.Messages.NewStreaming(context.Background(), anthropic.MessageNewParams{Model: "fake-moe", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Weather in Paris?"))},
		Tools: []anthropic.ToolUnionParam{{OfTool: &anthropic.ToolParam{Name: "get_weather",
			InputSchema: anthropic.ToolInputSchemaParam{Properties: map[string]any{"city": map[string]any{"type": "string"}}}}}}})
	var acc anthropic.Message
	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(acc.Content) != 2 || strings.TrimSpace(acc.Content[0].Text) != "I will look." || acc.Content[1].Type != "tool_use" || acc.Content[1].Name != "get_weather" ||
		string(acc.Content[1].Input) != `{"city":"Paris"}` || acc.StopReason != anthropic.StopReasonToolUse {
		t.Errorf("streamed: %+v", acc)
	}

	resp, raw = post(t, url, "/api/chat", `{"model":"fake-moe","stream":false,"messages":[{"role":"user","content":"Weather in Paris?"}],"options":{"num_predict":64},
	  "tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`)
	var o struct {
		Message struct {
			Content   string
			ToolCalls []struct {
				Function struct {
					Name      string
					Arguments json.RawMessage
				}
			} `json:"tool_calls"`
		}
		Done bool
	}
	if resp.StatusCode != 200 || json.Unmarshal(raw, &o) != nil || !o.Done || o.Message.Content != "I will look." || len(o.Message.ToolCalls) != 1 ||
		o.Message.ToolCalls[0].Function.Name != "get_weather" || string(o.Message.ToolCalls[0].Function.Arguments) != `{"city":"Paris"}` {
		t.Errorf("ollama chat: %d %s", resp.StatusCode, raw)
	}
}

// TestAnthropicCountTokens: POST /v1/messages/count_tokens, through
// Anthropic's Go SDK, counts the input tokens /v1/messages then reports
// for the same system prompt and messages, more with tools, and refuses a
// bad request in Anthropic's error shape.
func TestAnthropicCountTokens(t *testing.T) {
	tok, tmpl, be, l, eos := defaultModel(t)
	ts := serveEngine(t, tok, tmpl, be, l, eos)
	client := anthropic.NewClient(option.WithBaseURL(ts.URL), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx := context.Background()
	system := []anthropic.TextBlockParam{{Text: "Answer briefly."}}
	msgs := []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("Who made the light?"))}
	msg, err := client.Messages.New(ctx, anthropic.MessageNewParams{Model: "default", MaxTokens: 2, System: system, Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	count, err := client.Messages.CountTokens(ctx, anthropic.MessageCountTokensParams{Model: "default",
		System: anthropic.MessageCountTokensParamsSystemUnion{OfTextBlockArray: system}, Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	if count.InputTokens != msg.Usage.InputTokens || count.InputTokens == 0 {
		t.Errorf("count_tokens %d, /v1/messages used %d input tokens", count.InputTokens, msg.Usage.InputTokens)
	}
	// Tools: their descriptions go into the prompt (a model whose template
	// writes Hermes tool calls).
	url := serveTools(t, newFake(4096))
	fc := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	counts := map[bool]int64{}
	for _, tools := range []bool{false, true} {
		p := anthropic.MessageCountTokensParams{Model: "fake-moe", Messages: msgs}
		if tools {
			p.Tools = []anthropic.MessageCountTokensToolUnionParam{anthropic.MessageCountTokensToolParamOfTool(
				anthropic.ToolInputSchemaParam{Properties: map[string]any{"book": map[string]any{"type": "string"}}}, "find_verse")}
		}
		n, err := fc.Messages.CountTokens(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		counts[tools] = n.InputTokens
	}
	if counts[true] <= counts[false] || counts[false] == 0 {
		t.Errorf("with a tool: %d input tokens, without %d", counts[true], counts[false])
	}
	resp, err := http.Post(ts.URL+"/v1/messages/count_tokens", "application/json",
		strings.NewReader(`{"model":"default","messages":[{"role":"robot","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 400 || e.Type != "error" ||
		e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, "role") {
		t.Errorf("a bad role: status %d, %+v (%v)", resp.StatusCode, e, err)
	}
}
