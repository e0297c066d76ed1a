package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/mkserve/mkserve/engine"
)

// Anthropic's Messages API (POST /v1/messages), so that clients written
// for it (agents that take a base URL, Anthropic's SDKs) talk to mkserve.
// A request is turned into a chat completion — system, messages of text,
// tool_use, tool_result and thinking blocks, tools with input_schema,
// tool_choice (auto, any, tool, none), max_tokens, stop_sequences,
// temperature, top_p, top_k, thinking, output_config (a JSON schema the
// reply must match; effort as reasoning_effort) — runs through the same checks and
// engine, and the reply comes back as content blocks (thinking, text,
// tool_use), whole or streamed as Anthropic's named events
// (message_start … message_stop). Errors are Anthropic's
// {"type": "error", "error": {"type", "message"}}. Images and documents
// are refused (text models).

// anthropicBlock is one content block of a message.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`          // tool_use
	Name      string          `json:"name,omitempty"`        // tool_use
	Input     json.RawMessage `json:"input,omitempty"`       // tool_use: an object
	ToolUseID string          `json:"tool_use_id,omitempty"` // tool_result
	Content   json.RawMessage `json:"content,omitempty"`     // tool_result: a string or text blocks
	Thinking  string          `json:"thinking,omitempty"`    // thinking
	Signature string          `json:"signature,omitempty"`   // thinking (kept empty)
}

// anthropicContent is a message's content: a string or a list of blocks.
type anthropicContent []anthropicBlock

func (c *anthropicContent) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*c = anthropicContent{{Type: "text", Text: s}}
		return nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(b, &blocks); err != nil {
		return errors.New("content must be a string or a list of content blocks")
	}
	*c = blocks
	return nil
}

type anthropicRequest struct {
	Model    string            `json:"model"`
	System   *anthropicContent `json:"system"`
	Messages []struct {
		Role    string           `json:"role"`
		Content anthropicContent `json:"content"`
	} `json:"messages"`
	MaxTokens     *int                   `json:"max_tokens"`
	StopSequences []string               `json:"stop_sequences"`
	Temperature   *float64               `json:"temperature"`
	TopP          *float64               `json:"top_p"`
	TopK          *int                   `json:"top_k"`
	Stream        *bool                  `json:"stream"`
	Tools         []anthropicTool        `json:"tools"`
	ToolChoice    *anthropicToolChoice   `json:"tool_choice"`
	Thinking      *struct{ Type string } `json:"thinking"`
	OutputConfig  *struct {
		Effort string `json:"effort"` // low, medium, high, xhigh, max
		Format *struct {
			Type   string          `json:"type"` // json_schema
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
	Metadata json.RawMessage `json:"metadata"` // accepted and ignored
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

type anthropicToolChoice struct {
	Type string `json:"type"` // auto, any, tool, none
	Name string `json:"name"` // tool
}

// text is the text of blocks that must all be text (a system prompt, a
// tool result's content).
func blocksText(field string, blocks anthropicContent) (string, *apiError) {
	var b strings.Builder
	for j, bl := range blocks {
		if bl.Type != "text" {
			return "", invalid(field, "%s[%d]: a %q block is not allowed here (text only)", field, j, bl.Type)
		}
		if j > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(bl.Text)
	}
	return b.String(), nil
}

// chatRequest is the request as a chat completion.
func (r *anthropicRequest) chatRequest() (*chatRequest, *apiError) {
	req := &chatRequest{sampling: sampling{Model: r.Model, MaxTokens: r.MaxTokens, Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK}}
	if len(r.StopSequences) > 0 {
		req.Stop, _ = json.Marshal(r.StopSequences)
	}
	if r.Thinking != nil {
		on := r.Thinking.Type == "enabled"
		req.ChatTemplateKwargs = map[string]any{"enable_thinking": on}
		req.IncludeReasoning = &on
	}
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	if oc := r.OutputConfig; oc != nil {
		if f := oc.Format; f != nil {
			if f.Type != "json_schema" || len(f.Schema) == 0 {
				return nil, invalid("output_config.format", "output_config.format must be {\"type\": \"json_schema\", \"schema\": {…}}")
			}
			req.ResponseFormat, _ = json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "output", "schema": f.Schema}})
		}
		switch oc.Effort {
		case "":
		case "low", "medium", "high":
			req.ReasoningEffort = &oc.Effort
		case "xhigh", "max":
			high := "high"
			req.ReasoningEffort = &high
		default:
			return nil, invalid("output_config.effort", "output_config.effort must be low, medium, high, xhigh or max, got %q", oc.Effort)
		}
	}
	if r.System != nil {
		text, e := blocksText("system", *r.System)
		if e != nil {
			return nil, e
		}
		req.Messages = append(req.Messages, chatMessage{Role: "system", Content: str(text)})
	}
	for i, m := range r.Messages {
		if m.Role != "user" && m.Role != "assistant" {
			return nil, invalid("messages", "messages[%d].role must be user or assistant, got %q", i, m.Role)
		}
		var text, thinking strings.Builder
		var calls []toolCall
		flush := func() {
			if text.Len() > 0 || (m.Role == "assistant" && (len(calls) > 0 || thinking.Len() > 0)) {
				cm := chatMessage{Role: m.Role, Content: str(text.String()), ToolCalls: calls, ReasoningContent: thinking.String()}
				if text.Len() == 0 && len(calls) > 0 {
					cm.Content = json.RawMessage("null")
				}
				req.Messages = append(req.Messages, cm)
			}
			text.Reset()
			thinking.Reset()
			calls = nil
		}
		for j, bl := range m.Content {
			switch {
			case bl.Type == "text":
				if text.Len() > 0 {
					text.WriteByte('\n')
				}
				text.WriteString(bl.Text)
			case bl.Type == "thinking" && m.Role == "assistant":
				thinking.WriteString(bl.Thinking)
			case bl.Type == "redacted_thinking" && m.Role == "assistant":
			case bl.Type == "tool_use" && m.Role == "assistant":
				var c toolCall
				c.ID, c.Type, c.Function.Name, c.Function.Arguments = bl.ID, "function", bl.Name, bl.Input
				calls = append(calls, c)
			case bl.Type == "tool_result" && m.Role == "user":
				flush() // (text before the result stays before it)
				var blocks anthropicContent
				content := ""
				if len(bl.Content) > 0 && !isNull(bl.Content) {
					if err := json.Unmarshal(bl.Content, &blocks); err != nil {
						return nil, invalid("messages", "messages[%d].content[%d].content: %v", i, j, err)
					}
					var e *apiError
					if content, e = blocksText("messages", blocks); e != nil {
						return nil, e
					}
				}
				req.Messages = append(req.Messages, chatMessage{Role: "tool", ToolCallID: bl.ToolUseID, Content: str(content)})
			default:
				return nil, invalid("messages", "messages[%d].content[%d]: a %q block is not supported in a %s message (text models take text, tool_use, tool_result and thinking)", i, j, bl.Type, m.Role)
			}
		}
		flush()
	}
	if len(r.Tools) > 0 {
		tools := make([]map[string]any, len(r.Tools))
		for i, t := range r.Tools {
			fn := map[string]any{"name": t.Name, "description": t.Description}
			if len(t.InputSchema) > 0 {
				fn["parameters"] = t.InputSchema
			}
			tools[i] = map[string]any{"type": "function", "function": fn}
		}
		req.Tools, _ = json.Marshal(tools)
	}
	if tc := r.ToolChoice; tc != nil {
		switch tc.Type {
		case "auto", "none":
			req.ToolChoice = str(tc.Type)
		case "any":
			req.ToolChoice = str("required")
		case "tool":
			req.ToolChoice, _ = json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}})
		default:
			return nil, invalid("tool_choice", "tool_choice.type must be auto, any, tool or none, got %q", tc.Type)
		}
	}
	return req, nil
}

// anthropicError is an error in Anthropic's shape (call.errBody).
func anthropicError(e *apiError) any {
	typ := "invalid_request_error"
	switch {
	case e.Status == http.StatusNotFound:
		typ = "not_found_error"
	case e.Status == http.StatusUnauthorized:
		typ = "authentication_error"
	case e.Status == http.StatusTooManyRequests:
		typ = "rate_limit_error"
	case e.Status == http.StatusRequestEntityTooLarge:
		typ = "request_too_large"
	case e.Status == http.StatusServiceUnavailable:
		typ = "overloaded_error"
	case e.Status >= 500:
		typ = "api_error"
	}
	return map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": e.Message}}
}

// anthropicStop is the stop reason of a finish reason.
func anthropicStop(reason string, calls bool) string {
	switch {
	case calls:
		return "tool_use"
	case reason == engine.FinishLength:
		return "max_tokens"
	}
	return "end_turn"
}

// anthropicMessages answers POST /v1/messages.
func (s *Server) anthropicMessages(c *gin.Context) {
	k := s.newCall(c, "messages", "msg_")
	k.errBody = anthropicError
	defer k.done()
	areq, req, ok := s.anthropicRequest(c, k)
	if !ok {
		return
	}
	stream := areq.Stream != nil && *areq.Stream
	k.stream = stream
	run, e := s.startChat(c.Request.Context(), k, req)
	if e != nil {
		k.fail(c, e)
		return
	}
	defer run.cancel()
	model := s.gen.ModelName()
	out := run.newOut()
	usage := map[string]int{"input_tokens": run.lens[0], "output_tokens": 0}
	msg := func(content []anthropicBlock, stop *string) map[string]any {
		return map[string]any{"id": k.id, "type": "message", "role": "assistant", "model": model, "content": content,
			"stop_reason": stop, "stop_sequence": nil, "usage": usage}
	}
	var reason string
	var calls []toolCallJS
	if !stream {
		var thinking, text strings.Builder
		u, err := k.run(run.ctx, run.cancel, run.chans, 1, run.lens, func(_ int, ev *engine.Event) error {
			r, t := out.push(ev.Text)
			if ev.FinishReason != "" {
				r2, rest, cl := out.finish()
				r, t, calls, reason = r+r2, t+rest, cl, ev.FinishReason
			}
			thinking.WriteString(r)
			text.WriteString(t)
			return nil
		})
		if err != nil {
			k.finishGeneration(c, err)
			return
		}
		content := []anthropicBlock{}
		if thinking.Len() > 0 && run.withReasoning {
			content = append(content, anthropicBlock{Type: "thinking", Thinking: thinking.String()})
		}
		t := text.String()
		if len(calls) > 0 {
			t = strings.TrimSpace(t) // (the text around the calls, as chat completions trim it)
		}
		if t != "" || len(calls) == 0 {
			content = append(content, anthropicBlock{Type: "text", Text: t})
		}
		content = append(content, anthropicToolUses(calls)...)
		usage["output_tokens"] = u.CompletionTokens
		stop := anthropicStop(reason, len(calls) > 0)
		writeJSON(c, http.StatusOK, msg(content, &stop))
		return
	}

	sse := startSSE(c)
	index, open := 0, "" // the content block being streamed and its type
	send := func(typ string, v map[string]any) error {
		v["type"] = typ
		return sse.event(typ, v)
	}
	closeBlock := func() error {
		if open == "" {
			return nil
		}
		open = ""
		index++
		return send("content_block_stop", map[string]any{"index": index - 1})
	}
	block := func(typ string, start anthropicBlock, delta map[string]any) error {
		if open != typ {
			if err := closeBlock(); err != nil {
				return err
			}
			open = typ
			if err := send("content_block_start", map[string]any{"index": index, "content_block": start}); err != nil {
				return err
			}
		}
		return send("content_block_delta", map[string]any{"index": index, "delta": delta})
	}
	if err := send("message_start", map[string]any{"message": msg([]anthropicBlock{}, nil)}); err != nil {
		k.finishGeneration(c, errClientGone)
		return
	}
	u, err := k.run(run.ctx, run.cancel, run.chans, 1, run.lens, func(_ int, ev *engine.Event) error {
		r, t := out.push(ev.Text)
		if ev.FinishReason != "" {
			r2, rest, cl := out.finish()
			r, t, calls, reason = r+r2, t+rest, cl, ev.FinishReason
			if len(calls) > 0 {
				t = strings.TrimRight(t, " \t\r\n") // (the text before the calls ends trimmed)
			}
		}
		if r != "" && run.withReasoning {
			if err := block("thinking", anthropicBlock{Type: "thinking", Thinking: ""}, map[string]any{"type": "thinking_delta", "thinking": r}); err != nil {
				return err
			}
		}
		if t != "" {
			if err := block("text", anthropicBlock{Type: "text", Text: ""}, map[string]any{"type": "text_delta", "text": t}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		k.finishGeneration(c, err) // (the stream has started: recorded only)
		return
	}
	for _, tu := range anthropicToolUses(calls) {
		if err := closeBlock(); err != nil { // (each call its own block)
			k.finishGeneration(c, err)
			return
		}
		if err := block("tool_use", anthropicBlock{Type: "tool_use", ID: tu.ID, Name: tu.Name, Input: json.RawMessage("{}")},
			map[string]any{"type": "input_json_delta", "partial_json": string(tu.Input)}); err != nil {
			k.finishGeneration(c, err)
			return
		}
	}
	if open == "" && index == 0 { // nothing streamed: one empty text block, as a reply always has content
		if err := block("text", anthropicBlock{Type: "text", Text: ""}, map[string]any{"type": "text_delta", "text": ""}); err != nil {
			k.finishGeneration(c, err)
			return
		}
	}
	stop := anthropicStop(reason, len(calls) > 0)
	if err := errors.Join(closeBlock(),
		send("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
			"usage": map[string]int{"output_tokens": u.CompletionTokens}}),
		send("message_stop", map[string]any{})); err != nil {
		k.finishGeneration(c, errClientGone)
	}
}

// anthropicRequest admits, reads and decodes an Anthropic Messages
// request and turns it into a chat request, checked; on an error it has
// answered it (ok false).
func (s *Server) anthropicRequest(c *gin.Context, k *call) (areq *anthropicRequest, req *chatRequest, ok bool) {
	areq = &anthropicRequest{}
	if e := s.admitBody(c, areq); e != nil {
		k.fail(c, e)
		return nil, nil, false
	}
	k.model = areq.Model
	if e := s.checkModel(areq.Model); e != nil {
		k.fail(c, e)
		return nil, nil, false
	}
	req, e := areq.chatRequest()
	if e == nil {
		e = req.check()
	}
	if e != nil {
		k.fail(c, e)
		return nil, nil, false
	}
	return areq, req, true
}

// anthropicCountTokens serves POST /v1/messages/count_tokens: the input
// tokens a /v1/messages request with the same system prompt, messages,
// tools and thinking setting would take, as {"input_tokens": n} (the
// rendered conversation tokenized, exactly as the request would run it).
func (s *Server) anthropicCountTokens(c *gin.Context) {
	k := s.newCall(c, "messages/count_tokens", "")
	k.errBody = anthropicError
	defer k.done()
	_, req, ok := s.anthropicRequest(c, k)
	if !ok {
		return
	}
	var ids []int32
	sp, e := req.params(s.tok.VocabSize(), s.opts.Defaults.Base())
	if e == nil {
		_, _, ids, e = s.chatPrompt(req, &sp)
	}
	if e != nil {
		k.fail(c, e)
		return
	}
	k.usage.PromptTokens = len(ids)
	writeJSON(c, http.StatusOK, map[string]int{"input_tokens": len(ids)})
}

// anthropicToolUses are a reply's calls as tool_use blocks.
func anthropicToolUses(calls []toolCallJS) []anthropicBlock {
	var out []anthropicBlock
	for _, tc := range calls {
		id := tc.ID
		if id == "" {
			id = newID("toolu_")
		}
		out = append(out, anthropicBlock{Type: "tool_use", ID: id, Name: tc.Function.Name, Input: json.RawMessage(tc.Function.Arguments)})
	}
	return out
}
