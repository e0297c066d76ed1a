package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
)

// Limits on request parameters (OpenAI's where it has one).
const (
	maxN           = 128  // choices per prompt
	maxPrompts     = 2048 // prompts in one completions request
	maxStops       = 4    // stop strings
	maxStopLen     = 256  // bytes per stop string (as the gRPC API)
	maxStopIDs     = 64   // stop_token_ids (as the gRPC API)
	maxRepPenalty  = 10   // repetition_penalty, as engine.SamplingParams.Validate
	maxCompLogprob = 5    // completions: logprobs
	maxTopLogprobs = 20   // chat: top_logprobs
	defaultCompMax = 16   // completions: max_tokens when absent, as OpenAI
)

// sampling holds the parameters both endpoints share. Pointers tell
// "absent or null" (nil: the default) from a given value.
type sampling struct {
	Model               string          `json:"model"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Temperature         *float64        `json:"temperature"`
	TopP                *float64        `json:"top_p"`
	TopK                *int            `json:"top_k"`
	MinP                *float64        `json:"min_p"`
	N                   *int            `json:"n"`
	Seed                *int64          `json:"seed"`
	PresencePenalty     *float64        `json:"presence_penalty"`
	FrequencyPenalty    *float64        `json:"frequency_penalty"`
	RepetitionPenalty   *float64        `json:"repetition_penalty"`
	Stop                json.RawMessage `json:"stop"`
	StopTokenIDs        []int64         `json:"stop_token_ids"`
	IgnoreEOS           *bool           `json:"ignore_eos"`
	MinTokens           *int            `json:"min_tokens"` // vLLM's extension
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	User                *string         `json:"user"` // accepted and ignored
	LogitBias           map[string]any  `json:"logit_bias"`
	Priority            *int            `json:"priority"`            // vLLM's extension: lower runs first
	ResponseFormat      json.RawMessage `json:"response_format"`     // text, json_object or json_schema (completions too, as vLLM)
	GuidedJSON          json.RawMessage `json:"guided_json"`         // vLLM's: a JSON Schema (an object or its text)
	GuidedChoice        []string        `json:"guided_choice"`       // vLLM's: the output is exactly one of these
	GuidedRegex         *string         `json:"guided_regex"`        // vLLM's: the whole output matches this
	GuidedGrammar       *string         `json:"guided_grammar"`      // vLLM\'s: the whole output matches this GBNF grammar
	SkipSpecialTokens   *bool           `json:"skip_special_tokens"` // vLLM's: false keeps special tokens' text
}

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"` // vLLM's: every chunk carries the usage so far
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	sampling
	Prompt   json.RawMessage `json:"prompt"`
	Suffix   *string         `json:"suffix"` // fill-in-the-middle, for tokenizers with FIM tokens (fim.go)
	Echo     *bool           `json:"echo"`
	BestOf   *int            `json:"best_of"`
	Logprobs *int            `json:"logprobs"`
}

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	sampling
	Messages            []chatMessage   `json:"messages"`
	Logprobs            *bool           `json:"logprobs"`
	TopLogprobs         *int            `json:"top_logprobs"`
	ChatTemplateKwargs  map[string]any  `json:"chat_template_kwargs"`
	ReasoningEffort     *string         `json:"reasoning_effort"`      // low, medium or high: the template's reasoning_effort (gpt-oss)
	IncludeReasoning    *bool           `json:"include_reasoning"`     // vLLM's: false leaves reasoning_content out
	AddGenerationPrompt *bool           `json:"add_generation_prompt"` // vLLM's extension; default true
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	ParallelToolCalls   *bool           `json:"parallel_tool_calls"` // false: at most one call a choice
	Prediction          *predictionJSON `json:"prediction"`          // OpenAI's predicted outputs
}

// predictionJSON is a chat request's prediction: {"type": "content",
// "content": text or a list of text parts}.
type predictionJSON struct {
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// chatMessage is one entry of messages. Content is a string, a list of
// parts, or null (an assistant message without text).
type chatMessage struct {
	Role             string          `json:"role"`
	Content          json.RawMessage `json:"content"`
	Name             string          `json:"name"`
	ToolCallID       string          `json:"tool_call_id"`
	ToolCalls        []toolCall      `json:"tool_calls"`
	ReasoningContent string          `json:"reasoning_content"` // earlier turns' reasoning, for templates that show it
}

// toolCall is a function call in an earlier assistant turn.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type contentPart struct {
	Type string  `json:"type"`
	Text *string `json:"text"`
}

// decodeBody decodes a JSON object into v. Unknown fields are ignored, as
// OpenAI's and vLLM's servers do for fields they do not use; every known
// field of the wrong type is a 400 naming it.
func decodeBody(data []byte, v any) *apiError {
	if len(bytes.TrimSpace(data)) == 0 {
		return invalid("", "the request body is empty; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(v); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &se):
			return invalid("", "the request body is not valid JSON: %v (at byte %d)", se, se.Offset)
		case errors.As(err, &te):
			if te.Field == "" {
				return invalid("", "the request body must be a JSON object, not %s", jsonKind(te.Value))
			}
			// Fields of the embedded parameter struct are reported under its name.
			field := strings.TrimPrefix(te.Field, "sampling.")
			return invalid(field, "%s: expected %s, got %s", field, goKind(te.Type), jsonKind(te.Value))
		case errors.Is(err, io.ErrUnexpectedEOF):
			return invalid("", "the request body is truncated JSON")
		}
		return invalid("", "the request body is not valid: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("", "the request body has data after its JSON object")
	}
	return nil
}

// jsonKind describes the JSON value encoding/json reports ("number 1.5").
func jsonKind(v string) string {
	switch {
	case v == "object" || v == "array":
		return "an " + v
	case v == "bool":
		return "a boolean"
	case v == "number":
		return "a number"
	case strings.HasPrefix(v, "number"):
		return v
	}
	return "a " + v
}

// goKind names what a Go type accepts, in JSON terms.
func goKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	}
	return "an object"
}

// isNull reports whether a raw value is absent or JSON null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// prompt is one prompt: text, or token ids already.
type prompt struct {
	text   string
	ids    []int32
	isText bool
}

// parsePrompt reads prompt: a string, a list of strings, a list of token
// ids, or a list of token-id lists. vocab bounds the ids.
func parsePrompt(raw json.RawMessage, vocab int) ([]prompt, *apiError) {
	if isNull(raw) {
		return nil, invalid("prompt", "prompt is required")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []prompt{{text: s, isText: true}}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, invalid("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists")
	}
	if len(items) == 0 {
		return nil, invalid("prompt", "prompt must not be an empty list")
	}
	first := bytes.TrimSpace(items[0])
	switch {
	case len(first) > 0 && first[0] == '"': // list of strings
		if len(items) > maxPrompts {
			return nil, invalid("prompt", "prompt has %d entries; at most %d are allowed", len(items), maxPrompts)
		}
		out := make([]prompt, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &out[i].text); err != nil {
				return nil, invalid("prompt", "prompt[%d] must be a string like prompt[0]", i)
			}
			out[i].isText = true
		}
		return out, nil
	case len(first) > 0 && first[0] == '[': // list of token-id lists
		if len(items) > maxPrompts {
			return nil, invalid("prompt", "prompt has %d entries; at most %d are allowed", len(items), maxPrompts)
		}
		out := make([]prompt, len(items))
		for i, it := range items {
			var inner []json.RawMessage
			if err := json.Unmarshal(it, &inner); err != nil {
				return nil, invalid("prompt", "prompt[%d] must be a list of token ids like prompt[0]", i)
			}
			ids, err := tokenIDs(inner, fmt.Sprintf("prompt[%d]", i), vocab)
			if err != nil {
				return nil, err
			}
			if len(ids) == 0 {
				return nil, invalid("prompt", "prompt[%d] is an empty token list", i)
			}
			out[i].ids = ids
		}
		return out, nil
	}
	ids, err := tokenIDs(items, "prompt", vocab)
	if err != nil {
		return nil, err
	}
	return []prompt{{ids: ids}}, nil
}

// tokenIDs reads a list of token ids in [0, vocab); where names the list.
func tokenIDs(items []json.RawMessage, where string, vocab int) ([]int32, *apiError) {
	ids := make([]int32, len(items))
	for j, it := range items {
		v, err := strconv.ParseInt(string(bytes.TrimSpace(it)), 10, 64)
		if err != nil {
			return nil, invalid("prompt", "%s[%d] must be a token id (an integer), got %.40s", where, j, it)
		}
		if v < 0 || v >= int64(vocab) {
			return nil, invalid("prompt", "%s[%d]: token id %d is out of range [0, %d)", where, j, v, vocab)
		}
		ids[j] = int32(v)
	}
	return ids, nil
}

// parseStop reads stop: null, a string, or a list of at most maxStops
// non-empty strings.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s == "" {
			return nil, invalid("stop", "stop must not be an empty string")
		}
		if len(s) > maxStopLen {
			return nil, invalid("stop", "stop has %d bytes; at most %d are allowed", len(s), maxStopLen)
		}
		return []string{s}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("stop", "stop must be a string or a list of strings")
	}
	if len(list) > maxStops {
		return nil, invalid("stop", "stop has %d strings; at most %d are allowed", len(list), maxStops)
	}
	for i, s := range list {
		if s == "" {
			return nil, invalid("stop", "stop[%d] must not be an empty string", i)
		}
		if len(s) > maxStopLen {
			return nil, invalid("stop", "stop[%d] has %d bytes; at most %d are allowed", i, len(s), maxStopLen)
		}
	}
	if len(list) == 0 {
		return nil, nil
	}
	return list, nil
}

// params turns the shared parameters into engine.SamplingParams (all but
// MaxTokens and the logprob fields, which depend on the endpoint).
// base holds the values of unset parameters (the model's defaults).
func (p *sampling) params(vocab int, base engine.SamplingParams) (engine.SamplingParams, *apiError) {
	sp := base
	sp.N = 1
	inRange := func(name string, v *float64, lo, hi float64, loOpen bool, dst *float32) *apiError {
		if v == nil {
			return nil
		}
		if *v < lo || *v > hi || (loOpen && *v == lo) {
			open := "["
			if loOpen {
				open = "("
			}
			return invalid(name, "%s must be in %s%g, %g], got %g", name, open, lo, hi, *v)
		}
		*dst = float32(*v)
		return nil
	}
	if p.N != nil {
		if *p.N < 1 || *p.N > maxN {
			return sp, invalid("n", "n must be in [1, %d], got %d", maxN, *p.N)
		}
		sp.N = *p.N
	}
	for _, c := range []struct {
		name   string
		v      *float64
		lo, hi float64
		loOpen bool
		dst    *float32
	}{
		{"temperature", p.Temperature, 0, 2, false, &sp.Temperature},
		{"top_p", p.TopP, 0, 1, true, &sp.TopP},
		{"min_p", p.MinP, 0, 1, false, &sp.MinP},
		{"presence_penalty", p.PresencePenalty, -2, 2, false, &sp.PresencePenalty},
		{"frequency_penalty", p.FrequencyPenalty, -2, 2, false, &sp.FrequencyPenalty},
	} {
		if err := inRange(c.name, c.v, c.lo, c.hi, c.loOpen, c.dst); err != nil {
			return sp, err
		}
	}
	if p.RepetitionPenalty != nil {
		if !(*p.RepetitionPenalty > 0) || *p.RepetitionPenalty > maxRepPenalty {
			return sp, invalid("repetition_penalty", "repetition_penalty must be in (0, %d] (1: off), got %g", maxRepPenalty, *p.RepetitionPenalty)
		}
		sp.RepetitionPenalty = float32(*p.RepetitionPenalty)
	}
	if p.TopK != nil {
		switch k := *p.TopK; {
		case k == -1 || k == 0:
			sp.TopK = 0 // off, whatever the model's default
		case k > 0:
			sp.TopK = k
		default:
			return sp, invalid("top_k", "top_k must be -1 or 0 (off) or positive, got %d", k)
		}
	}
	if p.Seed != nil {
		s := uint64(*p.Seed) // two's complement: distinct int64 seeds stay distinct
		sp.Seed = &s
	}
	stops, err := parseStop(p.Stop)
	if err != nil {
		return sp, err
	}
	sp.Stop = stops
	if len(p.StopTokenIDs) > maxStopIDs {
		return sp, invalid("stop_token_ids", "stop_token_ids has %d ids; at most %d are allowed", len(p.StopTokenIDs), maxStopIDs)
	}
	for i, id := range p.StopTokenIDs {
		if id < 0 || id >= int64(vocab) {
			return sp, invalid("stop_token_ids", "stop_token_ids[%d]: token id %d is out of range [0, %d)", i, id, vocab)
		}
		sp.StopTokenIDs = append(sp.StopTokenIDs, int32(id))
	}
	if p.IgnoreEOS != nil {
		sp.IgnoreEOS = *p.IgnoreEOS
	}
	if p.SkipSpecialTokens != nil {
		sp.KeepSpecialTokens = !*p.SkipSpecialTokens
	}
	if p.MinTokens != nil {
		if *p.MinTokens < 0 {
			return sp, invalid("min_tokens", "min_tokens must not be negative, got %d", *p.MinTokens)
		}
		sp.MinTokens = *p.MinTokens
	}
	if len(p.LogitBias) > engine.MaxLogitBias {
		return sp, invalid("logit_bias", "logit_bias has %d entries; at most %d are allowed", len(p.LogitBias), engine.MaxLogitBias)
	}
	for k, v := range p.LogitBias {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || id >= int64(vocab) {
			return sp, invalid("logit_bias", "logit_bias key %q is not a token id in [0, %d)", k, vocab)
		}
		b, ok := v.(float64)
		if !ok || !(b >= -100 && b <= 100) {
			return sp, invalid("logit_bias", "logit_bias[%q] must be a number in [-100, 100], got %v", k, v)
		}
		if sp.LogitBias == nil {
			sp.LogitBias = map[int32]float32{}
		}
		sp.LogitBias[int32(id)] = float32(b)
	}
	if !isNull(p.ResponseFormat) {
		var rf struct {
			Type       string `json:"type"`
			JSONSchema *struct {
				Schema json.RawMessage `json:"schema"`
			} `json:"json_schema"`
		}
		if json.Unmarshal(p.ResponseFormat, &rf) != nil {
			return sp, invalid("response_format", `response_format must be an object such as {"type": "json_object"}`)
		}
		switch rf.Type {
		case "text":
		case "json_object", "json_schema":
			if sp.IgnoreEOS {
				return sp, invalid("response_format", "response_format %s cannot be used with ignore_eos (the choice ends when the object closes)", rf.Type)
			}
			if rf.Type == "json_object" {
				sp.Grammar = grammar.JSONObject
				break
			}
			if rf.JSONSchema == nil || isNull(rf.JSONSchema.Schema) {
				return sp, invalid("response_format", "response_format json_schema needs json_schema.schema")
			}
			s, err := grammar.Shared.Schema(rf.JSONSchema.Schema)
			if err != nil {
				return sp, invalid("response_format", "response_format json_schema: %v", err)
			}
			sp.Grammar = s.New
		default:
			return sp, invalid("response_format", `response_format type must be "text", "json_object" or "json_schema", got %q`, rf.Type)
		}
	}
	if e := p.guided(&sp); e != nil {
		return sp, e
	}
	if p.StreamOptions != nil && (p.Stream == nil || !*p.Stream) {
		return sp, invalid("stream_options", "stream_options is only allowed when stream is true")
	}
	for _, c := range []struct {
		name string
		v    *int
	}{{"max_tokens", p.MaxTokens}, {"max_completion_tokens", p.MaxCompletionTokens}} {
		if c.v != nil && *c.v < 1 {
			return sp, invalid(c.name, "%s must be at least 1, got %d", c.name, *c.v)
		}
	}
	return sp, nil
}

// guided reads vLLM's guided_json, guided_choice, guided_regex and
// guided_grammar into sp.Grammar (one constraint a request: not with
// response_format json_* either).
func (p *sampling) guided(sp *engine.SamplingParams) *apiError {
	hasJSON, hasChoice, hasRegex, hasGrammar := !isNull(p.GuidedJSON), p.GuidedChoice != nil, p.GuidedRegex != nil, p.GuidedGrammar != nil
	n := 0
	name := ""
	for _, g := range []struct {
		has  bool
		name string
	}{{hasJSON, "guided_json"}, {hasChoice, "guided_choice"}, {hasRegex, "guided_regex"}, {hasGrammar, "guided_grammar"}} {
		if g.has {
			n++
			name = g.name
		}
	}
	if n == 0 {
		return nil
	}
	if n > 1 || sp.Grammar != nil {
		return invalid(name, "only one of response_format (json), guided_json, guided_choice, guided_regex and guided_grammar may be given")
	}
	if sp.IgnoreEOS {
		return invalid(name, "%s cannot be used with ignore_eos (the choice ends when the text is complete)", name)
	}
	if hasGrammar {
		g, err := grammar.Shared.Grammar(*p.GuidedGrammar)
		if err != nil {
			return invalid(name, "guided_grammar: %v", err)
		}
		sp.Grammar = g.New
		return nil
	}
	if hasRegex {
		re, err := grammar.Shared.Regex(*p.GuidedRegex)
		if err != nil {
			return invalid(name, "guided_regex: %v", err)
		}
		sp.Grammar = re.New
		return nil
	}
	if hasChoice {
		c, err := grammar.NewChoice(p.GuidedChoice)
		if err != nil {
			return invalid(name, "guided_choice: %v", err)
		}
		sp.Grammar = c.New
		return nil
	}
	raw := []byte(p.GuidedJSON)
	var text string
	if json.Unmarshal(raw, &text) == nil { // the schema as a JSON string
		raw = []byte(text)
	}
	schema, err := grammar.Shared.Schema(raw)
	if err != nil {
		return invalid(name, "guided_json: %v", err)
	}
	sp.Grammar = schema.New
	return nil
}

// checkMinTokens refuses min_tokens above the request's max_tokens (known
// once the context has fixed it).
func checkMinTokens(sp *engine.SamplingParams) *apiError {
	if sp.MinTokens > sp.MaxTokens {
		return invalid("min_tokens", "min_tokens %d is above max_tokens %d", sp.MinTokens, sp.MaxTokens)
	}
	return nil
}

// maxTokens is the requested completion length (max_completion_tokens
// wins over max_tokens, as vLLM does) and the parameter that set it; 0
// when neither is given.
func (p *sampling) maxTokens() (int, string) {
	switch {
	case p.MaxCompletionTokens != nil:
		return *p.MaxCompletionTokens, "max_completion_tokens"
	case p.MaxTokens != nil:
		return *p.MaxTokens, "max_tokens"
	}
	return 0, ""
}

func (p *sampling) streaming() bool { return p.Stream != nil && *p.Stream }

func (r *completionRequest) common() *sampling { return &r.sampling }
func (r *chatRequest) common() *sampling       { return &r.sampling }

func (p *sampling) includeUsage() bool {
	return p.StreamOptions != nil && p.StreamOptions.IncludeUsage != nil && *p.StreamOptions.IncludeUsage
}

// chunkUsage is the usage field of a streamed response's chunks: absent
// (nil), null until the last chunk (stream_options.include_usage), or,
// with continuous_usage_stats as well, the tokens so far in every chunk.
type chunkUsage struct {
	null       **usageJSON
	continuous bool
	prompt     int
	completion int
}

// newChunkUsage is p's chunk usage for prompts of lens tokens.
func (p *sampling) newChunkUsage(lens []int) *chunkUsage {
	u := &chunkUsage{}
	if p.includeUsage() {
		u.null = new(*usageJSON)
		u.continuous = p.StreamOptions.ContinuousUsageStats != nil && *p.StreamOptions.ContinuousUsageStats
		for _, n := range lens {
			u.prompt += n
		}
	}
	return u
}

// add counts an event's tokens.
func (u *chunkUsage) add(ev *engine.Event) { u.completion += len(ev.TokenIDs) }

// field is the usage field of the next chunk.
func (u *chunkUsage) field() **usageJSON {
	if !u.continuous {
		return u.null
	}
	x := &usageJSON{PromptTokens: u.prompt, CompletionTokens: u.completion, TotalTokens: u.prompt + u.completion}
	return &x
}

// checkCompletion validates what only completions have.
func (r *completionRequest) check() *apiError {

	if r.Suffix != nil && *r.Suffix != "" && r.Echo != nil && *r.Echo {
		return invalid("suffix", "suffix cannot be combined with echo")
	}
	n := 1
	if r.N != nil {
		n = *r.N
	}
	if r.BestOf != nil && *r.BestOf != n {
		return invalid("best_of", "best_of is not supported unless it equals n (%d), got %d", n, *r.BestOf)
	}
	if r.Logprobs != nil && (*r.Logprobs < 0 || *r.Logprobs > maxCompLogprob) {
		return invalid("logprobs", "logprobs must be in [0, %d], got %d", maxCompLogprob, *r.Logprobs)
	}
	return nil
}

// check validates what only chat has.
func (r *chatRequest) check() *apiError {
	if len(r.Messages) == 0 {
		return invalid("messages", "messages must be a non-empty list")
	}
	if r.TopLogprobs != nil {
		if *r.TopLogprobs < 0 || *r.TopLogprobs > maxTopLogprobs {
			return invalid("top_logprobs", "top_logprobs must be in [0, %d], got %d", maxTopLogprobs, *r.TopLogprobs)
		}
		if *r.TopLogprobs > 0 && (r.Logprobs == nil || !*r.Logprobs) {
			return invalid("top_logprobs", "top_logprobs requires logprobs to be true")
		}
	}
	for k := range r.ChatTemplateKwargs {
		if reservedKwargs[k] || strings.HasPrefix(k, "__") {
			return invalid("chat_template_kwargs", "chat_template_kwargs may not set %q", k)
		}
	}
	if e := r.ReasoningEffort; e != nil && *e != "low" && *e != "medium" && *e != "high" {
		return invalid("reasoning_effort", "reasoning_effort must be low, medium or high, got %q", *e)
	}
	return nil // tools and tool_choice: Server.tools
}

// reservedKwargs are template variables the server sets itself.
var reservedKwargs = map[string]bool{"messages": true, "tools": true, "documents": true, "add_generation_prompt": true,
	"bos_token": true, "eos_token": true, "raise_exception": true, "strftime_now": true}

// Roles a message may have.
var roles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// toChat converts message i for the chat template: content is a string
// or the text parts joined by newlines (as vLLM does); null content is
// allowed for assistant turns only.
func toChat(i int, m *chatMessage) (chat.Message, *apiError) {
	out := chat.Message{Role: m.Role, Name: m.Name, ToolCallID: m.ToolCallID, Reasoning: m.ReasoningContent}
	if !roles[m.Role] {
		return out, invalid("messages", "messages[%d].role must be one of system, developer, user, assistant, tool; got %q", i, m.Role)
	}
	for j, tc := range m.ToolCalls {
		if m.Role != "assistant" {
			return out, invalid("messages", "messages[%d].tool_calls: only assistant messages have tool calls", i)
		}
		if tc.Function.Name == "" {
			return out, invalid("messages", "messages[%d].tool_calls[%d].function.name is required", i, j)
		}
		args := tc.Function.Arguments
		if isNull(args) {
			args = json.RawMessage(`"{}"`)
		}
		out.ToolCalls = append(out.ToolCalls, chat.ToolCall{ID: tc.ID, Type: tc.Type, Name: tc.Function.Name, Arguments: args})
	}
	if isNull(m.Content) {
		if m.Role == "assistant" {
			out.ContentNone = true
			return out, nil
		}
		return out, invalid("messages", "messages[%d].content is required", i)
	}
	if json.Unmarshal(m.Content, &out.Content) == nil {
		return out, nil
	}
	var parts []contentPart
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return out, invalid("messages", "messages[%d].content must be a string or a list of content parts", i)
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" {
			return out, invalid("messages", "messages[%d].content[%d].type %q is not supported (only text)", i, j, p.Type)
		}
		if p.Text == nil {
			return out, invalid("messages", "messages[%d].content[%d].text is required", i, j)
		}
		if j > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(*p.Text)
	}
	out.Content = b.String()
	return out, nil
}
