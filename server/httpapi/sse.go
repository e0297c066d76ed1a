package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/gin-gonic/gin"
)

// sse writes a server-sent event stream: "data: <json>\n\n" per event,
// flushed at once, and "data: [DONE]\n\n" at the end.
type sse struct {
	w   gin.ResponseWriter
	buf bytes.Buffer
	enc *json.Encoder
}

// startSSE sends the stream's headers (status 200).
func startSSE(c *gin.Context) *sse {
	h := c.Writer.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no") // proxies: do not buffer
	c.Status(http.StatusOK)
	c.Writer.WriteHeaderNow()
	c.Writer.Flush()
	s := &sse{w: c.Writer}
	s.enc = json.NewEncoder(&s.buf)
	s.enc.SetEscapeHTML(false)
	return s
}

// send writes one event holding v as JSON.
func (s *sse) send(v any) error {
	s.buf.Reset()
	s.buf.WriteString("data: ")
	if err := s.enc.Encode(v); err != nil { // Encode ends the line
		return err
	}
	s.buf.WriteByte('\n')
	return s.write()
}

// event writes one named event holding v as JSON ("event: typ" before
// its data, as the Responses API streams).
func (s *sse) event(typ string, v any) error {
	s.buf.Reset()
	s.buf.WriteString("event: ")
	s.buf.WriteString(typ)
	s.buf.WriteString("\ndata: ")
	if err := s.enc.Encode(v); err != nil {
		return err
	}
	s.buf.WriteByte('\n')
	return s.write()
}

// done writes the final [DONE] event.
func (s *sse) done() error {
	s.buf.Reset()
	s.buf.WriteString("data: [DONE]\n\n")
	return s.write()
}

func (s *sse) write() error {
	if _, err := s.w.Write(s.buf.Bytes()); err != nil {
		return err
	}
	s.w.Flush()
	return nil
}
