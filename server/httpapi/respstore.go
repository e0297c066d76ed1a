package httpapi

import (
	"encoding/json"
	"net/http"

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
	body  []byte          // the response object as returned
	prev  *storedResp     // the turn before (nil: the conversation starts here)
	items []respInputItem // this turn's input items, then its output as input items
	size  int64           // body and the whole conversation's items, in bytes
}

func newRespStore(limit int) *respStore {
	return lru.NewSized[string](limit, respStoreBytes, func(r *storedResp) int64 { return r.size })
}

// newStored is a turn after prev (nil: none) with its items.
func newStored(body []byte, prev *storedResp, items []respInputItem) *storedResp {
	r := &storedResp{body: body, prev: prev, items: items, size: int64(len(body))}
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
		out = append(out, turns[i].items...)
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
			out = append(out, respInputItem{Type: "reasoning", Content: b})
		case *respMessageJS:
			text := ""
			for _, c := range v.Content {
				text += c.Text
			}
			out = append(out, respInputItem{Type: "message", Role: "assistant", Content: str(text)})
		case *respCallJS:
			args := v.Arguments
			out = append(out, respInputItem{Type: "function_call", CallID: v.CallID, Name: v.Name, Arguments: &args})
		}
	}
	return out
}

// errNoResponse is a 404 for a response the store does not hold.
func errNoResponse(id string, limit int) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: typeInvalid, Code: "not_found", Param: "response_id",
		Message: "no stored response " + id + " (the server keeps its latest " + itoa(limit) + " responses in memory; this one was not stored, was dropped, or the server restarted)"}
}

// getResponse serves GET /v1/responses/{id}.
func (s *Server) getResponse(c *gin.Context) {
	id := c.Param("id")
	r, ok := s.store.Get(id)
	if !ok {
		writeError(c, errNoResponse(id, s.opts.ResponsesStore))
		return
	}
	c.Data(http.StatusOK, "application/json", r.body)
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
