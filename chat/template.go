// Package chat renders Hugging Face chat templates (the Jinja templates in
// tokenizer_config.json) the way transformers' apply_chat_template does.
//
// Templates run on github.com/ardanlabs/jinja. What that library lacks or
// does differently from Jinja2 with transformers' settings is handled here:
// Jinja2's lexer-level whitespace control (trim_blocks, lstrip_blocks,
// "-"/"+" markers, newline normalization, no trailing newline), Python's
// str() when printing (None, floats, lists, dicts), transformers' tojson
// (Python json.dumps with ensure_ascii=False, indent, separators,
// sort_keys), map with a filter name, raise_exception as an error, and
// strftime_now at a chosen time, and Jinja2's per-iteration scope of
// {% set %} in loop bodies. Template errors come back as errors; a panic
// inside the library is recovered into an error too, and runaway macro
// recursion is stopped.
//
// Known differences from Jinja2 that remain (each has a "gap/" case in
// testdata/cases.json that fails once it is fixed): ** gives a float; //
// truncates negative quotients toward zero; str.split ignores maxsplit; ~
// prints None as "" and 2.0 as "2"; tuples (dictsort pairs) print as
// lists; -x | f applies the filter before the minus; round rounds halves
// away from zero; an attribute of an undefined value is undefined instead
// of an error. Integers beyond 64 bits in tool schemas are rejected.
package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Message is one chat message. Only the fields that are set appear in the
// template's message dict (content always does, as None when ContentNone).
type Message struct {
	Role    string
	Content string
	// ContentNone makes content None (an assistant turn with only tool
	// calls, say) instead of a string.
	ContentNone bool
	// Reasoning is "reasoning_content" (Qwen3, DeepSeek-R1 style).
	Reasoning string
	// Thinking is "thinking" (gpt-oss style).
	Thinking   string
	ToolCalls  []ToolCall
	Name       string // "name" (the tool of a tool result, say)
	ToolCallID string // "tool_call_id"
}

// ToolCall is one function call of an assistant message, seen by the
// template as {"id", "type", "function": {"name", "arguments"}}.
type ToolCall struct {
	ID   string // "id" when set
	Type string // "type" when set; usually "function"
	Name string
	// Arguments is JSON: an object becomes a dict (key order kept), a
	// string stays a string (OpenAI sends arguments as a JSON string).
	Arguments json.RawMessage
}

// Options are the variables transformers passes besides the messages.
type Options struct {
	AddGenerationPrompt bool
	BOSToken, EOSToken  string // bos_token / eos_token, when not empty
	// Tools are JSON tool schemas (key order kept); nil renders tools as
	// None, as transformers does without tools.
	Tools []json.RawMessage
	// Kwargs are extra template variables (enable_thinking,
	// reasoning_effort, ...): nil, bool, string, integers, floats,
	// json.RawMessage, []any, []string, map[string]any.
	Kwargs map[string]any
	// Now is the time strftime_now reports; zero means the current time.
	Now time.Time
}

// Template is a compiled chat template, safe for concurrent use.
type Template struct {
	tmpl  *jinja.Template
	texts []jinja.Value // literal text pieces, bound to __mkserve_tN
}

// RaiseError is the error a template raises with raise_exception(msg).
type RaiseError struct{ Message string }

func (e *RaiseError) Error() string { return "chat template raised: " + e.Message }

// Compile parses a chat template.
func Compile(src string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("chat: compile: template engine panic: %v", r)
		}
	}()
	rewritten, texts, err := preprocess(src)
	if err != nil {
		return nil, fmt.Errorf("chat: compile: %w", err)
	}
	jt, err := jinja.Compile(rewritten)
	if err != nil {
		return nil, fmt.Errorf("chat: compile: %w", err)
	}
	t = &Template{tmpl: jt, texts: make([]jinja.Value, len(texts))}
	for i, s := range texts {
		t.texts[i] = jinja.NewString(s)
	}
	return t, nil
}

// Render renders the conversation.
func (t *Template) Render(msgs []Message, opts Options) (out string, err error) {
	data := make(map[string]jinja.Value, len(t.texts)+16)
	for i, v := range t.texts {
		data[textVar(i)] = v
	}
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		if list[i], err = messageValue(m); err != nil {
			return "", fmt.Errorf("chat: messages[%d]: %w", i, err)
		}
	}
	data["messages"] = jinja.NewList(list)
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	data["tools"] = jinja.None()
	if opts.Tools != nil {
		tools := make([]jinja.Value, len(opts.Tools))
		for i, raw := range opts.Tools {
			if tools[i], err = jsonValue(raw); err != nil {
				return "", fmt.Errorf("chat: tools[%d]: %w", i, err)
			}
		}
		data["tools"] = jinja.NewList(tools)
	}
	data["documents"] = jinja.None()
	if opts.BOSToken != "" {
		data["bos_token"] = jinja.NewString(opts.BOSToken)
	}
	if opts.EOSToken != "" {
		data["eos_token"] = jinja.NewString(opts.EOSToken)
	}
	for k, v := range opts.Kwargs {
		if strings.HasPrefix(k, "__mkserve") {
			return "", fmt.Errorf("chat: kwarg %q: reserved name", k)
		}
		if data[k], err = goValue(v); err != nil {
			return "", fmt.Errorf("chat: kwarg %q: %w", k, err)
		}
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	var raised *RaiseError
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = pyStr(args[0])
		}
		raised = &RaiseError{Message: msg}
		return jinja.Undefined(), raised
	})
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), fmt.Errorf("strftime_now: want one format string")
		}
		return jinja.NewString(strftime(now, args[0].AsString())), nil
	})
	data["__mkserve_str"] = jinja.NewCallable("str", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 {
			return jinja.Undefined(), fmt.Errorf("print: want one value")
		}
		return jinja.NewString(pyStr(args[0])), nil
	})
	depth := 0
	data["__mkserve_enter"] = jinja.NewCallable("macro", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		if depth++; depth > maxMacroDepth {
			return jinja.Undefined(), fmt.Errorf("macros nested deeper than %d (runaway recursion?)", maxMacroDepth)
		}
		return jinja.NewString(""), nil
	})
	data["__mkserve_leave"] = jinja.NewCallable("macro", func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
		depth--
		return jinja.NewString(""), nil
	})
	data["__mkserve_tojson"] = jinja.NewCallable("tojson", filterToJSON)
	data["__mkserve_map"] = jinja.NewCallable("map", filterMap)

	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat: render: template engine panic: %v", r)
		}
	}()
	out, err = t.tmpl.RenderValues(data)
	if err != nil {
		if raised != nil && errors.Is(err, raised) || raised != nil && strings.Contains(err.Error(), raised.Message) {
			return "", raised
		}
		return "", fmt.Errorf("chat: render: %w", err)
	}
	return out, nil
}

// messageValue builds the dict a template sees for one message.
func messageValue(m Message) (jinja.Value, error) {
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	if m.ContentNone {
		d.Set("content", jinja.None())
	} else {
		d.Set("content", jinja.NewString(m.Content))
	}
	if m.Reasoning != "" {
		d.Set("reasoning_content", jinja.NewString(m.Reasoning))
	}
	if m.Thinking != "" {
		d.Set("thinking", jinja.NewString(m.Thinking))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, tc := range m.ToolCalls {
			c := jinja.NewDict()
			if tc.ID != "" {
				c.AsDict().Set("id", jinja.NewString(tc.ID))
			}
			if tc.Type != "" {
				c.AsDict().Set("type", jinja.NewString(tc.Type))
			}
			f := jinja.NewDict()
			f.AsDict().Set("name", jinja.NewString(tc.Name))
			args := jinja.NewDict()
			if len(tc.Arguments) > 0 {
				var err error
				if args, err = jsonValue(tc.Arguments); err != nil {
					return jinja.Undefined(), fmt.Errorf("tool_calls[%d].arguments: %w", i, err)
				}
			}
			f.AsDict().Set("arguments", args)
			c.AsDict().Set("function", f)
			calls[i] = c
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	if m.Name != "" {
		d.Set("name", jinja.NewString(m.Name))
	}
	if m.ToolCallID != "" {
		d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	return v, nil
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False).
func filterToJSON(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: missing value")
	}
	o := jsonOptions{itemSep: ", ", keySep: ": "}
	get := func(name string, pos int) (jinja.Value, bool) {
		if v, ok := kwargs[name]; ok {
			return v, true
		}
		if pos < len(args) {
			return args[pos], true
		}
		return jinja.Undefined(), false
	}
	if v, ok := get("ensure_ascii", 1); ok {
		o.ensureASCII = v.IsTruthy()
	}
	if v, ok := get("indent", 2); ok && !v.IsNone() && !v.IsUndefined() {
		o.hasIndent = true
		o.itemSep = ","
		switch {
		case v.IsInt():
			o.indent = strings.Repeat(" ", int(max(0, min(v.AsInt(), 64))))
		case v.IsString():
			o.indent = v.AsString()
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an integer or a string")
		}
	}
	if v, ok := get("separators", 3); ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings")
		}
		o.itemSep, o.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if v, ok := get("sort_keys", 4); ok {
		o.sortKeys = v.IsTruthy()
	}
	var sb strings.Builder
	if err := pyJSON(&sb, args[0], &o, 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(sb.String()), nil
}

// filterMap is Jinja2's map: map(attribute='a.b', default=...) or
// map('filter', args...) for the filters chat templates use with it.
func filterMap(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("map: missing value")
	}
	var items []jinja.Value
	switch v := args[0]; {
	case v.IsList():
		items = v.AsList().Items
	case v.IsDict():
		for _, k := range v.AsDict().Keys {
			items = append(items, jinja.NewString(k))
		}
	case v.IsString():
		for _, r := range v.AsString() {
			items = append(items, jinja.NewString(string(r)))
		}
	case v.IsUndefined() || v.IsNone():
		return jinja.NewList(nil), nil
	default:
		return jinja.Undefined(), fmt.Errorf("map: %s is not iterable", v.String())
	}
	out := make([]jinja.Value, len(items))
	if attr, ok := kwargs["attribute"]; ok {
		def, hasDef := kwargs["default"]
		for i, it := range items {
			v := it
			for _, part := range strings.Split(pyStr(attr), ".") {
				if v.IsDict() {
					if x, ok := v.AsDict().Get(part); ok {
						v = x
						continue
					}
				}
				v = jinja.Undefined()
				break
			}
			if v.IsUndefined() && hasDef {
				v = def
			}
			out[i] = v
		}
		return jinja.NewList(out), nil
	}
	if len(args) < 2 || !args[1].IsString() {
		return jinja.Undefined(), fmt.Errorf("map: want a filter name or attribute=")
	}
	name, rest := args[1].AsString(), args[2:]
	for i, it := range items {
		v, err := applyFilter(name, it, rest, kwargs)
		if err != nil {
			return jinja.Undefined(), err
		}
		out[i] = v
	}
	return jinja.NewList(out), nil
}

// applyFilter runs one of the simple filters map is used with.
func applyFilter(name string, v jinja.Value, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	switch name {
	case "tojson":
		return filterToJSON(append([]jinja.Value{v}, args...), kwargs)
	case "string":
		return jinja.NewString(pyStr(v)), nil
	case "upper", "lower", "trim", "title", "capitalize":
		if !v.IsString() {
			v = jinja.NewString(pyStr(v))
		}
		s := v.AsString()
		switch name {
		case "upper":
			s = strings.ToUpper(s)
		case "lower":
			s = strings.ToLower(s)
		case "trim":
			s = strings.TrimFunc(s, pyIsSpace)
		case "title":
			s = pyTitle(s)
		case "capitalize":
			s = pyCapitalize(s)
		}
		return jinja.NewString(s), nil
	case "length", "count":
		switch {
		case v.IsString():
			return jinja.NewInt(int64(len([]rune(v.AsString())))), nil
		case v.IsList():
			return jinja.NewInt(int64(v.AsList().Len())), nil
		case v.IsDict():
			return jinja.NewInt(int64(v.AsDict().Len())), nil
		}
		return jinja.Undefined(), fmt.Errorf("map: length of %s", v.String())
	case "int":
		switch {
		case v.IsInt():
			return v, nil
		case v.IsFloat():
			return jinja.NewInt(int64(v.AsFloat())), nil
		}
		return jinja.NewInt(0), nil
	}
	return jinja.Undefined(), fmt.Errorf("map: unsupported filter %q", name)
}

func pyCapitalize(s string) string {
	r := []rune(strings.ToLower(s))
	if len(r) > 0 {
		r[0] = []rune(strings.ToUpper(string(r[0])))[0]
	}
	return string(r)
}

func pyTitle(s string) string {
	var sb strings.Builder
	prevCased := false
	for _, r := range s {
		cased := strings.ToUpper(string(r)) != strings.ToLower(string(r))
		if cased {
			if prevCased {
				sb.WriteString(strings.ToLower(string(r)))
			} else {
				sb.WriteString(strings.ToUpper(string(r)))
			}
		} else {
			sb.WriteRune(r)
		}
		prevCased = cased
	}
	return sb.String()
}
