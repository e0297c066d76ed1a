package httpapi

import (
	"context"
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

// TestRealEngine serves the repository's default model through the real
// engine and checks greedy output against the single-sequence decoder
// (engine.Greedy), which shares no code with the server or the scheduler's
// streaming path: completions, chat, streaming and a stop string.
func TestRealEngine(t *testing.T) {
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
	defer l.Close()
	var eos []int32
	for _, id := range l.Generation.EOSTokenIDs {
		eos = append(eos, int32(id))
	}
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

	eng, err := engine.New(l.Model, be, tok, engine.Config{KVCacheBytes: 32 << 20, MaxNumSeqs: 8}, engine.Options{Name: "default", EOS: eos})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Shutdown(ctx)
	}()
	s := New(eng, tok, tmpl, Options{})
	s.SetReady(true)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
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
