package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/mkserve/mkserve/chat"
)

func TestHermesCalls(t *testing.T) {
	for _, c := range []struct {
		name, text, content string
		calls               []string // name + " " + arguments
	}{
		{"one call", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, 2]}}\n</tool_call>", "",
			[]string{`get_weather {"city":"Paris","n":[1,2]}`}},
		{"content and two calls", "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>", "Let me check.",
			[]string{`a {}`, `b {"x":1}`}},
		{"no arguments", `<tool_call>{"name": "now"}</tool_call>`, "", []string{`now {}`}},
		{"plain text", "Just an answer.", "Just an answer.", nil},
		{"unclosed", "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}", "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}", nil},
		{"not JSON", "x <tool_call>\nget_weather(Paris)\n</tool_call>", "x <tool_call>\nget_weather(Paris)\n</tool_call>", nil},
		{"arguments not an object", `<tool_call>{"name": "a", "arguments": [1]}</tool_call>`, `<tool_call>{"name": "a", "arguments": [1]}</tool_call>`, nil},
		{"two values", `<tool_call>{"name": "a"} {"name": "b"}</tool_call>`, `<tool_call>{"name": "a"} {"name": "b"}</tool_call>`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			content, calls := hermesCalls(c.text)
			if content != c.content {
				t.Errorf("content %q, want %q", content, c.content)
			}
			var got []string
			for _, k := range calls {
				got = append(got, k.Function.Name+" "+k.Function.Arguments)
				if !strings.HasPrefix(k.ID, "call_") || k.Type != "function" {
					t.Errorf("call %+v: id or type", k)
				}
			}
			if strings.Join(got, "|") != strings.Join(c.calls, "|") {
				t.Errorf("calls %q, want %q", got, c.calls)
			}
		})
	}
}

// TestToolStream: streamed in random pieces, the content passed on plus
// what finish returns is hermesCalls' content, and no piece of a call
// leaks into the streamed content.
func TestToolStream(t *testing.T) {
	texts := []struct{ format, text string }{
		{ToolFormatHermes, "Sure. <tool_call>\n{\"name\": \"a\", \"arguments\": {\"q\": \"<tool\"}}\n</tool_call> done"},
		{ToolFormatHermes, "plain <tool answer without calls <"},
		{ToolFormatHermes, "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"},
		{ToolFormatHermes, "<tool_call>broken</tool_call> tail"},
		{ToolFormatDeepSeek, "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>a\n```json\n{\"x\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"},
		{ToolFormatDeepSeek, "no calls <｜tool▁ here"},
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, tc := range texts {
		text, f := tc.text, toolFormats[tc.format]
		for range 50 {
			ts := toolStream{ts: &toolSetup{f: f}}
			var streamed strings.Builder
			for k := 0; k < len(text); {
				end := min(k+1+r.IntN(7), len(text))
				streamed.WriteString(ts.push(text[k:end]))
				k = end
			}
			if strings.Contains(streamed.String(), f.open) {
				t.Fatalf("%q: a call leaked into the stream: %q", text, streamed.String())
			}
			rest, calls := ts.finish()
			wantContent, wantCalls := f.parse(text)
			if len(calls) != len(wantCalls) {
				t.Fatalf("%q: %d calls, want %d", text, len(calls), len(wantCalls))
			}
			got := streamed.String() + rest
			if calls != nil && strings.Join(strings.Fields(got), " ") != strings.Join(strings.Fields(wantContent), " ") {
				t.Fatalf("%q: content %q, want %q", text, got, wantContent)
			}
			if calls == nil && got != text {
				t.Fatalf("%q: content %q, want the whole text", text, got)
			}
		}
	}
}

func TestDeepseekCalls(t *testing.T) {
	one := "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"
	two := "<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>"
	for _, c := range []struct {
		name, text, content string
		calls               []string
	}{
		{"one", dsCallsBegin + one + dsCallsEnd, "", []string{`get_weather {"city":"Paris"}`}},
		{"content and two", "Let me see." + dsCallsBegin + one + "\n" + two + dsCallsEnd, "Let me see.", []string{`get_weather {"city":"Paris"}`, `now {}`}},
		{"unclosed", dsCallsBegin + one, dsCallsBegin + one, nil},
		{"bad arguments", dsCallsBegin + strings.Replace(one, `{"city": "Paris"}`, `city=Paris`, 1) + dsCallsEnd, dsCallsBegin + strings.Replace(one, `{"city": "Paris"}`, `city=Paris`, 1) + dsCallsEnd, nil},
		{"plain", "Just text.", "Just text.", nil},
	} {
		content, calls := deepseekCalls(c.text)
		var got []string
		for _, k := range calls {
			got = append(got, k.Function.Name+" "+k.Function.Arguments)
		}
		if content != c.content || strings.Join(got, "|") != strings.Join(c.calls, "|") {
			t.Errorf("%s: content %q calls %q, want %q %q", c.name, content, got, c.content, c.calls)
		}
	}
}

// FuzzToolCalls: either format's parser, on any text, keeps the whole text
// as content when it finds no calls, and gives calls with a name and
// JSON-object arguments.
func FuzzToolCalls(f *testing.F) {
	f.Add("a <tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call> b", false)
	f.Add("<tool_call>", false)
	f.Add(dsCallsBegin+dsCallBegin+"function"+dsSep+"x\n```json\n{}\n```"+dsCallEnd+dsCallsEnd, true)
	f.Fuzz(func(t *testing.T, text string, deepseek bool) {
		parse := hermesCalls
		if deepseek {
			parse = deepseekCalls
		}
		content, calls := parse(text)
		if calls == nil && content != text {
			t.Fatalf("no calls, but content %q is not the text", content)
		}
		for _, c := range calls {
			if !json.Valid([]byte(c.Function.Arguments)) || !strings.HasPrefix(c.Function.Arguments, "{") || c.Function.Name == "" {
				t.Fatalf("call %+v", c)
			}
		}
	})
}

// serveTools serves f with the test tokenizer, a Qwen-style chat template
// that teaches <tool_call> (chat/testdata) and ToolFormat set from it.
func serveTools(t *testing.T, f *fakeGen) string {
	t.Helper()
	return serveTemplate(t, f, "qwen3.jinja")
}

// serveTemplate serves f with the test tokenizer and chat/testdata's
// template name, its tool format detected.
func serveTemplate(t *testing.T, f *fakeGen, name string) string {
	t.Helper()
	tok, _ := loadTok(t)
	src, err := os.ReadFile(filepath.Join("..", "..", "chat", "testdata", "templates", name))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Compile(string(src))
	if err != nil {
		t.Fatal(err)
	}
	s := New(f, tok, tmpl, Options{ToolFormat: DetectToolFormat(string(src)), Reasoning: DetectReasoning(string(src))})
	s.SetReady(true)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		f.running.Wait()
	})
	return ts.URL
}

const weatherTools = `[{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
	"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
	{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]`

func TestChatTools(t *testing.T) {
	f := newFake(4096)
	f.reply = "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	url := serveTools(t, f)
	body := `{"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 64, "tools": ` + weatherTools + `}`
	resp, raw := post(t, url, "/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Type     string `json:"type"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatal(err)
	}
	ch := out.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.Content == nil || *ch.Message.Content != "I will look." {
		t.Fatalf("response %s", raw)
	}
	call := ch.Message.ToolCalls[0]
	if call.Function.Name != "get_weather" || call.Function.Arguments != `{"city":"Paris"}` || call.Type != "function" || !strings.HasPrefix(call.ID, "call_") {
		t.Fatalf("call %+v", call)
	}
	// The tools reached the prompt (rendered by the template).
	reqs := f.requests()
	tok, _ := loadTok(t)
	prompt, err := tok.Decode(reqs[len(reqs)-1].Prompt, false)
	if err != nil || !strings.Contains(prompt, "get_weather") || !strings.Contains(prompt, "<tools>") {
		t.Fatalf("prompt %q (%v) does not show the tools", prompt, err)
	}
	if reqs[len(reqs)-1].Sampling.Grammar != nil {
		t.Error("tool_choice auto forced a call")
	}
	if !reqs[len(reqs)-1].Sampling.KeepSpecialTokens {
		t.Error("with tools the text drops special tokens (call markers may be special)")
	}
	// Two calls, then parallel_tool_calls false keeps the first only.
	f.reply = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}</tool_call>"
	for _, c := range []struct {
		extra string
		n     int
	}{{"", 2}, {`, "parallel_tool_calls": false`, 1}} {
		resp, raw := post(t, url, "/v1/chat/completions", strings.Replace(body, `"max_tokens": 64`, `"max_tokens": 64`+c.extra, 1))
		var two struct {
			Choices []struct {
				Message struct {
					ToolCalls []json.RawMessage `json:"tool_calls"`
				}
			}
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &two) != nil || len(two.Choices[0].Message.ToolCalls) != c.n {
			t.Errorf("%q: %d %s, want %d calls", c.extra, resp.StatusCode, raw, c.n)
		}
	}
	f.reply = "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"

	// Streaming: the content, then one tool_calls delta, then finish tool_calls.
	resp, raw = post(t, url, "/v1/chat/completions", strings.Replace(body, `"max_tokens": 64`, `"max_tokens": 64, "stream": true`, 1))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d %s", resp.StatusCode, raw)
	}
	var content strings.Builder
	var calls []string
	finish := ""
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Delta struct {
					Content   *string `json:"content"`
					ToolCalls []struct {
						Index    *int `json:"index"`
						ID       string
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &chunk); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		for _, c := range chunk.Choices {
			if c.Delta.Content != nil {
				content.WriteString(*c.Delta.Content)
			}
			for _, tc := range c.Delta.ToolCalls {
				if tc.Index == nil || tc.ID == "" {
					t.Errorf("tool call delta without index or id: %s", line)
				}
				calls = append(calls, tc.Function.Name+" "+tc.Function.Arguments)
			}
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	if strings.TrimSpace(content.String()) != "I will look." || strings.Join(calls, "|") != `get_weather {"city":"Paris"}` || finish != "tool_calls" {
		t.Fatalf("stream: content %q, calls %q, finish %q\n%s", content.String(), calls, finish, raw)
	}
}

func TestChatToolChoice(t *testing.T) {
	f := newFake(4096)
	url := serveTools(t, f)
	msgs := `"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 64, "tools": ` + weatherTools
	// Named: the engine gets a grammar that takes exactly a call of it.
	if resp, raw := post(t, url, "/v1/chat/completions", `{`+msgs+`, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs := f.requests()
	g := reqs[len(reqs)-1].Sampling.Grammar
	if g == nil {
		t.Fatal("a named tool_choice set no grammar")
	}
	good := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	if v := g(); !v.Advance([]byte(good)) || !v.Complete() {
		t.Errorf("the grammar refuses %q", good)
	}
	for _, bad := range []string{"Sure", "<tool_call>\n{\"name\": \"get_time\"", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}"} {
		if g().Advance([]byte(bad)) {
			t.Errorf("the grammar takes %q", bad)
		}
	}
	// Required with two tools: a call of either, its arguments held to that
	// tool's own parameters (a union of the calls' objects).
	if resp, raw := post(t, url, "/v1/chat/completions", `{`+msgs+`, "tool_choice": "required"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs = f.requests()
	g = reqs[len(reqs)-1].Sampling.Grammar
	if g == nil {
		t.Fatal("tool_choice required: no grammar")
	}
	for _, ok := range []string{"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>", good} {
		if v := g(); !v.Advance([]byte(ok)) || !v.Complete() {
			t.Errorf("tool_choice required refuses %q", ok)
		}
	}
	for _, bad := range []string{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}", "<tool_call>\n{\"name\": \"get_date\"",
		"<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\""} {
		if g().Advance([]byte(bad)) {
			t.Errorf("tool_choice required takes %q", bad)
		}
	}
	// none: the tools stay out of the prompt and nothing is forced.
	if resp, raw := post(t, url, "/v1/chat/completions", `{`+msgs+`, "tool_choice": "none"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs = f.requests()
	tok, _ := loadTok(t)
	if p, _ := tok.Decode(reqs[len(reqs)-1].Prompt, false); strings.Contains(p, "get_weather") || reqs[len(reqs)-1].Sampling.Grammar != nil {
		t.Errorf("tool_choice none: prompt %q, grammar %v", p, reqs[len(reqs)-1].Sampling.Grammar != nil)
	}
	// Refused.
	for _, c := range []struct{ body, param string }{
		{`{` + msgs + `, "tool_choice": {"type": "function", "function": {"name": "nope"}}}`, "tool_choice"},
		{`{` + msgs + `, "tool_choice": "sometimes"}`, "tool_choice"},
		{`{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}`, "tool_choice"},
		{`{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "bad name"}}]}`, "tools"},
		{`{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]}`, "tools"},
		{`{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}`, "tools"},
		{`{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {"p": {"type": "string", "pattern": "(http"}}}}}], "tool_choice": "required"}`, "tools"},
		{`{` + msgs + `, "tool_choice": "required", "response_format": {"type": "json_object"}}`, "tool_choice"},
	} {
		resp, raw := post(t, url, "/v1/chat/completions", c.body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), `"param":"`+c.param+`"`) {
			t.Errorf("%s: %d %s, want 400 naming %s", c.body, resp.StatusCode, raw, c.param)
		}
	}
	// A template without a tool-call format: tools are refused (none is fine).
	_, plain := serve(t, f, Options{})
	if resp, raw := post(t, plain, "/v1/chat/completions", `{`+msgs+`}`); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "tool-call format") {
		t.Errorf("tools without a format: %d %s", resp.StatusCode, raw)
	}
}

// TestChatToolsSDK: the official OpenAI Go SDK reads the calls, streamed
// (its accumulator) and not.
func TestChatToolsSDK(t *testing.T) {
	f := newFake(4096)
	f.reply = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>"
	url := serveTools(t, f)
	params := openai.ChatCompletionNewParams{
		Model:     "fake-moe",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Weather in Oslo?")},
		MaxTokens: openai.Int(64),
		Tools: []openai.ChatCompletionToolUnionParam{openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: "get_weather", Description: openai.String("Weather now"),
			Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}},
				"required": []string{"city"}},
		})},
	}
	resp, err := sdk(url, "").Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	m := resp.Choices[0].Message
	if resp.Choices[0].FinishReason != "tool_calls" || len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "get_weather" ||
		m.ToolCalls[0].Function.Arguments != `{"city":"Oslo"}` || m.Content != "" {
		t.Fatalf("message %+v, finish %q", m, resp.Choices[0].FinishReason)
	}
	stream := sdk(url, "").Chat.Completions.NewStreaming(context.Background(), params)
	acc := openai.ChatCompletionAccumulator{}
	finished := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished++
			if tc.Name != "get_weather" || tc.Arguments != `{"city":"Oslo"}` {
				t.Errorf("streamed call %+v", tc)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if got := acc.Choices[0].Message.ToolCalls; len(got) != 1 || got[0].Function.Arguments != `{"city":"Oslo"}` || finished != 1 {
		t.Fatalf("accumulated calls %+v (%d finished)", got, finished)
	}
}

// TestChatToolsDeepSeek: DeepSeek-V3's format, parsed and forced.
func TestChatToolsDeepSeek(t *testing.T) {
	f := newFake(4096)
	f.reply = "On it." + dsCallsBegin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Lima\"}\n```<｜tool▁call▁end｜>" + dsCallsEnd
	url := serveTemplate(t, f, "deepseek3.jinja")
	body := `{"messages": [{"role": "user", "content": "Weather in Lima?"}], "max_tokens": 64, "tools": ` + weatherTools + `}`
	resp, raw := post(t, url, "/v1/chat/completions", body)
	var out struct {
		Choices []struct {
			Message struct {
				Content   *string
				ToolCalls []struct {
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			FinishReason string `json:"finish_reason"`
		}
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Choices) != 1 {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	ch := out.Choices[0]
	if ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Arguments != `{"city":"Lima"}` ||
		ch.Message.Content == nil || *ch.Message.Content != "On it." {
		t.Fatalf("response %s", raw)
	}
	// Named: the grammar is the call's fixed text around the parameters.
	if resp, raw := post(t, url, "/v1/chat/completions", strings.Replace(body, `"max_tokens": 64`, `"max_tokens": 64, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}`, 1)); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs := f.requests()
	g := reqs[len(reqs)-1].Sampling.Grammar
	call := dsCallsBegin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Lima\"}\n```<｜tool▁call▁end｜>" + dsCallsEnd
	if g == nil {
		t.Fatal("no grammar for a named tool_choice")
	}
	if v := g(); !v.Advance([]byte(call)) || !v.Complete() {
		t.Errorf("the grammar refuses %q", call)
	}
	if _, calls := deepseekCalls(call); len(calls) != 1 {
		t.Errorf("the forced shape does not parse back: %q", call)
	}
	// required with several tools: a call of either function, each held
	// to its own parameters.
	if resp, raw := post(t, url, "/v1/chat/completions", strings.Replace(body, `"max_tokens": 64`, `"max_tokens": 64, "tool_choice": "required"`, 1)); resp.StatusCode != http.StatusOK {
		t.Fatalf("required with two tools: %d %s", resp.StatusCode, raw)
	}
	reqs = f.requests()
	g = reqs[len(reqs)-1].Sampling.Grammar
	timeCall := dsCallsBegin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>" + dsCallsEnd
	for _, good := range []string{call, timeCall} {
		if v := g(); !v.Advance([]byte(good)) || !v.Complete() {
			t.Errorf("required: the grammar refuses %q", good)
		}
	}
	for _, bad := range []string{dsCallsBegin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{\"city\"", dsCallsBegin + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_date", "Sure"} {
		if g().Advance([]byte(bad)) {
			t.Errorf("required: the grammar takes %q", bad)
		}
	}
}
