package httpapi

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestTokenize(t *testing.T) {
	f := newFake(4096)
	_, url := serve(t, f, Options{APIKey: testKey})
	auth := []string{"Authorization", "Bearer " + testKey}
	tok, _ := loadTok(t)
	text := "The cat sat on the mat. Zoë 🙂"

	var tr tokenizeResponse
	resp, raw := post(t, url, "/tokenize", `{"prompt": "`+text+`", "return_token_strs": true}`, auth...)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &tr) != nil {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, raw)
	}
	want, err := tok.Encode(text, true)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr.Tokens, want) || tr.Count != len(want) || tr.MaxModelLen != 4096 || len(tr.TokenStrs) != len(want) {
		t.Fatalf("tokenize: %+v, want tokens %v", tr, want)
	}
	ids, _ := json.Marshal(tr.Tokens)
	var dr detokenizeResponse
	resp, raw = post(t, url, "/detokenize", `{"tokens": `+string(ids)+`}`, auth...)
	wantText, _ := tok.Decode(want, false)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &dr) != nil || dr.Prompt != wantText {
		t.Fatalf("detokenize: %d %s, want %q", resp.StatusCode, raw, wantText)
	}

	// Messages: the ids chat completions sends the engine for them.
	msgs := `[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]`
	resp, raw = post(t, url, "/tokenize", `{"messages": `+msgs+`}`, auth...)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &tr) != nil {
		t.Fatalf("tokenize messages: %d %s", resp.StatusCode, raw)
	}
	if resp, raw := post(t, url, "/v1/chat/completions", `{"messages": `+msgs+`, "max_tokens": 1}`, auth...); resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %s", resp.StatusCode, raw)
	}
	reqs := f.requests()
	if !slices.Equal(tr.Tokens, reqs[len(reqs)-1].Prompt) {
		t.Errorf("tokenized messages %v, chat sent %v", tr.Tokens, reqs[len(reqs)-1].Prompt)
	}

	for _, c := range []struct {
		path, body string
		status     int
		want       string
	}{
		{"/tokenize", `{"prompt": "x", "messages": []}`, 400, "prompt"},
		{"/tokenize", `{}`, 400, "prompt"},
		{"/tokenize", `{"prompt": "x", "model": "other"}`, 404, "other"},
		{"/tokenize", `{"messages": [{"role": "wizard", "content": "x"}]}`, 400, "messages"},
		{"/detokenize", `{"tokens": [1, -2]}`, 400, "tokens"},
		{"/detokenize", `{"tokens": [1, 999999999]}`, 400, "tokens"},
		{"/detokenize", `{}`, 400, "tokens"},
		{"/detokenize", `{"tokens": "abc"}`, 400, "tokens"},
	} {
		resp, raw := post(t, url, c.path, c.body, auth...)
		if resp.StatusCode != c.status || !strings.Contains(string(raw), c.want) {
			t.Errorf("%s %s: %d %s, want %d naming %s", c.path, c.body, resp.StatusCode, raw, c.status, c.want)
		}
	}
	if resp, _ := post(t, url, "/tokenize", `{"prompt": "x"}`); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("tokenize without the API key: %d, want 401", resp.StatusCode)
	}
}
