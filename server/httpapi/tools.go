package httpapi

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
)

// Function calling. The tools are rendered into the prompt by the chat
// template; the model's calls are read back from its text in the format
// the template teaches. Two formats are known: Hermes, which Qwen2, Qwen2.5
// and Qwen3 templates use —
//
//	<tool_call>
//	{"name": "get_weather", "arguments": {"city": "Paris"}}
//	</tool_call>
//
// — and DeepSeek-V3's, between <｜tool▁calls▁begin｜> and
// <｜tool▁calls▁end｜>, each call
//
//	<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//	```json
//	{"city": "Paris"}
//	```<｜tool▁call▁end｜>
//
// tool_choice "auto" parses whatever calls the text holds (text that does
// not parse stays content); "required" and a named function force one call
// by constraining the output to that shape (grammar.Wrapped over the
// function's parameter schema), so even a model that would rather answer in
// prose returns a call.

// Tool-call formats (Options.ToolFormat).
const (
	ToolFormatHermes   = "hermes"
	ToolFormatDeepSeek = "deepseek_v3"
	// ToolFormatHarmony: gpt-oss's messages to=functions.NAME, read by the
	// harmony reasoning splitter (reasoning.go) with the rest of the text.
	ToolFormatHarmony = "harmony"
)

// DetectToolFormat is the tool-call format a chat template's source
// teaches ("" when it shows none mkserve can read).
func DetectToolFormat(src string) string {
	switch {
	case DetectReasoning(src) == ReasoningHarmony:
		return ToolFormatHarmony
	case strings.Contains(src, "<tool_call>"):
		return ToolFormatHermes
	case strings.Contains(src, dsCallsBegin):
		return ToolFormatDeepSeek
	}
	return ""
}

// toolFormat is how one format's calls are written and read.
type toolFormat struct {
	open  string                                   // the text its calls start with
	parse func(text string) (string, []toolCallJS) // content and calls (nil: none, the whole text is content)
	// forced returns the bytes around a forced call of function name and
	// whether the object between them is {"name", "arguments"} (else the
	// arguments alone); ok false: this format cannot force a choice among
	// several functions (name "").
	forced func(name string) (prefix, suffix string, wrapped, ok bool)
}

var toolFormats = map[string]*toolFormat{
	ToolFormatHermes: {open: hermesOpen, parse: hermesCalls, forced: func(string) (string, string, bool, bool) {
		return hermesOpen + "\n", "\n" + hermesClose, true, true
	}},
	ToolFormatDeepSeek: {open: dsCallsBegin, parse: deepseekCalls, forced: func(name string) (string, string, bool, bool) {
		return dsCallsBegin + dsCallBegin + "function" + dsSep + name + "\n```json\n", "\n```" + dsCallEnd + dsCallsEnd, false, name != ""
	}},
	// Harmony's markers are special tokens: a forced call writes them as
	// such (the request keeps special tokens, so the grammar's vocabulary
	// has them); the call ends at <|call|>, an end-of-sequence token. The
	// name is in the prefix, so "required" with several tools reads each
	// tool's whole call side by side (grammar.AnyOf).
	ToolFormatHarmony: {open: hChannel, parse: func(text string) (string, []toolCallJS) {
		_, content, calls := splitAll(&harmonySplit{calls: true}, text)
		if calls == nil {
			return text, nil
		}
		return strings.TrimSpace(content), calls
	}, forced: func(name string) (string, string, bool, bool) {
		return hChannel + "commentary to=functions." + name + " <|constrain|>json" + hMessage, "", false, name != ""
	}},
}

const (
	maxTools      = 128
	hermesOpen    = "<tool_call>"
	hermesClose   = "</tool_call>"
	dsCallsBegin  = "<｜tool▁calls▁begin｜>"
	dsCallsEnd    = "<｜tool▁calls▁end｜>"
	dsCallBegin   = "<｜tool▁call▁begin｜>"
	dsCallEnd     = "<｜tool▁call▁end｜>"
	dsSep         = "<｜tool▁sep｜>"
	toolCallIDLen = 24 // hex digits after "call_"
)

var toolNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// toolDef is one entry of a request's tools.
type toolDef struct {
	Type     string `json:"type"`
	Function *struct {
		Name        string          `json:"name"`
		Description json.RawMessage `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	} `json:"function"`
}

// toolSetup is a chat request's function calling (tool_choice auto,
// required or named): the tools as given (for the template), and how calls
// are read back from the output.
type toolSetup struct {
	raw []json.RawMessage
	one bool        // parallel_tool_calls false: keep the first call only
	f   *toolFormat // the template's format
}

// calls splits a choice's text into content and calls (parallel_tool_calls
// false: the first call only).
func (ts *toolSetup) calls(text string) (string, []toolCallJS) {
	content, calls := ts.f.parse(text)
	if ts.one && len(calls) > 1 {
		calls = calls[:1]
	}
	return content, calls
}

// tools validates tools and tool_choice and, for a forced call, sets the
// grammar that makes the output one call. nil: no function calling.
func (s *Server) tools(r *chatRequest, sp *engine.SamplingParams) (*toolSetup, *apiError) {
	hasTools := !isNull(r.Tools) && string(bytes.TrimSpace(r.Tools)) != "[]"
	choice, named, e := toolChoice(r.ToolChoice)
	if e != nil {
		return nil, e
	}
	if !hasTools {
		if !isNull(r.ToolChoice) && choice != "none" {
			return nil, invalid("tool_choice", "tool_choice is only allowed with tools (got %q)", choice)
		}
		return nil, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(r.Tools, &raw); err != nil {
		return nil, invalid("tools", "tools must be a list of tool objects")
	}
	if len(raw) > maxTools {
		return nil, invalid("tools", "at most %d tools, got %d", maxTools, len(raw))
	}
	defs := make([]toolDef, len(raw))
	byName := map[string]int{}
	for i, t := range raw {
		if err := json.Unmarshal(t, &defs[i]); err != nil || defs[i].Type != "function" || defs[i].Function == nil {
			return nil, invalid("tools", `tools[%d] must be {"type": "function", "function": {...}}`, i)
		}
		f := defs[i].Function
		if !toolNameRE.MatchString(f.Name) {
			return nil, invalid("tools", "tools[%d].function.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -; got %q", i, f.Name)
		}
		if _, dup := byName[f.Name]; dup {
			return nil, invalid("tools", "tools[%d].function.name %q is given twice", i, f.Name)
		}
		byName[f.Name] = i
		if !isNull(f.Parameters) && !bytes.HasPrefix(bytes.TrimSpace(f.Parameters), []byte("{")) {
			return nil, invalid("tools", "tools[%d].function.parameters must be a JSON Schema object", i)
		}
	}
	if choice == "none" {
		return nil, nil // the model is not to call: the tools stay out of the prompt
	}
	f := toolFormats[s.opts.ToolFormat]
	if f == nil {
		return nil, invalid("tools", "this model's chat template shows no tool-call format mkserve can read (it reads Hermes <tool_call> blocks, as Qwen templates write them, DeepSeek-V3's and gpt-oss's harmony messages)")
	}
	if named != "" {
		if _, ok := byName[named]; !ok {
			return nil, invalid("tool_choice", "tool_choice names %q, which is not among the tools", named)
		}
	}
	if choice == "required" || named != "" {
		if named == "" && len(defs) == 1 {
			named = defs[0].Function.Name
		}
		if sp.IgnoreEOS {
			return nil, invalid("tool_choice", "a forced tool call cannot be used with ignore_eos")
		}
		if sp.Grammar != nil {
			return nil, invalid("tool_choice", "a forced tool call cannot be combined with response_format")
		}
		// One call: of the named function, or (required) of any, each
		// call's arguments held to its own function's schema.
		names := []string{named}
		if _, _, _, ok := f.forced(named); !ok { // the format puts the name in fixed text: each call's own
			names = names[:0]
			for _, d := range defs {
				names = append(names, d.Function.Name)
			}
		}
		calls := make([]func() grammar.Validator, len(names))
		for i, n := range names {
			prefix, suffix, wrapped, ok := f.forced(n)
			if !ok {
				return nil, invalid("tool_choice", "a forced call of %q cannot be written in this model's tool-call format", n)
			}
			schema, e := callSchema(defs, n, wrapped)
			if e != nil {
				return nil, e
			}
			calls[i] = func() grammar.Validator { return grammar.NewWrapped([]byte(prefix), schema, []byte(suffix)) }
		}
		sp.Grammar = calls[0]
		if len(calls) > 1 {
			sp.Grammar = func() grammar.Validator {
				vs := make([]grammar.Validator, len(calls))
				for i, c := range calls {
					vs[i] = c()
				}
				return grammar.NewAnyOf(vs...)
			}
		}
	}
	// The call markers may be special tokens of the tokenizer (as vLLM's
	// tool parsers do, the text keeps them so the parser sees the calls).
	sp.KeepSpecialTokens = true
	return &toolSetup{raw: raw, one: r.ParallelToolCalls != nil && !*r.ParallelToolCalls, f: f}, nil
}

// toolChoice reads tool_choice: "none", "auto", "required", or a named
// function (returned as named, with choice "function").
func toolChoice(raw json.RawMessage) (choice, named string, e *apiError) {
	if isNull(raw) {
		return "auto", "", nil
	}
	if json.Unmarshal(raw, &choice) == nil {
		switch choice {
		case "none", "auto", "required":
			return choice, "", nil
		}
		return "", "", invalid("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}; got %q`, choice)
	}
	var obj struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &obj) != nil || obj.Type != "function" || obj.Function.Name == "" {
		return "", "", invalid("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}`)
	}
	return "function", obj.Function.Name, nil
}

// callSchema is the schema of one forced call: wrapped, {"name": the
// function, "arguments": its parameters} — with several candidates
// (required), the name among them and the arguments any object; else the
// named function's parameters alone.
func callSchema(defs []toolDef, named string, wrapped bool) (*grammar.Schema, *apiError) {
	var name, args json.RawMessage
	pick := -1
	for i, d := range defs {
		if d.Function.Name == named {
			pick = i
		}
	}
	if pick >= 0 {
		f := defs[pick].Function
		name, _ = json.Marshal(map[string]any{"const": f.Name})
		args = f.Parameters
		if isNull(args) {
			args = json.RawMessage(`{"type": "object"}`)
		}
	}
	call := func(name, args json.RawMessage) string {
		if isNull(args) {
			args = json.RawMessage(`{"type": "object"}`)
		}
		return `{"type": "object", "properties": {"name": ` + string(name) + `, "arguments": ` + string(args) +
			`}, "required": ["name", "arguments"], "additionalProperties": false}`
	}
	var src string
	switch {
	case !wrapped:
		src = string(args)
	case pick >= 0:
		src = call(name, args)
	default: // "required" with several tools: one call of any, its arguments its own schema's
		alts := make([]string, len(defs))
		for i, d := range defs {
			n, _ := json.Marshal(map[string]any{"const": d.Function.Name})
			alts[i] = call(n, d.Function.Parameters)
		}
		src = `{"anyOf": [` + strings.Join(alts, ", ") + `]}`
		if len(defs) == 1 {
			src = alts[0]
		}
	}
	schema, err := grammar.Shared.Schema([]byte(src))
	if err != nil {
		return nil, invalid("tools", "the forced call's parameters: %v", err)
	}
	return schema, nil
}

// toolCallJS is a call in a response (message.tool_calls, or a streamed
// delta's, which carries Index).
type toolCallJS struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"` // JSON, as a string (OpenAI's shape)
	} `json:"function"`
}

// hermesCalls splits a choice's text into its content (the text outside
// the <tool_call> blocks, trimmed) and its calls. With a block that is not
// a call ({"name": string, "arguments": object or JSON string}) or an
// unclosed one, the whole text is content and there are no calls.
func hermesCalls(text string) (string, []toolCallJS) {
	var content strings.Builder
	var calls []toolCallJS
	rest := text
	for {
		i := strings.Index(rest, hermesOpen)
		if i < 0 {
			content.WriteString(rest)
			break
		}
		content.WriteString(rest[:i])
		body := rest[i+len(hermesOpen):]
		j := strings.Index(body, hermesClose)
		if j < 0 {
			return text, nil
		}
		call, ok := parseCall(body[:j])
		if !ok {
			return text, nil
		}
		calls = append(calls, call)
		rest = body[j+len(hermesClose):]
	}
	if calls == nil {
		return text, nil
	}
	return strings.TrimSpace(content.String()), calls
}

// parseCall reads one block's {"name": ..., "arguments": ...}.
func parseCall(body string) (toolCallJS, bool) {
	var c struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	d := json.NewDecoder(strings.NewReader(body))
	if err := d.Decode(&c); err != nil || c.Name == "" || d.More() {
		return toolCallJS{}, false
	}
	return newCall(c.Name, c.Arguments)
}

// newCall is a call of name with arguments (a JSON object, or a JSON string
// holding one; empty or null: {}), compacted.
func newCall(name string, arguments []byte) (toolCallJS, bool) {
	var out toolCallJS
	args := bytes.TrimSpace(arguments)
	switch {
	case len(args) == 0 || string(args) == "null":
		args = []byte("{}")
	case args[0] == '"': // already a JSON string holding the arguments
		var s string
		if json.Unmarshal(args, &s) != nil {
			return out, false
		}
		args = []byte(s)
	case args[0] != '{':
		return out, false
	}
	var compact bytes.Buffer
	if json.Compact(&compact, args) != nil {
		return out, false
	}
	out.ID, out.Type = newCallID(), "function"
	out.Function.Name, out.Function.Arguments = name, compact.String()
	return out, true
}

// deepseekCalls splits a choice's text into its content (outside the
// <｜tool▁calls▁begin｜> … <｜tool▁calls▁end｜> section, trimmed) and the
// section's calls. A section that is not closed, or a call that does not
// parse, leaves the whole text as content and no calls.
func deepseekCalls(text string) (string, []toolCallJS) {
	i := strings.Index(text, dsCallsBegin)
	if i < 0 {
		return text, nil
	}
	body := text[i+len(dsCallsBegin):]
	j := strings.Index(body, dsCallsEnd)
	if j < 0 {
		return text, nil
	}
	content := strings.TrimSpace(text[:i] + body[j+len(dsCallsEnd):])
	var calls []toolCallJS
	for rest := strings.TrimSpace(body[:j]); rest != ""; rest = strings.TrimSpace(rest) {
		// <｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
		after, ok := strings.CutPrefix(rest, dsCallBegin)
		if !ok {
			return text, nil
		}
		k := strings.Index(after, dsCallEnd)
		if k < 0 {
			return text, nil
		}
		call := after[:k]
		rest = after[k+len(dsCallEnd):]
		_, nameArgs, ok := strings.Cut(call, dsSep)
		if !ok {
			return text, nil
		}
		name, args, ok := strings.Cut(nameArgs, "\n")
		if !ok {
			return text, nil
		}
		args = strings.TrimSpace(args)
		args = strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(args, "```json"), "```"), "```")
		c, ok := newCall(strings.TrimSpace(name), []byte(args))
		if !ok || !toolNameRE.MatchString(c.Function.Name) {
			return text, nil
		}
		calls = append(calls, c)
	}
	if calls == nil {
		return text, nil
	}
	return content, calls
}

// newCallID is a fresh "call_…" id.
func newCallID() string {
	b := make([]byte, toolCallIDLen/2)
	_, _ = rand.Read(b)
	return "call_" + hex.EncodeToString(b)
}

// toolStream is one streamed choice's text when calls are parsed: content
// is passed on as it comes, except a tail that may be the start of a
// <tool_call> block; from the first block on, everything is held and
// read at the end.
type toolStream struct {
	ts      *toolSetup
	all     strings.Builder // the whole text
	pending string          // content not yet passed on
	inCall  bool            // a block has started
	sent    int             // bytes of content passed on
}

// push takes new text and returns the content that may be streamed now.
func (t *toolStream) push(text string) string {
	t.all.WriteString(text)
	if t.inCall {
		return ""
	}
	t.pending += text
	open := t.ts.f.open
	if i := strings.Index(t.pending, open); i >= 0 {
		out := t.pending[:i]
		t.inCall, t.pending = true, ""
		t.sent += len(out)
		return out
	}
	keep := 0 // the longest tail that begins the calls
	for k := min(len(t.pending), len(open)-1); k > 0; k-- {
		if strings.HasSuffix(t.pending, open[:k]) {
			keep = k
			break
		}
	}
	out := t.pending[:len(t.pending)-keep]
	t.pending = t.pending[len(t.pending)-keep:]
	t.sent += len(out)
	return out
}

// finish returns the content still to stream and the calls (as
// toolSetup.calls gives them). Without calls that is everything held back;
// with them, the content after the first block (what the parse keeps
// beyond what was sent).
func (t *toolStream) finish() (string, []toolCallJS) {
	if !t.inCall {
		out := t.pending
		t.pending = ""
		return out, nil
	}
	content, calls := t.ts.calls(t.all.String())
	if calls == nil {
		return t.all.String()[t.sent:], nil
	}
	// Content before the first block was streamed already; what follows
	// the blocks is the rest of the trimmed content.
	sentTrim := strings.TrimSpace(t.all.String()[:t.sent])
	return strings.TrimPrefix(content, sentTrim), calls
}
