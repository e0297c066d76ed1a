package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/mkserve/mkserve/engine"
)

// Ollama's API (POST /api/chat, /api/generate, /api/show; GET /api/tags,
// /api/ps, /api/version), so that ollama's clients (its CLI's HTTP API users, its
// Python and JavaScript libraries, Open WebUI in ollama mode) talk to
// mkserve as they are. A request is turned into a chat completion (with
// /api/generate's "raw": true, a completion of the prompt as written) and
// runs through the same checks and engine; the reply comes as
// newline-delimited JSON objects (stream, the default) or as one object.
// Sampling options map to OpenAI's parameters (num_predict → max_tokens,
// repeat_penalty → repetition_penalty); options for the runtime
// (num_ctx, num_gpu, …) are accepted and ignored, and unset ones take the
// checkpoint's generation_config.json defaults, as the OpenAI endpoints
// do (not ollama's own defaults). Errors are ollama's {"error": "…"}.

// ollamaOptions are the options ollama's requests carry.
type ollamaOptions struct {
	Temperature      *float64 `json:"temperature"`
	TopP             *float64 `json:"top_p"`
	TopK             *int     `json:"top_k"`
	MinP             *float64 `json:"min_p"`
	NumPredict       *int     `json:"num_predict"` // -1, -2: until the context is full
	Stop             []string `json:"stop"`
	Seed             *int64   `json:"seed"`
	RepeatPenalty    *float64 `json:"repeat_penalty"`
	PresencePenalty  *float64 `json:"presence_penalty"`
	FrequencyPenalty *float64 `json:"frequency_penalty"`
}

// ollamaMessage is one message of /api/chat.
type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	Images    []string         `json:"images,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"` // a tool message's tool
}

type ollamaToolCall struct {
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"` // an object
	} `json:"function"`
}

// ollamaRequest is the body of /api/chat and /api/generate (each uses its
// own fields).
type ollamaRequest struct {
	Model    string          `json:"model"`
	Messages []ollamaMessage `json:"messages"` // chat
	Prompt   string          `json:"prompt"`   // generate
	Suffix   string          `json:"suffix"`   // generate
	System   string          `json:"system"`   // generate
	Raw      bool            `json:"raw"`      // generate: the prompt as written, no template
	Images   []string        `json:"images"`   // generate
	Tools    json.RawMessage `json:"tools"`
	Format   json.RawMessage `json:"format"` // "json" or a JSON schema
	Options  ollamaOptions   `json:"options"`
	Stream   *bool           `json:"stream"` // default true
	Think    *bool           `json:"think"`
}

func (r *ollamaRequest) streaming() bool { return r.Stream == nil || *r.Stream }

// sampling maps the request's options and format to OpenAI's parameters.
func (r *ollamaRequest) sampling() (sampling, *apiError) {
	o := r.Options
	sp := sampling{Model: r.Model, Temperature: o.Temperature, TopP: o.TopP, TopK: o.TopK, MinP: o.MinP, Seed: o.Seed,
		RepetitionPenalty: o.RepeatPenalty, PresencePenalty: o.PresencePenalty, FrequencyPenalty: o.FrequencyPenalty}
	if n := o.NumPredict; n != nil && *n > 0 {
		sp.MaxTokens = n
	} else if n != nil && *n != -1 && *n != -2 {
		return sp, invalid("options.num_predict", "options.num_predict must be positive, or -1 / -2 (until the context is full); got %d", *n)
	}
	if len(o.Stop) > 0 {
		sp.Stop, _ = json.Marshal(o.Stop)
	}
	switch f := bytes.TrimSpace(r.Format); {
	case len(f) == 0 || isNull(f) || string(f) == `""`:
	case string(f) == `"json"`:
		sp.ResponseFormat = json.RawMessage(`{"type":"json_object"}`)
	case f[0] == '{':
		sp.ResponseFormat, _ = json.Marshal(map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "format", "schema": json.RawMessage(f)}})
	default:
		return sp, invalid("format", `format must be "json" or a JSON schema object`)
	}
	return sp, nil
}

// chatRequest is the request as a chat completion: /api/chat's messages,
// or /api/generate's system and prompt.
func (r *ollamaRequest) chatRequest(generate bool) (*chatRequest, *apiError) {
	sp, e := r.sampling()
	if e != nil {
		return nil, e
	}
	req := &chatRequest{sampling: sp, Tools: r.Tools}
	if r.Think != nil {
		req.ChatTemplateKwargs = map[string]any{"enable_thinking": *r.Think}
		req.IncludeReasoning = r.Think
	}
	msgs := r.Messages
	if generate {
		msgs = nil
		if r.System != "" {
			msgs = append(msgs, ollamaMessage{Role: "system", Content: r.System})
		}
		msgs = append(msgs, ollamaMessage{Role: "user", Content: r.Prompt, Images: r.Images})
	}
	for i, m := range msgs {
		if len(m.Images) > 0 {
			return nil, invalid("messages", "messages[%d].images: this model takes text only", i)
		}
		content, _ := json.Marshal(m.Content)
		cm := chatMessage{Role: m.Role, Content: content, Name: m.ToolName, ReasoningContent: m.Thinking}
		for _, tc := range m.ToolCalls {
			var c toolCall
			c.Type, c.Function.Name, c.Function.Arguments = "function", tc.Function.Name, tc.Function.Arguments
			cm.ToolCalls = append(cm.ToolCalls, c)
		}
		req.Messages = append(req.Messages, cm)
	}
	return req, nil
}

// ollamaReply is one object of a reply: a piece of the message (done
// false) or the last one, with the counts and durations (done true).
type ollamaReply struct {
	Model     string         `json:"model"`
	CreatedAt string         `json:"created_at"`
	Message   *ollamaMessage `json:"message,omitempty"`  // chat
	Response  *string        `json:"response,omitempty"` // generate
	Thinking  string         `json:"thinking,omitempty"` // generate
	Done      bool           `json:"done"`
	// On the last object:
	DoneReason         string `json:"done_reason,omitempty"`
	TotalDuration      int64  `json:"total_duration,omitempty"` // ns
	LoadDuration       int64  `json:"load_duration,omitempty"`
	PromptEvalCount    int    `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64  `json:"prompt_eval_duration,omitempty"`
	EvalCount          int    `json:"eval_count,omitempty"`
	EvalDuration       int64  `json:"eval_duration,omitempty"`
}

// ollamaError is an error in ollama's shape (call.errBody).
func ollamaError(e *apiError) any { return map[string]string{"error": e.Message} }

func (s *Server) ollamaChat(c *gin.Context)     { s.ollama(c, false) }
func (s *Server) ollamaGenerate(c *gin.Context) { s.ollama(c, true) }

// ollama answers POST /api/chat (generate false) and /api/generate.
func (s *Server) ollama(c *gin.Context, generate bool) {
	endpoint := "ollama_chat"
	if generate {
		endpoint = "ollama_generate"
	}
	k := s.newCall(c, endpoint, "chatcmpl-")
	k.errBody = ollamaError
	defer k.done()
	var oreq ollamaRequest
	if e := s.admitBody(c, &oreq); e != nil {
		k.fail(c, e)
		return
	}
	k.model, k.stream = oreq.Model, oreq.streaming()
	if e := s.checkModel(oreq.Model); e != nil {
		k.fail(c, &apiError{Status: http.StatusNotFound, Message: "model \"" + oreq.Model + "\" not found"})
		return
	}
	if generate && oreq.Raw {
		s.ollamaRaw(c, k, &oreq)
		return
	}
	req, e := oreq.chatRequest(generate)
	if e == nil {
		e = req.check()
	}
	if e != nil {
		k.fail(c, e)
		return
	}
	run, e := s.startChat(c.Request.Context(), k, req)
	if e != nil {
		k.fail(c, e)
		return
	}
	defer run.cancel()
	out := run.newOut()
	w := newOllamaWriter(c, k, s.gen.ModelName(), generate, oreq.streaming())
	var calls []toolCallJS
	usage, err := k.run(run.ctx, run.cancel, run.chans, 1, run.lens, func(_ int, ev *engine.Event) error {
		reasoning, text := out.push(ev.Text)
		if ev.FinishReason != "" {
			r, rest, cl := out.finish()
			reasoning, text, calls = reasoning+r, text+rest, cl
			w.reason = ev.FinishReason
			if len(calls) > 0 {
				text = strings.TrimRight(text, " \t\r\n") // (the text before the calls ends trimmed)
			}
		}
		if !run.withReasoning {
			reasoning = ""
		}
		return w.piece(reasoning, text)
	})
	if err != nil {
		k.finishGeneration(c, err)
		return
	}
	w.finish(usage, calls)
}

// ollamaRaw is /api/generate with "raw": true: the prompt (and suffix, for
// fill-in-the-middle) completed as written, as /v1/completions would.
func (s *Server) ollamaRaw(c *gin.Context, k *call, oreq *ollamaRequest) {
	sp, e := oreq.sampling()
	if e != nil {
		k.fail(c, e)
		return
	}
	if len(oreq.Images) > 0 {
		k.fail(c, invalid("images", "images: this model takes text only"))
		return
	}
	cr := &completionRequest{sampling: sp}
	cr.Prompt, _ = json.Marshal(oreq.Prompt)
	if e := cr.check(); e != nil {
		k.fail(c, e)
		return
	}
	params, e := cr.params(s.tok.VocabSize(), s.opts.Defaults.Base())
	if e != nil {
		k.fail(c, e)
		return
	}
	s.layout(&params)
	text := oreq.Prompt
	if oreq.Suffix != "" {
		if s.fim == nil {
			k.fail(c, invalid("suffix", "suffix (fill-in-the-middle) needs a tokenizer with FIM tokens; this model's has none"))
			return
		}
		text = s.fim.render(text, oreq.Suffix)
	}
	ids, err := s.tok.Encode(text, true)
	if err != nil || len(ids) == 0 {
		k.fail(c, invalid("prompt", "the prompt is empty or cannot be tokenized"))
		return
	}
	maxTok, maxParam := cr.maxTokens()
	if params.MaxTokens, e = s.fitContext(len(ids), maxTok, 0, "prompt", maxParam); e != nil {
		k.fail(c, e)
		return
	}
	ctx, cancel := context.WithCancel(c.Request.Context())
	defer cancel()
	chans, err := s.submit(ctx, cancel, []*engine.Request{{ID: k.id, Prompt: ids, Sampling: params, Arrival: k.start}})
	if err != nil {
		k.fail(c, generateError(err, "prompt"))
		return
	}
	w := newOllamaWriter(c, k, s.gen.ModelName(), true, oreq.streaming())
	usage, err := k.run(ctx, cancel, chans, 1, []int{len(ids)}, func(_ int, ev *engine.Event) error {
		if ev.FinishReason != "" {
			w.reason = ev.FinishReason
		}
		return w.piece("", ev.Text)
	})
	if err != nil {
		k.finishGeneration(c, err)
		return
	}
	w.finish(usage, nil)
}

// ollamaWriter writes a reply: NDJSON objects as the text comes, or the
// whole text in one object at the end.
type ollamaWriter struct {
	c                  *gin.Context
	k                  *call
	model              string
	generate, stream   bool
	reason             string
	text, thinking     bytes.Buffer // (whole replies)
	first              time.Time    // the first token's arrival
	wroteHeader, began bool
}

func newOllamaWriter(c *gin.Context, k *call, model string, generate, stream bool) *ollamaWriter {
	return &ollamaWriter{c: c, k: k, model: model, generate: generate, stream: stream}
}

func (w *ollamaWriter) reply(thinking, text string) ollamaReply {
	r := ollamaReply{Model: w.model, CreatedAt: time.Now().UTC().Format(time.RFC3339Nano)}
	if w.generate {
		r.Response, r.Thinking = &text, thinking
	} else {
		r.Message = &ollamaMessage{Role: "assistant", Content: text, Thinking: thinking}
	}
	return r
}

// piece takes the next reasoning and text of the reply.
func (w *ollamaWriter) piece(thinking, text string) error {
	if w.first.IsZero() {
		w.first = time.Now()
	}
	if !w.stream {
		w.thinking.WriteString(thinking)
		w.text.WriteString(text)
		return nil
	}
	if thinking == "" && text == "" {
		return nil
	}
	return w.write(w.reply(thinking, text))
}

// write sends one NDJSON object and flushes it.
func (w *ollamaWriter) write(r ollamaReply) error {
	if !w.wroteHeader {
		w.c.Header("Content-Type", "application/x-ndjson")
		w.c.Status(http.StatusOK)
		w.wroteHeader = true
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := w.c.Writer.Write(append(b, '\n')); err != nil {
		return errClientGone
	}
	w.c.Writer.Flush()
	return nil
}

// finish sends the last object: the whole reply when not streaming, the
// tool calls, the finish reason and ollama's counts and durations.
func (w *ollamaWriter) finish(u engine.Usage, calls []toolCallJS) {
	r := w.reply(w.thinking.String(), w.text.String())
	r.Done, r.DoneReason = true, w.reason
	if r.DoneReason == "" {
		r.DoneReason = engine.FinishStop
	}
	if r.Message != nil {
		if len(calls) > 0 {
			r.Message.Content = strings.TrimSpace(r.Message.Content) // (the text around the calls, as chat completions trim it)
		}
		for _, tc := range calls {
			var oc ollamaToolCall
			oc.Function.Name, oc.Function.Arguments = tc.Function.Name, json.RawMessage(tc.Function.Arguments)
			r.Message.ToolCalls = append(r.Message.ToolCalls, oc)
		}
	}
	now := time.Now()
	r.TotalDuration = now.Sub(w.k.start).Nanoseconds()
	r.PromptEvalCount, r.EvalCount = u.PromptTokens, u.CompletionTokens
	if !w.first.IsZero() {
		r.PromptEvalDuration, r.EvalDuration = w.first.Sub(w.k.start).Nanoseconds(), now.Sub(w.first).Nanoseconds()
	}
	if err := w.write(r); err != nil {
		w.k.finishGeneration(w.c, err)
	}
}

// ollamaTags answers GET /api/tags: the served model, in ollama's list.
func (s *Server) ollamaTags(c *gin.Context) {
	writeJSON(c, http.StatusOK, map[string]any{"models": []map[string]any{s.ollamaModel()}})
}

// ollamaModel is the served model as ollama describes one.
func (s *Server) ollamaModel() map[string]any {
	name := s.gen.ModelName()
	return map[string]any{"name": name, "model": name, "modified_at": time.Unix(s.created, 0).UTC().Format(time.RFC3339),
		"size": s.modelInfo().Bytes, "digest": "", "details": s.ollamaDetails()}
}

// ollamaDetails is the model's details as ollama gives them: format,
// family, parameter size ("20.9B") and quantization level (the form that
// holds most of the weights' bytes), those known.
func (s *Server) ollamaDetails() map[string]any {
	m := s.modelInfo()
	d := map[string]any{"format": "safetensors"}
	if m.Family != "" {
		d["family"], d["families"] = m.Family, []string{m.Family}
	}
	if m.Parameters > 0 {
		d["parameter_size"] = paramSize(m.Parameters)
	}
	if m.Quantization != "" {
		d["quantization_level"] = m.Quantization
	}
	return d
}

// paramSize writes a parameter count as ollama does: "11.5M", "20.9B".
func paramSize(n int64) string {
	switch {
	case n >= 1e9:
		return strconv.FormatFloat(float64(n)/1e9, 'f', 1, 64) + "B"
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + "M"
	}
	return strconv.FormatInt(n, 10)
}

// ollamaPS answers GET /api/ps: the model loaded (always, while serving).
func (s *Server) ollamaPS(c *gin.Context) {
	m := s.ollamaModel()
	m["expires_at"], m["size_vram"], m["context_length"] = "0001-01-01T00:00:00Z", 0, s.gen.MaxContext()
	writeJSON(c, http.StatusOK, map[string]any{"models": []map[string]any{m}})
}

// ollamaShow answers POST /api/show ({"model": name}): the model's
// details, its context length and what it can do.
func (s *Server) ollamaShow(c *gin.Context) {
	body, e := s.readBody(c)
	if e != nil {
		writeJSON(c, e.Status, map[string]string{"error": e.Message})
		return
	}
	var req struct {
		Model string `json:"model"`
		Name  string `json:"name"` // (older clients)
	}
	if e := decodeBody(body, &req); e != nil {
		writeJSON(c, e.Status, map[string]string{"error": e.Message})
		return
	}
	name := req.Model
	if name == "" {
		name = req.Name
	}
	if name != s.gen.ModelName() {
		writeJSON(c, http.StatusNotFound, map[string]string{"error": "model \"" + name + "\" not found"})
		return
	}
	caps := []string{"completion"}
	if s.opts.ToolFormat != "" {
		caps = append(caps, "tools")
	}
	if s.opts.Reasoning != "" {
		caps = append(caps, "thinking")
	}
	if s.fim != nil {
		caps = append(caps, "insert")
	}
	info := map[string]any{"context_length": s.gen.MaxContext()}
	if m := s.modelInfo(); m.Parameters > 0 {
		info["general.parameter_count"] = m.Parameters
	}
	writeJSON(c, http.StatusOK, map[string]any{
		"details":      s.ollamaDetails(),
		"model_info":   info,
		"capabilities": caps,
		"modified_at":  time.Unix(s.created, 0).UTC().Format(time.RFC3339),
	})
}

// ollamaVersion answers GET /api/version.
func (s *Server) ollamaVersion(c *gin.Context) {
	v := s.opts.Version.Version
	if v == "" {
		v = "unknown"
	}
	writeJSON(c, http.StatusOK, map[string]string{"version": v})
}
