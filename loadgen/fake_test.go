package loadgen

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fake is an OpenAI-compatible streaming server for tests. Each request gets
// max tokens content chunks ("w0 ", "w1 ", ...): the first after firstDelay,
// the others chunkDelay apart; then, unless told otherwise, a usage chunk
// and "data: [DONE]". It checks the request body the way a strict server
// would and answers 400 when a field loadgen must send is missing.
type fake struct {
	firstDelay, chunkDelay time.Duration

	// status, when set, gives the HTTP status of the n-th request (from 0);
	// 0 or 200 streams normally.
	status func(n int64) int
	// fault, when set, breaks the stream: "error-event", "no-done",
	// "bad-json", "no-usage", "no-content".
	fault string
	// wantAuth is the Authorization header every request must carry.
	wantAuth string

	n           atomic.Int64 // requests seen
	inflight    atomic.Int64
	maxInflight atomic.Int64

	mu          sync.Mutex
	promptWords []int // per request, as the server counted them
	maxTokens   []int
	models      []string
	sampling    []string // per request: its temperature, top_p, top_k and response_format fields as sent ("-": absent)
}

func (f *fake) start(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv
}

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	in := f.inflight.Add(1)
	// A request stops being in flight before the server's last write: the
	// client may start the next one as soon as it reads that write.
	done := sync.OnceFunc(func() { f.inflight.Add(-1) })
	defer done()
	httpError := func(w http.ResponseWriter, msg string, code int) {
		done()
		http.Error(w, msg, code)
	}
	for {
		m := f.maxInflight.Load()
		if in <= m || f.maxInflight.CompareAndSwap(m, in) {
			break
		}
	}
	n := f.n.Add(1) - 1

	chat := r.URL.Path == "/v1/chat/completions"
	if !chat && r.URL.Path != "/v1/completions" {
		httpError(w, "no route "+r.URL.Path, http.StatusNotFound)
		return
	}
	if f.wantAuth != "" && r.Header.Get("Authorization") != f.wantAuth {
		httpError(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
		return
	}
	var body struct {
		Model         string `json:"model"`
		Prompt        *string
		Messages      []struct{ Role, Content string }
		MaxTokens     *int  `json:"max_tokens"`
		MaxCompletion *int  `json:"max_completion_tokens"`
		Stream        bool  `json:"stream"`
		IgnoreEOS     *bool `json:"ignore_eos"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		Temperature    *float64        `json:"temperature"`
		TopP           *float64        `json:"top_p"`
		TopK           *int            `json:"top_k"`
		ResponseFormat *responseFormat `json:"response_format"`
		GuidedGrammar  *string         `json:"guided_grammar"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		httpError(w, "bad body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var text string
	var maxTok *int
	if chat {
		if len(body.Messages) != 1 || body.Messages[0].Role != "user" {
			httpError(w, "want one user message", http.StatusBadRequest)
			return
		}
		text, maxTok = body.Messages[0].Content, body.MaxCompletion
	} else {
		if body.Prompt == nil {
			httpError(w, "no prompt", http.StatusBadRequest)
			return
		}
		text, maxTok = *body.Prompt, body.MaxTokens
	}
	switch {
	case !body.Stream:
		httpError(w, "stream must be true", http.StatusBadRequest)
		return
	case body.GuidedGrammar != nil && (body.ResponseFormat != nil || body.IgnoreEOS != nil || *body.GuidedGrammar == ""):
		httpError(w, "guided_grammar alone, without ignore_eos", http.StatusBadRequest)
		return
	case body.GuidedGrammar != nil:
	case body.ResponseFormat == nil && (body.IgnoreEOS == nil || !*body.IgnoreEOS):
		httpError(w, "ignore_eos must be true", http.StatusBadRequest)
		return
	case body.ResponseFormat != nil && ((body.ResponseFormat.Type != "json_object" && body.ResponseFormat.Type != "json_schema") || body.IgnoreEOS != nil):
		httpError(w, "response_format json_object or json_schema, without ignore_eos", http.StatusBadRequest)
		return
	case body.StreamOptions == nil || !body.StreamOptions.IncludeUsage:
		httpError(w, "stream_options.include_usage must be true", http.StatusBadRequest)
		return
	case maxTok == nil || *maxTok < 1 || *maxTok > 10_000:
		httpError(w, "max tokens missing or out of range", http.StatusBadRequest)
		return
	}
	words := len(strings.Fields(text))
	f.mu.Lock()
	f.promptWords = append(f.promptWords, words)
	f.maxTokens = append(f.maxTokens, *maxTok)
	f.models = append(f.models, body.Model)
	field := func(v any, ok bool) string {
		if !ok {
			return "-"
		}
		return fmt.Sprint(v)
	}
	f.sampling = append(f.sampling, strings.Join([]string{
		field(deref(body.Temperature), body.Temperature != nil), field(deref(body.TopP), body.TopP != nil),
		field(deref(body.TopK), body.TopK != nil), field(rfType(body.ResponseFormat), body.ResponseFormat != nil) + field("grammar", body.GuidedGrammar != nil)}, " "))
	f.mu.Unlock()

	if f.status != nil {
		if st := f.status(n); st != 0 && st != http.StatusOK {
			httpError(w, fmt.Sprintf(`{"error":{"message":"injected %d"}}`, st), st)
			return
		}
	}

	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(s string) {
		fmt.Fprintf(w, "data: %s\n\n", s)
		fl.Flush()
	}
	sleep := func(d time.Duration) bool {
		if d <= 0 {
			return true
		}
		select {
		case <-r.Context().Done():
			return false
		case <-time.After(d):
			return true
		}
	}
	piece := func(i int) string {
		s, _ := json.Marshal(fmt.Sprintf("w%d ", i))
		if chat {
			return `{"choices":[{"index":0,"delta":{"content":` + string(s) + `}}]}`
		}
		return `{"choices":[{"index":0,"text":` + string(s) + `}]}`
	}
	if chat { // role-only first chunk: not content, must not stop the TTFT clock
		send(`{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`)
	}
	fmt.Fprint(w, ": keep-alive comment\n\n")
	if f.fault == "no-content" {
		send(`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0}}`)
		done()
		send("[DONE]")
		return
	}
	for i := range *maxTok {
		d := f.chunkDelay
		if i == 0 {
			d = f.firstDelay
		}
		if !sleep(d) {
			return
		}
		send(piece(i))
		if i == 0 && f.fault == "error-event" {
			send(`{"error":{"message":"injected stream error"}}`)
			return
		}
		if i == 0 && f.fault == "bad-json" {
			send(`{"choices":[`)
			return
		}
	}
	if f.fault == "no-done" {
		return
	}
	if f.fault != "no-usage" {
		send(fmt.Sprintf(`{"choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}`,
			words, *maxTok, words+*maxTok))
	}
	done()
	send("[DONE]")
}

func (f *fake) seen() (words, maxTokens []int, models []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.promptWords...), append([]int(nil), f.maxTokens...), append([]string(nil), f.models...)
}

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

// deref is *p, or the zero value for nil.
func deref[T any](p *T) T {
	var z T
	if p == nil {
		return z
	}
	return *p
}

// responseFormat is a request's response_format as the fake reads it.
type responseFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// rfType is "json" for json_object and "schema" for json_schema with a schema.
func rfType(r *responseFormat) string {
	if r == nil || r.Type == "json_object" {
		return "json"
	}
	if r.JSONSchema != nil && len(r.JSONSchema.Schema) > 0 {
		return "schema"
	}
	return "bad"
}
