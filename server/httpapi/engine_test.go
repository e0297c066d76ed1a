package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/chat"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/tokenizer"
)

// defaultModel loads the repository's default model on the CPU backend
// (closed with the test), with its tokenizer, chat template and EOS ids.
func defaultModel(t *testing.T) (*tokenizer.Tokenizer, *chat.Template, *cpu.Backend, *models.Loaded, []int32) {
	t.Helper()
	dir := filepath.Join("..", "..", "models", "default")
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.Compile(tok.Config().ChatTemplate)
	if err != nil {
		t.Fatal(err)
	}
	be := cpu.New(cpu.Options{})
	l, err := models.Load(dir, be, models.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var eos []int32
	for _, id := range l.Generation.EOSTokenIDs {
		eos = append(eos, int32(id))
	}
	return tok, tmpl, be, l, eos
}

// serveEngine serves l through the real engine on an httptest server;
// both stop with the test.
func serveEngine(t *testing.T, tok *tokenizer.Tokenizer, tmpl *chat.Template, be *cpu.Backend, l *models.Loaded, eos []int32) *httptest.Server {
	t.Helper()
	eng, err := engine.New(l.Model, be, tok, engine.Config{KVCacheBytes: 32 << 20, MaxNumSeqs: 8}, engine.Options{Name: "default", EOS: eos})
	if err != nil {
		t.Fatal(err)
	}
	s := New(eng, tok, tmpl, Options{})
	s.SetReady(true)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Shutdown(ctx)
	})
	return ts
}

// TestRealEngine serves the repository's default model through the real
// engine and checks greedy output against the single-sequence decoder
// (engine.Greedy), which shares no code with the server or the scheduler's
// streaming path: completions, chat, streaming and a stop string.
func TestRealEngine(t *testing.T) {
	tok, tmpl, be, l, eos := defaultModel(t)
	const maxTok = 12
	prompt := "And the LORD spake unto Moses, saying,"
	chatText := "<|im_start|>user\nWho made the light?<|im_end|>\n<|im_start|>assistant\n" // the ChatML template by hand
	// References first: the engine's step loop then owns the backend.
	ref := func(text string, special bool) string {
		ids, err := tok.Encode(text, special)
		if err != nil {
			t.Fatal(err)
		}
		out, err := engine.Greedy(context.Background(), l.Model, be, ids, engine.GreedyOptions{MaxTokens: maxTok, StopIDs: eos})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(out); n > 0 && slices.Contains(eos, out[n-1]) {
			out = out[:n-1] // the EOS token is not part of the text
		}
		s, err := tok.Decode(out, true)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	wantComp, wantChat := ref(prompt, true), ref(chatText, false)
	t.Logf("greedy references: completion %q, chat %q", wantComp, wantChat)
	if wantComp == "" || wantChat == "" {
		t.Fatalf("empty greedy references %q %q", wantComp, wantChat)
	}

	ts := serveEngine(t, tok, tmpl, be, l, eos)
	client := sdk(ts.URL, "")
	ctx := context.Background()

	comp, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: "default",
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(maxTok), Temperature: openai.Float(0), N: openai.Int(2)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range comp.Choices {
		if c.Text != wantComp {
			t.Errorf("completion choice %d %q, greedy reference %q", c.Index, c.Text, wantComp)
		}
	}

	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Who made the light?")}
	cc, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "default", Messages: msgs,
		MaxTokens: openai.Int(maxTok), Temperature: openai.Float(0)})
	if err != nil {
		t.Fatal(err)
	}
	if got := cc.Choices[0].Message.Content; got != wantChat {
		t.Errorf("chat %q, greedy reference %q", got, wantChat)
	}
	stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{Model: "default", Messages: msgs,
		MaxTokens: openai.Int(maxTok), Temperature: openai.Float(0)})
	var streamed strings.Builder
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			streamed.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil || streamed.String() != wantChat {
		t.Errorf("streamed chat %q (%v), greedy reference %q", streamed.String(), err, wantChat)
	}

	// A stop string from the middle of the reference cuts the text before it.
	runes := []rune(wantComp)
	if len(runes) >= 6 {
		stop := string(runes[len(runes)/2 : len(runes)/2+2])
		comp, err := client.Completions.New(ctx, openai.CompletionNewParams{Model: "default",
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			MaxTokens: openai.Int(maxTok), Temperature: openai.Float(0),
			Stop: openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)}})
		if err != nil {
			t.Fatal(err)
		}
		want := wantComp[:strings.Index(wantComp, stop)]
		if c := comp.Choices[0]; c.Text != want || c.FinishReason != "stop" {
			t.Errorf("stop %q: %q %s, want %q stop", stop, c.Text, c.FinishReason, want)
		}
	}
}

// TestRealEnginePrediction: a chat request's prediction (OpenAI's
// predicted outputs, sent with the official SDK) leaves the reply the
// model's greedy one — given the reply itself, an edit of it, or text
// that shares nothing with it — and its usage counts the prediction's
// draft tokens kept and refused; malformed predictions and ones combined
// with penalties are 400s naming the field.
func TestRealEnginePrediction(t *testing.T) {
	tok, tmpl, be, l, eos := defaultModel(t)
	ts := serveEngine(t, tok, tmpl, be, l, eos)
	client := sdk(ts.URL, "")
	ctx := context.Background()
	msgs := []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me of the waters and the light.")}
	ask := func(pred *string, parts []string) *openai.ChatCompletion {
		t.Helper()
		p := openai.ChatCompletionNewParams{Model: "default", Messages: msgs, MaxTokens: openai.Int(64), Temperature: openai.Float(0)}
		switch {
		case pred != nil:
			p.Prediction = openai.ChatCompletionPredictionContentParam{Content: openai.ChatCompletionPredictionContentContentUnionParam{OfString: openai.String(*pred)}}
		case parts != nil:
			var ps []openai.ChatCompletionContentPartTextParam
			for _, x := range parts {
				ps = append(ps, openai.ChatCompletionContentPartTextParam{Text: x})
			}
			p.Prediction = openai.ChatCompletionPredictionContentParam{Content: openai.ChatCompletionPredictionContentContentUnionParam{OfArrayOfContentParts: ps}}
		}
		cc, err := client.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}
	plain := ask(nil, nil)
	want := plain.Choices[0].Message.Content
	if len(want) < 40 {
		t.Fatalf("a reply too short to predict: %q", want)
	}
	edited := want[:len(want)/3] + " and lo, a thing unforeseen, " + want[len(want)/2:]
	for _, c := range []struct {
		name        string
		pred        *string
		parts       []string
		minAccepted int64
	}{
		{"the reply", &want, nil, plain.Usage.CompletionTokens / 2},
		{"the reply in parts", nil, []string{want[:10], want[10:]}, plain.Usage.CompletionTokens / 2},
		{"an edit of it", &edited, nil, 4},
		{"unrelated", openai.Ptr("Zebras quietly juggle violet umbrellas."), nil, 0},
	} {
		cc := ask(c.pred, c.parts)
		d := cc.Usage.CompletionTokensDetails
		t.Logf("%s: accepted %d, rejected %d of %d completion tokens", c.name, d.AcceptedPredictionTokens, d.RejectedPredictionTokens, cc.Usage.CompletionTokens)
		if got := cc.Choices[0].Message.Content; got != want {
			t.Errorf("%s: reply %q, without a prediction %q", c.name, got, want)
		}
		if d.AcceptedPredictionTokens < c.minAccepted || d.AcceptedPredictionTokens >= cc.Usage.CompletionTokens {
			t.Errorf("%s: %d prediction tokens accepted of %d completion tokens (want at least %d)", c.name, d.AcceptedPredictionTokens,
				cc.Usage.CompletionTokens, c.minAccepted)
		}
	}
	for _, c := range []struct{ body, param string }{
		{`"prediction": {"type": "text", "content": "x"}`, "prediction.type"},
		{`"prediction": {"type": "content", "content": 5}`, "prediction.content"},
		{`"prediction": {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}`, "prediction.content"},
		{`"prediction": {"type": "content", "content": "x"}, "presence_penalty": 0.5`, "prediction"},
		{`"prediction": {"type": "content", "content": "x"}, "logit_bias": {"5": 1}`, "prediction"},
		{`"prediction": "x"`, "prediction"},
	} {
		code, param := postStatus(t, ts.URL+"/v1/chat/completions",
			`{"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, `+c.body+`}`)
		if code != 400 || param != c.param {
			t.Errorf("%s: status %d param %q, want 400 %q", c.body, code, param, c.param)
		}
	}
}

// postStatus posts body to url and returns the status and the error's param.
func postStatus(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct {
			Param *string `json:"param"`
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&e)
	if e.Error.Param == nil {
		return resp.StatusCode, ""
	}
	return resp.StatusCode, *e.Error.Param
}
