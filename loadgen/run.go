// Package loadgen benchmarks an OpenAI-compatible streaming server the way
// vLLM's benchmark_serving does: NumPrompts requests with random-word
// prompts and fixed or random lengths arrive as a Poisson process (or all at
// once), optionally capped in concurrency; each is a streaming
// /v1/completions or /v1/chat/completions call with max_tokens, ignore_eos
// and stream_options.include_usage, timed per chunk.
//
// Per request it measures TTFT (send to first chunk with content), ITL (the
// gaps between content chunks after the first), TPOT ((E2E-TTFT)/(tokens-1))
// and E2E latency (send to end of stream), and reads the token counts from
// the usage chunk. Run aggregates them into a Result.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// request is one planned request.
type request struct {
	at        time.Duration // send time after the start
	prompt    string
	promptLen int // words in prompt
	outputLen int // max_tokens
}

// record is what one request measured.
type record struct {
	sent      bool
	ok        bool
	errKey    string // Errors key when !ok
	errMsg    string
	ttft      time.Duration
	itl       []time.Duration
	e2e       time.Duration
	promptTok int
	outTok    int
	usage     bool // the stream carried a usage chunk
}

// plan draws every request of the run from o.Seed.
func plan(o *Options) []request {
	at := Arrivals(o.NumPrompts, o.RequestRate, o.Seed)
	pr := newRand(o.Seed, streamPrompts)
	lr := newRand(o.Seed, streamLengths)
	reqs := make([]request, o.NumPrompts)
	for i := range reqs {
		pl := o.PromptLen.Sample(lr)
		reqs[i] = request{at: at[i], prompt: prompt(pr, pl), promptLen: pl, outputLen: o.OutputLen.Sample(lr)}
	}
	return reqs
}

// Run sends o.NumPrompts streaming requests and measures them. When ctx ends
// it stops sending, cancels the requests in flight (counted as failed under
// "canceled") and returns the partial Result with ctx's error.
func Run(ctx context.Context, o Options) (*Result, error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	url, _ := o.endpointURL()
	reqs := plan(&o)
	recs := make([]record, len(reqs))

	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 0
	tr.MaxIdleConnsPerHost = max(o.MaxConcurrency, 256)
	tr.DisableCompression = true
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	var sem chan struct{}
	if o.MaxConcurrency > 0 {
		sem = make(chan struct{}, o.MaxConcurrency)
	}
	var wg sync.WaitGroup
	start := time.Now()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
launch:
	for i := range reqs {
		if wait := reqs[i].at - time.Since(start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break launch
			case <-timer.C:
			}
		}
		if sem != nil {
			select {
			case <-ctx.Done():
				break launch
			case sem <- struct{}{}:
			}
		}
		if ctx.Err() != nil {
			if sem != nil {
				<-sem
			}
			break
		}
		wg.Go(func() {
			recs[i] = send(ctx, client, url, &o, &reqs[i])
			if sem != nil {
				<-sem
			}
		})
	}
	wg.Wait()
	res := aggregate(recs, time.Since(start))
	return res, ctx.Err()
}

// send makes one streaming request and times it.
func send(ctx context.Context, client *http.Client, url string, o *Options, r *request) (rec record) {
	rec.sent = true
	fail := func(key, msg string) record {
		rec.ok, rec.errKey, rec.errMsg = false, key, msg
		return rec
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	body, err := requestBody(o, r)
	if err != nil {
		return fail("request", err.Error())
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return fail("request", err.Error())
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	if o.APIKey != "" {
		hr.Header.Set("Authorization", "Bearer "+o.APIKey)
	}

	t0 := time.Now()
	resp, err := client.Do(hr)
	if err != nil {
		return fail(classify(ctx, err), err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fail("HTTP "+strconv.Itoa(resp.StatusCode), string(bytes.TrimSpace(msg)))
	}

	sse := newSSEReader(resp.Body)
	var last time.Time
	var chunks int
	done := false
	for !done {
		data, err := sse.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fail(classify(ctx, err), err.Error())
		}
		now := time.Now()
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			done = true
			break
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			return fail("stream: bad JSON", fmt.Sprintf("%v in %.200q", err, data))
		}
		if c.Error != nil {
			return fail("stream: error event", c.Error.Message)
		}
		if c.Usage != nil {
			rec.usage = true
			rec.promptTok, rec.outTok = c.Usage.PromptTokens, c.Usage.CompletionTokens
		}
		if !c.hasContent() {
			continue
		}
		if chunks == 0 {
			rec.ttft = now.Sub(t0)
		} else {
			rec.itl = append(rec.itl, now.Sub(last))
		}
		last = now
		chunks++
	}
	rec.e2e = time.Since(t0)
	if !done {
		return fail("stream: ended without [DONE]", fmt.Sprintf("after %d content chunks", chunks))
	}
	if chunks == 0 {
		return fail("stream: no content", "the stream carried no text")
	}
	if !rec.usage {
		rec.outTok = chunks
		rec.promptTok = r.promptLen
	}
	rec.ok = true
	return rec
}

// classify names a transport error for Result.Errors.
func classify(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, errLineTooLong):
		return "stream: line too long"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		return "connection"
	}
}

// requestBody is the JSON body of one request.
func requestBody(o *Options, r *request) ([]byte, error) {
	m := map[string]any{
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
		"ignore_eos":     true,
	}
	switch {
	case o.JSONObject:
		delete(m, "ignore_eos")
		m["response_format"] = map[string]string{"type": "json_object"}
	case o.JSONSchema != nil:
		delete(m, "ignore_eos")
		m["response_format"] = map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "bench", "schema": o.JSONSchema}}
	case o.Grammar != "":
		delete(m, "ignore_eos")
		m["guided_grammar"] = o.Grammar
	}
	if o.Model != "" {
		m["model"] = o.Model
	}
	if o.Temperature != nil {
		m["temperature"] = *o.Temperature
	}
	if o.TopP != nil {
		m["top_p"] = *o.TopP
	}
	if o.TopK != nil {
		m["top_k"] = *o.TopK
	}
	if o.Endpoint == EndpointChat {
		m["messages"] = []map[string]string{{"role": "user", "content": r.prompt}}
		m["max_completion_tokens"] = r.outputLen
	} else {
		m["prompt"] = r.prompt
		m["max_tokens"] = r.outputLen
	}
	return json.Marshal(m)
}

// chunk is one streamed JSON object of either endpoint.
type chunk struct {
	Choices []struct {
		Text  *string `json:"text"`
		Delta *struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// hasContent reports whether the chunk carries generated text.
func (c *chunk) hasContent() bool {
	for _, ch := range c.Choices {
		if ch.Text != nil && *ch.Text != "" {
			return true
		}
		if d := ch.Delta; d != nil && ((d.Content != nil && *d.Content != "") || (d.ReasoningContent != nil && *d.ReasoningContent != "")) {
			return true
		}
	}
	return false
}

// aggregate turns the records into a Result.
func aggregate(recs []record, dur time.Duration) *Result {
	res := &Result{Duration: dur, Errors: map[string]int{}, ErrorSamples: map[string]string{}}
	var ttft, itl, tpot, e2e []float64
	for _, r := range recs {
		if !r.sent {
			continue
		}
		res.Sent++
		if !r.ok {
			res.Failed++
			res.Errors[r.errKey]++
			if _, seen := res.ErrorSamples[r.errKey]; !seen {
				res.ErrorSamples[r.errKey] = r.errMsg
			}
			continue
		}
		res.Completed++
		if !r.usage {
			res.MissingUsage++
		}
		res.TotalInputTokens += r.promptTok
		res.TotalOutputTokens += r.outTok
		ttft = append(ttft, ms(r.ttft))
		e2e = append(e2e, ms(r.e2e))
		for _, d := range r.itl {
			itl = append(itl, ms(d))
		}
		if r.outTok > 1 {
			tpot = append(tpot, ms(r.e2e-r.ttft)/float64(r.outTok-1))
		}
	}
	if s := dur.Seconds(); s > 0 {
		res.RequestThroughput = float64(res.Completed) / s
		res.OutputTokenThroughput = float64(res.TotalOutputTokens) / s
		res.TotalTokenThroughput = float64(res.TotalInputTokens+res.TotalOutputTokens) / s
	}
	res.TTFT, res.ITL, res.TPOT, res.E2E = Summarize(ttft), Summarize(itl), Summarize(tpot), Summarize(e2e)
	return res
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
