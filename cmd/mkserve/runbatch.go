package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"
)

// cmdRunBatch is `mkserve run-batch`: OpenAI's batch file format (as
// vLLM's run-batch reads it) run offline. Each input line is a request
// {"custom_id", "method": "POST", "url", "body"} to /v1/chat/completions,
// /v1/completions or /v1/responses; each output line, in input order, is
// {"id", "custom_id", "response": {"status_code", "request_id", "body"},
// "error"}. The model is served in process on a loopback port with every
// serve setting (the flags after run-batch's own), so a batch line behaves
// exactly as the same request to `mkserve serve`; up to --max-concurrency
// lines run at once and continuous batching packs them.
func cmdRunBatch(args []string, stdin io.Reader, stdout io.Writer) error {
	in, out, conc, rest, err := runBatchFlags(args)
	if err != nil {
		return err
	}
	src := stdin
	if in != "-" {
		f, err := os.Open(in)
		if err != nil {
			return err
		}
		defer f.Close()
		src = f
	}
	lines, err := readBatchLines(src)
	if err != nil {
		return fmt.Errorf("reading %s: %w", in, err)
	}
	dst := stdout
	var outFile *os.File
	if out != "-" {
		if outFile, err = os.Create(out); err != nil {
			return err
		}
		defer outFile.Close()
		dst = outFile
	}
	ctx, stop := signal.NotifyContext(context.Background(), serveSignals...)
	defer stop()
	start := time.Now()
	ok, failed, err := runBatch(ctx, lines, dst, conc, rest)
	if err != nil {
		return err
	}
	if outFile != nil {
		if err := outFile.Close(); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "mkserve run-batch: %d requests, %d succeeded, %d failed, in %.1fs\n", len(lines), ok, failed, time.Since(start).Seconds())
	return nil
}

// runBatchFlags splits run-batch's own flags (-i/--input, -o/--output,
// --max-concurrency) from the serve flags that follow or surround them.
func runBatchFlags(args []string) (in, out string, conc int, rest []string, err error) {
	conc = 64
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			rest = append(rest, a)
			continue
		}
		switch name {
		case "i", "input", "o", "output", "max-concurrency":
		default:
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return "", "", 0, nil, fmt.Errorf("flag %s needs a value", a)
			}
			i++
			val = args[i]
		}
		switch name {
		case "i", "input":
			in = val
		case "o", "output":
			out = val
		default:
			if conc, err = strconv.Atoi(val); err != nil || conc < 1 {
				return "", "", 0, nil, fmt.Errorf("--max-concurrency must be a positive integer, got %q", val)
			}
		}
	}
	if in == "" || out == "" {
		return "", "", 0, nil, fmt.Errorf("usage: mkserve run-batch -i INPUT.jsonl -o OUTPUT.jsonl [--max-concurrency N] [serve flags: --model DIR …] (- for stdin / stdout)")
	}
	return in, out, conc, rest, nil
}

// readBatchLines reads the non-empty lines of a JSONL file.
func readBatchLines(r io.Reader) ([][]byte, error) {
	var lines [][]byte
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if l := bytes.TrimSpace(sc.Bytes()); len(l) > 0 {
			lines = append(lines, bytes.Clone(l))
		}
	}
	return lines, sc.Err()
}

// batchInput is one input line.
type batchInput struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// batchOutput is one output line.
type batchOutput struct {
	ID       string         `json:"id"`
	CustomID string         `json:"custom_id"`
	Response *batchResponse `json:"response"`
	Error    *batchError    `json:"error"`
}

type batchResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

type batchError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// batchURLs are the endpoints a batch line may call.
var batchURLs = map[string]bool{"/v1/chat/completions": true, "/v1/completions": true, "/v1/responses": true}

// runBatch serves the model in process, runs lines through it (up to conc
// at once) and writes one output line per input line, in order.
func runBatch(ctx context.Context, lines [][]byte, w io.Writer, conc int, serveArgs []string) (ok, failed int, err error) {
	base, stopServe, err := serveInProcess(ctx, serveArgs)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if serr := stopServe(); serr != nil && err == nil {
			err = serr
		}
	}()

	results := make([]chan batchOutput, len(lines))
	for i := range results {
		results[i] = make(chan batchOutput, 1)
	}
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	go func() {
		for i, l := range lines {
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				results[i] <- runBatchLine(ctx, base, l)
			}()
		}
	}()
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	for i := range lines {
		o := <-results[i]
		if o.Error == nil && o.Response != nil && o.Response.StatusCode == http.StatusOK {
			ok++
		} else {
			failed++
		}
		if err := enc.Encode(o); err != nil {
			return ok, failed, err
		}
	}
	wg.Wait()
	return ok, failed, bw.Flush()
}

// serveInProcess runs `mkserve serve` with serveArgs in this process on a
// loopback port — quiet unless asked otherwise, no gRPC, no API key
// (nothing but this process reaches it) — and returns its base URL once
// the model is ready, and a stop that shuts it down and returns its error.
func serveInProcess(ctx context.Context, serveArgs []string) (string, func() error, error) {
	sctx, cancel := context.WithCancel(ctx)
	ready := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		args := append(append([]string{"--log-level", "warn"}, serveArgs...), "--http-addr", "127.0.0.1:0", "--grpc-addr", "", "--api-key", "")
		served <- serve(sctx, args, os.LookupEnv, func(h, _ string) { ready <- h })
	}()
	select {
	case h := <-ready:
		return "http://" + h, func() error { cancel(); return <-served }, nil
	case err := <-served:
		cancel()
		if err == nil {
			err = errors.New("interrupted before the model was ready")
		}
		return "", nil, err
	}
}

// runBatchLine runs one input line against the server at base.
func runBatchLine(ctx context.Context, base string, line []byte) batchOutput {
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	out := batchOutput{ID: "batch_req_" + hex.EncodeToString(id)}
	var in batchInput
	fail := func(code, format string, args ...any) batchOutput {
		out.Error = &batchError{Code: code, Message: fmt.Sprintf(format, args...)}
		return out
	}
	if err := json.Unmarshal(line, &in); err != nil {
		return fail("invalid_json_line", "the line is not a JSON request object: %v", err)
	}
	out.CustomID = in.CustomID
	switch {
	case in.Method != "" && in.Method != http.MethodPost:
		return fail("invalid_method", "method %q: only POST", in.Method)
	case !batchURLs[in.URL]:
		return fail("invalid_url", "url %q: one of /v1/chat/completions, /v1/completions, /v1/responses", in.URL)
	}
	var body map[string]json.RawMessage
	if err := json.Unmarshal(in.Body, &body); err != nil {
		return fail("invalid_body", "body must be a JSON object")
	}
	if s, ok := body["stream"]; ok && string(s) == "true" {
		return fail("invalid_body", "stream is not supported in a batch")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+in.URL, bytes.NewReader(in.Body))
	if err != nil {
		return fail("internal_error", "%v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail("request_failed", "%v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fail("request_failed", "reading the response: %v", err)
	}
	b = bytes.TrimSpace(b)
	if !json.Valid(b) { // (every answer of the API is JSON; kept as a string if not)
		b, _ = json.Marshal(string(b))
	}
	out.Response = &batchResponse{StatusCode: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id"), Body: b}
	return out
}
