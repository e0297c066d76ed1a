package engine

import (
	"context"
	"errors"
	"time"

	"github.com/mkserve/mkserve/grammar"
)

// SamplingParams are a request's decoding settings, already validated by
// the server adapters (Validate checks them again).
type SamplingParams struct {
	N                 int      // choices per prompt (≥ 1); they share the prompt's KV blocks
	MaxTokens         int      // new tokens per choice at most (≥ 1)
	Temperature       float32  // 0: greedy
	TopP              float32  // (0, 1]; 1: off
	TopK              int      // 0: off
	MinP              float32  // [0, 1]; 0: off
	Seed              *uint64  // same seed + same request ⇒ same output
	PresencePenalty   float32  // [-2, 2]
	FrequencyPenalty  float32  // [-2, 2]
	RepetitionPenalty float32  // > 0; 1: off
	Stop              []string // stop strings: never part of the returned text
	StopTokenIDs      []int32  // extra stop tokens (kept out of the text too)
	IgnoreEOS         bool     // keep going past the model's end-of-sequence tokens
	MinTokens         int      // new tokens per choice before an end-of-sequence or stop token may come (vLLM's min_tokens; a Grammar's complete text ends the choice regardless)
	Logprobs          bool     // return the chosen token's log-probability
	TopLogprobs       int      // and this many alternatives (0–20)
	// PromptLogprobs also returns the log-probability of each prompt token
	// after the first (with TopLogprobs alternatives), on every choice's
	// first event: the prompt is computed in full (no prefix-cache hits)
	// and its steps sample on the host.
	PromptLogprobs bool
	// LogitBias adds a bias in [-100, 100] to token ids' logits before the
	// penalties and sampling (OpenAI's logit_bias; -100 in effect bans a
	// token, 100 forces it). Log-probabilities stay those of the raw logits.
	LogitBias map[int32]float32
	// KeepSpecialTokens keeps special tokens' text in the output (vLLM's
	// skip_special_tokens false): what a tool-call parser needs when the
	// template's call markers are special tokens. An end-of-sequence or
	// stop token still ends the text without appearing in it.
	KeepSpecialTokens bool
	// Grammar, when set, makes a fresh validator for each choice that the
	// choice's text must satisfy (package grammar: one JSON object for
	// response_format json_object, one matching a schema for json_schema, a
	// tool call's shape): each step the whole vocabulary is masked to the
	// tokens whose bytes keep the text a prefix (grammar.Vocab.Mask) and the
	// token is drawn from the masked logits — on the device when the backend
	// samples there (the mask goes with the row; overlapped steps compute it
	// while the GPU runs the forward pass) — and the choice ends with an
	// end-of-sequence token as soon as the validator is complete. Needs a
	// tokenizer whose tokens' bytes are known (TokenByter).
	Grammar func() grammar.Validator
}

// TokenByter is a Detokenizer that also gives each token's raw bytes
// (tokenizer.Tokenizer): JSON-constrained requests need it.
type TokenByter interface {
	TokenBytes(id int32) []byte
	HasTokenBytes() bool
}

// SpecialTokenByter is a TokenByter that also gives special tokens' bytes
// (their content): a constrained request that keeps special tokens
// (SamplingParams.KeepSpecialTokens) may then write them — gpt-oss's
// harmony markers in a forced tool call.
type SpecialTokenByter interface {
	SpecialTokenBytes(id int32) []byte
}

// Request is one generation request as the engine sees it.
type Request struct {
	ID       string // unique; used in logs and metrics
	Prompt   []int32
	Sampling SamplingParams
	Priority int // lower runs first among waiting requests; FCFS within a priority
	// Prediction is text the output is expected to repeat, as tokens
	// (OpenAI's predicted outputs: a file being edited, say). Decode steps
	// draft up to PredictionTokens tokens from it where the output follows
	// it, verified as speculation's drafts are (spec.go): the output is
	// the model's own; only the number of steps changes. Used when the
	// request qualifies for speculation (no penalties, no logit_bias).
	Prediction []int32
	// Arrival is when the server received the request (zero: now).
	Arrival time.Time
}

// TokenLogprob is a token with its log-probability.
type TokenLogprob struct {
	ID      int32
	Text    string
	Logprob float32
}

// Logprob is the log-probability record of one generated token.
type Logprob struct {
	TokenLogprob
	Top []TokenLogprob // the TopLogprobs most likely tokens, most likely first
}

// Usage counts a request's tokens.
type Usage struct {
	PromptTokens     int
	CompletionTokens int // summed over all choices
	CachedTokens     int // prompt tokens served from the prefix cache
	// Draft tokens from Request.Prediction that the model kept, and that
	// it refused (verified and replaced: not part of CompletionTokens).
	AcceptedPredictionTokens, RejectedPredictionTokens int
}

// Finish reasons, as OpenAI names them.
const (
	FinishStop   = "stop"   // a stop string, stop token or EOS
	FinishLength = "length" // MaxTokens reached or the context is full
	FinishAbort  = "abort"  // cancelled by the client, a deadline or shutdown
	FinishError  = "error"  // the engine failed the step
)

// Event is a piece of output of one choice. Text is the newly completed,
// stop-string-safe text since the previous event of that choice.
type Event struct {
	Index    int // choice index in [0, N)
	TokenIDs []int32
	Text     string
	Logprobs []Logprob // one per token in TokenIDs, when requested
	// PromptLogprobs (SamplingParams.PromptLogprobs): the prompt's tokens
	// 1 .. len−1 given the ones before, on each choice's first event.
	PromptLogprobs []Logprob
	FinishReason   string // non-empty on the choice's last event
	// Usage is set on the request's very last event (after every choice finished).
	Usage *Usage
	Err   error // set with FinishError
}

// Errors Generate returns before accepting a request.
var (
	ErrQueueFull = errors.New("engine: too many waiting requests")
	ErrDraining  = errors.New("engine: shutting down, not accepting requests")
	ErrTooLong   = errors.New("engine: prompt plus max_tokens exceeds the model's context")
	// ErrGrammarUnsupported: a constrained request (SamplingParams.Grammar)
	// for a model whose tokenizer gives no token bytes or that has no
	// end-of-sequence token.
	ErrGrammarUnsupported = errors.New("constrained output (response_format, a forced tool call) is not supported for this model")
)

// Generator is what the server adapters need from the engine.
type Generator interface {
	// Generate queues req and returns a channel that receives its events and
	// is closed after the last one. Cancelling ctx aborts the request and
	// frees its KV blocks at once. Errors: ErrQueueFull, ErrDraining,
	// ErrTooLong, or a validation error naming the bad parameter.
	Generate(ctx context.Context, req *Request) (<-chan Event, error)
	// ModelName is the served model's name (for /v1/models and metrics).
	ModelName() string
	// MaxContext is the longest prompt + completion the engine accepts.
	MaxContext() int
}
