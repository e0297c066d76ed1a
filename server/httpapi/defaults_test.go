package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/engine"
)

// TestModelSamplingDefaults: parameters a request leaves unset take the
// model's generation_config defaults; parameters it sets win.
func TestModelSamplingDefaults(t *testing.T) {
	tok, tmpl := loadTok(t)
	temp, topP, topK := float32(0.6), float32(0.8), 40
	for _, tc := range []struct {
		name     string
		defaults *engine.SamplingDefaults
		body     string
		want     engine.SamplingParams
	}{
		{"openai defaults", nil, `{"model":"fake-moe","prompt":"hi","max_tokens":2}`,
			engine.SamplingParams{Temperature: 1, TopP: 1, RepetitionPenalty: 1}},
		{"model defaults", &engine.SamplingDefaults{Temperature: &temp, TopP: &topP, TopK: &topK},
			`{"model":"fake-moe","prompt":"hi","max_tokens":2}`,
			engine.SamplingParams{Temperature: 0.6, TopP: 0.8, TopK: 40, RepetitionPenalty: 1}},
		{"request wins", &engine.SamplingDefaults{Temperature: &temp, TopP: &topP, TopK: &topK},
			`{"model":"fake-moe","prompt":"hi","max_tokens":2,"temperature":0,"top_p":1,"top_k":-1}`,
			engine.SamplingParams{Temperature: 0, TopP: 1, TopK: 0, RepetitionPenalty: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(4096)
			s := New(f, tok, tmpl, Options{Defaults: tc.defaults})
			s.SetReady(true)
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(tc.body)))
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			reqs := f.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d engine requests", len(reqs))
			}
			got := reqs[0].Sampling
			if got.Temperature != tc.want.Temperature || got.TopP != tc.want.TopP || got.TopK != tc.want.TopK || got.RepetitionPenalty != tc.want.RepetitionPenalty {
				t.Errorf("sampling %+v, want temperature %v top_p %v top_k %v", got, tc.want.Temperature, tc.want.TopP, tc.want.TopK)
			}
		})
	}
}
