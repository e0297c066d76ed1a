// Package httpapi serves the OpenAI-compatible HTTP API of mkserve on top
// of an engine.Generator:
//
//	POST /v1/completions       text or token prompts (one engine request each)
//	POST /v1/chat/completions  messages rendered with the checkpoint's chat template
//	GET  /v1/models            the served model (and /v1/models/{model})
//	POST /tokenize             a prompt or chat messages to token ids (vLLM's)
//	POST /detokenize           token ids to text (vLLM's)
//	GET  /health               200 when ready, 503 while loading or draining
//	GET  /metrics              Options.Metrics (404 when nil)
//
// Responses and errors have OpenAI's shapes; streams are server-sent events
// ending in "data: [DONE]". Request bodies are validated before anything
// reaches the engine: every bad parameter is a 400 naming it. Fields the
// server does not know are ignored, as OpenAI's and vLLM's servers do, so
// clients that send newer optional fields keep working; known fields that
// would change the output but are not implemented (suffix,
// best_of≠n, JSON Schema keywords grammar.Schema does not take, tools for
// a template without a readable tool-call format) are rejected instead of
// silently ignored. response_format {"type": "json_object"} or {"type":
// "json_schema"} (on both endpoints, as vLLM) constrains each choice to one
// JSON object, or to one matching the schema (engine.SamplingParams.Grammar).
// Chat requests take tools and tool_choice (tools.go).
package httpapi

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"go.uber.org/zap"

	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/grammar"
	"github.com/mkserve/mkserve/internal/version"
	"github.com/mkserve/mkserve/tokenizer"
)

func init() {
	// Release mode: no route dump or debug warnings on stdout.
	gin.SetMode(gin.ReleaseMode)
}

// DefaultMaxBodyBytes bounds request bodies when Options.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 8 << 20

// Options configure a Server.
type Options struct {
	// APIKey, when set, is the bearer token every /v1 request must carry
	// ("Authorization: Bearer <key>"); /health and /metrics stay open.
	APIKey string
	// CORSOrigins lists the browser origins allowed to call the API ("*":
	// any); empty disables CORS headers.
	CORSOrigins []string
	// MaxBodyBytes bounds a request body (0: DefaultMaxBodyBytes); larger
	// bodies get 413.
	MaxBodyBytes int64
	// Logger receives one line per finished request (nil: no logs).
	Logger *zap.Logger
	// LogPrompts adds the prompt text to each request's log line.
	LogPrompts bool
	// Defaults are the model's sampling defaults (generation_config.json),
	// used for parameters a request leaves unset, as vLLM does; nil:
	// OpenAI's defaults.
	Defaults *engine.SamplingDefaults
	// Metrics is served at /metrics; nil: 404.
	Metrics http.Handler
	// ToolFormat is the tool-call format the chat template teaches
	// (DetectToolFormat; "": requests with tools other than tool_choice
	// "none" get a 400).
	ToolFormat string
	// Reasoning is the reasoning format of the chat template's output
	// (DetectReasoning; ReasoningThink or ReasoningHarmony): chat
	// completions return the reasoning as reasoning_content. "": the text
	// is all content.
	Reasoning string
	// CompactJSON holds JSON-constrained output (response_format,
	// guided_json, forced tool calls) to compact whitespace: at most one
	// space between tokens, no newlines (json_whitespace compact).
	CompactJSON bool
	// ResponsesStore is how many finished /v1/responses responses are
	// kept in memory for previous_response_id and GET /v1/responses/{id}
	// (least recently used dropped first; 0: none).
	ResponsesStore int
	// Version is served at GET /version (vLLM's {"version": …}, with the
	// build's revision, time and Go version beside it); zero: the version
	// reads "unknown".
	Version version.Info
}

// Server is the HTTP API. Its methods are safe for concurrent use.
type Server struct {
	gen     engine.Generator
	tok     *tokenizer.Tokenizer
	tmpl    *chat.Template
	opts    Options
	log     *zap.Logger
	created int64 // for /v1/models
	handler http.Handler

	store *respStore // finished responses (/v1/responses)
	fim   *fimFormat // the tokenizer's fill-in-the-middle tokens (nil: none)

	ready    atomic.Bool
	info     atomic.Pointer[ModelInfo] // SetModelInfo
	draining atomic.Bool
}

// New builds a Server that sends requests to gen. tok encodes text
// prompts and rendered chat prompts; tmpl is the checkpoint's chat
// template (nil: chat completions answer 400). The server starts not
// ready: call SetReady(true) once it may take requests.
func New(gen engine.Generator, tok *tokenizer.Tokenizer, tmpl *chat.Template, opts Options) *Server {
	s := &Server{gen: gen, tok: tok, tmpl: tmpl, opts: opts, log: opts.Logger, created: time.Now().Unix(),
		store: newRespStore(max(opts.ResponsesStore, 0)), fim: detectFIM(tok)}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.opts.MaxBodyBytes <= 0 {
		s.opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	s.handler = s.routes()
	return s
}

// Handler is the http.Handler serving every endpoint.
func (s *Server) Handler() http.Handler { return s.handler }

// SetReady marks the server ready (or not) to take generation requests;
// /health follows it.
func (s *Server) SetReady(ready bool) { s.ready.Store(ready) }

// ModelInfo describes the loaded model to the APIs that report it
// (ollama's /api/tags, /api/ps and /api/show).
type ModelInfo struct {
	Family       string // config.json's model_type, e.g. "qwen3_moe"
	Parameters   int64  // values held in the weights
	Bytes        int64  // the weights' memory
	Quantization string // the form that holds most of the bytes: "F32", "BF16", "Q8" or "FP4"
}

// SetModelInfo records what the model loaded is (once it has loaded).
func (s *Server) SetModelInfo(m ModelInfo) { s.info.Store(&m) }

// modelInfo is what SetModelInfo recorded, or the zero ModelInfo.
func (s *Server) modelInfo() ModelInfo {
	if m := s.info.Load(); m != nil {
		return *m
	}
	return ModelInfo{}
}

// SetDraining makes the server refuse new generation requests with 503
// (and /health answer 503) while running ones finish.
func (s *Server) SetDraining(draining bool) { s.draining.Store(draining) }

func (s *Server) routes() http.Handler {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(s.recovery, s.cors)
	r.NoRoute(func(c *gin.Context) { writeError(c, errNotFound) })
	r.NoMethod(func(c *gin.Context) { writeError(c, errMethod) })
	r.GET("/health", s.health)
	r.GET("/version", s.version)
	r.GET("/metrics", s.metrics)
	v1 := r.Group("/v1", s.auth)
	v1.GET("/models", s.models)
	v1.GET("/models/*model", s.model)
	v1.POST("/completions", s.completions)
	v1.POST("/chat/completions", s.chatCompletions)
	v1.POST("/responses", s.responses)
	v1.POST("/messages", s.anthropicMessages) // Anthropic's Messages API (anthropic.go)
	v1.POST("/messages/count_tokens", s.anthropicCountTokens)
	v1.GET("/responses/:id", s.getResponse)
	v1.GET("/responses/:id/input_items", s.inputItems)
	v1.POST("/responses/:id/cancel", s.cancelResponse)
	v1.DELETE("/responses/:id", s.deleteResponse)
	r.POST("/tokenize", s.auth, s.tokenize)
	api := r.Group("/api", s.auth) // ollama's API (ollama.go)
	api.POST("/chat", s.ollamaChat)
	api.POST("/generate", s.ollamaGenerate)
	api.GET("/tags", s.ollamaTags)
	api.GET("/ps", s.ollamaPS)
	api.POST("/show", s.ollamaShow)
	api.GET("/version", s.ollamaVersion)
	r.POST("/detokenize", s.auth, s.detokenize)
	return r
}

// ---- middleware ----

// recovery turns a panic into a 500 in OpenAI's shape (when nothing was
// written yet) and a log line with the stack.
func (s *Server) recovery(c *gin.Context) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic serving request", zap.String("path", c.Request.URL.Path),
				zap.Any("panic", p), zap.ByteString("stack", debug.Stack()))
			if !c.Writer.Written() {
				writeError(c, errInternal)
			}
			c.Abort()
		}
	}()
	c.Next()
}

// cors answers preflight requests and marks responses to allowed origins.
func (s *Server) cors(c *gin.Context) {
	origin := c.GetHeader("Origin")
	if len(s.opts.CORSOrigins) == 0 || origin == "" {
		c.Next()
		return
	}
	any := slices.Contains(s.opts.CORSOrigins, "*")
	allowed := any || slices.Contains(s.opts.CORSOrigins, origin)
	preflight := c.Request.Method == http.MethodOptions && c.GetHeader("Access-Control-Request-Method") != ""
	h := c.Writer.Header()
	h.Add("Vary", "Origin")
	if !allowed {
		if preflight {
			writeError(c, &apiError{Status: http.StatusForbidden, Type: typeInvalid, Code: "cors_origin",
				Message: fmt.Sprintf("origin %q is not allowed", origin)})
			c.Abort()
			return
		}
		c.Next()
		return
	}
	if any {
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	h.Set("Access-Control-Expose-Headers", "X-Request-Id")
	if preflight {
		h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
		if req := c.GetHeader("Access-Control-Request-Headers"); req != "" {
			h.Set("Access-Control-Allow-Headers", req)
		} else {
			h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
		}
		h.Set("Access-Control-Max-Age", "600")
		c.AbortWithStatus(http.StatusNoContent)
		return
	}
	c.Next()
}

// auth checks the bearer token when Options.APIKey is set.
func (s *Server) auth(c *gin.Context) {
	if s.opts.APIKey == "" {
		c.Next()
		return
	}
	h := c.GetHeader("Authorization")
	scheme, key, ok := strings.Cut(h, " ")
	if x := c.GetHeader("X-Api-Key"); x != "" && h == "" { // (Anthropic's clients send the key so)
		scheme, key, ok = "Bearer", x, true
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") ||
		subtle.ConstantTimeCompare([]byte(strings.TrimSpace(key)), []byte(s.opts.APIKey)) != 1 {
		c.Header("WWW-Authenticate", "Bearer")
		writeError(c, errUnauthorized)
		c.Abort()
		return
	}
	c.Next()
}

// ---- small endpoints ----

func (s *Server) health(c *gin.Context) {
	switch {
	case s.draining.Load():
		writeJSON(c, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
	case !s.ready.Load():
		writeJSON(c, http.StatusServiceUnavailable, map[string]string{"status": "loading"})
	default:
		writeJSON(c, http.StatusOK, map[string]string{"status": "ok"})
	}
}

// version answers GET /version: the build the server runs.
func (s *Server) version(c *gin.Context) {
	v := s.opts.Version
	if v.Version == "" {
		v.Version = "unknown"
	}
	writeJSON(c, http.StatusOK, v)
}

func (s *Server) metrics(c *gin.Context) {
	if s.opts.Metrics == nil {
		writeError(c, errNotFound)
		return
	}
	s.opts.Metrics.ServeHTTP(c.Writer, c.Request)
}

func (s *Server) modelJSON() modelJSON {
	return modelJSON{ID: s.gen.ModelName(), Object: "model", Created: s.created, OwnedBy: "mkserve", MaxModelLen: s.gen.MaxContext()}
}

func (s *Server) models(c *gin.Context) {
	writeJSON(c, http.StatusOK, modelList{Object: "list", Data: []modelJSON{s.modelJSON()}})
}

func (s *Server) model(c *gin.Context) {
	name := strings.TrimPrefix(c.Param("model"), "/")
	if name != s.gen.ModelName() {
		writeError(c, unknownModel(name, s.gen.ModelName()))
		return
	}
	writeJSON(c, http.StatusOK, s.modelJSON())
}

// ---- helpers ----

// admit refuses generation while loading or draining.
func (s *Server) admit() *apiError {
	switch {
	case s.draining.Load():
		return errDraining
	case !s.ready.Load():
		return errNotReady
	}
	return nil
}

// readBody reads the request body, at most Options.MaxBodyBytes of it.
func (s *Server) readBody(c *gin.Context) ([]byte, *apiError) {
	limit := s.opts.MaxBodyBytes
	if c.Request.ContentLength > limit {
		return nil, tooLarge(limit)
	}
	data, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(limit)
		}
		return nil, invalid("", "reading the request body: %v", err)
	}
	return data, nil
}

// checkModel accepts the served model's name, or no name.
func (s *Server) checkModel(name string) *apiError {
	if name != "" && name != s.gen.ModelName() {
		return unknownModel(name, s.gen.ModelName())
	}
	return nil
}

func writeJSON(c *gin.Context, status int, v any) {
	b, err := encodeJSON(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = encodeJSON(errInternal.body())
	}
	c.Header("Content-Type", "application/json")
	c.Status(status)
	_, _ = c.Writer.Write(b)
}

// encodeJSON is v as the responses carry it: HTML characters unescaped,
// a newline at the end.
func encodeJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	err := enc.Encode(v)
	return buf.Bytes(), err
}

func writeError(c *gin.Context, e *apiError) { writeJSON(c, e.Status, e.body()) }

// newID returns prefix followed by 32 random hex digits.
func newID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// layout applies the server's JSON whitespace rule to a request's grammar.
func (s *Server) layout(sp *engine.SamplingParams) {
	if s.opts.CompactJSON && sp.Grammar != nil {
		sp.Grammar = grammar.Compact(sp.Grammar)
	}
}
