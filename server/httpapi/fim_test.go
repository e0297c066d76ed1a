package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/tokenizer"
)

// fimTokenizer is the test tokenizer with FIM special tokens added (after
// the vocabulary), in format f.
func fimTokenizer(t *testing.T, f fimFormat) *tokenizer.Tokenizer {
	t.Helper()
	dir := filepath.Join("..", "..", "models", "testdata", "golden", "qwen3_moe")
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	added, _ := m["added_tokens"].([]any)
	next := 0
	for _, a := range added {
		next = max(next, int(a.(map[string]any)["id"].(float64))+1)
	}
	for _, v := range m["model"].(map[string]any)["vocab"].(map[string]any) {
		next = max(next, int(v.(float64))+1)
	}
	for i, c := range []string{f.prefix, f.suffix, f.middle} {
		added = append(added, map[string]any{"id": next + i, "content": c, "single_word": false, "lstrip": false, "rstrip": false,
			"normalized": false, "special": true})
	}
	m["added_tokens"] = added
	out := t.TempDir()
	b, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(out, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(filepath.Join(out, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestFIM: a completion with a suffix, for a tokenizer with fill-in-the-
// middle tokens, reaches the engine as prefix, suffix and middle in the
// model's order with the three tokens whole; each known format is found;
// without FIM tokens, with token-id prompts or with echo it is a 400.
func TestFIM(t *testing.T) {
	loadTok(t) // (the fake engine's printable tokens)
	for _, f := range fimFormats {
		tok := fimTokenizer(t, f)
		fake := newFake(4096)
		fake.vocab = tok.VocabSize()
		s := New(fake, tok, nil, Options{})
		s.SetReady(true)
		ts := httptest.NewServer(s.Handler())
		resp, raw := post(t, ts.URL, "/v1/completions", `{"prompt": ["def add(a, b):\n    return ", "x = "], "suffix": "\n\nprint(add(1, 2))", "max_tokens": 4}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", f.prefix, resp.StatusCode, raw)
		}
		reqs := fake.requests()
		if len(reqs) != 2 {
			t.Fatalf("%d engine requests", len(reqs))
		}
		ids := map[string]int32{}
		for _, c := range []string{f.prefix, f.suffix, f.middle} {
			ids[c], _ = tok.TokenID(c)
		}
		for i, want := range []string{"def add(a, b):\n    return ", "x = "} {
			p := reqs[i].Prompt
			got, _ := tok.Decode(p, false)
			if got != f.render(want, "\n\nprint(add(1, 2))") || p[0] != ids[f.prefix] || p[len(p)-1] != ids[f.middle] {
				t.Errorf("%s: prompt %d reached the engine as %q (%v)", f.prefix, i, got, p)
			}
		}
		for _, bad := range []string{
			`{"prompt": [1, 2, 3], "suffix": "x", "max_tokens": 4}`,
			`{"prompt": "a", "suffix": "x", "echo": true, "max_tokens": 4}`,
		} {
			if resp, raw := post(t, ts.URL, "/v1/completions", bad); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), `"param":"suffix"`) {
				t.Errorf("%s: %d %s", bad, resp.StatusCode, raw)
			}
		}
		ts.Close()
		fake.running.Wait()
	}
	_, url := serve(t, newFake(4096), Options{})
	if resp, raw := post(t, url, "/v1/completions", `{"prompt": "a", "suffix": "b"}`); resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), "FIM tokens") {
		t.Errorf("no FIM tokens: %d %s", resp.StatusCode, raw)
	}
}
