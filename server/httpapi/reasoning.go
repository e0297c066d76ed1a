package httpapi

import (
	"strings"
)

// Reasoning output. Models that think before they answer write the
// thinking into their text; chat completions return it apart, as
// `reasoning_content` beside `content` (DeepSeek's API field, vLLM's
// reasoning parsers). Two formats are known:
//
//   - think: the thinking between <think> and </think> (Qwen3,
//     DeepSeek-R1), the answer after; when the prompt already opened the
//     block (a template that ends its generation prompt with <think>), the
//     text starts inside it.
//   - harmony (gpt-oss): the text is a run of messages,
//     <|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…
//     — the analysis channel is the reasoning, the final channel the
//     answer, and a commentary message addressed to=functions.NAME a tool
//     call whose body is its arguments. Its markers are special tokens, so
//     the text keeps them (engine.SamplingParams.KeepSpecialTokens).

// Reasoning formats (Options.Reasoning).
const (
	ReasoningThink   = "think"
	ReasoningHarmony = "harmony"
)

// DetectReasoning is the reasoning format a chat template's source
// teaches ("" when it shows none).
func DetectReasoning(src string) string {
	switch {
	case strings.Contains(src, "<|channel|>") && strings.Contains(src, "<|message|>"):
		return ReasoningHarmony
	case strings.Contains(src, "</think>"):
		return ReasoningThink
	}
	return ""
}

// splitter separates one choice's text, as it streams, into reasoning and
// content; a harmony splitter also collects the tool calls.
type splitter interface {
	// push takes new text and returns what may be streamed now.
	push(text string) (reasoning, content string)
	// finish returns what is still held back, and the calls.
	finish() (reasoning, content string, calls []toolCallJS)
}

// newSplitter is format's splitter for a choice whose rendered prompt is
// prompt; calls: whether harmony's function messages are tool calls (the
// request has tools), else content. nil for no format.
func newSplitter(format, prompt string, calls bool) splitter {
	switch format {
	case ReasoningThink:
		t := &thinkSplit{}
		p := strings.TrimRight(prompt, " \t\r\n")
		if i := strings.LastIndex(p, thinkOpen); i >= 0 && !strings.Contains(p[i:], thinkClose) {
			t.state = thinkIn // the template opened the block
		}
		return t
	case ReasoningHarmony:
		return &harmonySplit{calls: calls}
	}
	return nil
}

// splitAll is a whole text through a splitter.
func splitAll(s splitter, text string) (reasoning, content string, calls []toolCallJS) {
	r, c := s.push(text)
	r2, c2, calls := s.finish()
	return r + r2, c + c2, calls
}

// heldTail is the length of the longest tail of s that begins one of
// markers (text that may yet become a marker and must be held back).
func heldTail(s string, markers ...string) int {
	keep := 0
	for _, m := range markers {
		for k := min(len(s), len(m)-1); k > keep; k-- {
			if strings.HasSuffix(s, m[:k]) {
				keep = k
				break
			}
		}
	}
	return keep
}

const (
	thinkOpen  = "<think>"
	thinkClose = "</think>"
)

type thinkState uint8

const (
	thinkStart thinkState = iota // nothing decided: the text may open a block
	thinkIn                      // inside the block
	thinkAfter                   // after the block: the answer, whose leading newlines are dropped
	thinkOut                     // content to the end
)

// thinkSplit splits <think>…</think> from the answer.
type thinkSplit struct {
	state   thinkState
	pending string
}

func (t *thinkSplit) push(text string) (reasoning, content string) {
	t.pending += text
	for {
		switch t.state {
		case thinkStart:
			p := strings.TrimLeft(t.pending, " \t\r\n")
			if strings.HasPrefix(p, thinkOpen) {
				t.state, t.pending = thinkIn, p[len(thinkOpen):]
				continue
			}
			if strings.HasPrefix(thinkOpen, p) {
				return reasoning, content // (whitespace, or a start of <think>)
			}
			t.state = thinkOut
		case thinkIn:
			if i := strings.Index(t.pending, thinkClose); i >= 0 {
				reasoning += t.pending[:i]
				t.state, t.pending = thinkAfter, t.pending[i+len(thinkClose):]
				continue
			}
			k := heldTail(t.pending, thinkClose)
			reasoning += t.pending[:len(t.pending)-k]
			t.pending = t.pending[len(t.pending)-k:]
			return reasoning, content
		case thinkAfter:
			t.pending = strings.TrimLeft(t.pending, "\r\n")
			if t.pending == "" {
				return reasoning, content
			}
			t.state = thinkOut
		case thinkOut:
			content += t.pending
			t.pending = ""
			return reasoning, content
		}
	}
}

func (t *thinkSplit) finish() (reasoning, content string, calls []toolCallJS) {
	switch t.state {
	case thinkIn: // never closed (max_tokens): all reasoning
		reasoning = t.pending
	case thinkAfter:
	default:
		content = t.pending
	}
	t.pending = ""
	return reasoning, content, nil
}

// Harmony's markers.
const (
	hStart   = "<|start|>"
	hChannel = "<|channel|>"
	hMessage = "<|message|>"
	hEnd     = "<|end|>"
	hCall    = "<|call|>"
	hReturn  = "<|return|>"
	// maxHeader is the most bytes a header may take before the text is
	// taken to be no harmony message at all (and streamed as content).
	maxHeader = 512
)

type harmonyDest uint8

const (
	hHeader    harmonyDest = iota // reading a header, up to <|message|>
	hReasoning                    // the analysis channel
	hContent                      // the final channel, or commentary to no one
	hTool                         // a message to a function: its arguments
	hRaw                          // not harmony: content to the end
)

// harmonySplit reads gpt-oss's messages.
type harmonySplit struct {
	calls   bool
	dest    harmonyDest
	pending string
	name    string          // hTool: the function
	args    strings.Builder // hTool: its arguments so far
	out     []toolCallJS
}

func (h *harmonySplit) push(text string) (reasoning, content string) {
	h.pending += text
	for {
		switch h.dest {
		case hRaw:
			content += h.pending
			h.pending = ""
			return reasoning, content
		case hHeader:
			i := strings.Index(h.pending, hMessage)
			hdr := h.pending // the header so far, a tail that may begin <|message|> left out
			if i >= 0 {
				hdr = h.pending[:i]
			} else {
				hdr = hdr[:len(hdr)-heldTail(hdr, hMessage)]
			}
			if len(hdr) > maxHeader || !harmonyHeader(hdr) {
				h.dest = hRaw
				continue
			}
			if i < 0 {
				return reasoning, content
			}
			h.dest, h.name = headerDest(hdr, h.calls)
			h.pending = h.pending[i+len(hMessage):]
		default: // a body, up to the marker that ends it
			end, n := -1, 0
			for _, m := range []string{hEnd, hStart, hChannel, hCall, hReturn} {
				if j := strings.Index(h.pending, m); j >= 0 && (end < 0 || j < end) {
					end, n = j, len(m)
				}
			}
			body := h.pending
			if end >= 0 {
				body = h.pending[:end]
			} else {
				body = h.pending[:len(h.pending)-heldTail(h.pending, hEnd, hStart, hChannel, hCall, hReturn)]
			}
			switch h.dest {
			case hReasoning:
				reasoning += body
			case hContent:
				content += body
			case hTool:
				h.args.WriteString(body)
			}
			h.pending = h.pending[len(body):]
			if end < 0 {
				return reasoning, content
			}
			if h.dest == hTool {
				h.endCall()
			}
			if m := h.pending[:n]; m == hStart || m == hChannel {
				n = 0 // the next header starts with it
			}
			h.pending, h.dest = h.pending[n:], hHeader
		}
	}
}

// endCall ends the function message being read.
func (h *harmonySplit) endCall() {
	args := strings.TrimSpace(h.args.String())
	h.args.Reset()
	if args == "" {
		args = "{}"
	}
	c, ok := newCall(h.name, []byte(args))
	if !ok { // not a JSON object: passed on as written, for the client to judge
		c.ID, c.Type = newCallID(), "function"
		c.Function.Name, c.Function.Arguments = h.name, args
	}
	h.out = append(h.out, c)
}

// choiceOut turns one streamed choice's text into what its chunks carry:
// reasoning (a splitter), content, and tool calls (read from the content
// by a toolStream, or from harmony's messages by the splitter).
type choiceOut struct {
	sp splitter    // nil: no reasoning format
	ts *toolStream // nil: no calls read from the content
}

func (o *choiceOut) push(text string) (reasoning, content string) {
	content = text
	if o.sp != nil {
		reasoning, content = o.sp.push(text)
	}
	if o.ts != nil {
		content = o.ts.push(content)
	}
	return reasoning, content
}

func (o *choiceOut) finish() (reasoning, content string, calls []toolCallJS) {
	if o.sp != nil {
		reasoning, content, calls = o.sp.finish()
	}
	if o.ts != nil {
		content = o.ts.push(content)
		var rest string
		rest, calls = o.ts.finish()
		content += rest
	}
	return reasoning, content, calls
}

func (h *harmonySplit) finish() (reasoning, content string, calls []toolCallJS) {
	switch h.dest {
	case hReasoning:
		reasoning = h.pending
	case hContent, hRaw:
		content = h.pending
	case hTool:
		h.args.WriteString(h.pending)
		h.endCall()
	case hHeader:
		if !harmonyHeader(h.pending) {
			content = h.pending
		}
	}
	h.pending = ""
	return reasoning, content, h.out
}

// harmonyHeader reports whether s can be (the start of) a message header.
func harmonyHeader(s string) bool {
	if s == "" {
		return true
	}
	for _, p := range []string{hChannel, hStart} {
		if strings.HasPrefix(s, p) || strings.HasPrefix(p, s) {
			return true
		}
	}
	return false
}

// headerDest reads a header (the text before <|message|>): its channel and
// recipient ("to=functions.NAME", in the role part or after the channel).
func headerDest(hdr string, calls bool) (harmonyDest, string) {
	channel := ""
	if i := strings.Index(hdr, hChannel); i >= 0 {
		channel = hdr[i+len(hChannel):]
		if j := strings.IndexAny(channel, " <"); j >= 0 {
			channel = channel[:j]
		}
	}
	to := ""
	if i := strings.Index(hdr, "to="); i >= 0 {
		to = hdr[i+3:]
		if j := strings.IndexAny(to, " <"); j >= 0 {
			to = to[:j]
		}
	}
	if name, ok := strings.CutPrefix(to, "functions."); ok && name != "" && calls {
		return hTool, name
	}
	if channel == "analysis" {
		return hReasoning, ""
	}
	return hContent, ""
}
