package grpcapi

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/mkserve/mkserve/engine"
)

// Request limits, the same as the HTTP API's.
const (
	MaxN            = 128  // choices per request
	MaxTopLogprobs  = 20   // alternatives per token
	MaxStop         = 4    // stop strings per request (OpenAI's)
	MaxStopLen      = 256  // bytes per stop string
	MaxStopTokenIDs = 64   // extra stop token ids per request
	MaxRequestIDLen = 256  // bytes
	MaxBatch        = 4096 // requests per BatchGenerate, at most (Options.MaxBatch may lower it)
)

// FieldError is a request field that fails validation. Field is the path
// in the request as the proto (and OpenAI JSON) spells it, e.g.
// "sampling.top_p" or "requests[3].prompt.token_ids[7]".
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// at prefixes err's field with path (e.g. "requests[2]"); other errors
// pass unchanged.
func at(path string, err error) error {
	if fe, ok := err.(*FieldError); ok && path != "" {
		return &FieldError{Field: path + "." + fe.Field, Reason: fe.Reason}
	}
	return err
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// CheckN checks the number of choices: 1 ≤ n ≤ MaxN.
func CheckN(n int) error {
	if n < 1 || n > MaxN {
		return fieldErr("n", "%d is not in [1, %d]", n, MaxN)
	}
	return nil
}

// CheckMaxTokens checks max_tokens ≥ 1 (the context limit is the
// engine's: ErrTooLong).
func CheckMaxTokens(n int) error {
	if n < 1 {
		return fieldErr("max_tokens", "%d is not ≥ 1", n)
	}
	return nil
}

// CheckTemperature checks 0 ≤ t ≤ 2 (0: greedy).
func CheckTemperature(t float32) error {
	if !(t >= 0 && t <= 2) {
		return fieldErr("temperature", "%v is not in [0, 2]", t)
	}
	return nil
}

// CheckTopP checks 0 < p ≤ 1.
func CheckTopP(p float32) error {
	if !(p > 0 && p <= 1) {
		return fieldErr("top_p", "%v is not in (0, 1]", p)
	}
	return nil
}

// CheckTopK checks k ≥ 0 (0: off). The proto's -1 ("off", as vLLM) is
// turned into 0 before this check.
func CheckTopK(k int) error {
	if k < 0 {
		return fieldErr("top_k", "%d is not ≥ 0 (or -1 for off)", k)
	}
	return nil
}

// CheckMinP checks 0 ≤ p ≤ 1.
func CheckMinP(p float32) error {
	if !(p >= 0 && p <= 1) {
		return fieldErr("min_p", "%v is not in [0, 1]", p)
	}
	return nil
}

// CheckPenalty checks a presence or frequency penalty: -2 ≤ v ≤ 2.
func CheckPenalty(field string, v float32) error {
	if !(v >= -2 && v <= 2) {
		return fieldErr(field, "%v is not in [-2, 2]", v)
	}
	return nil
}

// MaxRepetitionPenalty bounds repetition_penalty, as the engine and the HTTP API do.
const MaxRepetitionPenalty = 10

// CheckRepetitionPenalty checks 0 < v ≤ MaxRepetitionPenalty (1: off).
func CheckRepetitionPenalty(v float32) error {
	if !(v > 0 && v <= MaxRepetitionPenalty) {
		return fieldErr("repetition_penalty", "%v is not in (0, %g]", v, float64(MaxRepetitionPenalty))
	}
	return nil
}

// CheckTopLogprobs checks 0 ≤ n ≤ MaxTopLogprobs, and that n > 0 only
// comes with logprobs.
func CheckTopLogprobs(n int, logprobs bool) error {
	if n < 0 || n > MaxTopLogprobs {
		return fieldErr("top_logprobs", "%d is not in [0, %d]", n, MaxTopLogprobs)
	}
	if n > 0 && !logprobs {
		return fieldErr("top_logprobs", "%d needs logprobs set", n)
	}
	return nil
}

// CheckStop checks the stop strings: at most MaxStop, each non-empty valid
// UTF-8 of at most MaxStopLen bytes.
func CheckStop(stop []string) error {
	if len(stop) > MaxStop {
		return fieldErr("stop", "%d strings, at most %d", len(stop), MaxStop)
	}
	for i, s := range stop {
		switch {
		case s == "":
			return fieldErr(fmt.Sprintf("stop[%d]", i), "empty")
		case len(s) > MaxStopLen:
			return fieldErr(fmt.Sprintf("stop[%d]", i), "%d bytes, at most %d", len(s), MaxStopLen)
		case !utf8.ValidString(s):
			return fieldErr(fmt.Sprintf("stop[%d]", i), "not valid UTF-8")
		}
	}
	return nil
}

// CheckTokenIDs checks that every id is in [0, vocab) (vocab ≤ 0: only
// that ids are ≥ 0). field names the list, e.g. "stop_token_ids".
func CheckTokenIDs(field string, ids []int32, vocab int) error {
	for i, id := range ids {
		if id < 0 || (vocab > 0 && int(id) >= vocab) {
			if vocab > 0 {
				return fieldErr(fmt.Sprintf("%s[%d]", field, i), "%d is not a token id in [0, %d)", id, vocab)
			}
			return fieldErr(fmt.Sprintf("%s[%d]", field, i), "%d is negative", id)
		}
	}
	return nil
}

// CheckRequestID checks a client's request id: at most MaxRequestIDLen
// bytes of printable ASCII (it lands in logs and headers).
func CheckRequestID(id string) error {
	if len(id) > MaxRequestIDLen {
		return fieldErr("request_id", "%d bytes, at most %d", len(id), MaxRequestIDLen)
	}
	if i := strings.IndexFunc(id, func(r rune) bool { return r < 0x21 || r > 0x7e }); i >= 0 {
		return fieldErr("request_id", "byte %d is not printable ASCII", i)
	}
	return nil
}

// ValidateSampling checks every field of p (after defaults) against the
// limits above; vocab bounds stop_token_ids (≤ 0: unknown). The error is
// a *FieldError naming the first bad field.
func ValidateSampling(p *engine.SamplingParams, vocab int) error {
	for _, err := range []error{
		CheckN(p.N),
		CheckMaxTokens(p.MaxTokens),
		CheckTemperature(p.Temperature),
		CheckTopP(p.TopP),
		CheckTopK(p.TopK),
		CheckMinP(p.MinP),
		CheckPenalty("presence_penalty", p.PresencePenalty),
		CheckPenalty("frequency_penalty", p.FrequencyPenalty),
		CheckRepetitionPenalty(p.RepetitionPenalty),
		CheckStop(p.Stop),
		CheckStopTokenIDs(p.StopTokenIDs, vocab),
		CheckTopLogprobs(p.TopLogprobs, p.Logprobs),
		checkJSONObject(p.Grammar != nil, p.IgnoreEOS),
		checkMinTokens(p.MinTokens, p.MaxTokens),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// CheckStopTokenIDs checks at most MaxStopTokenIDs ids, each in [0, vocab).
func CheckStopTokenIDs(ids []int32, vocab int) error {
	if len(ids) > MaxStopTokenIDs {
		return fieldErr("stop_token_ids", "%d ids, at most %d", len(ids), MaxStopTokenIDs)
	}
	return CheckTokenIDs("stop_token_ids", ids, vocab)
}

// checkJSONObject refuses json_object with ignore_eos: a constrained choice
// ends when its object closes.
func checkJSONObject(json, ignoreEOS bool) error {
	if json && ignoreEOS {
		return fieldErr("json_object", "json_object, json_schema and regex cannot be used with ignore_eos (the choice ends when the text is complete)")
	}
	return nil
}

// checkMinTokens bounds min_tokens by max_tokens.
func checkMinTokens(minTok, maxTok int) error {
	if minTok < 0 || minTok > maxTok {
		return fieldErr("min_tokens", "must be in [0, max_tokens %d], got %d", maxTok, minTok)
	}
	return nil
}
