package httpapi

import (
	"container/list"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/gin-gonic/gin"
)

// respStore keeps the latest finished responses in memory (Options.
// ResponsesStore of them, least recently used dropped first): their JSON,
// for GET /v1/responses/{id}, and their conversations — input items
// without instructions, then the output as input items — which a request
// naming one as previous_response_id continues. Lost on restart, as
// vLLM's in-memory store.
type respStore struct {
	mu    sync.Mutex
	limit int
	lru   *list.List // of *storedResp, most recent first
	byID  map[string]*list.Element
}

type storedResp struct {
	id      string
	body    []byte          // the response object as returned
	history []respInputItem // the conversation it ends
}

func newRespStore(limit int) *respStore {
	return &respStore{limit: limit, lru: list.New(), byID: map[string]*list.Element{}}
}

// put keeps a response, dropping the least recently used past the limit.
func (st *respStore) put(r *storedResp) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if el, ok := st.byID[r.id]; ok {
		st.lru.Remove(el)
	}
	st.byID[r.id] = st.lru.PushFront(r)
	for st.lru.Len() > st.limit {
		old := st.lru.Remove(st.lru.Back()).(*storedResp)
		delete(st.byID, old.id)
	}
}

// get is the response id (nil: not kept), now the most recently used.
func (st *respStore) get(id string) *storedResp {
	st.mu.Lock()
	defer st.mu.Unlock()
	el, ok := st.byID[id]
	if !ok {
		return nil
	}
	st.lru.MoveToFront(el)
	return el.Value.(*storedResp)
}

// remove drops response id and reports whether it was kept.
func (st *respStore) remove(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	el, ok := st.byID[id]
	if ok {
		st.lru.Remove(el)
		delete(st.byID, id)
	}
	return ok
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
	r := s.store.get(id)
	if r == nil {
		writeError(c, errNoResponse(id, s.opts.ResponsesStore))
		return
	}
	c.Data(http.StatusOK, "application/json", r.body)
}

// deleteResponse serves DELETE /v1/responses/{id}.
func (s *Server) deleteResponse(c *gin.Context) {
	id := c.Param("id")
	if !s.store.remove(id) {
		writeError(c, errNoResponse(id, s.opts.ResponsesStore))
		return
	}
	writeJSON(c, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true})
}
