package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Result is what Run measured. Latency summaries cover completed requests
// only; throughputs divide by Duration.
type Result struct {
	Sent      int // requests sent (NumPrompts unless ctx ended first)
	Completed int // requests whose stream ended with [DONE] after some content
	Failed    int // Sent - Completed

	Duration time.Duration // from the first send to the last response's end

	TotalInputTokens  int // prompt_tokens summed over completed requests
	TotalOutputTokens int // completion_tokens summed over completed requests
	// MissingUsage counts completed requests without a usage chunk: their
	// output tokens are the content chunks and their input tokens the words
	// sent.
	MissingUsage int

	RequestThroughput     float64 // completed requests per second
	OutputTokenThroughput float64 // output tokens per second
	TotalTokenThroughput  float64 // input plus output tokens per second

	TTFT Percentiles // time to first content chunk
	ITL  Percentiles // gaps between content chunks (all requests pooled)
	TPOT Percentiles // (E2E - TTFT) / (output tokens - 1), requests of 2+ tokens
	E2E  Percentiles // send to end of stream

	Errors       map[string]int    // failures by kind: "HTTP 503", "timeout", "canceled", "connection", "stream: ..."
	ErrorSamples map[string]string // the first message seen for each kind
}

// resultJSON is Result with durations in seconds and snake_case names.
type resultJSON struct {
	Sent                  int               `json:"sent"`
	Completed             int               `json:"completed"`
	Failed                int               `json:"failed"`
	DurationS             float64           `json:"duration_s"`
	TotalInputTokens      int               `json:"total_input_tokens"`
	TotalOutputTokens     int               `json:"total_output_tokens"`
	MissingUsage          int               `json:"missing_usage"`
	RequestThroughput     float64           `json:"request_throughput"`
	OutputTokenThroughput float64           `json:"output_token_throughput"`
	TotalTokenThroughput  float64           `json:"total_token_throughput"`
	TTFT                  Percentiles       `json:"ttft"`
	ITL                   Percentiles       `json:"itl"`
	TPOT                  Percentiles       `json:"tpot"`
	E2E                   Percentiles       `json:"e2e"`
	Errors                map[string]int    `json:"errors"`
	ErrorSamples          map[string]string `json:"error_samples"`
}

// JSON encodes r (durations in seconds, latencies in milliseconds).
func (r *Result) JSON() ([]byte, error) {
	return json.MarshalIndent(resultJSON{
		Sent: r.Sent, Completed: r.Completed, Failed: r.Failed,
		DurationS:        r.Duration.Seconds(),
		TotalInputTokens: r.TotalInputTokens, TotalOutputTokens: r.TotalOutputTokens,
		MissingUsage:      r.MissingUsage,
		RequestThroughput: r.RequestThroughput, OutputTokenThroughput: r.OutputTokenThroughput,
		TotalTokenThroughput: r.TotalTokenThroughput,
		TTFT:                 r.TTFT, ITL: r.ITL, TPOT: r.TPOT, E2E: r.E2E,
		Errors: nonNil(r.Errors), ErrorSamples: nonNil(r.ErrorSamples),
	}, "", "  ")
}

func nonNil[V any](m map[string]V) map[string]V {
	if m == nil {
		return map[string]V{}
	}
	return m
}

// Table writes r as a human-readable table.
func (r *Result) Table(w io.Writer) error {
	var b strings.Builder
	const width = 52
	rule := func(title string) {
		if title == "" {
			b.WriteString(strings.Repeat("=", width) + "\n")
			return
		}
		pad := width - len(title) - 2
		fmt.Fprintf(&b, "%s %s %s\n", strings.Repeat("-", pad/2), title, strings.Repeat("-", pad-pad/2))
	}
	row := func(name string, v any) {
		switch x := v.(type) {
		case float64:
			fmt.Fprintf(&b, "%-38s %13.2f\n", name+":", x)
		default:
			fmt.Fprintf(&b, "%-38s %13v\n", name+":", x)
		}
	}
	rule("")
	b.WriteString(centre("Serving Benchmark Result", width) + "\n")
	rule("")
	row("Successful requests", r.Completed)
	row("Failed requests", r.Failed)
	row("Benchmark duration (s)", r.Duration.Seconds())
	row("Total input tokens", r.TotalInputTokens)
	row("Total generated tokens", r.TotalOutputTokens)
	row("Request throughput (req/s)", r.RequestThroughput)
	row("Output token throughput (tok/s)", r.OutputTokenThroughput)
	row("Total token throughput (tok/s)", r.TotalTokenThroughput)
	for _, s := range []struct {
		title, short string
		p            Percentiles
	}{
		{"Time to First Token", "TTFT", r.TTFT},
		{"Time per Output Token (excl. 1st)", "TPOT", r.TPOT},
		{"Inter-token Latency", "ITL", r.ITL},
		{"End-to-end Latency", "E2E", r.E2E},
	} {
		rule(s.title)
		row("Mean "+s.short+" (ms)", s.p.Mean)
		row("Median "+s.short+" (ms)", s.p.P50)
		row("P90 "+s.short+" (ms)", s.p.P90)
		row("P99 "+s.short+" (ms)", s.p.P99)
	}
	if len(r.Errors) > 0 {
		rule("Errors")
		keys := make([]string, 0, len(r.Errors))
		for k := range r.Errors {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			row(k, r.Errors[k])
			if msg := r.ErrorSamples[k]; msg != "" {
				fmt.Fprintf(&b, "  e.g. %s\n", truncate(msg, width*2))
			}
		}
	}
	if r.MissingUsage > 0 {
		fmt.Fprintf(&b, "note: %d responses had no usage chunk; their tokens were counted as chunks\n", r.MissingUsage)
	}
	rule("")
	_, err := io.WriteString(w, b.String())
	return err
}

func centre(s string, width int) string {
	pad := max(0, width-len(s))
	return strings.Repeat(" ", pad/2) + s
}

func truncate(s string, n int) string {
	r := []rune(strings.Join(strings.Fields(s), " "))
	if len(r) <= n {
		return string(r)
	}
	return string(r[:n]) + "..."
}
