package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

// respEvents reads a Responses stream: each event's type line and data.
func respEvents(t *testing.T, raw []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	typ := ""
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			typ = v
			continue
		}
		v, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(v), &m); err != nil {
			t.Fatalf("event data %s: %v", v, err)
		}
		if m["type"] != typ {
			t.Fatalf("event line %q, data type %v", typ, m["type"])
		}
		out = append(out, m)
	}
	return out
}

// TestResponsesSDK: the official OpenAI Go SDK's Responses client, whole
// and streamed, on a template that reasons in <think>: a reasoning item
// then the message, instructions rendered as the system turn, usage with
// reasoning tokens; the stream's events numbered in order, from created to
// completed, their deltas adding up to the final items.
func TestResponsesSDK(t *testing.T) {
	f := newFake(4096)
	f.reply = "<think>Let me see.</think>The answer is 4."
	url := serveTemplate(t, f, "qwen3.jinja")
	cl := sdk(url, "")
	params := responses.ResponseNewParams{
		Model:           "fake-moe",
		Instructions:    openai.String("Answer briefly."),
		Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("What is 2+2?")},
		MaxOutputTokens: openai.Int(64),
	}
	resp, err := cl.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	if resp.OutputText() != "The answer is 4." || resp.Status != "completed" || !strings.HasPrefix(resp.ID, "resp_") || len(resp.Output) != 2 {
		t.Fatalf("response %s", resp.RawJSON())
	}
	if r := resp.Output[0]; r.Type != "reasoning" || len(r.Content) != 1 || r.Content[0].Text != "Let me see." {
		t.Errorf("reasoning item %s", r.RawJSON())
	}
	if m := resp.Output[1]; m.Type != "message" || m.Role != "assistant" || m.Status != "completed" {
		t.Errorf("message item %s", m.RawJSON())
	}
	events := (len(f.reply) + 4) / 5
	u := resp.Usage
	if u.InputTokens < 5 || u.OutputTokens != int64(events) || u.TotalTokens != u.InputTokens+u.OutputTokens ||
		u.OutputTokensDetails.ReasoningTokens < 2 || u.OutputTokensDetails.ReasoningTokens >= int64(events) {
		t.Errorf("usage %s", u.RawJSON())
	}
	reqs := f.requests()
	prompt, _ := testTok.Decode(reqs[len(reqs)-1].Prompt, false)
	if !strings.Contains(prompt, "<|im_start|>system\nAnswer briefly.") || !strings.Contains(prompt, "What is 2+2?") {
		t.Errorf("rendered prompt %q", prompt)
	}

	stream := cl.Responses.NewStreaming(context.Background(), params)
	var types []string
	var text, reasoning strings.Builder
	var final responses.Response
	seq := int64(-1)
	for stream.Next() {
		ev := stream.Current()
		if ev.SequenceNumber != seq+1 {
			t.Fatalf("event %s: sequence %d after %d", ev.Type, ev.SequenceNumber, seq)
		}
		seq = ev.SequenceNumber
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text.WriteString(ev.Delta)
		case "response.reasoning_text.delta":
			reasoning.WriteString(ev.Delta)
		case "response.completed":
			final = ev.Response
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if len(types) < 6 || types[0] != "response.created" || types[1] != "response.in_progress" || types[len(types)-1] != "response.completed" {
		t.Fatalf("event types %v", types)
	}
	if text.String() != "The answer is 4." || reasoning.String() != "Let me see." || final.OutputText() != text.String() ||
		len(final.Output) != 2 || final.Usage.OutputTokens != int64(events) {
		t.Errorf("streamed text %q reasoning %q, final %s", text.String(), reasoning.String(), final.RawJSON())
	}
	want := []string{"response.output_item.added", "response.content_part.added", "response.reasoning_text.delta"}
	if strings.Join(types[2:5], " ") != strings.Join(want, " ") {
		t.Errorf("events after in_progress: %v, want %v", types[2:5], want)
	}
}

// respWeatherTools are weatherTools in the Responses API's flat shape.
const respWeatherTools = `[{"type": "function", "name": "get_weather", "description": "Weather now",
	"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
	{"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}]`

// TestResponsesTools: function tools are rendered by the template, a call
// in the reply comes back as a function_call item after the message
// (whole and streamed), a named tool_choice constrains the output, and a
// second turn's function_call and function_call_output items render as
// the template's call and tool response.
func TestResponsesTools(t *testing.T) {
	f := newFake(4096)
	f.reply = "I will look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	url := serveTools(t, f)
	body := `{"input": "Weather in Paris?", "max_output_tokens": 64, "tools": ` + respWeatherTools
	resp, raw := post(t, url, "/v1/responses", body+`}`)
	var r struct {
		Status string
		Output []struct {
			Type, Name, Arguments, Status string
			CallID                        string `json:"call_id"`
			Content                       []struct{ Text string }
		}
		Tools []json.RawMessage
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &r) != nil || len(r.Output) != 2 || len(r.Tools) != 2 {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	if m := r.Output[0]; m.Type != "message" || len(m.Content) != 1 || strings.TrimSpace(m.Content[0].Text) != "I will look." {
		t.Errorf("message %s", raw)
	}
	if c := r.Output[1]; c.Type != "function_call" || c.Name != "get_weather" || c.Arguments != `{"city":"Paris"}` ||
		!strings.HasPrefix(c.CallID, "call_") || c.Status != "completed" {
		t.Errorf("call %s", raw)
	}
	reqs := f.requests()
	if prompt, _ := testTok.Decode(reqs[len(reqs)-1].Prompt, false); !strings.Contains(prompt, `"name": "get_weather"`) {
		t.Errorf("tools not rendered: %q", prompt)
	}
	// Streamed: the call's arguments in function_call_arguments events.
	resp, raw = post(t, url, "/v1/responses", body+`, "stream": true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	evs := respEvents(t, raw)
	var args string
	for _, ev := range evs {
		if ev["type"] == "response.function_call_arguments.done" {
			args, _ = ev["arguments"].(string)
		}
	}
	if args != `{"city":"Paris"}` || evs[len(evs)-1]["type"] != "response.completed" {
		t.Errorf("streamed call arguments %q, last event %v", args, evs[len(evs)-1]["type"])
	}
	// Named tool_choice: a grammar of one call.
	if resp, raw := post(t, url, "/v1/responses", body+`, "tool_choice": {"type": "function", "name": "get_weather"}}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs = f.requests()
	if g := reqs[len(reqs)-1].Sampling.Grammar; g == nil || !g().Advance([]byte("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}")) {
		t.Error("a named tool_choice did not constrain the output to its call")
	}
	// The next turn: the call and its output as input items.
	turn := `{"max_output_tokens": 8, "tools": ` + respWeatherTools + `, "input": [
		{"role": "user", "content": "Weather in Paris?"},
		{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
		{"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}]}`
	if resp, raw := post(t, url, "/v1/responses", turn); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs = f.requests()
	prompt, _ := testTok.Decode(reqs[len(reqs)-1].Prompt, false)
	if !strings.Contains(prompt, "<tool_call>") || !strings.Contains(prompt, "get_weather") || !strings.Contains(prompt, "<tool_response>\nSunny, 21 C") {
		t.Errorf("second turn rendered as %q", prompt)
	}
}

// TestResponsesIncomplete: an output cut by max_output_tokens is
// "incomplete" with its reason, the text the engine produced; include asks
// for log-probabilities, one a token, top alternatives as asked; the
// stream ends with response.incomplete.
func TestResponsesIncomplete(t *testing.T) {
	f := newFake(4096)
	_, url := serve(t, f, Options{})
	body := `{"input": "a b c", "max_output_tokens": 3, "include": ["message.output_text.logprobs"], "top_logprobs": 2`
	resp, raw := post(t, url, "/v1/responses", body+`}`)
	var r struct {
		Status            string
		IncompleteDetails *struct{ Reason string } `json:"incomplete_details"`
		Output            []struct {
			Status  string
			Content []struct {
				Text     string
				Logprobs []struct {
					Token       string
					TopLogprobs []json.RawMessage `json:"top_logprobs"`
				}
			}
		}
		Usage struct {
			OutputTokens int `json:"output_tokens"`
		}
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &r) != nil || len(r.Output) != 1 || len(r.Output[0].Content) != 1 {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs := f.requests()
	last := reqs[len(reqs)-1]
	want, _, _ := expect(last.Prompt, 0, last.Sampling)
	c := r.Output[0].Content[0]
	if r.Status != "incomplete" || r.IncompleteDetails == nil || r.IncompleteDetails.Reason != "max_output_tokens" ||
		r.Output[0].Status != "incomplete" || c.Text != want || r.Usage.OutputTokens != 3 {
		t.Errorf("response %s (want text %q)", raw, want)
	}
	if len(c.Logprobs) != 3 || len(c.Logprobs[0].TopLogprobs) != 2 {
		t.Errorf("logprobs %s", raw)
	}
	resp, raw = post(t, url, "/v1/responses", body+`, "stream": true}`)
	evs := respEvents(t, raw)
	if resp.StatusCode != http.StatusOK || evs[len(evs)-1]["type"] != "response.incomplete" {
		t.Errorf("stream %d %s", resp.StatusCode, raw)
	}
}

// TestResponsesTextFormat: text.format json_schema reaches the engine as
// a grammar of the schema; json_object as a JSON grammar; and it is echoed.
func TestResponsesTextFormat(t *testing.T) {
	f := newFake(4096)
	_, url := serve(t, f, Options{})
	for _, c := range []struct{ format, good, bad string }{
		{`{"type": "json_schema", "name": "p", "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}`, `{"n": 1}`, `{"m": 1}`},
		{`{"type": "json_object"}`, `{"m": 1}`, `[1]`},
	} {
		resp, raw := post(t, url, "/v1/responses", `{"input": "x", "max_output_tokens": 4, "text": {"format": `+c.format+`}}`)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"text":{"format":`) {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		reqs := f.requests()
		g := reqs[len(reqs)-1].Sampling.Grammar
		if g == nil {
			t.Fatalf("%s: no grammar", c.format)
		}
		if v := g(); !v.Advance([]byte(c.good)) || !v.Complete() || g().Advance([]byte(c.bad)) {
			t.Errorf("%s: the grammar takes %q: false, or %q: true", c.format, c.good, c.bad)
		}
	}
}

// TestResponsesErrors: what the server cannot do, or a malformed request,
// is a 400 naming the Responses API's parameter.
func TestResponsesErrors(t *testing.T) {
	f := newFake(64)
	_, url := serve(t, f, Options{})
	for _, c := range []struct{ body, param, text string }{
		{`{}`, "input", "required"},
		{`{"input": []}`, "input", "empty"},
		{`{"input": 5}`, "input", "string or a list"},
		{`{"input": [{"type": "input_image", "image_url": "x"}]}`, "input", `"input_image" is not supported`},
		{`{"input": [{"role": "tool", "content": "x"}]}`, "input", "role"},
		{`{"input": [{"role": "user", "content": [{"type": "input_image"}]}]}`, "input", "input_image"},
		{`{"input": [{"type": "function_call", "name": "f"}]}`, "input", "call_id"},
		{`{"input": "x", "previous_response_id": "resp_1"}`, "previous_response_id", "no stored response resp_1"},
		{`{"input": "x", "background": true}`, "background", ""},
		{`{"input": "x", "truncation": "auto"}`, "truncation", ""},
		{`{"input": "x", "n": 2}`, "n", ""},
		{`{"input": "x", "max_tokens": 2}`, "max_output_tokens", ""},
		{`{"input": "x", "max_output_tokens": 0}`, "max_output_tokens", ""},
		{`{"input": "x", "max_output_tokens": 100}`, "max_output_tokens", "max_output_tokens"},
		{`{"input": "x", "response_format": {"type": "json_object"}}`, "text.format", ""},
		{`{"input": "x", "text": {"format": {"type": "xml"}}}`, "text.format", ""},
		{`{"input": "x", "tools": [{"type": "web_search"}]}`, "tools", "only function tools"},
		{`{"input": "x", "tool_choice": {"type": "file_search"}}`, "tool_choice", ""},
		{`{"input": "x", "reasoning": {"effort": "extreme"}}`, "reasoning.effort", ""},
		{`{"input": "x", "top_logprobs": 30}`, "top_logprobs", ""},
		{`{"input": "x", "temperature": 3}`, "temperature", ""},
		{`{"input": "` + strings.Repeat("word ", 80) + `"}`, "input", ""},
	} {
		resp, raw := post(t, url, "/v1/responses", c.body)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d %s", c.body, resp.StatusCode, raw)
			continue
		}
		e := checkError(t, raw)
		if e.Error.Param == nil || *e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.text) {
			t.Errorf("%.60s: param %v message %q, want %q containing %q", c.body, e.Error.Param, e.Error.Message, c.param, c.text)
		}
	}
}

// TestResponsesStore: finished responses are kept (GET returns them as
// sent, streamed ones too); previous_response_id continues a kept
// conversation — its input and output rendered before the new input, its
// instructions not — ; store false keeps nothing; DELETE drops one; past
// the limit the least recently used goes.
func TestResponsesStore(t *testing.T) {
	f := newFake(4096)
	f.reply = "Paris is sunny."
	_, url := serve(t, f, Options{ResponsesStore: 2})
	get := func(id string) (int, string) {
		resp, err := http.Get(url + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp.StatusCode, b.String()
	}
	idOf := func(raw []byte) string {
		var r struct {
			ID    string
			Store bool
		}
		if json.Unmarshal(raw, &r) != nil || !strings.HasPrefix(r.ID, "resp_") {
			t.Fatalf("response %s", raw)
		}
		return r.ID
	}
	_, raw := post(t, url, "/v1/responses", `{"instructions": "Be terse.", "input": "Weather in Paris?", "max_output_tokens": 16}`)
	first := idOf(raw)
	if code, body := get(first); code != http.StatusOK || body != string(raw) || !strings.Contains(body, `"store":true`) {
		t.Fatalf("GET %s: %d %s", first, code, body)
	}
	// The next turn sees the first's input and output, not its instructions.
	resp, raw := post(t, url, "/v1/responses", `{"previous_response_id": "`+first+`", "input": "And tomorrow?", "max_output_tokens": 16, "stream": true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	evs := respEvents(t, raw)
	done, _ := evs[len(evs)-1]["response"].(map[string]any)
	second, _ := done["id"].(string)
	if done["previous_response_id"] != first || done["store"] != true {
		t.Errorf("second response %v", done)
	}
	reqs := f.requests()
	prompt, _ := testTok.Decode(reqs[len(reqs)-1].Prompt, false)
	i, j, k := strings.Index(prompt, "Weather in Paris?"), strings.Index(prompt, "Paris is sunny."), strings.Index(prompt, "And tomorrow?")
	if i < 0 || j < i || k < j || strings.Contains(prompt, "Be terse.") {
		t.Errorf("continued prompt %q", prompt)
	}
	if code, _ := get(second); code != http.StatusOK {
		t.Errorf("the streamed response was not kept: %d", code)
	}
	// A third turn from the second: the whole chain.
	_, raw = post(t, url, "/v1/responses", `{"previous_response_id": "`+second+`", "input": "Thanks.", "max_output_tokens": 4}`)
	third := idOf(raw)
	reqs = f.requests()
	prompt, _ = testTok.Decode(reqs[len(reqs)-1].Prompt, false)
	if strings.Count(prompt, "Paris is sunny.") != 2 || !strings.Contains(prompt, "Weather in Paris?") {
		t.Errorf("third prompt %q", prompt)
	}
	// The limit is 2: the first is gone, and continuing it is a 400.
	if code, body := get(first); code != http.StatusNotFound || !strings.Contains(body, "no stored response") {
		t.Errorf("GET evicted: %d %s", code, body)
	}
	if resp, raw := post(t, url, "/v1/responses", `{"previous_response_id": "`+first+`", "input": "x"}`); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(string(raw), "previous_response_not_found") {
		t.Errorf("continuing an evicted response: %d %s", resp.StatusCode, raw)
	}
	// store false keeps nothing; DELETE drops.
	_, raw = post(t, url, "/v1/responses", `{"input": "x", "max_output_tokens": 2, "store": false}`)
	if code, _ := get(idOf(raw)); code != http.StatusNotFound || strings.Contains(string(raw), `"store":true`) {
		t.Errorf("store false: kept (%d) %s", code, raw)
	}
	req, _ := http.NewRequest(http.MethodDelete, url+"/v1/responses/"+third, nil)
	dr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	dr.Body.Close()
	if code, _ := get(third); dr.StatusCode != http.StatusOK || code != http.StatusNotFound {
		t.Errorf("DELETE: %d, then GET %d", dr.StatusCode, code)
	}
}

// TestResponsesHarmony: gpt-oss's harmony channels through the Responses
// API — analysis as a reasoning item, a message to functions.NAME as a
// function_call item, final as the message — whole and streamed alike;
// and a second turn's items render back into harmony.
func TestResponsesHarmony(t *testing.T) {
	f := newFake(4096)
	f.reply = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>"
	url := serveTemplate(t, f, "gptoss.jinja")
	body := `{"input": "Weather in Paris?", "max_output_tokens": 64, "reasoning": {"effort": "low"}, "tools": ` + respWeatherTools
	type item struct {
		Type, Name, Arguments string
		CallID                string `json:"call_id"`
		Content               []struct{ Text string }
	}
	var whole []item
	for _, stream := range []bool{false, true} {
		b := body + `}`
		if stream {
			b = body + `, "stream": true}`
		}
		resp, raw := post(t, url, "/v1/responses", b)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		if stream {
			evs := respEvents(t, raw)
			raw, _ = json.Marshal(evs[len(evs)-1]["response"])
		}
		var r struct{ Output []item }
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Output) != 2 || r.Output[0].Type != "reasoning" || r.Output[0].Content[0].Text != "Need weather." ||
			r.Output[1].Type != "function_call" || r.Output[1].Name != "get_weather" || r.Output[1].Arguments != `{"city":"Paris"}` {
			t.Fatalf("stream %v: output %s", stream, raw)
		}
		if !stream {
			whole = r.Output
		} else if r.Output[1].Arguments != whole[1].Arguments || r.Output[0].Content[0].Text != whole[0].Content[0].Text {
			t.Errorf("streamed output differs from whole: %+v against %+v", r.Output, whole)
		}
	}
	reqs := f.requests()
	prompt, _ := testTok.Decode(reqs[len(reqs)-1].Prompt, true)
	if !strings.Contains(prompt, "Reasoning: low") || !strings.Contains(prompt, "get_weather") {
		t.Errorf("rendered prompt %q", prompt)
	}
	turn := `{"max_output_tokens": 8, "tools": ` + respWeatherTools + `, "input": [
		{"role": "user", "content": "Weather in Paris?"},
		{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Need weather."}]},
		{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
		{"type": "function_call_output", "call_id": "call_1", "output": "Sunny"}]}`
	if resp, raw := post(t, url, "/v1/responses", turn); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs = f.requests()
	prompt, _ = testTok.Decode(reqs[len(reqs)-1].Prompt, true)
	if !strings.Contains(prompt, "to=functions.get_weather") || !strings.Contains(prompt, "Sunny") {
		t.Errorf("second turn rendered as %q", prompt)
	}
}

// TestRespOutInterleaved: reasoning that resumes after the answer began
// opens a second reasoning item; every delta and done event names the
// output index of its own item, and the items hold their own text.
func TestRespOutInterleaved(t *testing.T) {
	type ev struct {
		typ string
		idx int
	}
	var evs []ev
	o := &respOut{emit: func(typ string, f map[string]any) error {
		if i, ok := f["output_index"].(int); ok {
			evs = append(evs, ev{typ, i})
		}
		return nil
	}}
	for _, step := range []struct{ reasoning, text string }{{"a", ""}, {"", "x"}, {"b", ""}, {"", "y"}} {
		if err := o.add(step.reasoning, step.text, nil, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := o.finish(nil, "completed", false); err != nil {
		t.Fatal(err)
	}
	if len(o.items) != 3 {
		t.Fatalf("%d items", len(o.items))
	}
	r1, m, r2 := o.items[0].(*respReasoningJS), o.items[1].(*respMessageJS), o.items[2].(*respReasoningJS)
	if r1.Content[0].Text != "a" || m.Content[0].Text != "xy" || r2.Content[0].Text != "b" {
		t.Errorf("items: %q %q %q", r1.Content[0].Text, m.Content[0].Text, r2.Content[0].Text)
	}
	for _, e := range evs {
		want := 1
		switch {
		case strings.Contains(e.typ, "reasoning") && e.idx != 2:
			want = 0
		case strings.Contains(e.typ, "reasoning"):
			want = 2
		case strings.Contains(e.typ, "output_item") || strings.Contains(e.typ, "content_part"):
			want = e.idx // (both kinds: checked through the others)
		}
		if e.idx != want {
			t.Errorf("%s at output_index %d, want %d", e.typ, e.idx, want)
		}
	}
}

// TestStoredChain: a conversation is its turns' items in order, and each
// turn counts the whole conversation against the store's byte limit.
func TestStoredChain(t *testing.T) {
	item := func(s string) respInputItem { b, _ := json.Marshal(s); return respInputItem{Role: "user", Content: b} }
	a := newStored([]byte("{}"), nil, []respInputItem{item("one")}, []respInputItem{item("two")})
	b := newStored([]byte("{}"), a, []respInputItem{item("three")}, nil)
	c := newStored([]byte("{}"), b, []respInputItem{item("four")}, []respInputItem{item("five")})
	var got []string
	for _, it := range c.history() {
		var s string
		_ = json.Unmarshal(it.Content, &s)
		got = append(got, s)
	}
	if strings.Join(got, " ") != "one two three four five" || !(a.size < b.size && b.size < c.size) {
		t.Errorf("history %v, sizes %d %d %d", got, a.size, b.size, c.size)
	}
	st := newRespStore(10)
	st.Add("a", a)
	st.Add("b", b)
	st.Add("c", c)
	if st.Bytes() != a.size+b.size+c.size {
		t.Errorf("store counts %d bytes", st.Bytes())
	}
}

// TestResponsesInputItems: the official SDK lists a stored response's
// input — the conversation before it and its own input, not its output —
// newest first by default, oldest first with order asc, a page at a time.
func TestResponsesInputItems(t *testing.T) {
	f := newFake(4096)
	f.reply = "Sunny."
	_, url := serve(t, f, Options{ResponsesStore: 8})
	cl := sdk(url, "")
	ctx := context.Background()
	first, err := cl.Responses.New(ctx, responses.ResponseNewParams{Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather?")},
		MaxOutputTokens: openai.Int(8)})
	if err != nil {
		t.Fatal(err)
	}
	second, err := cl.Responses.New(ctx, responses.ResponseNewParams{Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Tomorrow?")},
		PreviousResponseID: openai.String(first.ID), MaxOutputTokens: openai.Int(8)})
	if err != nil {
		t.Fatal(err)
	}
	page, err := cl.Responses.InputItems.List(ctx, second.ID, responses.InputItemListParams{})
	if err != nil {
		t.Fatal(err)
	}
	textOf := func(it responses.ResponseItemUnion) string {
		var m struct{ Content []struct{ Text string } }
		if json.Unmarshal([]byte(it.RawJSON()), &m) != nil || len(m.Content) != 1 {
			return "?"
		}
		return m.Content[0].Text
	}
	var got []string
	for _, it := range page.Data {
		got = append(got, it.Type+":"+it.Role+":"+textOf(it))
	}
	want := "message:user:Tomorrow? message:assistant:Sunny. message:user:Weather?"
	if strings.Join(got, " ") != want || page.Data[1].ID != first.Output[0].ID || page.HasMore {
		t.Errorf("items %v (ids %s / %s), want %s", got, page.Data[1].ID, first.Output[0].ID, want)
	}
	asc, err := cl.Responses.InputItems.List(ctx, second.ID, responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc,
		Limit: openai.Int(2)})
	if err != nil || len(asc.Data) != 2 || textOf(asc.Data[0]) != "Weather?" || !asc.HasMore {
		t.Fatalf("asc, limit 2: %+v %v", asc, err)
	}
	next, err := cl.Responses.InputItems.List(ctx, second.ID, responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc,
		After: openai.String(asc.Data[1].ID)})
	if err != nil || len(next.Data) != 1 || textOf(next.Data[0]) != "Tomorrow?" {
		t.Errorf("after %s: %+v %v", asc.Data[1].ID, next, err)
	}
	if resp, raw := post(t, url, "/v1/responses", `{"input": "x", "max_output_tokens": 2}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	for _, q := range []string{"limit=0", "order=sideways", "after=nope"} {
		r, err := http.Get(url + "/v1/responses/" + second.ID + "/input_items?" + q)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: %d", q, r.StatusCode)
		}
	}
}

// TestResponsesBackground: a background response answers at once
// ("queued"), runs on after the request, and GET shows it completed with
// its output; continuing it before it ends is refused; a running one is
// cancelled by POST …/cancel ("cancelled"); background needs the store
// and is not streamed; a foreground response cannot be cancelled.
func TestResponsesBackground(t *testing.T) {
	f := newFake(4096)
	f.reply = "Let there be light."
	_, url := serve(t, f, Options{ResponsesStore: 8})
	status := func(raw []byte) (string, string) {
		var r struct {
			ID, Status string
			Output     []struct{ Content []struct{ Text string } }
		}
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		text := ""
		if len(r.Output) > 0 && len(r.Output[0].Content) > 0 {
			text = r.Output[0].Content[0].Text
		}
		return r.Status, text
	}
	get := func(id string) []byte {
		resp, err := http.Get(url + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	wait := func(id string) []byte {
		for range 500 {
			b := get(id)
			if st, _ := status(b); st != "queued" && st != "in_progress" {
				return b
			}
			time.Sleep(5 * time.Millisecond)
		}
		t.Fatalf("%s never ended", id)
		return nil
	}
	resp, raw := post(t, url, "/v1/responses", `{"input": "Light?", "max_output_tokens": 16, "background": true}`)
	var r struct{ ID string }
	_ = json.Unmarshal(raw, &r)
	if st, _ := status(raw); resp.StatusCode != http.StatusOK || st != "queued" || !strings.Contains(string(raw), `"background":true`) {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	if st, text := status(wait(r.ID)); st != "completed" || text != f.reply {
		t.Errorf("ended %s with %q", st, text)
	}
	// Cancelled while it runs (the fake engine holds after its first token).
	f.reply, f.hold = "", true
	_, raw = post(t, url, "/v1/responses", `{"input": "Light?", "max_output_tokens": 16, "background": true}`)
	_ = json.Unmarshal(raw, &r)
	if resp, raw := post(t, url, "/v1/responses", `{"input": "x", "previous_response_id": "`+r.ID+`"}`); resp.StatusCode != http.StatusBadRequest ||
		!strings.Contains(string(raw), "still in progress") {
		t.Errorf("continuing a running response: %d %s", resp.StatusCode, raw)
	}
	resp, raw = post(t, url, "/v1/responses/"+r.ID+"/cancel", ``)
	if st, _ := status(raw); resp.StatusCode != http.StatusOK || st != "cancelled" {
		t.Errorf("cancel: %d %s", resp.StatusCode, raw)
	}
	f.hold = false
	for _, c := range []struct{ body, text string }{
		{`{"input": "x", "background": true, "store": false}`, "response store"},
		{`{"input": "x", "background": true, "stream": true}`, "cannot be streamed"},
	} {
		if resp, raw := post(t, url, "/v1/responses", c.body); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), c.text) {
			t.Errorf("%s: %d %s", c.body, resp.StatusCode, raw)
		}
	}
	_, raw = post(t, url, "/v1/responses", `{"input": "x", "max_output_tokens": 2}`)
	_ = json.Unmarshal(raw, &r)
	if resp, raw := post(t, url, "/v1/responses/"+r.ID+"/cancel", ``); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("cancelling a foreground response: %d %s", resp.StatusCode, raw)
	}
}
