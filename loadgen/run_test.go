package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// opts are small defaults for runs against the fake server.
func opts(url string) Options {
	return Options{
		BaseURL:    url,
		Model:      "m",
		NumPrompts: 8,
		PromptLen:  Uniform(3, 12),
		OutputLen:  Uniform(2, 6),
		Seed:       rand.Int64(),
		Timeout:    20 * time.Second,
	}
}

func TestRunCounts(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		baseSfx  string
		conc     int
	}{
		{"completions", EndpointCompletions, "", 0},
		{"chat", EndpointChat, "", 0},
		{"completions base/v1 capped", EndpointCompletions, "/v1/", 3},
		{"chat capped", EndpointChat, "", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{firstDelay: time.Millisecond, chunkDelay: time.Millisecond, wantAuth: "Bearer k"}
			srv := f.start(t)
			o := opts(srv.URL + tc.baseSfx)
			o.Endpoint, o.MaxConcurrency, o.APIKey = tc.endpoint, tc.conc, "k"
			o.NumPrompts = 10
			res, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if res.Sent != 10 || res.Completed != 10 || res.Failed != 0 || len(res.Errors) != 0 {
				t.Fatalf("sent %d completed %d failed %d errors %v %v", res.Sent, res.Completed, res.Failed, res.Errors, res.ErrorSamples)
			}
			words, maxTok, models := f.seen()
			// The plan is what was asked for: compare with what the server saw.
			p := plan(&o)
			var wantIn, wantOut []int
			for _, r := range p {
				wantIn = append(wantIn, r.promptLen)
				wantOut = append(wantOut, r.outputLen)
			}
			slices.Sort(words)
			slices.Sort(maxTok)
			slices.Sort(wantIn)
			slices.Sort(wantOut)
			if !slices.Equal(words, wantIn) || !slices.Equal(maxTok, wantOut) {
				t.Errorf("server saw prompt words %v max tokens %v, planned %v %v", words, maxTok, wantIn, wantOut)
			}
			if res.TotalInputTokens != sum(wantIn) || res.TotalOutputTokens != sum(wantOut) {
				t.Errorf("tokens in %d out %d, want %d %d", res.TotalInputTokens, res.TotalOutputTokens, sum(wantIn), sum(wantOut))
			}
			for _, m := range models {
				if m != "m" {
					t.Errorf("model field %q, want m", m)
				}
			}
			if res.MissingUsage != 0 {
				t.Errorf("MissingUsage %d", res.MissingUsage)
			}
			if res.TTFT.N != 10 || res.E2E.N != 10 || res.ITL.N != sum(wantOut)-10 {
				t.Errorf("sample sizes TTFT %d E2E %d ITL %d, want 10 10 %d", res.TTFT.N, res.E2E.N, res.ITL.N, sum(wantOut)-10)
			}
			if s := res.Duration.Seconds(); res.RequestThroughput != 10/s ||
				res.OutputTokenThroughput != float64(sum(wantOut))/s ||
				res.TotalTokenThroughput != float64(sum(wantOut)+sum(wantIn))/s {
				t.Errorf("throughputs %v %v %v for %v", res.RequestThroughput, res.OutputTokenThroughput, res.TotalTokenThroughput, res.Duration)
			}
		})
	}
}

// TestRunSampling: sampling parameters set in Options reach the server in
// every request (both endpoints), and unset ones are left out.
func TestRunSampling(t *testing.T) {
	temp, topP, topK := 0.6, 0.95, 20
	for _, tc := range []struct {
		name     string
		endpoint string
		set      func(o *Options)
		want     string
	}{
		{"none", EndpointCompletions, func(o *Options) {}, "- - - --"},
		{"all", EndpointCompletions, func(o *Options) { o.Temperature, o.TopP, o.TopK = &temp, &topP, &topK }, "0.6 0.95 20 --"},
		{"chat top-p", EndpointChat, func(o *Options) { o.TopP = &topP }, "- 0.95 - --"},
		{"json object", EndpointChat, func(o *Options) { o.JSONObject = true }, "- - - json-"},
		{"json schema", EndpointCompletions, func(o *Options) { o.JSONSchema = json.RawMessage(`{"type": "object"}`) }, "- - - schema-"},
		{"grammar", EndpointChat, func(o *Options) { o.Grammar = `root ::= "a"+` }, "- - - -grammar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{}
			srv := f.start(t)
			o := opts(srv.URL)
			o.Endpoint, o.NumPrompts = tc.endpoint, 4
			tc.set(&o)
			if res, err := Run(context.Background(), o); err != nil || res.Completed != 4 {
				t.Fatalf("run: %v, %+v", err, res)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for i, got := range f.sampling {
				if got != tc.want {
					t.Errorf("request %d sent %q, want %q", i, got, tc.want)
				}
			}
		})
	}
}

func TestRunTimings(t *testing.T) {
	const first, gap, out = 40 * time.Millisecond, 15 * time.Millisecond, 6
	for _, ep := range []string{EndpointCompletions, EndpointChat} {
		t.Run(ep, func(t *testing.T) {
			f := &fake{firstDelay: first, chunkDelay: gap}
			srv := f.start(t)
			o := opts(srv.URL)
			o.Endpoint, o.NumPrompts, o.OutputLen = ep, 4, Fixed(out)
			res, err := Run(context.Background(), o)
			if err != nil || res.Completed != 4 {
				t.Fatalf("err %v, result %+v", err, res)
			}
			// Upper bounds only catch nonsense: a loaded 2-core machine under
			// -race has stretched 40 ms sleeps by 150 ms here.
			const slack = 1000.0 // ms
			firstMS, gapMS := ms(first), ms(gap)
			// The server cannot answer before its delays, so the lower bounds
			// on TTFT and E2E hold for every request. Chunks can bunch up in
			// transit, so single gaps may be shorter than the server's.
			minE2E := firstMS + (out-1)*gapMS
			checks := []struct {
				name      string
				got, l, h float64
			}{
				{"TTFT p50", res.TTFT.P50, firstMS, firstMS + slack},
				{"TTFT mean", res.TTFT.Mean, firstMS, firstMS + slack},
				{"E2E p50", res.E2E.P50, minE2E, minE2E + slack},
				{"E2E mean", res.E2E.Mean, minE2E, minE2E + slack},
				{"ITL p50", res.ITL.P50, gapMS / 2, gapMS + slack},
				{"ITL mean", res.ITL.Mean, gapMS / 2, gapMS + slack},
				{"TPOT mean", res.TPOT.Mean, gapMS / 2, gapMS + slack},
			}
			for _, c := range checks {
				if c.got < c.l || c.got > c.h {
					t.Errorf("%s = %.2f ms, want in [%.1f, %.1f]", c.name, c.got, c.l, c.h)
				}
			}
			// Per request TTFT + the ITLs is the last chunk's time, <= E2E.
			if lastChunk := res.TTFT.Mean + (out-1)*res.ITL.Mean; lastChunk > res.E2E.Mean+1e-6 {
				t.Errorf("mean TTFT + %d mean ITL = %.3f ms > mean E2E %.3f ms", out-1, lastChunk, res.E2E.Mean)
			}
			if res.ITL.N != 4*(out-1) {
				t.Errorf("ITL samples %d, want %d", res.ITL.N, 4*(out-1))
			}
		})
	}
}

func TestRunArrivalSchedule(t *testing.T) {
	f := &fake{}
	srv := f.start(t)
	o := opts(srv.URL)
	o.NumPrompts, o.RequestRate, o.OutputLen = 15, 150, Fixed(1)
	res, err := Run(context.Background(), o)
	if err != nil || res.Completed != 15 {
		t.Fatalf("err %v, result %+v", err, res)
	}
	// The last request cannot be sent before its planned arrival.
	last := Arrivals(15, 150, o.Seed)[14]
	if last <= 0 || res.Duration < last {
		t.Errorf("duration %v, last arrival %v", res.Duration, last)
	}
}

func TestMaxConcurrency(t *testing.T) {
	for _, tc := range []struct {
		cap     int
		minSeen int64 // the server must see at least this many at once
	}{{1, 1}, {3, 1}, {0, 4}} {
		t.Run("cap"+string(rune('0'+tc.cap)), func(t *testing.T) {
			f := &fake{firstDelay: 15 * time.Millisecond, chunkDelay: 5 * time.Millisecond}
			srv := f.start(t)
			o := opts(srv.URL)
			o.NumPrompts, o.MaxConcurrency, o.OutputLen = 12, tc.cap, Fixed(3)
			res, err := Run(context.Background(), o)
			if err != nil || res.Completed != 12 {
				t.Fatalf("err %v, result %+v", err, res)
			}
			got := f.maxInflight.Load()
			if tc.cap > 0 && got > int64(tc.cap) {
				t.Errorf("server saw %d requests at once, cap %d", got, tc.cap)
			}
			if got < tc.minSeen {
				t.Errorf("server saw at most %d at once, want >= %d", got, tc.minSeen)
			}
		})
	}
}

func TestFailuresByStatus(t *testing.T) {
	f := &fake{status: func(n int64) int {
		switch n % 4 {
		case 0:
			return 500
		case 1:
			return 429
		}
		return 0
	}}
	srv := f.start(t)
	o := opts(srv.URL)
	o.NumPrompts, o.MaxConcurrency = 12, 2
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"HTTP 500": 3, "HTTP 429": 3}
	if res.Completed != 6 || res.Failed != 6 || !equalMaps(res.Errors, want) {
		t.Fatalf("completed %d failed %d errors %v, want 6 6 %v", res.Completed, res.Failed, res.Errors, want)
	}
	if !strings.Contains(res.ErrorSamples["HTTP 500"], "injected 500") {
		t.Errorf("error sample %q", res.ErrorSamples["HTTP 500"])
	}
	if res.TTFT.N != 6 {
		t.Errorf("latencies of failed requests counted: TTFT n %d", res.TTFT.N)
	}
}

func TestStreamFaults(t *testing.T) {
	for _, tc := range []struct {
		fault   string
		wantKey string // "" means the requests complete
	}{
		{"error-event", "stream: error event"},
		{"no-done", "stream: ended without [DONE]"},
		{"bad-json", "stream: bad JSON"},
		{"no-content", "stream: no content"},
		{"no-usage", ""},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			f := &fake{fault: tc.fault}
			srv := f.start(t)
			o := opts(srv.URL)
			o.NumPrompts, o.OutputLen = 4, Fixed(3)
			res, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantKey == "" {
				if res.Completed != 4 || res.MissingUsage != 4 || res.TotalOutputTokens != 12 {
					t.Errorf("completed %d missing usage %d output tokens %d, want 4 4 12", res.Completed, res.MissingUsage, res.TotalOutputTokens)
				}
				return
			}
			if res.Failed != 4 || res.Errors[tc.wantKey] != 4 {
				t.Errorf("failed %d errors %v, want 4 under %q", res.Failed, res.Errors, tc.wantKey)
			}
		})
	}
}

func TestConnectionRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	o := opts("http://" + addr)
	o.NumPrompts = 3
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failed != 3 || res.Errors["connection"] != 3 {
		t.Errorf("failed %d errors %v", res.Failed, res.Errors)
	}
}

func TestTimeout(t *testing.T) {
	f := &fake{firstDelay: 2 * time.Second}
	srv := f.start(t)
	o := opts(srv.URL)
	o.NumPrompts, o.Timeout = 3, 50*time.Millisecond
	t0 := time.Now()
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if el := time.Since(t0); el > 1500*time.Millisecond {
		t.Errorf("run took %v with a 50ms timeout", el)
	}
	if res.Failed != 3 || res.Errors["timeout"] != 3 {
		t.Errorf("failed %d errors %v", res.Failed, res.Errors)
	}
}

func TestCancelStopsRun(t *testing.T) {
	for _, tc := range []struct {
		name string
		rate float64
		conc int
	}{{"capped", 0, 4}, {"poisson", 20, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fake{firstDelay: 20 * time.Millisecond, chunkDelay: 50 * time.Millisecond}
			srv := f.start(t)
			o := opts(srv.URL)
			o.NumPrompts, o.RequestRate, o.MaxConcurrency, o.OutputLen = 30, tc.rate, tc.conc, Fixed(40)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			time.AfterFunc(150*time.Millisecond, cancel)
			t0 := time.Now()
			res, err := Run(ctx, o)
			if el := time.Since(t0); el > 2*time.Second {
				t.Errorf("Run returned %v after the cancel", el)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("err %v, want the context's", err)
			}
			if res == nil || res.Sent == 0 || res.Sent >= 30 || res.Completed != 0 {
				t.Fatalf("partial result %+v", res)
			}
			if res.Failed != res.Sent || res.Errors["canceled"] != res.Sent {
				t.Errorf("sent %d failed %d errors %v", res.Sent, res.Failed, res.Errors)
			}
			if n := f.n.Load(); n > int64(res.Sent) {
				t.Errorf("server saw %d requests, result says %d sent", n, res.Sent)
			}
		})
	}
}

func TestPlanDeterministic(t *testing.T) {
	o := Options{NumPrompts: 50, RequestRate: 10, PromptLen: Normal(20, 5), OutputLen: Uniform(1, 9), Seed: rand.Int64()}
	a, b := plan(&o), plan(&o)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different plans")
	}
	for _, r := range a {
		if n := len(strings.Fields(r.prompt)); n != r.promptLen {
			t.Fatalf("prompt has %d words, planned %d", n, r.promptLen)
		}
	}
	o.Seed++
	if slices.Equal(a, plan(&o)) {
		t.Fatal("different seeds, same plan")
	}
}

func TestValidate(t *testing.T) {
	good := Options{BaseURL: "http://127.0.0.1:1", NumPrompts: 1, PromptLen: Fixed(1), OutputLen: Fixed(1)}
	for _, tc := range []struct {
		name string
		mod  func(*Options)
		want string
	}{
		{"base url", func(o *Options) { o.BaseURL = "127.0.0.1:8000" }, "base URL"},
		{"endpoint", func(o *Options) { o.Endpoint = "embeddings" }, "endpoint"},
		{"prompts", func(o *Options) { o.NumPrompts = 0 }, "num prompts"},
		{"rate", func(o *Options) { o.RequestRate = -1 }, "request rate"},
		{"concurrency", func(o *Options) { o.MaxConcurrency = -2 }, "max concurrency"},
		{"prompt len", func(o *Options) { o.PromptLen = Dist{} }, "prompt length"},
		{"output len", func(o *Options) { o.OutputLen = Uniform(5, 2) }, "output length"},
		{"timeout", func(o *Options) { o.Timeout = -time.Second }, "timeout"},
		{"temperature", func(o *Options) { v := 2.5; o.Temperature = &v }, "temperature"},
		{"top-p", func(o *Options) { v := 0.0; o.TopP = &v }, "top-p"},
		{"top-k", func(o *Options) { v := -1; o.TopK = &v }, "top-k"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := good
			tc.mod(&o)
			_, err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestResultJSONAndTable(t *testing.T) {
	f := &fake{status: func(n int64) int {
		if n == 0 {
			return 503
		}
		return 0
	}}
	srv := f.start(t)
	o := opts(srv.URL)
	o.NumPrompts = 5
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	js, err := res.JSON()
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back["completed"] != float64(res.Completed) || back["failed"] != 1.0 ||
		back["duration_s"] != res.Duration.Seconds() ||
		back["ttft"].(map[string]any)["p99_ms"] != res.TTFT.P99 ||
		back["errors"].(map[string]any)["HTTP 503"] != 1.0 {
		t.Errorf("JSON does not match the result:\n%s", js)
	}
	var buf bytes.Buffer
	if err := res.Table(&buf); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Successful requests:", "Failed requests:", "Mean TTFT (ms):", "P99 ITL (ms):", "HTTP 503:", "Median E2E (ms):"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

func equalMaps(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func BenchmarkRun(b *testing.B) {
	f := &fake{}
	srv := f.start(b)
	o := opts(srv.URL)
	o.NumPrompts, o.OutputLen, o.MaxConcurrency = 32, Fixed(16), 8
	for b.Loop() {
		if res, err := Run(context.Background(), o); err != nil || res.Completed != 32 {
			b.Fatal(err, res)
		}
	}
}

// TestRunRefusesBadSchema: a JSON schema option that is not one JSON
// object, or comes with json_object, and a grammar with either, are
// refused before any request, naming the option.
func TestRunRefusesBadSchema(t *testing.T) {
	for _, c := range []struct {
		set  func(o *Options)
		want string
	}{
		{func(o *Options) { o.JSONSchema = json.RawMessage(`[1]`) }, "json schema"},
		{func(o *Options) { o.JSONSchema, o.JSONObject = json.RawMessage(`{"type": "object"}`), true }, "json schema"},
		{func(o *Options) { o.Grammar, o.JSONObject = `root ::= "a"`, true }, "grammar"},
	} {
		f := &fake{}
		srv := f.start(t)
		o := opts(srv.URL)
		c.set(&o)
		if _, err := Run(context.Background(), o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v, want an error naming the %s", err, c.want)
		}
		f.mu.Lock()
		if len(f.sampling) != 0 {
			t.Errorf("%d requests sent", len(f.sampling))
		}
		f.mu.Unlock()
	}
}
