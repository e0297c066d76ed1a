package httpapi

import (
	"context"
	"fmt"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/mkserve/mkserve/engine"
)

// completions serves POST /v1/completions: each prompt is one engine
// request with n choices; choice i*n+j is prompt i's choice j.
func (s *Server) completions(c *gin.Context) {
	k := s.newCall(c, "completions", "cmpl-")
	defer k.done()
	req, ok := begin[completionRequest](s, c, k)
	if !ok {
		return
	}
	vocab := s.tok.VocabSize()
	sp, e := req.params(vocab, s.opts.Defaults.Base())
	if e != nil {
		k.fail(c, e)
		return
	}
	s.layout(&sp)
	k.n = sp.N
	if req.Logprobs != nil {
		sp.Logprobs, sp.TopLogprobs = true, *req.Logprobs
		// echo with logprobs: the prompt's tokens too (the first one's null).
		sp.PromptLogprobs = req.Echo != nil && *req.Echo
	}
	prompts, e := parsePrompt(req.Prompt, vocab)
	if e != nil {
		k.fail(c, e)
		return
	}
	if req.Suffix != nil && *req.Suffix != "" {
		if s.fim == nil {
			k.fail(c, invalid("suffix", "suffix (fill-in-the-middle) needs a tokenizer with FIM tokens (<|fim_prefix|> …, <｜fim▁begin｜> …, <fim_prefix> …); this model's has none"))
			return
		}
		for i := range prompts {
			if !prompts[i].isText {
				k.fail(c, invalid("suffix", "suffix needs text prompts; prompt %d is token ids", i))
				return
			}
			prompts[i].text = s.fim.render(prompts[i].text, *req.Suffix)
		}
	}
	maxTok, maxParam := req.maxTokens()
	reqs := make([]*engine.Request, len(prompts))
	lens := make([]int, len(prompts))
	var echo []string // echo=true: each prompt's text, put before its choices' text
	if req.Echo != nil && *req.Echo {
		echo = make([]string, len(prompts))
	}
	for i, p := range prompts {
		ids := p.ids
		if p.isText {
			var err error
			if ids, err = s.tok.Encode(p.text, true); err != nil {
				k.fail(c, invalid("prompt", "prompt %d cannot be tokenized: %v", i, err))
				return
			}
			if len(ids) == 0 {
				k.fail(c, invalid("prompt", "prompt %d is empty", i))
				return
			}
		}
		if echo != nil {
			echo[i] = p.text
			if !p.isText {
				var err error
				if echo[i], err = s.tok.Decode(ids, false); err != nil {
					k.fail(c, invalid("prompt", "prompt %d cannot be decoded for echo: %v", i, err))
					return
				}
			}
		}
		if s.opts.LogPrompts {
			if p.isText {
				k.prompts = append(k.prompts, p.text)
			} else {
				k.prompts = append(k.prompts, fmt.Sprint(ids))
			}
		}
		psp := sp
		if psp.MaxTokens, e = s.fitContext(len(ids), maxTok, defaultCompMax, "prompt", maxParam); e != nil {
			k.fail(c, e)
			return
		}
		if e := checkMinTokens(&psp); e != nil {
			k.fail(c, e)
			return
		}
		reqs[i] = &engine.Request{ID: engineRequestID(k.id, i, len(prompts)), Prompt: ids, Sampling: psp, Arrival: k.start}
		if req.Priority != nil {
			reqs[i].Priority = *req.Priority
		}
		lens[i] = len(ids)
	}
	tooLongParam := "max_tokens"
	if maxParam != "" {
		tooLongParam = maxParam
	}

	ctx, cancel := context.WithCancel(c.Request.Context())
	defer cancel()
	chans, err := s.submit(ctx, cancel, reqs)
	if err != nil {
		ae := generateError(err, tooLongParam)
		if ae == errInternal {
			k.cause = err
		}
		k.fail(c, ae)
		return
	}
	created := k.start.Unix()
	model := s.gen.ModelName()
	choices := len(prompts) * sp.N
	offsets := make([]int, choices) // text_offset of each choice's next token

	if req.streaming() {
		out := startSSE(c)
		cu := req.newChunkUsage(lens)
		echoed := make([]bool, choices)
		usage, err := k.run(ctx, cancel, chans, sp.N, lens, func(i int, ev *engine.Event) error {
			cu.add(ev)
			text := ev.Text
			if echo != nil && !echoed[i] { // the prompt first, with the choice's first text
				echoed[i] = true
				text = echo[i/sp.N] + text
			}
			if text == "" && len(ev.Logprobs) == 0 && ev.FinishReason == "" {
				return nil
			}
			ch := completionChoice{Index: i, Text: text}
			if sp.Logprobs && (len(ev.Logprobs) > 0 || ev.PromptLogprobs != nil) {
				ch.Logprobs = &completionLogprobs{}
				if ev.PromptLogprobs != nil {
					offsets[i] = s.addPrompt(ch.Logprobs, reqs[i/sp.N].Prompt, ev.PromptLogprobs, offsets[i])
				}
				offsets[i] = ch.Logprobs.add(ev.Logprobs, offsets[i])
			}
			if ev.FinishReason != "" {
				ch.FinishReason = &ev.FinishReason
			}
			return out.send(completionChunk{ID: k.id, Object: "text_completion", Created: created, Model: model,
				Choices: []completionChoice{ch}, Usage: cu.field()})
		})
		k.endStream(c, out, err, func() any {
			u := toUsage(usage)
			return completionChunk{ID: k.id, Object: "text_completion", Created: created, Model: model,
				Choices: []completionChoice{}, Usage: &u}
		}, req.includeUsage())
		return
	}

	texts := make([]strings.Builder, choices)
	var lps []*completionLogprobs
	if sp.Logprobs {
		lps = make([]*completionLogprobs, choices)
		for i := range lps {
			lps[i] = &completionLogprobs{Tokens: []string{}, TokenLogprobs: []*float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
		}
	}
	usage, err := k.run(ctx, cancel, chans, sp.N, lens, func(i int, ev *engine.Event) error {
		texts[i].WriteString(ev.Text)
		if lps != nil {
			if ev.PromptLogprobs != nil {
				offsets[i] = s.addPrompt(lps[i], reqs[i/sp.N].Prompt, ev.PromptLogprobs, offsets[i])
			}
			offsets[i] = lps[i].add(ev.Logprobs, offsets[i])
		}
		return nil
	})
	if err != nil {
		k.finishGeneration(c, err)
		return
	}
	resp := completionResponse{ID: k.id, Object: "text_completion", Created: created, Model: model,
		Choices: make([]completionChoice, choices), Usage: toUsage(usage)}
	for i := range resp.Choices {
		text := texts[i].String()
		if echo != nil {
			text = echo[i/sp.N] + text
		}
		resp.Choices[i] = completionChoice{Index: i, Text: text, FinishReason: &k.finishes[i]}
		if lps != nil {
			resp.Choices[i].Logprobs = lps[i]
		}
	}
	writeJSON(c, 200, resp)
}

// endStream finishes a stream: an error event if run failed (unless the
// client left), the usage chunk when asked for, then [DONE].
func (k *call) endStream(c *gin.Context, out *sse, err error, usageChunk func() any, includeUsage bool) {
	if err != nil {
		k.finishGeneration(c, err)
		if k.status == statusClientClosed {
			return
		}
		_ = out.send(runError(err).body())
		_ = out.done()
		return
	}
	if includeUsage {
		if werr := out.send(usageChunk()); werr != nil {
			k.finishGeneration(c, werr)
			return
		}
	}
	if werr := out.done(); werr != nil {
		k.finishGeneration(c, werr)
	}
}

// addPrompt appends an echoed prompt's tokens to l: the first without a
// log-probability, the others with theirs (engine.Event.PromptLogprobs).
func (s *Server) addPrompt(l *completionLogprobs, prompt []int32, lps []engine.Logprob, offset int) int {
	first, _ := s.tok.Decode(prompt[:1], false)
	offset = l.addFirst(first, offset)
	return l.add(lps, offset)
}
