package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"time"

	"golang.org/x/term"
)

// cmdChat is `mkserve chat`: a conversation in the terminal with a running
// server, or with --model a checkpoint served in this process (what `ollama
// run` is to ollama). Each line of stdin is
// a user turn; the reply streams to stdout as it is generated, the
// reasoning (if the model thinks) to stderr; the conversation is kept and
// sent whole each turn, so the server's prefix cache reuses its earlier
// tokens. /reset starts over, /exit (or end of input) quits.
func cmdChat(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := newFlags("chat")
	baseURL := fs.String("base-url", "http://127.0.0.1:8000", "the running server (mkserve serve / make run)")
	modelDir := fs.String("model", "", "a checkpoint directory to serve in this process instead of talking to --base-url (as `ollama run`)")
	backendName := fs.String("backend", "cpu", "with --model: cpu or cuda")
	apiKey := fs.String("api-key", os.Getenv("MKSERVE_API_KEY"), "bearer token, when the server has api_key set (default $MKSERVE_API_KEY)")
	system := fs.String("system", "", "a system message to start the conversation with")
	maxTokens := fs.Int("max-tokens", 512, "new tokens a reply at most")
	temp := fs.Float64("temperature", -1, "sampling temperature (unset: the model's default)")
	showReasoning := fs.Bool("reasoning", true, "print the model's reasoning (to stderr) when it thinks")
	timeout := fs.Duration("timeout", 10*time.Minute, "how long one reply may take")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (type your messages on stdin)", fs.Arg(0))
	}
	if *maxTokens < 1 {
		return fmt.Errorf("--max-tokens must be at least 1, got %d", *maxTokens)
	}
	sigs, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	base := strings.TrimRight(*baseURL, "/")
	if *modelDir != "" {
		b, stopServe, err := serveInProcess(sigs, []string{"--model", *modelDir, "--backend", *backendName})
		if err != nil {
			return err
		}
		defer stopServe()
		base = b
	}
	c := &chatClient{url: base + "/v1/chat/completions", key: *apiKey,
		maxTokens: *maxTokens, out: stdout, reasoningOut: io.Discard}
	if *showReasoning {
		c.reasoningOut = os.Stderr
	}
	if *temp >= 0 {
		c.temperature = temp
	}
	reset := func() {
		c.history = c.history[:0]
		if *system != "" {
			c.history = append(c.history, chatTurn{Role: "system", Content: *system})
		}
	}
	reset()
	in := bufio.NewScanner(stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	prompt := func() {} // a ">>> " before each line when a person types them
	if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		prompt = func() { fmt.Fprint(os.Stderr, ">>> ") }
	}
	for prompt(); in.Scan(); prompt() {
		line := strings.TrimSpace(in.Text())
		switch line {
		case "":
			continue
		case "/exit", "/quit", "/bye":
			return nil
		case "/reset":
			reset()
			continue
		}
		ctx, cancel := context.WithTimeout(sigs, *timeout)
		err := c.turn(ctx, line)
		cancel()
		if err != nil {
			return err
		}
		if sigs.Err() != nil {
			return nil
		}
	}
	return in.Err()
}

// chatTurn is one message of the conversation.
type chatTurn struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatClient struct {
	url, key     string
	maxTokens    int
	temperature  *float64
	history      []chatTurn
	out          io.Writer
	reasoningOut io.Writer
}

// turn sends the conversation with the user's line, streams the reply and
// keeps it.
func (c *chatClient) turn(ctx context.Context, line string) error {
	c.history = append(c.history, chatTurn{Role: "user", Content: line})
	body := map[string]any{"messages": c.history, "stream": true, "max_tokens": c.maxTokens}
	if c.temperature != nil {
		body["temperature"] = *c.temperature
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.history = c.history[:len(c.history)-1]
		return fmt.Errorf("%s: %w (is the server running? make run starts one)", c.url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		c.history = c.history[:len(c.history)-1]
		var e struct{ Error struct{ Message string } }
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		if json.Unmarshal(raw, &e) == nil && e.Error.Message != "" {
			return fmt.Errorf("server: %d %s", resp.StatusCode, e.Error.Message)
		}
		return fmt.Errorf("server: %d %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	var reply strings.Builder
	finish := ""
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content          *string `json:"content"`
					ReasoningContent *string `json:"reasoning_content"`
				}
				FinishReason *string `json:"finish_reason"`
			}
			Error *struct{ Message string }
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return fmt.Errorf("bad event from the server: %v", err)
		}
		if ch.Error != nil {
			return fmt.Errorf("server: %s", ch.Error.Message)
		}
		for _, x := range ch.Choices {
			if r := x.Delta.ReasoningContent; r != nil {
				fmt.Fprint(c.reasoningOut, *r)
			}
			if t := x.Delta.Content; t != nil {
				reply.WriteString(*t)
				if _, err := io.WriteString(c.out, *t); err != nil {
					return err
				}
			}
			if x.FinishReason != nil {
				finish = *x.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("reading the reply: %w", err)
	}
	if finish == "length" {
		fmt.Fprint(c.out, " […]")
	}
	fmt.Fprintln(c.out)
	c.history = append(c.history, chatTurn{Role: "assistant", Content: reply.String()})
	return nil
}
