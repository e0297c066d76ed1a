package chat

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pyCase is one rendering produced by scripts/gen_chat_testdata.py with
// Python jinja2 set up as transformers sets it up.
type pyCase struct {
	Name     string            `json:"name"`
	Template string            `json:"template"`
	Source   *string           `json:"source"`
	Messages []json.RawMessage `json:"messages"`
	Options  struct {
		AddGenerationPrompt bool              `json:"add_generation_prompt"`
		BOSToken            string            `json:"bos_token"`
		EOSToken            string            `json:"eos_token"`
		Tools               []json.RawMessage `json:"tools"`
		Kwargs              map[string]json.RawMessage
	} `json:"options"`
	Output    *string `json:"output"`
	KnownGap  string  `json:"known_gap"`
	Error     string  `json:"error"`
	ErrorType string  `json:"error_type"`
}

type pyCases struct {
	Jinja2Version string   `json:"jinja2_version"`
	Now           string   `json:"now"`
	Cases         []pyCase `json:"cases"`
}

func loadPyCases(t testing.TB) *pyCases {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cs pyCases
	if err := json.Unmarshal(data, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs.Cases) < 50 {
		t.Fatalf("only %d cases", len(cs.Cases))
	}
	return &cs
}

// messageFromJSON converts a message dict of the test data into a Message.
func messageFromJSON(t testing.TB, raw json.RawMessage) Message {
	t.Helper()
	var m struct {
		Role       string  `json:"role"`
		Content    *string `json:"content"`
		Reasoning  string  `json:"reasoning_content"`
		Thinking   string  `json:"thinking"`
		Name       string  `json:"name"`
		ToolCallID string  `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	out := Message{Role: m.Role, Reasoning: m.Reasoning, Thinking: m.Thinking, Name: m.Name, ToolCallID: m.ToolCallID}
	if m.Content == nil {
		out.ContentNone = true
	} else {
		out.Content = *m.Content
	}
	for _, c := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, ToolCall{ID: c.ID, Type: c.Type, Name: c.Function.Name, Arguments: c.Function.Arguments})
	}
	return out
}

func caseSource(t testing.TB, c pyCase) string {
	t.Helper()
	if c.Source != nil {
		return *c.Source
	}
	data, err := os.ReadFile(filepath.Join("testdata", "templates", c.Template))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func caseInputs(t testing.TB, c pyCase, now time.Time) ([]Message, Options) {
	msgs := make([]Message, len(c.Messages))
	for i, raw := range c.Messages {
		msgs[i] = messageFromJSON(t, raw)
	}
	opts := Options{
		AddGenerationPrompt: c.Options.AddGenerationPrompt,
		BOSToken:            c.Options.BOSToken,
		EOSToken:            c.Options.EOSToken,
		Tools:               c.Options.Tools,
		Now:                 now,
	}
	if len(c.Options.Kwargs) > 0 {
		opts.Kwargs = map[string]any{}
		for k, v := range c.Options.Kwargs {
			opts.Kwargs[k] = v
		}
	}
	return msgs, opts
}

// TestMatchesJinja2 renders every case and compares byte for byte with
// Python jinja2's output (or its error).
func TestMatchesJinja2(t *testing.T) {
	cs := loadPyCases(t)
	now, err := time.Parse("2006-01-02T15:04:05", cs.Now)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs.Cases {
		t.Run(c.Name, func(t *testing.T) {
			tmpl, err := Compile(caseSource(t, c))
			if err != nil {
				if c.ErrorType == "TemplateSyntaxError" {
					return
				}
				t.Fatalf("Compile: %v", err)
			}
			msgs, opts := caseInputs(t, c, now)
			got, err := tmpl.Render(msgs, opts)
			if c.KnownGap != "" {
				// A documented difference: it must still differ, so that a
				// fix shows up here and in the package doc.
				if c.Output != nil && err == nil && got == *c.Output {
					t.Errorf("known gap %q no longer differs from jinja2: update the package doc and the case", c.KnownGap)
				}
				return
			}
			if c.Output == nil {
				if err == nil {
					t.Fatalf("Render succeeded with %q; jinja2 failed with %s: %s", got, c.ErrorType, c.Error)
				}
				var re *RaiseError
				if c.ErrorType == "TemplateError" && (!errors.As(err, &re) || re.Message != c.Error) {
					t.Errorf("error %v; want raise_exception(%q)", err, c.Error)
				}
				return
			}
			if err != nil {
				t.Fatalf("Render: %v\nwant %q", err, *c.Output)
			}
			if got != *c.Output {
				t.Errorf("mismatch\n got %q\nwant %q", got, *c.Output)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	for _, src := range []string{
		"{% if x %}unclosed",
		"{{ 'unterminated }}",
		"{# no end",
		"{{ x ) }}",
		"{% raw %}no endraw",
		"{% for %}{% endfor %}",
		"{{ x",
	} {
		if _, err := Compile(src); err == nil {
			t.Errorf("Compile(%q) succeeded", src)
		} else if !strings.HasPrefix(err.Error(), "chat: compile:") {
			t.Errorf("Compile(%q) error %q lacks the package prefix", src, err)
		}
	}
}

func TestRenderInputErrors(t *testing.T) {
	tmpl, err := Compile("{{ messages | length }}")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		msgs []Message
		opts Options
		want string
	}{
		{"bad tool schema", nil, Options{Tools: []json.RawMessage{json.RawMessage(`{"a": `)}}, "tools[0]"},
		{"bad arguments", []Message{{Role: "assistant", ToolCalls: []ToolCall{{Name: "f", Arguments: json.RawMessage(`{x}`)}}}}, Options{}, "messages[0]"},
		{"bad kwarg", nil, Options{Kwargs: map[string]any{"k": struct{}{}}}, `kwarg "k"`},
		{"reserved kwarg", nil, Options{Kwargs: map[string]any{"__mkserve_t0": "x"}}, "reserved"},
		{"huge integer", nil, Options{Tools: []json.RawMessage{json.RawMessage(`{"n": 123456789012345678901234}`)}}, "tools[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := tmpl.Render(c.msgs, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

// FuzzRender compiles and renders arbitrary templates and messages: errors
// are fine, panics are not.
func FuzzRender(f *testing.F) {
	cs := loadPyCases(f)
	seen := map[string]bool{}
	for _, c := range cs.Cases {
		src := caseSource(f, c)
		if !seen[src] {
			seen[src] = true
			f.Add(src, "hello {{ world }}")
		}
	}
	f.Add("{{ x | tojson(indent='\t') }}{% for a, b in messages %}{{ a }}{% endfor %}", "</s>")
	f.Fuzz(func(t *testing.T, src, content string) {
		tmpl, err := Compile(src)
		if err != nil {
			return
		}
		msgs := []Message{{Role: "system", Content: content}, {Role: "user", Content: content},
			{Role: "assistant", ContentNone: true, ToolCalls: []ToolCall{{Name: "f", Arguments: json.RawMessage(`{"a": [1, 2.5, null]}`)}}},
			{Role: "tool", Content: content}}
		opts := Options{AddGenerationPrompt: true, BOSToken: "<s>", EOSToken: "</s>",
			Tools:  []json.RawMessage{json.RawMessage(`{"type": "function", "function": {"name": "f"}}`)},
			Kwargs: map[string]any{"enable_thinking": false, "reasoning_effort": "low"}, Now: time.Unix(0, 0).UTC()}
		_, _ = tmpl.Render(msgs, opts)
	})
}

func TestRunawayRecursion(t *testing.T) {
	tmpl, err := Compile("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmpl.Render(nil, Options{}); err == nil || !strings.Contains(err.Error(), "nested deeper") {
		t.Errorf("err = %v", err)
	}
	// Bounded recursion is fine.
	tmpl, err = Compile("{% macro f(n) %}{% if n < 50 %}{{ f(n + 1) }}{% else %}{{ n }}{% endif %}{% endmacro %}{{ f(0) }}")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := tmpl.Render(nil, Options{}); err != nil || out != "50" {
		t.Errorf("Render = %q, %v", out, err)
	}
	if _, err := Compile("{{ " + strings.Repeat("(", 5000) + "1" + strings.Repeat(")", 5000) + " }}"); err == nil {
		t.Error("deep nesting compiled")
	}
}
