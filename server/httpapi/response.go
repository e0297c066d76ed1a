package httpapi

import (
	"unicode/utf8"

	"github.com/mkserve/mkserve/engine"
)

// The response bodies, in OpenAI's shapes (field order as OpenAI's).

type usageJSON struct {
	PromptTokens            int                     `json:"prompt_tokens"`
	CompletionTokens        int                     `json:"completion_tokens"`
	TotalTokens             int                     `json:"total_tokens"`
	PromptTokensDetails     *promptTokenDetails     `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *completionTokenDetails `json:"completion_tokens_details,omitempty"`
}

type promptTokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// completionTokenDetails: a prediction's draft tokens that the model kept
// and refused (engine.Usage; OpenAI's names). Refused ones are not in
// completion_tokens (OpenAI bills them): they were verified, not output.
type completionTokenDetails struct {
	AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
}

func toUsage(u engine.Usage) *usageJSON {
	return &usageJSON{
		PromptTokens:        u.PromptTokens,
		CompletionTokens:    u.CompletionTokens,
		TotalTokens:         u.PromptTokens + u.CompletionTokens,
		PromptTokensDetails: &promptTokenDetails{CachedTokens: u.CachedTokens},
		CompletionTokensDetails: &completionTokenDetails{AcceptedPredictionTokens: u.AcceptedPredictionTokens,
			RejectedPredictionTokens: u.RejectedPredictionTokens},
	}
}

// ---- /v1/completions ----

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"` // "text_completion"
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usageJSON         `json:"usage,omitempty"`
}

// completionChunk is one streamed event; Usage is null on every chunk but
// the last when stream_options.include_usage is set, and absent otherwise.
type completionChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"` // "text_completion"
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   **usageJSON        `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
}

// completionLogprobs is the legacy completions logprobs record: parallel
// lists, one entry per token.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float32           `json:"token_logprobs"` // null for an echoed prompt's first token
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`   // the same
	TextOffset    []int                `json:"text_offset"`
}

// addFirst appends a token without a log-probability (an echoed prompt's
// first), text at offset; it returns offset advanced past it.
func (l *completionLogprobs) addFirst(text string, offset int) int {
	l.Tokens = append(l.Tokens, text)
	l.TokenLogprobs = append(l.TokenLogprobs, nil)
	l.TopLogprobs = append(l.TopLogprobs, nil)
	l.TextOffset = append(l.TextOffset, offset)
	return offset + utf8.RuneCountInString(text)
}

// add appends lps; offset is the text length (in characters) before them
// and is returned advanced past them.
func (l *completionLogprobs) add(lps []engine.Logprob, offset int) int {
	for _, lp := range lps {
		l.Tokens = append(l.Tokens, lp.Text)
		v := lp.Logprob
		l.TokenLogprobs = append(l.TokenLogprobs, &v)
		top := make(map[string]float32, len(lp.Top))
		for _, t := range lp.Top {
			if _, dup := top[t.Text]; !dup { // the most likely of equal texts
				top[t.Text] = t.Logprob
			}
		}
		l.TopLogprobs = append(l.TopLogprobs, top)
		l.TextOffset = append(l.TextOffset, offset)
		offset += utf8.RuneCountInString(lp.Text)
	}
	return offset
}

// ---- /v1/chat/completions ----

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"` // "chat.completion"
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *usageJSON   `json:"usage,omitempty"`
}

type chatChoice struct {
	Index        int           `json:"index"`
	Message      chatMessageJS `json:"message"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason string        `json:"finish_reason"`
}

type chatMessageJS struct {
	Role             string       `json:"role"`
	Content          *string      `json:"content"` // null when the message is only tool calls
	ReasoningContent *string      `json:"reasoning_content,omitempty"`
	Refusal          *string      `json:"refusal"`
	ToolCalls        []toolCallJS `json:"tool_calls,omitempty"`
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"` // "chat.completion.chunk"
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   **usageJSON       `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatDelta struct {
	Role             string       `json:"role,omitempty"`
	Content          *string      `json:"content,omitempty"`
	ReasoningContent *string      `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallJS `json:"tool_calls,omitempty"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
	Refusal []chatTokenLogprob `json:"refusal"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float32          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

func tokenBytes(s string) []int {
	b := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		b[i] = int(s[i])
	}
	return b
}

func (l *chatLogprobs) add(lps []engine.Logprob) {
	for _, lp := range lps {
		e := chatTokenLogprob{Token: lp.Text, Logprob: lp.Logprob, Bytes: tokenBytes(lp.Text), TopLogprobs: []chatTopLogprob{}}
		for _, t := range lp.Top {
			e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: t.Text, Logprob: t.Logprob, Bytes: tokenBytes(t.Text)})
		}
		l.Content = append(l.Content, e)
	}
}

// ---- /v1/models ----

type modelList struct {
	Object string      `json:"object"` // "list"
	Data   []modelJSON `json:"data"`
}

type modelJSON struct {
	ID          string `json:"id"`
	Object      string `json:"object"` // "model"
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	MaxModelLen int    `json:"max_model_len,omitempty"` // vLLM's extension
}
