package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
)

// apiError is an error as OpenAI's API reports it: an HTTP status and the
// body {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	Status  int
	Message string
	Type    string
	Param   string // "" is sent as null
	Code    string // "" is sent as null
}

func (e *apiError) Error() string { return e.Message }

// errorBody is the JSON shape of an apiError.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func (e *apiError) body() errorBody {
	var b errorBody
	b.Error.Message, b.Error.Type = e.Message, e.Type
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	if e.Code != "" {
		b.Error.Code = &e.Code
	}
	return b
}

// Error types, as OpenAI names them where it has a name.
const (
	typeInvalid     = "invalid_request_error"
	typeRateLimit   = "rate_limit_error"
	typeUnavailable = "service_unavailable_error"
	typeServer      = "server_error"
)

// invalid is a 400 naming the parameter at fault.
func invalid(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: fmt.Sprintf(format, args...), Type: typeInvalid, Param: param}
}

var (
	errUnauthorized = &apiError{Status: http.StatusUnauthorized, Type: typeInvalid, Code: "invalid_api_key",
		Message: "missing or incorrect API key: send it as 'Authorization: Bearer <key>'"}
	errNotReady = &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "not_ready",
		Message: "the server is loading the model; retry shortly"}
	errDraining = &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "draining",
		Message: "the server is shutting down and accepts no new requests"}
	errQueueFull = &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "queue_full",
		Message: "too many requests are waiting; retry later"}
	errInternal = &apiError{Status: http.StatusInternalServerError, Type: typeServer,
		Message: "the server had an error while processing the request"}
	errNotFound = &apiError{Status: http.StatusNotFound, Type: typeInvalid, Code: "not_found",
		Message: "no such endpoint"}
	errMethod = &apiError{Status: http.StatusMethodNotAllowed, Type: typeInvalid, Code: "method_not_allowed",
		Message: "method not allowed for this endpoint"}
)

func tooLarge(limit int64) *apiError {
	return &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalid, Code: "request_too_large",
		Message: fmt.Sprintf("request body exceeds the limit of %d bytes", limit)}
}

func unknownModel(name, served string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: typeInvalid, Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("the model %q does not exist; this server serves %q", name, served)}
}

// generateError maps an error of engine.Generator.Generate to the response
// a client sees; tooLongParam names the parameter an ErrTooLong blames.
// Anything unknown becomes a 500 that reveals nothing of the cause (which
// the request log records).
func generateError(err error, tooLongParam string) *apiError {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, engine.ErrQueueFull):
		return errQueueFull
	case errors.Is(err, engine.ErrDraining):
		return errDraining
	case errors.Is(err, engine.ErrTooLong):
		return invalid(tooLongParam, "the prompt plus max_tokens exceeds the model's context length")
	case errors.Is(err, engine.ErrGrammarUnsupported):
		return invalid("response_format", "%s", strings.TrimPrefix(err.Error(), "engine: "))
	case errors.Is(err, grammar.ErrGrammarTooComplex):
		return invalid("guided_grammar", "%s", grammar.ErrGrammarTooComplex.Error())
	}
	return errInternal
}
