package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/engine"
)

// chatCompletions serves POST /v1/chat/completions: the messages are
// rendered with the chat template (add_generation_prompt true unless the
// request says otherwise), encoded without added special tokens (the
// template writes them, as vLLM does) and sent as one engine request.
func (s *Server) chatCompletions(c *gin.Context) {
	k := s.newCall(c, "chat", "chatcmpl-")
	defer k.done()
	req, ok := begin[chatRequest](s, c, k)
	if !ok {
		return
	}
	run, e := s.startChat(c.Request.Context(), k, req)
	if e != nil {
		k.fail(c, e)
		return
	}
	defer run.cancel()
	sp, ts, ctx, cancel, chans, newOut, withReasoning, harmonyCalls := run.sp, run.ts, run.ctx, run.cancel, run.chans, run.newOut, run.withReasoning, run.harmonyCalls
	created := k.start.Unix()
	model := s.gen.ModelName()
	lens := run.lens

	if req.streaming() {
		out := startSSE(c)
		cu := req.newChunkUsage(lens)
		chunk := func(ch chatChunkChoice) chatChunk {
			return chatChunk{ID: k.id, Object: "chat.completion.chunk", Created: created, Model: model,
				Choices: []chatChunkChoice{ch}, Usage: cu.field()}
		}
		// Every choice's first chunk carries the role, sent before any token.
		empty := ""
		for i := range sp.N {
			if err := out.send(chunk(chatChunkChoice{Index: i, Delta: chatDelta{Role: "assistant", Content: &empty}})); err != nil {
				cancel()
				k.finishGeneration(c, err)
				return
			}
		}
		outs := make([]*choiceOut, sp.N) // reasoning split off, content held back where a call may start
		for i := range outs {
			outs[i] = newOut()
		}
		usage, err := k.run(ctx, cancel, chans, sp.N, lens, func(i int, ev *engine.Event) error {
			cu.add(ev)
			reason := ev.FinishReason
			reasoning, text := outs[i].push(ev.Text)
			var calls []toolCallJS
			if reason != "" {
				r, rest, cl := outs[i].finish()
				reasoning, text, calls = reasoning+r, text+rest, cl
				if calls != nil && reason == engine.FinishStop {
					reason = finishToolCalls
				}
			}
			if !withReasoning {
				reasoning = ""
			}
			if text == "" && reasoning == "" && len(ev.Logprobs) == 0 && reason == "" {
				return nil
			}
			ch := chatChunkChoice{Index: i, Delta: chatDelta{Content: &text}}
			if reasoning != "" {
				ch.Delta.ReasoningContent = &reasoning
				if text == "" {
					ch.Delta.Content = nil
				}
			}
			if sp.Logprobs && len(ev.Logprobs) > 0 {
				ch.Logprobs = &chatLogprobs{}
				ch.Logprobs.add(ev.Logprobs)
			}
			if reason != "" && calls != nil {
				// Content first (if any), then the calls, then the close.
				if text != "" || reasoning != "" || ch.Logprobs != nil {
					if err := out.send(chunk(ch)); err != nil {
						return err
					}
				}
				for j := range calls {
					calls[j].Index = &j
				}
				if err := out.send(chunk(chatChunkChoice{Index: i, Delta: chatDelta{ToolCalls: calls}})); err != nil {
					return err
				}
				ch = chatChunkChoice{Index: i}
			}
			if reason != "" {
				ch.FinishReason = &reason
				if text == "" || calls != nil {
					ch.Delta.Content = nil // the closing chunk: an empty delta, as OpenAI sends
				}
			}
			return out.send(chunk(ch))
		})
		k.endStream(c, out, err, func() any {
			u := toUsage(usage)
			return chatChunk{ID: k.id, Object: "chat.completion.chunk", Created: created, Model: model,
				Choices: []chatChunkChoice{}, Usage: &u}
		}, req.includeUsage())
		return
	}

	texts := make([]strings.Builder, sp.N)
	var lps []*chatLogprobs
	if sp.Logprobs {
		lps = make([]*chatLogprobs, sp.N)
		for i := range lps {
			lps[i] = &chatLogprobs{Content: []chatTokenLogprob{}}
		}
	}
	usage, err := k.run(ctx, cancel, chans, sp.N, lens, func(i int, ev *engine.Event) error {
		texts[i].WriteString(ev.Text)
		if lps != nil {
			lps[i].add(ev.Logprobs)
		}
		return nil
	})
	if err != nil {
		k.finishGeneration(c, err)
		return
	}
	resp := chatResponse{ID: k.id, Object: "chat.completion", Created: created, Model: model,
		Choices: make([]chatChoice, sp.N), Usage: toUsage(usage)}
	for i := range resp.Choices {
		content := texts[i].String()
		msg := chatMessageJS{Role: "assistant"}
		reason := k.finishes[i]
		var calls []toolCallJS
		if o := newOut(); o.sp != nil {
			var reasoning string
			reasoning, content, calls = splitAll(o.sp, content)
			if reasoning != "" && withReasoning {
				msg.ReasoningContent = &reasoning
			}
		}
		if ts != nil && !harmonyCalls {
			var rest string
			if rest, calls = ts.calls(content); calls != nil {
				content = rest
			}
		}
		msg.Content = &content
		if calls != nil {
			msg.ToolCalls = calls
			if content = strings.TrimSpace(content); content == "" {
				msg.Content = nil
			}
			if reason == engine.FinishStop {
				reason = finishToolCalls
			}
		}
		resp.Choices[i] = chatChoice{Index: i, Message: msg, FinishReason: reason}
		if lps != nil {
			resp.Choices[i].Logprobs = lps[i]
		}
	}
	writeJSON(c, http.StatusOK, resp)
}

// chatRun is a chat request on its way through the engine: its sampling
// parameters, tools, rendered prompt and the engine's events. cancel ends
// it (the caller defers it).
type chatRun struct {
	sp            engine.SamplingParams
	ts            *toolSetup // nil: no tools
	text          string     // the rendered prompt
	lens          []int      // its length in tokens
	ctx           context.Context
	cancel        context.CancelFunc
	chans         []<-chan engine.Event
	newOut        func() *choiceOut // a choice's reader of reasoning, content and calls
	withReasoning bool              // reasoning is returned (include_reasoning)
	harmonyCalls  bool              // calls are read by the harmony splitter, not a toolStream
}

// chatPrompt sets up req's tools (their grammar in sp) and renders and
// tokenizes its conversation: the prompt a chat request runs, which POST
// /v1/messages/count_tokens counts.
func (s *Server) chatPrompt(req *chatRequest, sp *engine.SamplingParams) (*toolSetup, string, []int32, *apiError) {
	ts, e := s.tools(req, sp)
	if e != nil {
		return nil, "", nil, e
	}
	s.layout(sp)
	text, e := s.render(req, ts)
	if e != nil {
		return nil, "", nil, e
	}
	ids, err := s.tok.Encode(text, false)
	if err != nil {
		return nil, "", nil, invalid("messages", "the rendered conversation cannot be tokenized: %v", err)
	}
	if len(ids) == 0 {
		return nil, "", nil, invalid("messages", "the rendered conversation is empty")
	}
	return ts, text, ids, nil
}

// startChat checks a decoded chat request's parameters, renders and
// tokenizes its conversation and submits it to the engine (POST
// /v1/chat/completions and /v1/responses), under ctx (the client's
// request, or a background response's own).
func (s *Server) startChat(ctx context.Context, k *call, req *chatRequest) (*chatRun, *apiError) {
	sp, e := req.params(s.tok.VocabSize(), s.opts.Defaults.Base())
	if e != nil {
		return nil, e
	}
	k.n = sp.N
	if req.Logprobs != nil && *req.Logprobs {
		sp.Logprobs = true
		if req.TopLogprobs != nil {
			sp.TopLogprobs = *req.TopLogprobs
		}
	}
	ts, text, ids, e := s.chatPrompt(req, &sp)
	if e != nil {
		return nil, e
	}
	if s.opts.Reasoning == ReasoningHarmony {
		sp.KeepSpecialTokens = true // the messages' markers are special tokens
	}
	run := &chatRun{ts: ts, text: text, harmonyCalls: ts != nil && s.opts.ToolFormat == ToolFormatHarmony,
		withReasoning: req.IncludeReasoning == nil || *req.IncludeReasoning}
	run.newOut = func() *choiceOut {
		o := &choiceOut{sp: newSplitter(s.opts.Reasoning, text, run.harmonyCalls)}
		if ts != nil && !run.harmonyCalls {
			o.ts = &toolStream{ts: ts}
		}
		return o
	}
	if s.opts.LogPrompts {
		k.prompts = []string{text}
	}
	maxTok, maxParam := req.maxTokens()
	if sp.MaxTokens, e = s.fitContext(len(ids), maxTok, 0, "messages", maxParam); e != nil {
		return nil, e
	}
	if e := checkMinTokens(&sp); e != nil {
		return nil, e
	}
	tooLongParam := "messages"
	if maxParam != "" {
		tooLongParam = maxParam
	}
	r := &engine.Request{ID: k.id, Prompt: ids, Sampling: sp, Arrival: k.start}
	if req.Priority != nil {
		r.Priority = *req.Priority
	}
	if req.Prediction != nil {
		if r.Prediction, e = s.prediction(req.Prediction, &sp); e != nil {
			return nil, e
		}
	}
	run.sp, run.lens = sp, []int{len(ids)}
	run.ctx, run.cancel = context.WithCancel(ctx)
	chans, err := s.submit(run.ctx, run.cancel, []*engine.Request{r})
	if err != nil {
		run.cancel()
		ae := generateError(err, tooLongParam)
		if ae == errInternal {
			k.cause = err
		}
		return nil, ae
	}
	run.chans = chans
	return run, nil
}

// prediction checks and tokenizes a chat request's prediction (OpenAI's
// predicted outputs): {"type": "content", "content": a string or a list of
// text parts}. Its tokens become drafts the engine verifies, so it cannot
// change the output; a request whose sampling rules out speculation
// (penalties, logit_bias) is refused rather than given a prediction that
// would go unused.
func (s *Server) prediction(p *predictionJSON, sp *engine.SamplingParams) ([]int32, *apiError) {
	if p.Type != "content" {
		return nil, invalid("prediction.type", "prediction.type must be \"content\", got %q", p.Type)
	}
	var text string
	if err := json.Unmarshal(p.Content, &text); err != nil {
		var parts []contentPart
		if err := json.Unmarshal(p.Content, &parts); err != nil || len(p.Content) == 0 {
			return nil, invalid("prediction.content", "prediction.content must be a string or a list of text parts")
		}
		var b strings.Builder
		for i, part := range parts {
			if part.Type != "text" || part.Text == nil {
				return nil, invalid("prediction.content", "prediction.content[%d] must be a text part ({\"type\": \"text\", \"text\": …})", i)
			}
			b.WriteString(*part.Text)
		}
		text = b.String()
	}
	if name := sp.Unpredictable(); name != "" {
		return nil, invalid("prediction", "prediction cannot be combined with %s: its drafts could not be verified against penalised or biased logits", name)
	}
	ids, err := s.tok.Encode(text, false)
	if err != nil {
		return nil, invalid("prediction.content", "prediction.content cannot be tokenized: %v", err)
	}
	if len(ids) > engine.MaxPredictionTokens {
		return nil, invalid("prediction.content", "prediction.content is %d tokens; at most %d are allowed", len(ids), engine.MaxPredictionTokens)
	}
	return ids, nil
}

// finishToolCalls is the finish reason of a choice that ends in tool calls.
const finishToolCalls = "tool_calls"

// render applies the chat template to the request's messages (and its
// tools, when ts is not nil).
func (s *Server) render(req *chatRequest, ts *toolSetup) (string, *apiError) {
	if s.tmpl == nil {
		return "", invalid("messages", "this model has no chat template; use /v1/completions")
	}
	msgs := make([]chat.Message, len(req.Messages))
	for i := range req.Messages {
		var e *apiError
		if msgs[i], e = toChat(i, &req.Messages[i]); e != nil {
			return "", e
		}
	}
	kwargs := req.ChatTemplateKwargs
	if e := req.ReasoningEffort; e != nil { // (chat_template_kwargs wins when it sets it too)
		kwargs = maps.Clone(kwargs)
		if kwargs == nil {
			kwargs = map[string]any{}
		}
		if _, set := kwargs["reasoning_effort"]; !set {
			kwargs["reasoning_effort"] = *e
		}
	}
	opts := chat.Options{AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt, Kwargs: kwargs}
	if ts != nil {
		opts.Tools = ts.raw
	}
	if cfg := s.tok.Config(); cfg != nil {
		opts.BOSToken, opts.EOSToken = cfg.BOSToken, cfg.EOSToken
	}
	text, err := s.tmpl.Render(msgs, opts)
	if err != nil {
		var raised *chat.RaiseError
		if errors.As(err, &raised) {
			return "", invalid("messages", "the chat template refused the messages: %s", raised.Message)
		}
		return "", invalid("messages", "the chat template failed on these messages: %v", err)
	}
	return text, nil
}
