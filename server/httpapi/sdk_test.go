package httpapi

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/mkserve/mkserve/engine"
)

const testKey = "sk-test-0123456789"

// serve starts the API on 127.0.0.1 over f and returns its URL.
func serve(t *testing.T, f *fakeGen, opts Options) (*Server, string) {
	t.Helper()
	tok, tmpl := loadTok(t)
	s := New(f, tok, tmpl, opts)
	s.SetReady(true)
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		f.running.Wait() // every fake event goroutine ended: nothing left blocked
	})
	return s, ts.URL
}

func sdk(url, key string) *openai.Client {
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0),
		option.WithRequestTimeout(30*time.Second))
	return &c
}

// randomText is a fresh prompt of printable words.
func randomText(rng *rand.Rand) string {
	words := []string{"the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "far", "away", "light", "of", "day"}
	var b strings.Builder
	for i := range 3 + rng.IntN(8) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

func encode(t *testing.T, text string, special bool) []int32 {
	t.Helper()
	ids, err := testTok.Encode(text, special)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

func TestSDKCompletion(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
	f := newFake(256)
	_, url := serve(t, f, Options{APIKey: testKey})
	client := sdk(url, testKey)
	prompt := randomText(rng)
	maxTok := 5 + rng.IntN(20)
	seed := rng.Int64N(1 << 40)
	resp, err := client.Completions.New(context.Background(), openai.CompletionNewParams{
		Model:            "fake-moe",
		Prompt:           openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens:        openai.Int(int64(maxTok)),
		Temperature:      openai.Float(0.7),
		TopP:             openai.Float(0.9),
		Seed:             openai.Int(seed),
		PresencePenalty:  openai.Float(0.5),
		FrequencyPenalty: openai.Float(-0.25),
		User:             openai.String("ignored"),
	}, option.WithJSONSet("top_k", 7), option.WithJSONSet("min_p", 0.05), option.WithJSONSet("repetition_penalty", 1.1),
		option.WithJSONSet("ignore_eos", true), option.WithJSONSet("priority", 3), option.WithJSONSet("some_future_field", 1))
	if err != nil {
		t.Fatal(err)
	}
	ids := encode(t, prompt, true)
	reqs := f.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d engine requests", len(reqs))
	}
	r := reqs[0]
	if !reflect.DeepEqual(r.Prompt, ids) {
		t.Errorf("engine prompt %v, want %v", r.Prompt, ids)
	}
	useed := uint64(seed)
	want := engine.SamplingParams{N: 1, MaxTokens: maxTok, Temperature: 0.7, TopP: 0.9, TopK: 7, MinP: 0.05, Seed: &useed,
		PresencePenalty: 0.5, FrequencyPenalty: -0.25, RepetitionPenalty: 1.1, IgnoreEOS: true}
	if !reflect.DeepEqual(r.Sampling, want) {
		t.Errorf("sampling\n got %+v\nwant %+v", r.Sampling, want)
	}
	if r.Priority != 3 || r.ID != resp.ID || r.Arrival.IsZero() {
		t.Errorf("priority %d id %q (response %q) arrival %v", r.Priority, r.ID, resp.ID, r.Arrival)
	}
	text, finish, n := expect(ids, 0, r.Sampling)
	if !strings.HasPrefix(resp.ID, "cmpl-") || resp.Object != "text_completion" || resp.Model != "fake-moe" ||
		resp.Created < time.Now().Add(-time.Minute).Unix() {
		t.Errorf("envelope: id %q object %q model %q created %d", resp.ID, resp.Object, resp.Model, resp.Created)
	}
	if len(resp.Choices) != 1 || resp.Choices[0].Text != text || string(resp.Choices[0].FinishReason) != finish || resp.Choices[0].Index != 0 {
		t.Fatalf("choices %+v, want text %q finish %s", resp.Choices, text, finish)
	}
	if resp.Choices[0].JSON.Logprobs.Raw() != "null" {
		t.Errorf("logprobs = %s, want null", resp.Choices[0].JSON.Logprobs.Raw())
	}
	u := resp.Usage
	if u.PromptTokens != int64(len(ids)) || u.CompletionTokens != int64(n) || u.TotalTokens != int64(len(ids)+n) ||
		u.PromptTokensDetails.CachedTokens != int64(len(ids)/2) {
		t.Errorf("usage %+v, want prompt %d completion %d", u, len(ids), n)
	}
}

// TestSDKCompletionPrompts: every prompt form, n > 1, indices p*n+j, stop
// strings and stop token ids.
func TestSDKCompletionPrompts(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 2))
	f := newFake(128)
	_, url := serve(t, f, Options{})
	client := sdk(url, "")
	texts := []string{randomText(rng), randomText(rng), randomText(rng)}
	var tokens [][]int64
	var tokIDs [][]int32
	for range 2 {
		var l []int64
		var l32 []int32
		for range 1 + rng.IntN(6) {
			id := rng.Int32N(int32(testTok.VocabSize()))
			l, l32 = append(l, int64(id)), append(l32, id)
		}
		tokens, tokIDs = append(tokens, l), append(tokIDs, l32)
	}
	cases := []struct {
		name    string
		prompt  openai.CompletionNewParamsPromptUnion
		prompts [][]int32
	}{
		{"strings", openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: texts},
			[][]int32{encode(t, texts[0], true), encode(t, texts[1], true), encode(t, texts[2], true)}},
		{"tokens", openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: tokens[0]}, tokIDs[:1]},
		{"token lists", openai.CompletionNewParamsPromptUnion{OfArrayOfTokenArrays: tokens}, tokIDs},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := 2 + rng.IntN(2)
			maxTok := 8 + rng.IntN(8)
			// A stop string from the middle of prompt 0 / choice 1's text.
			full, _, _ := expect(tc.prompts[0], 1, engine.SamplingParams{MaxTokens: maxTok})
			stop := full[len(full)/2 : len(full)/2+2]
			// And a stop token: the 4th token of prompt 0 / choice 0.
			stopID := tokenAt(tc.prompts[0], 0, 3)
			before := len(f.requests())
			resp, err := client.Completions.New(context.Background(), openai.CompletionNewParams{
				Model: "fake-moe", Prompt: tc.prompt, N: openai.Int(int64(n)), MaxTokens: openai.Int(int64(maxTok)),
				Stop: openai.CompletionNewParamsStopUnion{OfStringArray: []string{stop, "\x00never"}},
			}, option.WithJSONSet("stop_token_ids", []int32{stopID}))
			if err != nil {
				t.Fatal(err)
			}
			reqs := f.requests()[before:]
			if len(reqs) != len(tc.prompts) || len(resp.Choices) != n*len(tc.prompts) {
				t.Fatalf("%d engine requests, %d choices for %d prompts n=%d", len(reqs), len(resp.Choices), len(tc.prompts), n)
			}
			byID := map[string]engine.Request{}
			for _, r := range reqs {
				byID[r.ID] = r
			}
			wantUsage := 0
			for p, ids := range tc.prompts {
				id := resp.ID
				if len(tc.prompts) > 1 {
					id += "-" + string(rune('0'+p))
				}
				r, ok := byID[id]
				if !ok || !reflect.DeepEqual(r.Prompt, ids) {
					t.Fatalf("prompt %d: engine request %q %v, want prompt %v", p, id, r.Prompt, ids)
				}
				sp := r.Sampling
				if sp.N != n || sp.MaxTokens != maxTok || !reflect.DeepEqual(sp.Stop, []string{stop, "\x00never"}) ||
					!reflect.DeepEqual(sp.StopTokenIDs, []int32{stopID}) {
					t.Errorf("prompt %d sampling %+v", p, sp)
				}
				for j := range n {
					c := resp.Choices[p*n+j]
					text, finish, k := expect(ids, j, sp)
					wantUsage += k
					if c.Index != int64(p*n+j) || c.Text != text || string(c.FinishReason) != finish {
						t.Errorf("choice %d: index %d text %q finish %s; want %q %s", p*n+j, c.Index, c.Text, c.FinishReason, text, finish)
					}
				}
			}
			if resp.Usage.CompletionTokens != int64(wantUsage) {
				t.Errorf("completion tokens %d, want %d", resp.Usage.CompletionTokens, wantUsage)
			}
			// The stop string and the stop token both ended a choice.
			if c := resp.Choices[1]; c.FinishReason != "stop" || strings.Contains(c.Text, stop) {
				t.Errorf("stop string: %+v", c)
			}
			if c := resp.Choices[0]; c.FinishReason != "stop" {
				t.Errorf("stop token: %+v", c)
			}
		})
	}
}

func TestSDKCompletionLogprobs(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 3))
	f := newFake(128)
	_, url := serve(t, f, Options{})
	prompt := randomText(rng)
	top := 1 + rng.IntN(5)
	resp, err := sdk(url, "").Completions.New(context.Background(), openai.CompletionNewParams{
		Model: "fake-moe", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(6), Logprobs: openai.Int(int64(top)), N: openai.Int(2),
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := encode(t, prompt, true)
	sp := f.requests()[0].Sampling
	if !sp.Logprobs || sp.TopLogprobs != top {
		t.Fatalf("engine logprobs %v top %d, want top %d", sp.Logprobs, sp.TopLogprobs, top)
	}
	for i, c := range resp.Choices {
		lp := c.Logprobs
		if len(lp.Tokens) != 6 || len(lp.TokenLogprobs) != 6 || len(lp.TopLogprobs) != 6 || len(lp.TextOffset) != 6 {
			t.Fatalf("choice %d logprobs lengths %+v", i, lp)
		}
		offset := 0
		for k := range 6 {
			id := tokenAt(ids, i, k)
			if lp.Tokens[k] != tokText(id) || float32(lp.TokenLogprobs[k]) != fakeLogprob(i, k, 0) || lp.TextOffset[k] != int64(offset) {
				t.Errorf("choice %d token %d: %q %g @%d", i, k, lp.Tokens[k], lp.TokenLogprobs[k], lp.TextOffset[k])
			}
			offset += len(tokText(id))
			for j := range top {
				alt := tokText(fakeTop(ids, i, k, j))
				if v, ok := lp.TopLogprobs[k][alt]; !ok || (float32(v) != fakeLogprob(i, k, j+1) && !dupBefore(ids, i, k, j)) {
					t.Errorf("choice %d token %d top %q = %g, %v", i, k, alt, v, ok)
				}
			}
		}
	}
}

// dupBefore reports whether alternative j has the text of an earlier one
// (the map keeps the first).
func dupBefore(ids []int32, i, k, j int) bool {
	for a := range j {
		if tokText(fakeTop(ids, i, k, a)) == tokText(fakeTop(ids, i, k, j)) {
			return true
		}
	}
	return false
}

func TestSDKCompletionStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 4))
	f := newFake(128)
	_, url := serve(t, f, Options{})
	prompts := []string{randomText(rng), randomText(rng)}
	n, maxTok := 2, 10+rng.IntN(10)
	full, _, _ := expect(encode(t, prompts[1], true), 0, engine.SamplingParams{MaxTokens: maxTok})
	stop := full[len(full)/3 : len(full)/3+3]
	stream := sdk(url, "").Completions.NewStreaming(context.Background(), openai.CompletionNewParams{
		Model: "fake-moe", Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: prompts},
		N: openai.Int(int64(n)), MaxTokens: openai.Int(int64(maxTok)), Logprobs: openai.Int(0),
		Stop:          openai.CompletionNewParamsStopUnion{OfString: openai.String(stop)},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	texts := make([]string, 4)
	finish := make([]string, 4)
	tokens := make([]int, 4)
	var usage *openai.CompletionUsage
	var id string
	for stream.Next() {
		ch := stream.Current()
		if id == "" {
			id = ch.ID
		} else if ch.ID != id {
			t.Errorf("chunk id %q, first was %q", ch.ID, id)
		}
		if ch.JSON.Usage.Valid() && ch.Usage.TotalTokens > 0 {
			if len(ch.Choices) != 0 || usage != nil {
				t.Errorf("usage chunk with %d choices (or twice)", len(ch.Choices))
			}
			u := ch.Usage
			usage = &u
			continue
		}
		for _, c := range ch.Choices {
			if finish[c.Index] != "" {
				t.Errorf("choice %d: chunk after its finish", c.Index)
			}
			texts[c.Index] += c.Text
			finish[c.Index] = string(c.FinishReason)
			tokens[c.Index] += len(c.Logprobs.Tokens)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	want := 0
	for p, pr := range prompts {
		ids := encode(t, pr, true)
		for j := range n {
			text, fin, k := expect(ids, j, f.requests()[0].Sampling)
			want += k
			if texts[p*n+j] != text || finish[p*n+j] != fin {
				t.Errorf("choice %d: %q %s, want %q %s", p*n+j, texts[p*n+j], finish[p*n+j], text, fin)
			}
			if tokens[p*n+j] != k {
				t.Errorf("choice %d: %d logprob tokens, want %d", p*n+j, tokens[p*n+j], k)
			}
		}
	}
	if usage == nil || usage.CompletionTokens != int64(want) {
		t.Errorf("usage %+v, want %d completion tokens", usage, want)
	}
	if finish[2] != "stop" {
		t.Errorf("prompt 1 choice 0 did not stop at %q: %q", stop, texts[2])
	}
}

// chatPrompt is the golden template rendered by hand: ChatML with a
// generation prompt.
func chatPrompt(msgs [][2]string) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>" + m[0] + "\n" + m[1] + "<|im_end|>\n")
	}
	return b.String() + "<|im_start|>assistant\n"
}

func TestSDKChat(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 5))
	f := newFake(512)
	_, url := serve(t, f, Options{APIKey: testKey})
	sys, user := randomText(rng), randomText(rng)
	top := 1 + rng.IntN(4)
	resp, err := sdk(url, testKey).Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:               "fake-moe",
		Messages:            []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys), openai.UserMessage(user)},
		MaxCompletionTokens: openai.Int(9),
		N:                   openai.Int(2),
		Logprobs:            openai.Bool(true),
		TopLogprobs:         openai.Int(int64(top)),
		Temperature:         openai.Float(0),
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := encode(t, chatPrompt([][2]string{{"system", sys}, {"user", user}}), false)
	r := f.requests()[0]
	if !reflect.DeepEqual(r.Prompt, ids) {
		t.Fatalf("engine prompt %v, want %v", r.Prompt, ids)
	}
	want := engine.SamplingParams{N: 2, MaxTokens: 9, Temperature: 0, TopP: 1, RepetitionPenalty: 1, Logprobs: true, TopLogprobs: top}
	if !reflect.DeepEqual(r.Sampling, want) {
		t.Errorf("sampling\n got %+v\nwant %+v", r.Sampling, want)
	}
	if !strings.HasPrefix(resp.ID, "chatcmpl-") || resp.Object != "chat.completion" || resp.Model != "fake-moe" || len(resp.Choices) != 2 {
		t.Fatalf("envelope %+v", resp)
	}
	total := 0
	for i, c := range resp.Choices {
		text, finish, k := expect(ids, i, r.Sampling)
		total += k
		if c.Index != int64(i) || c.Message.Content != text || c.Message.Role != "assistant" || c.FinishReason != finish {
			t.Errorf("choice %d: %+v, want %q %s", i, c.Message, text, finish)
		}
		if len(c.Logprobs.Content) != k {
			t.Fatalf("choice %d: %d logprobs, want %d", i, len(c.Logprobs.Content), k)
		}
		for kk, lp := range c.Logprobs.Content {
			tt := tokText(tokenAt(ids, i, kk))
			if lp.Token != tt || float32(lp.Logprob) != fakeLogprob(i, kk, 0) || len(lp.Bytes) != len(tt) || len(lp.TopLogprobs) != top {
				t.Errorf("choice %d token %d: %+v", i, kk, lp)
			}
			for j, alt := range lp.TopLogprobs {
				if alt.Token != tokText(fakeTop(ids, i, kk, j)) || float32(alt.Logprob) != fakeLogprob(i, kk, j+1) {
					t.Errorf("choice %d token %d alt %d: %+v", i, kk, j, alt)
				}
			}
		}
	}
	if resp.Usage.PromptTokens != int64(len(ids)) || resp.Usage.CompletionTokens != int64(total) {
		t.Errorf("usage %+v", resp.Usage)
	}
}

func TestSDKChatStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(rand.Uint64(), 6))
	f := newFake(512)
	_, url := serve(t, f, Options{})
	user := randomText(rng)
	ids := encode(t, chatPrompt([][2]string{{"user", user}}), false)
	full, _, _ := expect(ids, 0, engine.SamplingParams{MaxTokens: 20})
	stop := full[len(full)/2 : len(full)/2+2]
	stream := sdk(url, "").Chat.Completions.NewStreaming(context.Background(), openai.ChatCompletionNewParams{
		Model:         "fake-moe",
		Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage(user)},
		MaxTokens:     openai.Int(20),
		Stop:          openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(stop)},
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	})
	var content, finish string
	var chunks int
	var usage int64
	for stream.Next() {
		ch := stream.Current()
		chunks++
		if chunks == 1 {
			if len(ch.Choices) != 1 || ch.Choices[0].Delta.Role != "assistant" || ch.Object != "chat.completion.chunk" {
				t.Errorf("first chunk %s", ch.RawJSON())
			}
		} else if len(ch.Choices) > 0 && ch.Choices[0].Delta.Role != "" {
			t.Errorf("role in chunk %d: %s", chunks, ch.RawJSON())
		}
		if len(ch.Choices) == 0 {
			usage = ch.Usage.CompletionTokens
			continue
		}
		content += ch.Choices[0].Delta.Content
		if ch.Choices[0].FinishReason != "" {
			finish = ch.Choices[0].FinishReason
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	text, fin, k := expect(ids, 0, f.requests()[0].Sampling)
	if content != text || finish != fin || usage != int64(k) || fin != "stop" {
		t.Errorf("streamed %q finish %s usage %d; want %q %s %d", content, finish, usage, text, fin, k)
	}
}

// TestSDKErrors: the SDK surfaces each status with the server's message,
// param and code.
func TestSDKErrors(t *testing.T) {
	f := newFake(64)
	s, url := serve(t, f, Options{APIKey: testKey, MaxBodyBytes: 4096})
	good := func() openai.CompletionNewParams {
		return openai.CompletionNewParams{Model: "fake-moe", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello there")}, MaxTokens: openai.Int(4)}
	}
	cases := []struct {
		name   string
		key    string
		params func() openai.CompletionNewParams
		setup  func()
		status int
		param  string
		code   string
		msg    string
	}{
		{"bad key", "wrong", good, nil, 401, "", "invalid_api_key", "API key"},
		{"no key", "", good, nil, 401, "", "invalid_api_key", "API key"},
		{"unknown model", testKey, func() openai.CompletionNewParams { p := good(); p.Model = "gpt-9"; return p }, nil, 404, "model", "model_not_found", "gpt-9"},
		{"temperature", testKey, func() openai.CompletionNewParams { p := good(); p.Temperature = openai.Float(3); return p }, nil, 400, "temperature", "", "temperature"},
		{"suffix", testKey, func() openai.CompletionNewParams { p := good(); p.Suffix = openai.String("end"); return p }, nil, 400, "suffix", "", "suffix"},
		{"too long", testKey, func() openai.CompletionNewParams { p := good(); p.MaxTokens = openai.Int(1000); return p }, nil, 400, "max_tokens", "", "context length"},
		{"body too large", testKey, func() openai.CompletionNewParams {
			p := good()
			p.Prompt = openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("x", 5000))}
			return p
		}, nil, 413, "", "request_too_large", "4096"},
		{"queue full", testKey, good, func() { f.err = engine.ErrQueueFull }, 429, "", "queue_full", "retry"},
		{"engine draining", testKey, good, func() { f.err = engine.ErrDraining }, 503, "", "draining", "shutting down"},
		{"engine too long", testKey, good, func() { f.err = engine.ErrTooLong }, 400, "max_tokens", "", "context"},
		{"server draining", testKey, good, func() { s.SetDraining(true) }, 503, "", "draining", "shutting down"},
		{"not ready", testKey, good, func() { s.SetReady(false) }, 503, "", "not_ready", "loading"},
		{"internal", testKey, good, func() { f.err = errors.New("cuda: secret-internal-detail") }, 500, "", "", "server had an error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.err = nil
			s.SetDraining(false)
			s.SetReady(true)
			if tc.setup != nil {
				tc.setup()
			}
			var err error
			if tc.key == "" {
				c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithMaxRetries(0), option.WithAPIKey(""))
				_, err = c.Completions.New(context.Background(), tc.params())
			} else {
				_, err = sdk(url, tc.key).Completions.New(context.Background(), tc.params())
			}
			var ae *openai.Error
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an *openai.Error", err)
			}
			if ae.StatusCode != tc.status || ae.Param != tc.param || ae.Code != tc.code || !strings.Contains(ae.Message, tc.msg) || ae.Type == "" {
				t.Errorf("status %d param %q code %q type %q message %q", ae.StatusCode, ae.Param, ae.Code, ae.Type, ae.Message)
			}
			if strings.Contains(ae.RawJSON(), "secret") {
				t.Errorf("internal detail leaked: %s", ae.RawJSON())
			}
			// The same error on a stream.
			stream := sdk(url, tc.key).Completions.NewStreaming(context.Background(), tc.params())
			for stream.Next() {
			}
			if !errors.As(stream.Err(), &ae) || ae.StatusCode != tc.status {
				t.Errorf("stream error %v", stream.Err())
			}
		})
	}
	f.err = nil
	s.SetDraining(false)
	s.SetReady(true)
}

func TestSDKModels(t *testing.T) {
	f := newFake(333)
	_, url := serve(t, f, Options{})
	page, err := sdk(url, "").Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != "fake-moe" || page.Data[0].Object != "model" || page.Data[0].OwnedBy == "" {
		t.Errorf("models %+v", page.Data)
	}
	m, err := sdk(url, "").Models.Get(context.Background(), "fake-moe")
	if err != nil || m.ID != "fake-moe" {
		t.Errorf("get: %+v %v", m, err)
	}
	_, err = sdk(url, "").Models.Get(context.Background(), "other")
	var ae *openai.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusNotFound {
		t.Errorf("unknown model: %v", err)
	}
}
