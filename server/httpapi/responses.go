package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/mkserve/mkserve/engine"
)

// POST /v1/responses: OpenAI's Responses API over the same engine path as
// chat completions. The request (instructions, input items, tools,
// text.format, reasoning.effort, max_output_tokens) is translated into a
// chat request; the output comes back as items — reasoning, an assistant
// message, function calls — whole or streamed as typed server-sent
// events. Finished responses are kept in memory (Options.ResponsesStore
// of them: respstore.go) for previous_response_id and GET / DELETE
// /v1/responses/{id}; background responses are refused. One output a
// request.

// responsesRequest is the body of POST /v1/responses. The embedded
// sampling carries model, temperature, top_p, stream and vLLM's extensions
// (top_k, min_p, seed, penalties, stop, guided_*, priority …); the chat
// names it shares but the Responses API renames are refused.
type responsesRequest struct {
	sampling
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Tools              []json.RawMessage `json:"tools"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls  *bool             `json:"parallel_tool_calls"`
	Text               *respTextConfig   `json:"text"`
	Reasoning          *respReasoning    `json:"reasoning"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Background         *bool             `json:"background"`
	Store              *bool             `json:"store"`
	Truncation         *string           `json:"truncation"`
	Metadata           map[string]string `json:"metadata"`
	Include            []string          `json:"include"`
	TopLogprobs        *int              `json:"top_logprobs"`
	IncludeReasoning   *bool             `json:"include_reasoning"` // vLLM's: false leaves reasoning out
	ChatTemplateKwargs map[string]any    `json:"chat_template_kwargs"`
}

type respTextConfig struct {
	Format json.RawMessage `json:"format"`
}

type respReasoning struct {
	Effort  *string `json:"effort"`
	Summary *string `json:"summary"`
}

func (r *responsesRequest) common() *sampling { return &r.sampling }

// includeLogprobs is the include value that asks for output_text's
// log-probabilities.
const includeLogprobs = "message.output_text.logprobs"

// check refuses what this server cannot do, naming the parameter.
func (r *responsesRequest) check() *apiError {
	switch {
	case isNull(r.Input):
		return invalid("input", "input is required: a string or a list of input items")
	case r.Truncation != nil && *r.Truncation != "disabled":
		return invalid("truncation", "truncation %q is not supported (only disabled)", *r.Truncation)
	case r.N != nil && *r.N != 1:
		return invalid("n", "n is not supported by /v1/responses (one output a request)")
	case r.MaxTokens != nil || r.MaxCompletionTokens != nil:
		return invalid("max_output_tokens", "use max_output_tokens on /v1/responses (not max_tokens or max_completion_tokens)")
	case !isNull(r.ResponseFormat):
		return invalid("text.format", "use text.format on /v1/responses (not response_format)")
	case r.TopLogprobs != nil && (*r.TopLogprobs < 0 || *r.TopLogprobs > maxTopLogprobs):
		return invalid("top_logprobs", "top_logprobs must be in [0, %d], got %d", maxTopLogprobs, *r.TopLogprobs)
	case r.MaxOutputTokens != nil && *r.MaxOutputTokens < 1:
		return invalid("max_output_tokens", "max_output_tokens must be at least 1, got %d", *r.MaxOutputTokens)
	}
	if r.Reasoning != nil && r.Reasoning.Effort != nil {
		if e := *r.Reasoning.Effort; e != "low" && e != "medium" && e != "high" {
			return invalid("reasoning.effort", "reasoning.effort must be low, medium or high, got %q", e)
		}
	}
	return nil
}

// respInputItem is one item of input: a message (type "message" or no
// type), a function call of an earlier turn, a function call's output, or
// earlier reasoning.
type respInputItem struct {
	ID        string          `json:"id"` // (given or, once stored, made)
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments *string         `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Summary   []respPartIn    `json:"summary"`
}

type respPartIn struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// respText is content given as a string or a list of text parts (joined
// by newlines); what names it in errors.
func respText(raw json.RawMessage, what string, kinds ...string) (string, *apiError) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []respPartIn
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", invalid("input", "%s must be a string or a list of content parts", what)
	}
	var b strings.Builder
	for j, p := range parts {
		if !slices.Contains(kinds, p.Type) {
			return "", invalid("input", "%s[%d].type %q is not supported (only %s)", what, j, p.Type, strings.Join(kinds, ", "))
		}
		if p.Text == nil {
			return "", invalid("input", "%s[%d].text is required", what, j)
		}
		if j > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}

// toChat translates the request into a chat request: instructions as a
// system message, input items as messages, tools and tool_choice into
// chat's shapes, text.format into response_format.
func (r *responsesRequest) toChat(history []respInputItem) (*chatRequest, []respInputItem, *apiError) {
	cr := &chatRequest{sampling: r.sampling}
	cr.MaxCompletionTokens = r.MaxOutputTokens
	cr.ParallelToolCalls = r.ParallelToolCalls
	cr.IncludeReasoning = r.IncludeReasoning
	cr.ChatTemplateKwargs = r.ChatTemplateKwargs
	if r.Reasoning != nil {
		cr.ReasoningEffort = r.Reasoning.Effort
	}
	if slices.Contains(r.Include, includeLogprobs) {
		t := true
		cr.Logprobs, cr.TopLogprobs = &t, r.TopLogprobs
	}
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	if r.Instructions != nil && *r.Instructions != "" {
		cr.Messages = append(cr.Messages, chatMessage{Role: "system", Content: str(*r.Instructions)})
	}
	var items []respInputItem
	var text string
	if json.Unmarshal(r.Input, &text) == nil {
		items = []respInputItem{{Role: "user", Content: str(text)}}
	} else {
		if err := json.Unmarshal(r.Input, &items); err != nil {
			return nil, nil, invalid("input", "input must be a string or a list of input items")
		}
		if len(items) == 0 {
			return nil, nil, invalid("input", "input must not be an empty list")
		}
	}
	{
		reasoning := "" // an earlier turn's reasoning, for the assistant message after it
		all := append(slices.Clip(history), items...)
		for i, it := range all {
			where := "input[" + itoa(i-len(history)) + "]"
			if i < len(history) {
				where = "the stored conversation's item " + itoa(i)
			}
			switch it.Type {
			case "", "message":
				if it.Role != "user" && it.Role != "system" && it.Role != "developer" && it.Role != "assistant" {
					return nil, nil, invalid("input", "%s.role must be user, system, developer or assistant; got %q", where, it.Role)
				}
				kinds := []string{"input_text", "text"}
				if it.Role == "assistant" {
					kinds = []string{"output_text", "text"}
				}
				c, e := respText(it.Content, where+".content", kinds...)
				if e != nil {
					return nil, nil, e
				}
				m := chatMessage{Role: it.Role, Content: str(c)}
				if it.Role == "assistant" {
					m.ReasoningContent, reasoning = reasoning, ""
				}
				cr.Messages = append(cr.Messages, m)
			case "function_call":
				if it.Name == "" || it.CallID == "" || it.Arguments == nil {
					return nil, nil, invalid("input", "%s: a function_call needs call_id, name and arguments", where)
				}
				// Calls join the assistant turn before them (its text, if any).
				if n := len(cr.Messages); n == 0 || cr.Messages[n-1].Role != "assistant" {
					cr.Messages = append(cr.Messages, chatMessage{Role: "assistant", Content: json.RawMessage("null"), ReasoningContent: reasoning})
					reasoning = ""
				}
				var tc toolCall
				tc.ID, tc.Type = it.CallID, "function"
				tc.Function.Name, tc.Function.Arguments = it.Name, str(*it.Arguments)
				last := &cr.Messages[len(cr.Messages)-1]
				last.ToolCalls = append(last.ToolCalls, tc)
			case "function_call_output":
				if it.CallID == "" || isNull(it.Output) {
					return nil, nil, invalid("input", "%s: a function_call_output needs call_id and output", where)
				}
				out, e := respText(it.Output, where+".output", "input_text", "output_text", "text")
				if e != nil {
					return nil, nil, e
				}
				cr.Messages = append(cr.Messages, chatMessage{Role: "tool", ToolCallID: it.CallID, Content: str(out)})
			case "reasoning":
				var parts []respPartIn
				if !isNull(it.Content) {
					if err := json.Unmarshal(it.Content, &parts); err != nil {
						return nil, nil, invalid("input", "%s.content must be a list of reasoning_text parts", where)
					}
				}
				if len(parts) == 0 {
					parts = it.Summary
				}
				for _, p := range parts {
					if p.Text != nil {
						reasoning += *p.Text
					}
				}
			default:
				return nil, nil, invalid("input", "%s.type %q is not supported (message, function_call, function_call_output, reasoning)", where, it.Type)
			}
		}
	}
	if len(r.Tools) > 0 {
		tools := make([]json.RawMessage, len(r.Tools))
		for i, raw := range r.Tools {
			var t struct {
				Type        string          `json:"type"`
				Name        string          `json:"name"`
				Description *string         `json:"description"`
				Parameters  json.RawMessage `json:"parameters"`
				Strict      *bool           `json:"strict"`
			}
			if err := json.Unmarshal(raw, &t); err != nil {
				return nil, nil, invalid("tools", "tools[%d] must be an object", i)
			}
			if t.Type != "function" {
				return nil, nil, invalid("tools", "tools[%d].type %q is not supported (only function tools)", i, t.Type)
			}
			fn := map[string]any{"name": t.Name}
			if t.Description != nil {
				fn["description"] = *t.Description
			}
			if !isNull(t.Parameters) {
				fn["parameters"] = t.Parameters
			}
			if t.Strict != nil {
				fn["strict"] = *t.Strict
			}
			tools[i], _ = json.Marshal(map[string]any{"type": "function", "function": fn})
		}
		cr.Tools, _ = json.Marshal(tools)
	}
	if !isNull(r.ToolChoice) {
		var mode string
		var named struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		switch {
		case json.Unmarshal(r.ToolChoice, &mode) == nil:
			cr.ToolChoice = r.ToolChoice
		case json.Unmarshal(r.ToolChoice, &named) == nil && named.Type == "function":
			cr.ToolChoice, _ = json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": named.Name}})
		default:
			return nil, nil, invalid("tool_choice", `tool_choice must be "none", "auto", "required" or {"type": "function", "name": …}`)
		}
	}
	if r.Text != nil && !isNull(r.Text.Format) {
		var f struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Schema      json.RawMessage `json:"schema"`
			Strict      *bool           `json:"strict"`
			Description *string         `json:"description"`
		}
		if err := json.Unmarshal(r.Text.Format, &f); err != nil {
			return nil, nil, invalid("text.format", "text.format must be an object")
		}
		switch f.Type {
		case "text":
		case "json_object":
			cr.ResponseFormat = json.RawMessage(`{"type": "json_object"}`)
		case "json_schema":
			cr.ResponseFormat, _ = json.Marshal(map[string]any{"type": "json_schema",
				"json_schema": map[string]any{"name": f.Name, "schema": f.Schema, "strict": f.Strict}})
		default:
			return nil, nil, invalid("text.format", "text.format.type must be text, json_object or json_schema, got %q", f.Type)
		}
	}
	if e := cr.check(); e != nil {
		return nil, nil, e
	}
	return cr, items, nil
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// respRename maps chat's parameter names in an error to the Responses API's.
var respRename = strings.NewReplacer("max_completion_tokens", "max_output_tokens", "response_format", "text.format",
	"messages", "input")

// asResponses is e with the Responses API's parameter names (a copy: e may
// be shared).
func asResponses(e *apiError) *apiError {
	c := *e
	c.Param, c.Message = respRename.Replace(c.Param), respRename.Replace(c.Message)
	return &c
}

// ---- the response ----

// responseJS is a Response object, in OpenAI's field order.
type responseJS struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"` // "response"
	CreatedAt          int64             `json:"created_at"`
	Status             string            `json:"status"` // in_progress, completed, incomplete, failed
	CompletedAt        *int64            `json:"completed_at"`
	Error              *respErrorJS      `json:"error"`
	IncompleteDetails  *respIncomplete   `json:"incomplete_details"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Model              string            `json:"model"`
	Output             []any             `json:"output"`
	ParallelToolCalls  bool              `json:"parallel_tool_calls"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Reasoning          respReasoning     `json:"reasoning"`
	Store              bool              `json:"store"`
	Background         bool              `json:"background"`
	Temperature        float32           `json:"temperature"`
	Text               respTextJS        `json:"text"`
	ToolChoice         json.RawMessage   `json:"tool_choice"`
	Tools              []json.RawMessage `json:"tools"`
	TopP               float32           `json:"top_p"`
	Truncation         string            `json:"truncation"`
	Usage              *respUsageJS      `json:"usage"`
	Metadata           map[string]string `json:"metadata"`
}

type respErrorJS struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type respIncomplete struct {
	Reason string `json:"reason"` // max_output_tokens
}

type respTextJS struct {
	Format json.RawMessage `json:"format"`
}

type respUsageJS struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

// Output items.

type respMessageJS struct {
	Type    string          `json:"type"` // "message"
	ID      string          `json:"id"`
	Status  string          `json:"status"`
	Role    string          `json:"role"` // "assistant"
	Content []respOutTextJS `json:"content"`
}

type respOutTextJS struct {
	Type        string             `json:"type"` // "output_text"
	Text        string             `json:"text"`
	Annotations []any              `json:"annotations"`
	Logprobs    []chatTokenLogprob `json:"logprobs"`
}

type respReasoningJS struct {
	Type    string             `json:"type"` // "reasoning"
	ID      string             `json:"id"`
	Status  string             `json:"status"`
	Summary []any              `json:"summary"`
	Content []respReasonTextJS `json:"content"`
}

type respReasonTextJS struct {
	Type string `json:"type"` // "reasoning_text"
	Text string `json:"text"`
}

type respCallJS struct {
	Type      string `json:"type"` // "function_call"
	ID        string `json:"id"`
	Status    string `json:"status"`
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// respID is a fresh id with prefix (resp_, msg_, rs_, fc_).
func respID(prefix string) string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// respOut builds a response's output items from its choice's text as it
// arrives, and — streaming — sends the events that announce them.
type respOut struct {
	emit       func(typ string, fields map[string]any) error // nil: not streaming
	items      []any
	reasoning  *respReasoningJS // open reasoning item
	message    *respMessageJS   // open message item
	rIdx, mIdx int              // their output indexes
	text       strings.Builder
	reasonBuf  strings.Builder
	lps        []chatTokenLogprob
	reasonTok  int // output tokens while only reasoning had come
	answered   bool
}

func (o *respOut) send(typ string, fields map[string]any) error {
	if o.emit == nil {
		return nil
	}
	return o.emit(typ, fields)
}

// openReasoning starts the reasoning item.
func (o *respOut) openReasoning() error {
	o.reasoning = &respReasoningJS{Type: "reasoning", ID: respID("rs_"), Status: "in_progress", Summary: []any{}, Content: []respReasonTextJS{}}
	o.items = append(o.items, o.reasoning)
	o.rIdx = len(o.items) - 1
	o.reasonBuf.Reset()
	idx := o.rIdx
	if err := o.send("response.output_item.added", map[string]any{"output_index": idx, "item": o.reasoning}); err != nil {
		return err
	}
	return o.send("response.content_part.added", map[string]any{"item_id": o.reasoning.ID, "output_index": idx, "content_index": 0,
		"part": respReasonTextJS{Type: "reasoning_text"}})
}

// closeReasoning ends the open reasoning item.
func (o *respOut) closeReasoning() error {
	r := o.reasoning
	if r == nil {
		return nil
	}
	o.reasoning = nil
	idx := o.rIdx
	part := respReasonTextJS{Type: "reasoning_text", Text: o.reasonBuf.String()}
	r.Content, r.Status = []respReasonTextJS{part}, "completed"
	if err := o.send("response.reasoning_text.done", map[string]any{"item_id": r.ID, "output_index": idx, "content_index": 0, "text": part.Text}); err != nil {
		return err
	}
	if err := o.send("response.content_part.done", map[string]any{"item_id": r.ID, "output_index": idx, "content_index": 0, "part": part}); err != nil {
		return err
	}
	return o.send("response.output_item.done", map[string]any{"output_index": idx, "item": r})
}

// openMessage starts the assistant message item.
func (o *respOut) openMessage() error {
	if err := o.closeReasoning(); err != nil {
		return err
	}
	o.message = &respMessageJS{Type: "message", ID: respID("msg_"), Status: "in_progress", Role: "assistant", Content: []respOutTextJS{}}
	o.items = append(o.items, o.message)
	o.mIdx = len(o.items) - 1
	idx := o.mIdx
	if err := o.send("response.output_item.added", map[string]any{"output_index": idx, "item": o.message}); err != nil {
		return err
	}
	return o.send("response.content_part.added", map[string]any{"item_id": o.message.ID, "output_index": idx, "content_index": 0,
		"part": respOutTextJS{Type: "output_text", Annotations: []any{}, Logprobs: []chatTokenLogprob{}}})
}

// add takes one event's share: reasoning text, answer text, the tokens'
// log-probabilities (when asked for) and how many tokens it carried.
func (o *respOut) add(reasoning, text string, lps []chatTokenLogprob, tokens int) error {
	if reasoning != "" {
		if o.reasoning == nil {
			if err := o.openReasoning(); err != nil {
				return err
			}
		}
		o.reasonBuf.WriteString(reasoning)
		if err := o.send("response.reasoning_text.delta", map[string]any{"item_id": o.reasoning.ID, "output_index": o.rIdx, "content_index": 0, "delta": reasoning}); err != nil {
			return err
		}
	}
	if !o.answered && text == "" && (reasoning != "" || o.reasoning != nil) {
		o.reasonTok += tokens
	}
	if lps != nil {
		o.lps = append(o.lps, lps...)
	}
	if text == "" {
		return nil
	}
	o.answered = true
	if o.message == nil {
		if err := o.openMessage(); err != nil {
			return err
		}
	}
	o.text.WriteString(text)
	if lps == nil {
		lps = []chatTokenLogprob{}
	}
	return o.send("response.output_text.delta", map[string]any{"item_id": o.message.ID, "output_index": o.mIdx, "content_index": 0,
		"delta": text, "logprobs": lps})
}

// finish closes the items: the message (made, empty, when there is
// neither text nor a call), then one item a call.
func (o *respOut) finish(calls []toolCallJS, status string, withLogprobs bool) error {
	if o.message == nil && (calls == nil || o.text.Len() > 0) {
		if err := o.openMessage(); err != nil {
			return err
		}
	}
	if err := o.closeReasoning(); err != nil {
		return err
	}
	if m := o.message; m != nil {
		idx := o.mIdx
		part := respOutTextJS{Type: "output_text", Text: o.text.String(), Annotations: []any{}, Logprobs: []chatTokenLogprob{}}
		if withLogprobs && o.lps != nil {
			part.Logprobs = o.lps
		}
		m.Content, m.Status = []respOutTextJS{part}, status
		if err := o.send("response.output_text.done", map[string]any{"item_id": m.ID, "output_index": idx, "content_index": 0,
			"text": part.Text, "logprobs": part.Logprobs}); err != nil {
			return err
		}
		if err := o.send("response.content_part.done", map[string]any{"item_id": m.ID, "output_index": idx, "content_index": 0, "part": part}); err != nil {
			return err
		}
		if err := o.send("response.output_item.done", map[string]any{"output_index": idx, "item": m}); err != nil {
			return err
		}
	}
	for _, c := range calls {
		fc := &respCallJS{Type: "function_call", ID: respID("fc_"), Status: "in_progress", CallID: c.ID, Name: c.Function.Name}
		o.items = append(o.items, fc)
		idx := len(o.items) - 1
		if err := o.send("response.output_item.added", map[string]any{"output_index": idx, "item": *fc}); err != nil {
			return err
		}
		if err := o.send("response.function_call_arguments.delta", map[string]any{"item_id": fc.ID, "output_index": idx, "delta": c.Function.Arguments}); err != nil {
			return err
		}
		fc.Arguments, fc.Status = c.Function.Arguments, "completed"
		if err := o.send("response.function_call_arguments.done", map[string]any{"item_id": fc.ID, "output_index": idx,
			"name": fc.Name, "arguments": fc.Arguments}); err != nil {
			return err
		}
		if err := o.send("response.output_item.done", map[string]any{"output_index": idx, "item": fc}); err != nil {
			return err
		}
	}
	return nil
}

// responses serves POST /v1/responses.
func (s *Server) responses(c *gin.Context) {
	k := s.newCall(c, "responses", "resp_")
	background := false // (a background response logs its line when it ends)
	defer func() {
		if !background {
			k.done()
		}
	}()
	req, ok := begin[responsesRequest](s, c, k)
	if !ok {
		return
	}
	var history []respInputItem
	var prev *storedResp
	if id := req.PreviousResponseID; id != nil {
		var ok bool
		if prev, ok = s.store.Get(*id); !ok {
			e := errNoResponse(*id, s.opts.ResponsesStore)
			e.Status, e.Param, e.Code = http.StatusBadRequest, "previous_response_id", "previous_response_not_found"
			k.fail(c, e)
			return
		}
		if prev.running() {
			k.fail(c, invalid("previous_response_id", "response %s is still in progress; continue it once it has finished", *id))
			return
		}
		history = prev.history()
	}
	cr, items, e := req.toChat(history)
	if e != nil {
		k.fail(c, asResponses(e))
		return
	}
	store := s.opts.ResponsesStore > 0 && (req.Store == nil || *req.Store)
	bg := req.Background != nil && *req.Background
	switch {
	case bg && !store:
		k.fail(c, invalid("background", "a background response needs the response store (store not false, and the server's responses_store above 0)"))
		return
	case bg && req.streaming():
		k.fail(c, invalid("background", "a background response cannot be streamed; poll GET /v1/responses/{id}"))
		return
	}
	ctx := c.Request.Context()
	if bg {
		ctx = context.Background() // (it outlives the request; POST …/cancel ends it)
	}
	run, e := s.startChat(ctx, k, cr)
	if e != nil {
		k.fail(c, asResponses(e))
		return
	}
	resp := s.newResponse(k, req, &run.sp)
	resp.Store, resp.Background = store, bg
	if bg {
		resp.Status = "queued"
		body, _ := encodeJSON(resp)
		entry := newStored(body, prev, withIDs(items), nil)
		entry.cancel = run.cancel
		s.store.Add(resp.ID, entry)
		background = true
		c.Data(http.StatusOK, "application/json", body)
		go s.background(k, run, resp, entry) // (resp is the goroutine's from here)
		return
	}
	defer run.cancel()
	o := &respOut{}
	seq := 0
	var out *sse
	if req.streaming() {
		out = startSSE(c)
		o.emit = func(typ string, fields map[string]any) error {
			fields["type"], fields["sequence_number"] = typ, seq
			seq++
			return out.event(typ, fields)
		}
		for _, typ := range []string{"response.created", "response.in_progress"} {
			if err := o.emit(typ, map[string]any{"response": resp}); err != nil {
				run.cancel()
				k.finishGeneration(c, err)
				return
			}
		}
	}
	if err := s.generateResponse(k, run, resp, o); err != nil {
		k.finishGeneration(c, err)
		if out != nil && k.status != statusClientClosed {
			ae := runError(err)
			code := "server_error"
			if ae != errInternal {
				code = "invalid_request_error"
			}
			_ = o.emit("error", map[string]any{"code": code, "message": ae.Message, "param": nil})
		}
		return
	}
	if store {
		body, _ := encodeJSON(resp)
		s.store.Add(resp.ID, newStored(body, prev, withIDs(items), outputItems(o.items)))
	}
	if out == nil {
		writeJSON(c, http.StatusOK, resp)
		return
	}
	typ := "response.completed"
	if resp.Status == "incomplete" {
		typ = "response.incomplete"
	}
	if err := o.emit(typ, map[string]any{"response": resp}); err != nil {
		k.finishGeneration(c, err)
	}
}

// generateResponse runs a response's generation through o (its items, and
// its events when streaming) and fills resp's output, status and usage.
func (s *Server) generateResponse(k *call, run *chatRun, resp *responseJS, o *respOut) error {
	withLogprobs := run.sp.Logprobs
	co := run.newOut()
	var finish string
	usage, err := k.run(run.ctx, run.cancel, run.chans, 1, run.lens, func(_ int, ev *engine.Event) error {
		reasoning, text := co.push(ev.Text)
		var calls []toolCallJS
		if ev.FinishReason != "" {
			r, rest, cl := co.finish()
			reasoning, text, calls = reasoning+r, text+rest, cl
		}
		if !run.withReasoning {
			reasoning = ""
		}
		var lps []chatTokenLogprob
		if withLogprobs && len(ev.Logprobs) > 0 {
			var l chatLogprobs
			l.add(ev.Logprobs)
			lps = l.Content
		}
		if err := o.add(reasoning, text, lps, len(ev.TokenIDs)); err != nil {
			return err
		}
		if ev.FinishReason == "" {
			return nil
		}
		finish = ev.FinishReason
		status := "completed"
		if finish == engine.FinishLength {
			status = "incomplete"
		}
		return o.finish(calls, status, withLogprobs)
	})
	if err != nil {
		return err
	}
	resp.Output = o.items
	resp.Status = "completed"
	now := time.Now().Unix()
	resp.CompletedAt = &now
	if finish == engine.FinishLength {
		resp.Status, resp.CompletedAt = "incomplete", nil
		resp.IncompleteDetails = &respIncomplete{Reason: "max_output_tokens"}
	}
	u := &respUsageJS{InputTokens: usage.PromptTokens, OutputTokens: usage.CompletionTokens, TotalTokens: usage.PromptTokens + usage.CompletionTokens}
	u.InputTokensDetails.CachedTokens = usage.CachedTokens
	u.OutputTokensDetails.ReasoningTokens = o.reasonTok
	resp.Usage = u
	return nil
}

// background runs a background response to its end and keeps the result
// in its store entry: completed or incomplete with its output, cancelled
// (POST …/cancel), or failed with the reason.
func (s *Server) background(k *call, run *chatRun, resp *responseJS, entry *storedResp) {
	defer k.done()
	defer run.cancel()
	o := &respOut{}
	err := s.generateResponse(k, run, resp, o)
	switch {
	case entry.wasCancelled(): // (the engine ends a cancelled request with aborts, not an error)
		resp.Status, resp.Output, resp.CompletedAt, resp.IncompleteDetails = "cancelled", o.items, nil, nil
		k.status, k.errMsg = statusClientClosed, "cancelled"
	case err == nil:
		k.status = http.StatusOK
	case errors.Is(err, errClientGone):
		resp.Status, resp.Output = "cancelled", o.items
		k.status, k.errMsg = statusClientClosed, "cancelled"
	default:
		ae := runError(err)
		resp.Status, resp.Output = "failed", o.items
		resp.Error = &respErrorJS{Code: "server_error", Message: ae.Message}
		if ae != errInternal {
			resp.Error.Code = "invalid_prompt"
		}
		k.status, k.errMsg, k.cause = ae.Status, ae.Message, err
	}
	body, _ := encodeJSON(resp)
	entry.finish(body, outputItems(o.items))
}

// newResponse is the response object before any output: what the request
// asked for, with the sampling it runs under.
func (s *Server) newResponse(k *call, req *responsesRequest, sp *engine.SamplingParams) *responseJS {
	r := &responseJS{ID: k.id, Object: "response", CreatedAt: k.start.Unix(), Status: "in_progress",
		Instructions: req.Instructions, MaxOutputTokens: req.MaxOutputTokens, Model: s.gen.ModelName(),
		Output: []any{}, ParallelToolCalls: req.ParallelToolCalls == nil || *req.ParallelToolCalls, PreviousResponseID: req.PreviousResponseID,
		Temperature: sp.Temperature, TopP: sp.TopP, Truncation: "disabled", Tools: req.Tools,
		ToolChoice: req.ToolChoice, Metadata: req.Metadata}
	if r.Tools == nil {
		r.Tools = []json.RawMessage{}
	}
	if isNull(r.ToolChoice) {
		r.ToolChoice = json.RawMessage(`"auto"`)
	}
	if r.Metadata == nil {
		r.Metadata = map[string]string{}
	}
	r.Text.Format = json.RawMessage(`{"type": "text"}`)
	if req.Text != nil && !isNull(req.Text.Format) {
		r.Text.Format = req.Text.Format
	}
	if req.Reasoning != nil {
		r.Reasoning = *req.Reasoning
	}
	return r
}
