// Package tokenizer encodes and decodes text exactly like Hugging Face
// `tokenizers` for BPE tokenizer.json files (GPT-2, Llama-2/Mixtral byte
// fallback, Llama-3, Qwen2/Qwen3, DeepSeek and similar families).
//
// It wraps github.com/sugarme/tokenizer: every pipeline stage (normalizer,
// pre-tokenizer, model, post-processor, decoder) implements sugarme's
// interfaces and is assembled into a sugarme Tokenizer, which holds them and
// runs post-processing and decoding; running the stages over sugarme's
// PreTokenizedString gives the same ids, but Encode calls the stages
// directly because that is about three times faster. The stages are
// implemented here because sugarme v0.3.0 differs from HF where it matters:
// its JSON loader panics on the Llama-3/Qwen2 Split regexes (lookahead,
// (?i:...)), its BPE breaks merge ties arbitrarily and has no byte fallback
// or ignore_merges, and its added-vocabulary renumbers added tokens and
// mis-orders overlapping matches. Added tokens are matched here with HF's
// rules (leftmost-longest, lstrip/rstrip/single_word/normalized).
//
// Non-RE2 regexes run on github.com/dlclark/regexp2, except the GPT-2,
// Llama-3 and Qwen2 pre-tokenizer patterns, which have exact hand-written
// matchers. Offsets are not tracked.
package tokenizer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"unicode/utf8"

	sugar "github.com/sugarme/tokenizer"
	sugarnorm "github.com/sugarme/tokenizer/normalizer"
)

// Tokenizer encodes text to token ids and decodes ids to text. It is safe
// for concurrent use.
type Tokenizer struct {
	path  string
	st    *sugar.Tokenizer // the assembled sugarme pipeline (our stages)
	model *bpeModel
	norm  textNormalizer // nil if none
	pre   preTokenizer   // nil if none
	post  postProcessor  // nil if none
	dec   decoder        // nil if none
	added addedVocab
	cfg   *Config

	vocabSize    int
	byteFallback bool // the decoder has a ByteFallback stage
	warnings     []string

	bytesOnce sync.Once
	tokBytes  [][]byte // TokenBytes' table
}

// Load reads a Hugging Face tokenizer.json.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parseTokenizerJSON(path, data)
	if err != nil {
		return nil, err
	}
	t.cfg = &Config{ChatTemplates: map[string]string{}}
	return t, nil
}

// LoadDir reads dir/tokenizer.json and, if present, dir/tokenizer_config.json
// (special tokens, chat templates); without a chat template there, it reads
// dir/chat_template.jinja or dir/chat_template.json as newer repositories
// ship them.
func LoadDir(dir string) (*Tokenizer, error) {
	t, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(cfgPath)
	switch {
	case err == nil:
		if t.cfg, err = parseConfig(cfgPath, data); err != nil {
			return nil, err
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if t.cfg.ChatTemplate == "" {
		if err := t.cfg.readTemplateFiles(dir); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// addTokens registers the added tokens of tokenizer.json in file order with
// the ids HF tokenizers 0.23 gives them when it loads a file: a token the
// model vocabulary already has keeps the model id; every other token gets
// the next id after the model vocabulary (model size + number of such
// tokens before it). For files written by HF this equals the id stored in
// the file; where it does not, HF's id is used and a warning is recorded.
func (t *Tokenizer) addTokens(where string, list []addedJSON) error {
	t.added = addedVocab{byContent: map[string]int32{}, byID: map[int32]*addedToken{}}
	fresh := int32(0)
	var specials, others []*addedToken
	for i, a := range list {
		if a.Content == "" {
			continue // HF ignores empty added tokens
		}
		normalized := !a.Special
		if a.Normalized != nil {
			normalized = *a.Normalized
		}
		tok := &addedToken{content: a.Content, special: a.Special, lstrip: a.LStrip, rstrip: a.RStrip,
			singleWord: a.SingleWord, normalized: normalized}
		if id, ok := t.added.byContent[a.Content]; ok {
			tok.id = id // a repeated token updates the flags of the first
			*t.added.byID[id] = *tok
			continue
		}
		if id, ok := t.model.vocab[a.Content]; ok {
			tok.id = id
		} else {
			n := int64(t.model.GetVocabSize()) + int64(fresh)
			if n >= maxTokenID {
				return fmt.Errorf("tokenizer: %s: added_tokens[%d]: id out of range", where, i)
			}
			tok.id = int32(n)
			fresh++
		}
		if a.ID != nil && *a.ID != int64(tok.id) {
			t.warnings = append(t.warnings, fmt.Sprintf("%s: added token %q has id %d in the file; HF tokenizers uses %d", where, a.Content, *a.ID, tok.id))
		}
		t.added.byContent[a.Content] = tok.id
		t.added.byID[tok.id] = tok
		if tok.special {
			specials = append(specials, tok)
		} else {
			others = append(others, tok)
		}
	}
	t.added.order = append(specials, others...)
	t.added.raw, t.added.norm = newMatchTrie(), newMatchTrie()
	for _, tok := range t.added.order {
		if !tok.normalized {
			t.added.raw.insert(tok.content, tok)
			continue
		}
		content := tok.content
		if t.norm != nil {
			var err error
			if content, err = t.norm.normalize(content); err != nil {
				return fmt.Errorf("tokenizer: %s: added token %q: %w", where, tok.content, err)
			}
		}
		if content != "" {
			t.added.norm.insert(content, tok)
		}
	}
	return nil
}

// assemble builds the sugarme Tokenizer that holds the pipeline stages and
// computes the id range.
func (t *Tokenizer) assemble() {
	t.st = sugar.NewTokenizer(t.model)
	if t.norm != nil {
		t.st.WithNormalizer(normalizerAdapter{t.norm})
	}
	if t.pre != nil {
		t.st.WithPreTokenizer(preTokenizerAdapter{t.pre})
	}
	if t.post != nil {
		t.st.WithPostProcessor(postAdapter{t.post})
	}
	if t.dec != nil {
		t.st.WithDecoder(decoderAdapter{t.dec})
	}
	t.byteFallback = hasByteFallback(t.dec)
	t.vocabSize = len(t.model.vocabR)
	for id := range t.added.byID {
		if int(id) >= t.vocabSize {
			t.vocabSize = int(id) + 1
		}
	}
}

// Warnings lists differences found while loading that HF tokenizers also
// only warns about (added-token ids that differ from the file).
func (t *Tokenizer) Warnings() []string { return append([]string(nil), t.warnings...) }

// VocabSize is one more than the largest token id (model or added), i.e.
// the number of rows an embedding needs. With no gaps in the ids it equals
// HF's get_vocab_size(with_added_tokens=True).
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenID returns the id of a token string (added tokens first, then the
// model vocabulary).
func (t *Tokenizer) TokenID(tok string) (int32, bool) {
	if id, ok := t.added.byContent[tok]; ok {
		return id, true
	}
	id, ok := t.model.vocab[tok]
	return id, ok
}

// IDToken returns the token string of id and whether it is a special token.
func (t *Tokenizer) IDToken(id int32) (tok string, special bool, ok bool) {
	if a, ok := t.added.byID[id]; ok {
		return a.content, a.special, true
	}
	s, ok := t.model.idToToken(id)
	if !ok {
		return "", false, false
	}
	if aid, found := t.added.byContent[s]; found {
		return s, t.added.byID[aid].special, true
	}
	return s, false, true
}

// SpecialIDs returns the ids of all special added tokens in increasing
// order.
func (t *Tokenizer) SpecialIDs() []int32 {
	var out []int32
	for id, a := range t.added.byID {
		if a.special {
			out = append(out, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Config returns the settings of tokenizer_config.json (empty after Load).
func (t *Tokenizer) Config() *Config { return t.cfg }

// Encode tokenizes text. With addSpecial the post-processor's special
// tokens (a BOS token, say) are added, as HF's add_special_tokens=True.
// Special tokens written in the text are always recognized. Invalid UTF-8
// is replaced by U+FFFD first.
func (t *Tokenizer) Encode(text string, addSpecial bool) ([]int32, error) {
	if !utf8.ValidString(text) {
		text = lossyUTF8([]byte(text))
	}
	ids, err := t.encode(text)
	if err != nil {
		return nil, err
	}
	if !addSpecial || t.post == nil {
		return ids, nil
	}
	enc := sugar.DefaultEncoding()
	enc.Ids = make([]int, len(ids))
	for i, id := range ids {
		enc.Ids[i] = int(id)
	}
	return toInt32s(t.st.PostProcess(enc, nil, true).Ids), nil
}

func (t *Tokenizer) encode(text string) ([]int32, error) {
	return t.encodeWith(text, t.encodePiece)
}

func (t *Tokenizer) encodeWith(text string, encodePiece func([]int32, piece) ([]int32, error)) ([]int32, error) {
	var out []int32
	for _, seg := range t.added.raw.find(text) {
		if seg.id >= 0 {
			out = append(out, seg.id)
			continue
		}
		s := text[seg.start:seg.end]
		if n := t.st.GetNormalizer(); n != nil {
			ns, err := n.Normalize(sugarnorm.NewNormalizedString(s, s, nil, nil, seg.start))
			if err != nil {
				return nil, fmt.Errorf("tokenizer: normalize: %w", err)
			}
			s = ns.GetNormalized()
		}
		for _, sub := range t.added.norm.find(s) {
			if sub.id >= 0 {
				out = append(out, sub.id)
				continue
			}
			var err error
			out, err = encodePiece(out, piece{text: s[sub.start:sub.end], off: seg.start + sub.start})
			if err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// encodePiece pre-tokenizes one span of normalized text and runs the model
// on every word. It calls the stages directly; encodePieceSugarme does the
// same through sugarme's PreTokenizedString and interfaces (identical ids,
// checked by TestSugarmePipelineMatches, but about three times slower
// because of its per-split allocations).
func (t *Tokenizer) encodePiece(out []int32, p piece) ([]int32, error) {
	words := []piece{p}
	if t.pre != nil {
		var err error
		if words, err = t.pre.split(p); err != nil {
			return nil, fmt.Errorf("tokenizer: pre-tokenize: %w", err)
		}
	}
	for _, w := range words {
		ids, err := t.model.tokenize(w.text)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: model: %w", err)
		}
		out = append(out, ids...)
	}
	return out, nil
}

// encodePieceSugarme is encodePiece run through the assembled sugarme
// pipeline: a sugarme PreTokenizedString split by the pre-tokenizer adapter
// and tokenized by the model through sugarme's Model interface.
func (t *Tokenizer) encodePieceSugarme(out []int32, p piece) ([]int32, error) {
	pts := sugar.NewPreTokenizedStringFromNS(sugarnorm.NewNormalizedString(p.text, p.text, nil, nil, p.off))
	if pre := t.st.GetPreTokenizer(); pre != nil {
		var err error
		if pts, err = pre.PreTokenize(pts); err != nil {
			return nil, fmt.Errorf("tokenizer: pre-tokenize: %w", err)
		}
	}
	model := t.st.GetModel()
	pts, err := pts.Tokenize(func(ns *sugarnorm.NormalizedString) ([]sugar.Token, error) {
		return model.Tokenize(ns.GetNormalized())
	})
	if err != nil {
		return nil, fmt.Errorf("tokenizer: model: %w", err)
	}
	for _, split := range pts.GetSplits(sugarnorm.NormalizedTarget, sugar.Byte) {
		for _, tk := range split.Tokens {
			out = append(out, int32(tk.Id))
		}
	}
	return out, nil
}

// tokens maps ids to token strings for decoding, dropping special tokens
// when skipSpecial is set.
func (t *Tokenizer) tokens(ids []int32, skipSpecial bool) ([]string, error) {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		s, special, ok := t.IDToken(id)
		if !ok {
			return nil, fmt.Errorf("tokenizer: decode: id %d is not in the vocabulary (ids go up to %d) of %s", id, t.vocabSize-1, t.path)
		}
		if skipSpecial && special {
			continue
		}
		toks = append(toks, s)
	}
	return toks, nil
}

// decodeTokens runs the decoder over token strings.
func (t *Tokenizer) decodeTokens(toks []string) string {
	d := t.st.GetDecoder()
	if d == nil {
		return strings.Join(toks, " ")
	}
	return d.Decode(toks)
}

// Decode turns ids back into text, as HF's decode(ids,
// skip_special_tokens=skipSpecial). An id with no token is an error.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) (string, error) {
	toks, err := t.tokens(ids, skipSpecial)
	if err != nil {
		return "", err
	}
	return t.decodeTokens(toks), nil
}

func hasByteFallback(d decoder) bool {
	switch d := d.(type) {
	case byteFallbackDec:
		return true
	case seqDec:
		for _, x := range d {
			if hasByteFallback(x) {
				return true
			}
		}
	}
	return false
}
