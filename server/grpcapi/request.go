package grpcapi

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
)

// reqSeq makes engine request ids unique even when clients reuse theirs.
var reqSeq atomic.Uint64

// prepared is a validated request ready for the engine.
type prepared struct {
	clientID string // what the response reports: the client's id or a made one
	req      *engine.Request
}

// prepare validates req, tokenizes its prompt and applies defaults;
// sampling is used when req has none (a batch's shared settings). Errors
// are *FieldError or wrap engine.ErrTooLong.
func (s *Server) prepare(req *pb.GenerateRequest, sampling *pb.SamplingParams, arrival time.Time) (*prepared, error) {
	if req == nil {
		return nil, fieldErr("request", "missing")
	}
	if err := CheckRequestID(req.GetRequestId()); err != nil {
		return nil, err
	}
	prompt, err := s.prompt(req)
	if err != nil {
		return nil, err
	}
	if req.Sampling != nil {
		sampling = req.Sampling
	}
	sp, err := s.sampling(sampling, len(prompt))
	if err != nil {
		return nil, at("sampling", err)
	}
	seq := reqSeq.Add(1)
	id := req.GetRequestId()
	engineID := fmt.Sprintf("%s-%d", id, seq)
	if id == "" {
		id = fmt.Sprintf("grpc-%016x", rand.Uint64())
		engineID = fmt.Sprintf("%s-%d", id, seq)
	}
	var pred []int32
	if text := req.GetPrediction(); text != "" {
		if pred, err = s.prediction(text, &sp); err != nil {
			return nil, err
		}
	}
	return &prepared{clientID: id, req: &engine.Request{
		ID:         engineID,
		Prompt:     prompt,
		Sampling:   sp,
		Priority:   int(req.GetPriority()),
		Arrival:    arrival,
		Prediction: pred,
	}}, nil
}

// prediction tokenizes a request's prediction (OpenAI's predicted
// outputs: drafts the engine verifies), refusing one that sp rules out.
func (s *Server) prediction(text string, sp *engine.SamplingParams) ([]int32, error) {
	if name := sp.Unpredictable(); name != "" {
		return nil, fieldErr("prediction", "cannot be combined with %s: its drafts could not be verified against penalised or biased logits", name)
	}
	if s.tok == nil {
		return nil, fieldErr("prediction", "this server has no tokenizer")
	}
	ids, err := s.tok.Encode(text, false)
	if err != nil {
		return nil, fieldErr("prediction", "tokenizing: %v", err)
	}
	if len(ids) > engine.MaxPredictionTokens {
		return nil, fieldErr("prediction", "%d tokens; at most %d are allowed", len(ids), engine.MaxPredictionTokens)
	}
	return ids, nil
}

// prompt returns req's prompt token ids.
func (s *Server) prompt(req *pb.GenerateRequest) ([]int32, error) {
	switch p := req.Prompt.(type) {
	case *pb.GenerateRequest_Text:
		if p.Text == "" {
			return nil, fieldErr("text", "empty prompt")
		}
		if s.tok == nil {
			return nil, fieldErr("text", "this server has no tokenizer; send token_ids")
		}
		ids, err := s.tok.Encode(p.Text, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
		if err != nil {
			return nil, fieldErr("text", "tokenizing: %v", err)
		}
		if len(ids) == 0 {
			return nil, fieldErr("text", "the prompt has no tokens")
		}
		return ids, nil
	case *pb.GenerateRequest_Chat:
		return s.chatPrompt(p.Chat)
	case *pb.GenerateRequest_TokenIds:
		ids := p.TokenIds.GetIds()
		if len(ids) == 0 {
			return nil, fieldErr("token_ids.ids", "empty prompt")
		}
		if err := CheckTokenIDs("token_ids.ids", ids, s.vocab()); err != nil {
			return nil, err
		}
		return append([]int32(nil), ids...), nil
	default:
		return nil, fieldErr("prompt", "missing: set text, token_ids or chat")
	}
}

// chatRoles are the roles a chat message may have.
var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// chatPrompt renders c with the model's chat template and tokenizes it
// (without added special tokens: the template writes them).
func (s *Server) chatPrompt(c *pb.Chat) ([]int32, error) {
	if s.opts.Template == nil || s.tok == nil {
		return nil, fieldErr("chat", "this model has no chat template; send text or token_ids")
	}
	if len(c.GetMessages()) == 0 {
		return nil, fieldErr("chat.messages", "no messages")
	}
	msgs := make([]chat.Message, len(c.Messages))
	for i, m := range c.Messages {
		if !chatRoles[m.GetRole()] {
			return nil, fieldErr(fmt.Sprintf("chat.messages[%d].role", i), "must be system, developer, user, assistant or tool; got %q", m.GetRole())
		}
		msgs[i] = chat.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallId}
	}
	opts := chat.Options{AddGenerationPrompt: c.AddGenerationPrompt == nil || *c.AddGenerationPrompt}
	if k := c.GetChatTemplateKwargsJson(); k != "" {
		if err := json.Unmarshal([]byte(k), &opts.Kwargs); err != nil || opts.Kwargs == nil {
			return nil, fieldErr("chat.chat_template_kwargs_json", "must be one JSON object")
		}
		for name := range opts.Kwargs {
			if name == "messages" || name == "tools" || name == "add_generation_prompt" || strings.HasPrefix(name, "__") {
				return nil, fieldErr("chat.chat_template_kwargs_json", "may not set %q", name)
			}
		}
	}
	if cfg := s.tok.Config(); cfg != nil {
		opts.BOSToken, opts.EOSToken = cfg.BOSToken, cfg.EOSToken
	}
	text, err := s.opts.Template.Render(msgs, opts)
	if err != nil {
		return nil, fieldErr("chat.messages", "the chat template refused the messages: %v", err)
	}
	ids, err := s.tok.Encode(text, false)
	if err != nil {
		return nil, fieldErr("chat", "tokenizing the rendered conversation: %v", err)
	}
	if len(ids) == 0 {
		return nil, fieldErr("chat", "the rendered conversation has no tokens")
	}
	return ids, nil
}

func (s *Server) vocab() int {
	if s.tok == nil {
		return 0
	}
	return s.tok.VocabSize()
}

// sampling turns p (nil: all defaults) into engine settings for a prompt
// of promptLen tokens and validates them.
func (s *Server) sampling(p *pb.SamplingParams, promptLen int) (engine.SamplingParams, error) {
	if p == nil {
		p = &pb.SamplingParams{}
	}
	base := s.opts.Defaults.Base()
	sp := engine.SamplingParams{
		N:                 int(opt(p.N, 1)),
		Temperature:       opt(p.Temperature, base.Temperature),
		TopP:              opt(p.TopP, base.TopP),
		TopK:              int(opt(p.TopK, int32(base.TopK))),
		MinP:              opt(p.MinP, base.MinP),
		PresencePenalty:   opt(p.PresencePenalty, 0),
		FrequencyPenalty:  opt(p.FrequencyPenalty, 0),
		RepetitionPenalty: opt(p.RepetitionPenalty, base.RepetitionPenalty),
		Stop:              append([]string(nil), p.Stop...),
		StopTokenIDs:      append([]int32(nil), p.StopTokenIds...),
		IgnoreEOS:         p.IgnoreEos,
		Logprobs:          p.Logprobs,
		TopLogprobs:       int(opt(p.TopLogprobs, 0)),
		MinTokens:         int(p.MinTokens),
		KeepSpecialTokens: p.KeepSpecialTokens,
	}
	if p.Regex != "" && (p.JsonSchema != "" || p.JsonObject) {
		return sp, fieldErr("regex", "regex cannot be combined with json_object or json_schema")
	}
	if p.Grammar != "" && (p.Regex != "" || p.JsonSchema != "" || p.JsonObject) {
		return sp, fieldErr("grammar", "grammar cannot be combined with regex, json_object or json_schema")
	}
	switch {
	case p.Grammar != "":
		g, err := grammar.Shared.Grammar(p.Grammar)
		if err != nil {
			return sp, fieldErr("grammar", "%v", err)
		}
		sp.Grammar = g.New
	case p.Regex != "":
		re, err := grammar.Shared.Regex(p.Regex)
		if err != nil {
			return sp, fieldErr("regex", "%v", err)
		}
		sp.Grammar = re.New
	case p.JsonSchema != "":
		schema, err := grammar.Shared.Schema([]byte(p.JsonSchema))
		if err != nil {
			return sp, fieldErr("json_schema", "%v", err)
		}
		sp.Grammar = schema.New
	case p.JsonObject:
		sp.Grammar = grammar.JSONObject
	}
	if s.opts.CompactJSON && sp.Grammar != nil {
		sp.Grammar = grammar.Compact(sp.Grammar)
	}
	if sp.TopK == -1 { // vLLM's "off"
		sp.TopK = 0
	}
	if p.Seed != nil {
		seed := *p.Seed
		sp.Seed = &seed
	}
	maxCtx := s.gen.MaxContext()
	if p.MaxTokens != nil {
		sp.MaxTokens = int(*p.MaxTokens)
	} else {
		left := maxCtx - promptLen
		if maxCtx <= 0 { // unknown context
			left = fallbackMaxTokens
		}
		if s.opts.DefaultMaxTokens > 0 {
			left = min(left, s.opts.DefaultMaxTokens)
		}
		if left < 1 {
			return sp, fmt.Errorf("%w: the prompt's %d tokens fill the %d-token context", engine.ErrTooLong, promptLen, maxCtx)
		}
		sp.MaxTokens = left
	}
	if err := ValidateSampling(&sp, s.vocab()); err != nil {
		return sp, err
	}
	if maxCtx > 0 && promptLen+sp.MaxTokens > maxCtx {
		return sp, fmt.Errorf("%w: %d prompt tokens + max_tokens %d > %d", engine.ErrTooLong, promptLen, sp.MaxTokens, maxCtx)
	}
	return sp, nil
}

// fallbackMaxTokens is max_tokens when neither the request, the server
// options nor the engine's context bound it (OpenAI's completions default).
const fallbackMaxTokens = 16

// opt is *v, or def when v is nil.
func opt[T any](v *T, def T) T {
	if v == nil {
		return def
	}
	return *v
}
