package httpapi

import (
	"net/http"

	"github.com/gin-gonic/gin"
)

// POST /tokenize and POST /detokenize, as vLLM serves them: a client counts
// or inspects tokens with the server's own tokenizer and chat template.

type tokenizeRequest struct {
	Model            string        `json:"model"`
	Prompt           *string       `json:"prompt"`
	Messages         []chatMessage `json:"messages"` // instead of prompt: rendered by the chat template
	AddSpecialTokens *bool         `json:"add_special_tokens"`
	// AddGenerationPrompt (messages): default true, as chat completions.
	AddGenerationPrompt *bool          `json:"add_generation_prompt"`
	ChatTemplateKwargs  map[string]any `json:"chat_template_kwargs"`
	ReturnTokenStrs     bool           `json:"return_token_strs"`
}

type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int32  `json:"tokens"`
	TokenStrs   []string `json:"token_strs,omitempty"`
}

type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int64 `json:"tokens"`
}

type detokenizeResponse struct {
	Prompt string `json:"prompt"`
}

// tokenize serves POST /tokenize: a prompt (special tokens added unless
// add_special_tokens is false) or chat messages (rendered by the template,
// encoded as chat completions encodes them) to token ids.
func (s *Server) tokenize(c *gin.Context) {
	var req tokenizeRequest
	if !s.readRequest(c, &req, &req.Model) {
		return
	}
	var ids []int32
	var err error
	switch {
	case (req.Prompt == nil) == (req.Messages == nil):
		writeError(c, invalid("prompt", "give exactly one of prompt and messages"))
		return
	case req.Prompt != nil:
		ids, err = s.tok.Encode(*req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	default:
		cr := &chatRequest{Messages: req.Messages, AddGenerationPrompt: req.AddGenerationPrompt, ChatTemplateKwargs: req.ChatTemplateKwargs}
		if e := cr.check(); e != nil {
			writeError(c, e)
			return
		}
		text, e := s.render(cr, nil)
		if e != nil {
			writeError(c, e)
			return
		}
		ids, err = s.tok.Encode(text, req.AddSpecialTokens != nil && *req.AddSpecialTokens)
	}
	if err != nil {
		writeError(c, invalid("prompt", "cannot be tokenized: %v", err))
		return
	}
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: s.gen.MaxContext(), Tokens: ids}
	if resp.Tokens == nil {
		resp.Tokens = []int32{}
	}
	if req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i, id := range ids {
			resp.TokenStrs[i], _, _ = s.tok.IDToken(id)
		}
	}
	writeJSON(c, http.StatusOK, resp)
}

// detokenize serves POST /detokenize: token ids to text (special tokens
// kept, as vLLM does).
func (s *Server) detokenize(c *gin.Context) {
	var req detokenizeRequest
	if !s.readRequest(c, &req, &req.Model) {
		return
	}
	if req.Tokens == nil {
		writeError(c, invalid("tokens", "tokens is required"))
		return
	}
	ids := make([]int32, len(req.Tokens))
	vocab := s.tok.VocabSize()
	for i, t := range req.Tokens {
		if t < 0 || t >= int64(vocab) {
			writeError(c, invalid("tokens", "tokens[%d] = %d is not a token id in [0, %d)", i, t, vocab))
			return
		}
		ids[i] = int32(t)
	}
	text, err := s.tok.Decode(ids, false)
	if err != nil {
		writeError(c, invalid("tokens", "cannot be decoded: %v", err))
		return
	}
	writeJSON(c, http.StatusOK, detokenizeResponse{Prompt: text})
}

// readRequest reads and decodes the body into req and checks the model it
// names (*model, once decoded); on failure it has written the error.
func (s *Server) readRequest(c *gin.Context, req any, model *string) bool {
	body, e := s.readBody(c)
	if e == nil {
		e = decodeBody(body, req)
	}
	if e == nil {
		e = s.checkModel(*model)
	}
	if e != nil {
		writeError(c, e)
		return false
	}
	return true
}
