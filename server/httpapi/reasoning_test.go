package httpapi

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

// splitCase is a text, the prompt before it and what its format splits it
// into.
type splitCase struct {
	name, format, prompt, text string
	calls                      bool
	reasoning, content         string
	callNames                  []string
	callArgs                   []string
}

var splitCases = []splitCase{
	{name: "think block", format: ReasoningThink, prompt: "<|im_start|>assistant\n",
		text: "<think>\nI add 2 and 2.\n</think>\n\nIt is 4.", reasoning: "\nI add 2 and 2.\n", content: "It is 4."},
	{name: "no block", format: ReasoningThink, prompt: "x", text: "Just 4. <think> is a tag.", content: "Just 4. <think> is a tag."},
	{name: "opened by the prompt", format: ReasoningThink, prompt: "<|Assistant|><think>\n",
		text: "hmm</think>four", reasoning: "hmm", content: "four"},
	{name: "closed by the prompt", format: ReasoningThink, prompt: "<think>\n\n</think>\n\n", text: "four", content: "four"},
	{name: "unterminated", format: ReasoningThink, prompt: "x", text: "<think>still thinking", reasoning: "still thinking"},
	{name: "leading space then block", format: ReasoningThink, prompt: "x", text: "\n<think>a</think>b", reasoning: "a", content: "b"},
	{name: "harmony", format: ReasoningHarmony, prompt: "<|start|>assistant",
		text:      "<|channel|>analysis<|message|>User asks 2+2.<|end|><|start|>assistant<|channel|>final<|message|>4.",
		reasoning: "User asks 2+2.", content: "4."},
	{name: "harmony call", format: ReasoningHarmony, prompt: "<|start|>assistant", calls: true,
		text:      "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}",
		reasoning: "Need weather.", callNames: []string{"get_weather"}, callArgs: []string{`{"city":"Oslo"}`}},
	{name: "harmony recipient after channel", format: ReasoningHarmony, prompt: "<|start|>assistant", calls: true,
		text:    "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|end|><|start|>assistant<|channel|>final<|message|>done",
		content: "done", callNames: []string{"f"}, callArgs: []string{`{}`}},
	{name: "harmony call without tools", format: ReasoningHarmony, prompt: "<|start|>assistant",
		text: "<|channel|>commentary to=functions.f<|message|>{\"a\": 1}", content: `{"a": 1}`},
	{name: "harmony bad arguments", format: ReasoningHarmony, prompt: "<|start|>assistant", calls: true,
		text: "<|channel|>commentary to=functions.f<|message|>not json", callNames: []string{"f"}, callArgs: []string{"not json"}},
	{name: "harmony without end and start", format: ReasoningHarmony, prompt: "<|start|>assistant",
		text: "<|channel|>analysis<|message|>Think.<|channel|>final<|message|>Done.", reasoning: "Think.", content: "Done."},
	{name: "not harmony", format: ReasoningHarmony, prompt: "<|start|>assistant", text: "plain words, no channel", content: "plain words, no channel"},
	{name: "harmony unterminated analysis", format: ReasoningHarmony, prompt: "<|start|>assistant",
		text: "<|channel|>analysis<|message|>thinking <|en", reasoning: "thinking <|en"},
}

// TestSplitters: each case's text, whole and streamed in random pieces,
// splits into the same reasoning, content and calls.
func TestSplitters(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, c := range splitCases {
		t.Run(c.name, func(t *testing.T) {
			check := func(how, reasoning, content string, calls []toolCallJS) {
				t.Helper()
				if reasoning != c.reasoning || content != c.content {
					t.Errorf("%s: reasoning %q content %q, want %q %q", how, reasoning, content, c.reasoning, c.content)
				}
				if len(calls) != len(c.callNames) {
					t.Fatalf("%s: %d calls, want %d", how, len(calls), len(c.callNames))
				}
				for i, cl := range calls {
					if cl.Function.Name != c.callNames[i] || cl.Function.Arguments != c.callArgs[i] || !strings.HasPrefix(cl.ID, "call_") {
						t.Errorf("%s: call %d %+v, want %s(%s)", how, i, cl, c.callNames[i], c.callArgs[i])
					}
				}
			}
			rs, cs, calls := splitAll(newSplitter(c.format, c.prompt, c.calls), c.text)
			check("whole", rs, cs, calls)
			for range 30 {
				s := newSplitter(c.format, c.prompt, c.calls)
				var rb, cb strings.Builder
				for k := 0; k < len(c.text); {
					end := min(len(c.text), k+1+r.IntN(6))
					x, y := s.push(c.text[k:end])
					rb.WriteString(x)
					cb.WriteString(y)
					k = end
				}
				x, y, calls := s.finish()
				check("streamed", rb.String()+x, cb.String()+y, calls)
			}
		})
	}
	if newSplitter("", "", false) != nil {
		t.Error("a splitter for no format")
	}
}

func TestDetectReasoning(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"{{ '<|start|>assistant<|channel|>final<|message|>' }}", ReasoningHarmony},
		{"{%- if '</think>' in content %}", ReasoningThink},
		{"{{ '<|im_start|>' }}", ""},
	} {
		if got := DetectReasoning(c.src); got != c.want {
			t.Errorf("DetectReasoning(%q) = %q, want %q", c.src, got, c.want)
		}
	}
}

// FuzzSplitters: any text streamed in any pieces splits as the whole text
// does, and nothing is lost: reasoning and content together hold every
// byte outside the markers (checked loosely: never longer than the text).
func FuzzSplitters(f *testing.F) {
	for _, c := range splitCases {
		f.Add(c.format == ReasoningHarmony, c.prompt, c.text, uint64(len(c.text)))
	}
	f.Fuzz(func(t *testing.T, harmony bool, prompt, text string, seed uint64) {
		format := ReasoningThink
		if harmony {
			format = ReasoningHarmony
		}
		wr, wc, wcalls := splitAll(newSplitter(format, prompt, true), text)
		if len(wr)+len(wc) > len(text) {
			t.Fatalf("%q split into %d + %d bytes", text, len(wr), len(wc))
		}
		r := rand.New(rand.NewPCG(seed, 3))
		s := newSplitter(format, prompt, true)
		var rb, cb strings.Builder
		for k := 0; k < len(text); {
			end := min(len(text), k+1+r.IntN(8))
			x, y := s.push(text[k:end])
			rb.WriteString(x)
			cb.WriteString(y)
			k = end
		}
		x, y, calls := s.finish()
		if rb.String()+x != wr || cb.String()+y != wc || len(calls) != len(wcalls) {
			t.Fatalf("%q streamed: %q %q %d calls; whole: %q %q %d calls", text, rb.String()+x, cb.String()+y, len(calls), wr, wc, len(wcalls))
		}
	})
}

// TestChatReasoning: chat completions return a thinking model's reasoning
// as reasoning_content (whole and streamed), and gpt-oss's harmony
// messages as reasoning, content and tool calls, its markers kept in the
// text the engine returns.
func TestChatReasoning(t *testing.T) {
	type msg struct {
		Content          *string `json:"content"`
		ReasoningContent *string `json:"reasoning_content"`
		ToolCalls        []struct {
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	}
	for _, c := range []struct {
		template, reply, tools    string
		reasoning, content, calls string
		finish                    string
	}{
		{"qwen3.jinja", "<think>\nAdd them.\n</think>\n\nIt is 4.", "", "\nAdd them.\n", "It is 4.", "", "stop"},
		{"qwen3.jinja", "<think>Weather needed.</think>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
			weatherTools, "Weather needed.", "", "get_weather", "tool_calls"},
		{"gptoss.jinja", "<|channel|>analysis<|message|>Simple sum.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.", "",
			"Simple sum.", "It is 4.", "", "stop"},
		{"gptoss.jinja", "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
			weatherTools, "Weather needed.", "", "get_weather", "tool_calls"},
	} {
		f := newFake(4096)
		f.reply = c.reply
		url := serveTemplate(t, f, c.template)
		body := `{"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 64`
		if c.tools != "" {
			body += `, "tools": ` + c.tools
		}
		name := c.template + " " + c.reply[:20]
		// Whole.
		resp, raw := post(t, url, "/v1/chat/completions", body+`}`)
		var out struct {
			Choices []struct {
				Message      msg
				FinishReason string `json:"finish_reason"`
			}
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil || len(out.Choices) != 1 {
			t.Fatalf("%s: %d %s", name, resp.StatusCode, raw)
		}
		m := out.Choices[0].Message
		got := func(p *string) string {
			if p == nil {
				return ""
			}
			return *p
		}
		callName := ""
		if len(m.ToolCalls) > 0 {
			callName = m.ToolCalls[0].Function.Name
		}
		if got(m.ReasoningContent) != c.reasoning || got(m.Content) != c.content || callName != c.calls || out.Choices[0].FinishReason != c.finish {
			t.Errorf("%s: %s", name, raw)
		}
		if reqs := f.requests(); reqs[len(reqs)-1].Sampling.KeepSpecialTokens != (c.template == "gptoss.jinja" || c.tools != "") {
			t.Errorf("%s: KeepSpecialTokens %v", name, reqs[len(reqs)-1].Sampling.KeepSpecialTokens)
		}
		// Streamed: the deltas add up to the same.
		resp, raw = post(t, url, "/v1/chat/completions", body+`, "stream": true}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s stream: %d %s", name, resp.StatusCode, raw)
		}
		var rs, cs, calls, finish string
		sc := bufio.NewScanner(strings.NewReader(string(raw)))
		for sc.Scan() {
			line, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok || line == "[DONE]" {
				continue
			}
			var ch struct {
				Choices []struct {
					Delta        msg
					FinishReason *string `json:"finish_reason"`
				}
			}
			if err := json.Unmarshal([]byte(line), &ch); err != nil {
				t.Fatalf("%s: chunk %s: %v", name, line, err)
			}
			for _, x := range ch.Choices {
				rs += got(x.Delta.ReasoningContent)
				cs += got(x.Delta.Content)
				for _, tc := range x.Delta.ToolCalls {
					calls += tc.Function.Name
				}
				if x.FinishReason != nil {
					finish = *x.FinishReason
				}
			}
		}
		if rs != c.reasoning || cs != c.content || calls != c.calls || finish != c.finish {
			t.Errorf("%s streamed: reasoning %q content %q calls %q finish %q", name, rs, cs, calls, finish)
		}
	}
}

// TestHarmonyForcedCall: a named tool_choice on gpt-oss's template forces
// one harmony message to the function — its markers written as special
// tokens (the request keeps them) — whose body the parameters constrain,
// and the reply parses back into the call.
func TestHarmonyForcedCall(t *testing.T) {
	f := newFake(4096)
	call := "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}"
	f.reply = call
	url := serveTemplate(t, f, "gptoss.jinja")
	body := `{"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 64, "tools": ` + weatherTools +
		`, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}`
	resp, raw := post(t, url, "/v1/chat/completions", body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"tool_calls"`) || !strings.Contains(string(raw), `{\"city\":\"Paris\"}`) {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	reqs := f.requests()
	sp := reqs[len(reqs)-1].Sampling
	if sp.Grammar == nil || !sp.KeepSpecialTokens {
		t.Fatalf("grammar %v, keep special tokens %v", sp.Grammar != nil, sp.KeepSpecialTokens)
	}
	if v := sp.Grammar(); !v.Advance([]byte(call)) || !v.Complete() {
		t.Errorf("the grammar refuses %q", call)
	}
	for _, bad := range []string{"<|channel|>analysis", "<|channel|>commentary to=functions.get_time", call[:len(call)-10] + "\"x\": 1"} {
		if sp.Grammar().Advance([]byte(bad)) {
			t.Errorf("the grammar takes %q", bad)
		}
	}
	// required with several tools: the name is in the fixed text, so the
	// grammar takes a whole call of either function, each with its own
	// parameters, and refuses a mix.
	if resp, raw := post(t, url, "/v1/chat/completions", strings.Replace(body, `{"type": "function", "function": {"name": "get_weather"}}`, `"required"`, 1)); resp.StatusCode != http.StatusOK {
		t.Fatalf("required with two tools: %d %s", resp.StatusCode, raw)
	}
	reqs = f.requests()
	g := reqs[len(reqs)-1].Sampling.Grammar
	timeCall := "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}"
	for _, good := range []string{call, timeCall} {
		if v := g(); !v.Advance([]byte(good)) || !v.Complete() {
			t.Errorf("required: the grammar refuses %q", good)
		}
	}
	for _, bad := range []string{"<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{\"city\"", "<|channel|>commentary to=functions.get_date", "<|channel|>final"} {
		if g().Advance([]byte(bad)) {
			t.Errorf("required: the grammar takes %q", bad)
		}
	}
}

// TestCompactJSON: with Options.CompactJSON a JSON-constrained request's
// grammar takes no newline between tokens; without it, it does.
func TestCompactJSON(t *testing.T) {
	tok, _ := loadTok(t)
	for _, compact := range []bool{false, true} {
		f := newFake(4096)
		s := New(f, tok, nil, Options{CompactJSON: compact})
		s.SetReady(true)
		ts := httptest.NewServer(s.Handler())
		resp, raw := post(t, ts.URL, "/v1/completions", `{"prompt": "x", "max_tokens": 4, "response_format": {"type": "json_object"}}`)
		ts.Close()
		f.running.Wait()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		reqs := f.requests()
		g := reqs[len(reqs)-1].Sampling.Grammar
		if g == nil {
			t.Fatal("no grammar")
		}
		if got := g().Advance([]byte("{\n")); got == compact {
			t.Errorf("compact %v: a newline after { taken: %v", compact, got)
		}
		if !g().Advance([]byte(`{"a": 1}`)) {
			t.Errorf("compact %v: one space refused", compact)
		}
	}
}

// TestReasoningEffort: reasoning_effort reaches the chat template (gpt-oss
// writes it into its system message); a bad value is a 400 naming it.
func TestReasoningEffort(t *testing.T) {
	f := newFake(4096)
	f.reply = "<|channel|>final<|message|>ok"
	url := serveTemplate(t, f, "gptoss.jinja")
	tok, _ := loadTok(t)
	for _, effort := range []string{"low", "high"} {
		resp, raw := post(t, url, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "reasoning_effort": "`+effort+`"}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		reqs := f.requests()
		if p, _ := tok.Decode(reqs[len(reqs)-1].Prompt, false); !strings.Contains(p, "Reasoning: "+effort) {
			t.Errorf("effort %s: the prompt does not say it: %q", effort, p)
		}
	}
	if resp, raw := post(t, url, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "max"}`); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "reasoning_effort") {
		t.Errorf("bad effort: %d %s", resp.StatusCode, raw)
	}
}

// TestIncludeReasoning: include_reasoning false leaves reasoning_content
// out, whole and streamed; the content is the same.
func TestIncludeReasoning(t *testing.T) {
	f := newFake(4096)
	f.reply = "<think>hidden</think>shown"
	url := serveTemplate(t, f, "qwen3.jinja")
	for _, stream := range []string{"false", "true"} {
		resp, raw := post(t, url, "/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "include_reasoning": false, "stream": `+stream+`}`)
		content := strings.Join(regexp.MustCompile(`"content":"([^"]*)"`).FindAllString(string(raw), -1), "")
		if resp.StatusCode != http.StatusOK || strings.Contains(string(raw), "reasoning_content") || strings.Contains(string(raw), "hidden") ||
			strings.ReplaceAll(strings.ReplaceAll(content, `"content":`, ""), `"`, "") != "shown" {
			t.Errorf("stream %s: %d %s", stream, resp.StatusCode, raw)
		}
	}
}

// TestContinuousUsage: stream_options.continuous_usage_stats (vLLM's) puts
// the usage so far in every chunk — prompt tokens fixed, completion tokens
// never decreasing and ending at the final usage's — on both endpoints;
// with include_usage alone the chunks carry null.
func TestContinuousUsage(t *testing.T) {
	f := newFake(4096)
	_, url := serve(t, f, Options{})
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt": "a b c", "max_tokens": 6`},
		{"/v1/chat/completions", `{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6`},
	} {
		for _, continuous := range []bool{false, true} {
			body := c.body + fmt.Sprintf(`, "stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": %v}}`, continuous)
			resp, raw := post(t, url, c.path, body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d %s", c.path, resp.StatusCode, raw)
			}
			var last, final int
			prompt, chunks := -1, 0
			sc := bufio.NewScanner(strings.NewReader(string(raw)))
			for sc.Scan() {
				line, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok || line == "[DONE]" {
					continue
				}
				var ch struct {
					Choices []json.RawMessage `json:"choices"`
					Usage   *usageJSON        `json:"usage"`
				}
				if err := json.Unmarshal([]byte(line), &ch); err != nil {
					t.Fatal(err)
				}
				if len(ch.Choices) == 0 { // the usage chunk
					final = ch.Usage.CompletionTokens
					continue
				}
				chunks++
				switch {
				case !continuous && ch.Usage != nil:
					t.Errorf("%s: include_usage alone, a chunk with usage %+v", c.path, ch.Usage)
				case continuous && ch.Usage == nil:
					t.Errorf("%s: continuous, a chunk without usage", c.path)
				case continuous:
					if ch.Usage.CompletionTokens < last || (prompt >= 0 && ch.Usage.PromptTokens != prompt) ||
						ch.Usage.TotalTokens != ch.Usage.PromptTokens+ch.Usage.CompletionTokens {
						t.Errorf("%s: usage %+v after %d completion tokens", c.path, ch.Usage, last)
					}
					last, prompt = ch.Usage.CompletionTokens, ch.Usage.PromptTokens
				}
			}
			if chunks == 0 || final == 0 || (continuous && last != final) {
				t.Errorf("%s continuous %v: %d chunks, last %d, final %d", c.path, continuous, chunks, last, final)
			}
		}
	}
}
