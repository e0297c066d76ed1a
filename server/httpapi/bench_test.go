package httpapi

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
)

// The server's own cost per request (parse, validate, tokenize, render,
// merge events, encode), with the fake engine's token stream.

func benchServer(b *testing.B) http.Handler {
	tok, tmpl := loadTok(b)
	f := newFake(4096)
	f.noRecord = true
	s := New(f, tok, tmpl, Options{})
	s.SetReady(true)
	return s.Handler()
}

func benchPost(b *testing.B, h http.Handler, path, body string) {
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader([]byte(body)))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			b.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
}

func BenchmarkCompletion(b *testing.B) {
	benchPost(b, benchServer(b), "/v1/completions", `{"prompt":"the cat sat on the mat and then it ran far away","max_tokens":64}`)
}

func BenchmarkCompletionStream(b *testing.B) {
	benchPost(b, benchServer(b), "/v1/completions", `{"prompt":"the cat sat on the mat and then it ran far away","max_tokens":64,"stream":true}`)
}

func BenchmarkChatStream(b *testing.B) {
	benchPost(b, benchServer(b), "/v1/chat/completions",
		`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"the cat sat on the mat"}],"max_tokens":64,"stream":true,"logprobs":true,"top_logprobs":2}`)
}
