package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/mkserve/mkserve/internal/lru"
)

// respStore keeps the latest finished responses in memory (Options.
// ResponsesStore of them, and respStoreBytes of their conversations, least
// recently used dropped first): their JSON, for GET /v1/responses/{id},
// and their conversations — input items without instructions, then the
// output as input items — which a request naming one as
// previous_response_id continues. A conversation is a chain of turns, each
// holding its own items and the turn before (linear memory however long
// it runs), and counted whole against the byte limit (so what the store
// holds stays within it even through turns already dropped). Lost on
// restart, as vLLM's in-memory store.
type respStore = lru.Cache[string, *storedResp]

// respStoreBytes bounds the stored responses' bodies and conversations.
const respStoreBytes = 256 << 20

type storedResp struct {
	prev *storedResp // the turn before (nil: the conversation starts here)
	nIn  int         // input items (the first of items)
	size int64       // body and the whole conversation's items, in bytes (at creation)
	// A background response's entry changes once, when it ends.
	mu        sync.Mutex
	body      []byte          // the response object as it stands
	items     []respInputItem // this turn's input items, then its output as input items
	cancel    func()          // a running background response's (nil: not running)
	cancelled bool            // POST …/cancel stopped it
}

// wasCancelled reports whether POST …/cancel stopped r.
func (r *storedResp) wasCancelled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancelled
}

// running reports whether r is a background response still generating.
func (r *storedResp) running() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancel != nil
}

// current is r's response object as it stands.
func (r *storedResp) current() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.body
}

// finish records a background response's end: its final object and output.
func (r *storedResp) finish(body []byte, out []respInputItem) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.body, r.items, r.cancel = body, append(r.items, out...), nil
}

func newRespStore(limit int) *respStore {
	return lru.NewSized[string](limit, respStoreBytes, func(r *storedResp) int64 { return r.size })
}

// newStored is a turn after prev (nil: none) with its input and output items.
func newStored(body []byte, prev *storedResp, in, out []respInputItem) *storedResp {
	items := append(slices.Clip(in), out...)
	r := &storedResp{body: body, prev: prev, items: items, nIn: len(in), size: int64(len(body))}
	for _, it := range items {
		r.size += int64(len(it.Content) + len(it.Output) + len(it.Name) + len(it.CallID) + 64)
		if it.Arguments != nil {
			r.size += int64(len(*it.Arguments))
		}
	}
	if prev != nil {
		r.size += prev.size - int64(len(prev.body))
	}
	return r
}

// history is the conversation r ends, oldest item first.
func (r *storedResp) history() []respInputItem {
	var turns []*storedResp
	for t := r; t != nil; t = t.prev {
		turns = append(turns, t)
	}
	var out []respInputItem
	for i := len(turns) - 1; i >= 0; i-- {
		turns[i].mu.Lock()
		out = append(out, turns[i].items...)
		turns[i].mu.Unlock()
	}
	return out
}

// inputs is what r's request sent the model: the conversation before it
// and its own input items (not its output).
func (r *storedResp) inputs() []respInputItem {
	var before []respInputItem
	if r.prev != nil {
		before = r.prev.history()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append(before, r.items[:r.nIn]...)
}

// withIDs gives items without an id one (msg_, fc_, fco_, rs_ …).
func withIDs(items []respInputItem) []respInputItem {
	out := slices.Clone(items)
	for i := range out {
		if out[i].ID != "" {
			continue
		}
		prefix := map[string]string{"function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}[out[i].Type]
		if prefix == "" {
			prefix = "msg_"
		}
		out[i].ID = respID(prefix)
	}
	return out
}

// outputItems are a response's output as input items of the next turn.
func outputItems(items []any) []respInputItem {
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	var out []respInputItem
	for _, it := range items {
		switch v := it.(type) {
		case *respReasoningJS:
			b, _ := json.Marshal(v.Content)
			out = append(out, respInputItem{ID: v.ID, Type: "reasoning", Content: b})
		case *respMessageJS:
			text := ""
			for _, c := range v.Content {
				text += c.Text
			}
			out = append(out, respInputItem{ID: v.ID, Type: "message", Role: "assistant", Content: str(text)})
		case *respCallJS:
			args := v.Arguments
			out = append(out, respInputItem{ID: v.ID, Type: "function_call", CallID: v.CallID, Name: v.Name, Arguments: &args})
		}
	}
	return out
}

// errNoResponse is a 404 for a response the store does not hold.
func errNoResponse(id string, limit int) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: typeInvalid, Code: "not_found", Param: "response_id",
		Message: "no stored response " + id + " (the server keeps its latest " + itoa(limit) + " responses in memory; this one was not stored, was dropped, or the server restarted)"}
}

// stored is the response the path names, or false once a 404 is written.
func (s *Server) stored(c *gin.Context) (*storedResp, bool) {
	id := c.Param("id")
	r, ok := s.store.Get(id)
	if !ok {
		writeError(c, errNoResponse(id, s.opts.ResponsesStore))
	}
	return r, ok
}

// getResponse serves GET /v1/responses/{id}.
func (s *Server) getResponse(c *gin.Context) {
	r, ok := s.stored(c)
	if !ok {
		return
	}
	c.Data(http.StatusOK, "application/json", r.current())
}

// cancelResponse serves POST /v1/responses/{id}/cancel: a running
// background response stops (status "cancelled" once it has); the
// response object is returned as it then stands.
func (s *Server) cancelResponse(c *gin.Context) {
	r, ok := s.stored(c)
	if !ok {
		return
	}
	r.mu.Lock()
	cancel := r.cancel
	r.cancelled = r.cancelled || cancel != nil
	r.mu.Unlock()
	if cancel == nil {
		var st struct{ Background bool }
		if json.Unmarshal(r.current(), &st); !st.Background {
			writeError(c, invalid("response_id", "only background responses can be cancelled"))
			return
		}
		c.Data(http.StatusOK, "application/json", r.current()) // (already ended)
		return
	}
	cancel()
	for deadline := time.Now().Add(5 * time.Second); r.running() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
	c.Data(http.StatusOK, "application/json", r.current())
}

// deleteResponse serves DELETE /v1/responses/{id}.
func (s *Server) deleteResponse(c *gin.Context) {
	id := c.Param("id")
	if !s.store.Remove(id) {
		writeError(c, errNoResponse(id, s.opts.ResponsesStore))
		return
	}
	writeJSON(c, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}

// inputItems serves GET /v1/responses/{id}/input_items: the items the
// response's request sent the model, as OpenAI lists them (order desc by
// default; limit 1–100, default 20; after an item id).
func (s *Server) inputItems(c *gin.Context) {
	r, ok := s.stored(c)
	if !ok {
		return
	}
	limit := 20
	if q := c.Query("limit"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 1 || n > 100 {
			writeError(c, invalid("limit", "limit must be an integer in [1, 100], got %q", q))
			return
		}
		limit = n
	}
	items := r.inputs()
	switch c.DefaultQuery("order", "desc") {
	case "desc":
		slices.Reverse(items)
	case "asc":
	default:
		writeError(c, invalid("order", "order must be asc or desc, got %q", c.Query("order")))
		return
	}
	if after := c.Query("after"); after != "" {
		i := slices.IndexFunc(items, func(it respInputItem) bool { return it.ID == after })
		if i < 0 {
			writeError(c, invalid("after", "no item %q in this response's input", after))
			return
		}
		items = items[i+1:]
	}
	more := len(items) > limit
	items = items[:min(limit, len(items))]
	data := make([]any, len(items))
	for i, it := range items {
		data[i] = listedItem(it)
	}
	resp := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(items) > 0 {
		resp["first_id"], resp["last_id"] = items[0].ID, items[len(items)-1].ID
	}
	writeJSON(c, http.StatusOK, resp)
}

// listedItem is an input item as the Responses API lists it.
func listedItem(it respInputItem) any {
	text := func(raw json.RawMessage) string {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s
		}
		var parts []respPartIn
		_ = json.Unmarshal(raw, &parts)
		var out []string
		for _, p := range parts {
			if p.Text != nil {
				out = append(out, *p.Text)
			}
		}
		return strings.Join(out, "\n")
	}
	switch it.Type {
	case "function_call":
		args := ""
		if it.Arguments != nil {
			args = *it.Arguments
		}
		return map[string]any{"type": "function_call", "id": it.ID, "call_id": it.CallID, "name": it.Name, "arguments": args, "status": "completed"}
	case "function_call_output":
		return map[string]any{"type": "function_call_output", "id": it.ID, "call_id": it.CallID, "output": text(it.Output), "status": "completed"}
	case "reasoning":
		return map[string]any{"type": "reasoning", "id": it.ID, "summary": []any{}, "content": []map[string]string{{"type": "reasoning_text", "text": text(it.Content)}}}
	}
	kind := "input_text"
	if it.Role == "assistant" {
		kind = "output_text"
	}
	return map[string]any{"type": "message", "id": it.ID, "role": it.Role, "status": "completed",
		"content": []map[string]string{{"type": kind, "text": text(it.Content)}}}
}
