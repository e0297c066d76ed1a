package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// fileJSON is the top level of a Hugging Face tokenizer.json.
type fileJSON struct {
	Version       string          `json:"version"`
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type addedJSON struct {
	ID         *int64 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]int64  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

// typed is any component: the "type" field picks the kind.
type typed struct {
	Type string `json:"type"`
}

// patternJSON is a Split/Replace pattern: {"String": s} or {"Regex": r}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// isNull reports whether a raw JSON value is absent or null.
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

// parseTokenizerJSON builds a Tokenizer from the bytes of a tokenizer.json;
// where names the file in errors.
func parseTokenizerJSON(where string, data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: malformed JSON: %w", where, err)
	}
	if f.Version != "" && f.Version != "1.0" {
		return nil, fmt.Errorf("tokenizer: %s: version: unsupported tokenizer.json version %q", where, f.Version)
	}
	if isNull(f.Model) {
		return nil, fmt.Errorf("tokenizer: %s: model: missing", where)
	}
	model, err := buildModel(where, f.Model)
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{path: where, model: model}
	if !isNull(f.Normalizer) {
		if t.norm, err = buildNormalizer(where, "normalizer", f.Normalizer); err != nil {
			return nil, err
		}
	}
	if !isNull(f.PreTokenizer) {
		if t.pre, err = buildPreTokenizer(where, "pre_tokenizer", f.PreTokenizer); err != nil {
			return nil, err
		}
	}
	if !isNull(f.PostProcessor) {
		if t.post, err = buildPostProcessor(where, "post_processor", f.PostProcessor); err != nil {
			return nil, err
		}
	}
	if !isNull(f.Decoder) {
		if t.dec, err = buildDecoder(where, "decoder", f.Decoder); err != nil {
			return nil, err
		}
	}
	if err := t.addTokens(where, f.AddedTokens); err != nil {
		return nil, err
	}
	t.assemble()
	return t, nil
}

func buildModel(where string, raw json.RawMessage) (*bpeModel, error) {
	var m bpeJSON
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: model: %w", where, err)
	}
	if m.Type == "" && m.Merges != nil {
		m.Type = "BPE" // very old files have no type
	}
	if m.Type != "BPE" {
		return nil, fmt.Errorf("tokenizer: %s: model.type: unsupported model type %q (only BPE is supported)", where, m.Type)
	}
	if len(m.Vocab) == 0 {
		return nil, fmt.Errorf("tokenizer: %s: model.vocab: empty", where)
	}
	vocab := make(map[string]int32, len(m.Vocab))
	for tok, id := range m.Vocab {
		if id < 0 || id > math.MaxInt32-1 {
			return nil, fmt.Errorf("tokenizer: %s: model.vocab[%q]: id %d out of range", where, tok, id)
		}
		vocab[tok] = int32(id)
	}
	merges := make([][2]string, len(m.Merges))
	for i, r := range m.Merges {
		var s string
		if err := json.Unmarshal(r, &s); err == nil {
			parts := strings.Split(s, " ")
			if len(parts) != 2 {
				return nil, fmt.Errorf("tokenizer: %s: model.merges[%d]: %q is not two tokens separated by one space", where, i, s)
			}
			merges[i] = [2]string{parts[0], parts[1]}
			continue
		}
		var pair []string
		if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("tokenizer: %s: model.merges[%d]: want \"a b\" or [\"a\", \"b\"], got %s", where, i, r)
		}
		merges[i] = [2]string{pair[0], pair[1]}
	}
	deref := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	// dropout is ignored: HF samples merges randomly with it; inference
	// tokenizers ship without it.
	return newBPE(where, vocab, merges, deref(m.UnkToken), deref(m.ContinuingSubwordPrefix), deref(m.EndOfWordSuffix),
		m.FuseUnk, m.ByteFallback, m.IgnoreMerges)
}

func buildPattern(where, field string, raw json.RawMessage) (pattern, error) {
	var p patternJSON
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %s: %w", where, field, err)
	}
	switch {
	case p.String != nil:
		return stringPattern(*p.String), nil
	case p.Regex != nil:
		re, err := compileRegex(*p.Regex)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %s.Regex: %w", where, field, err)
		}
		return re, nil
	}
	return nil, fmt.Errorf("tokenizer: %s: %s: want {\"String\": ...} or {\"Regex\": ...}, got %s", where, field, raw)
}

func componentType(where, field string, raw json.RawMessage) (string, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", fmt.Errorf("tokenizer: %s: %s: %w", where, field, err)
	}
	if t.Type == "" {
		return "", fmt.Errorf("tokenizer: %s: %s.type: missing", where, field)
	}
	return t.Type, nil
}

func unmarshalField(where, field string, raw json.RawMessage, v any) error {
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("tokenizer: %s: %s: %w", where, field, err)
	}
	return nil
}

func buildNormalizer(where, field string, raw json.RawMessage) (textNormalizer, error) {
	typ, err := componentType(where, field, raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNorm{}, nil
	case "StripAccents":
		return stripAccentsNorm{}, nil
	case "ByteLevel":
		return byteLevelNorm{}, nil
	case "Prepend":
		var v struct {
			Prepend string `json:"prepend"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		return prependNorm{v.Prepend}, nil
	case "Strip":
		var v struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		return stripNorm{v.Left, v.Right}, nil
	case "Replace":
		var v struct {
			Pattern json.RawMessage `json:"pattern"`
			Content string          `json:"content"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		p, err := buildPattern(where, field+".pattern", v.Pattern)
		if err != nil {
			return nil, err
		}
		return replaceNorm{p, v.Content}, nil
	case "BertNormalizer":
		v := struct {
			CleanText    bool  `json:"clean_text"`
			Chinese      bool  `json:"handle_chinese_chars"`
			StripAccents *bool `json:"strip_accents"`
			Lowercase    bool  `json:"lowercase"`
		}{}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		strip := v.Lowercase // HF: strip_accents defaults to lowercase
		if v.StripAccents != nil {
			strip = *v.StripAccents
		}
		return bertNorm{v.CleanText, v.Chinese, strip, v.Lowercase}, nil
	case "Sequence":
		var v struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		var seq seqNorm
		for i, r := range v.Normalizers {
			n, err := buildNormalizer(where, fmt.Sprintf("%s.normalizers[%d]", field, i), r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, n)
		}
		return seq, nil
	}
	return nil, fmt.Errorf("tokenizer: %s: %s.type: unsupported normalizer %q", where, field, typ)
}

func buildPreTokenizer(where, field string, raw json.RawMessage) (preTokenizer, error) {
	typ, err := componentType(where, field, raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		v := struct {
			AddPrefixSpace bool  `json:"add_prefix_space"`
			UseRegex       *bool `json:"use_regex"`
		}{}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		b := byteLevelPre{addPrefixSpace: v.AddPrefixSpace}
		if v.UseRegex == nil || *v.UseRegex {
			re, err := compileRegex(gpt2Pattern)
			if err != nil {
				return nil, fmt.Errorf("tokenizer: %s: %s: %w", where, field, err)
			}
			b.re = re
		}
		return b, nil
	case "Split":
		var v struct {
			Pattern  json.RawMessage `json:"pattern"`
			Behavior string          `json:"behavior"`
			Invert   bool            `json:"invert"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		p, err := buildPattern(where, field+".pattern", v.Pattern)
		if err != nil {
			return nil, err
		}
		b, err := parseBehavior(v.Behavior)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: %s: %s.behavior: %w", where, field, err)
		}
		return splitPre{pat: p, behavior: b, invert: v.Invert}, nil
	case "Metaspace":
		v := struct {
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
			Split          *bool   `json:"split"`
		}{}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		m, err := metaspaceFrom(where, field, v.Replacement, v.PrependScheme, v.AddPrefixSpace)
		if err != nil {
			return nil, err
		}
		m.splitWords = v.Split == nil || *v.Split
		return m, nil
	case "Sequence":
		var v struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		var seq seqPre
		for i, r := range v.PreTokenizers {
			p, err := buildPreTokenizer(where, fmt.Sprintf("%s.pretokenizers[%d]", field, i), r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, p)
		}
		return seq, nil
	case "Digits":
		var v struct {
			Individual bool `json:"individual_digits"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		return digitsPre{v.Individual}, nil
	case "Whitespace":
		re, err := compileRegex(`\w+|[^\w\s]+`)
		if err != nil {
			return nil, err
		}
		return whitespacePre{re}, nil
	case "WhitespaceSplit":
		return whitespaceSplitPre{}, nil
	case "Punctuation":
		var v struct {
			Behavior string `json:"behavior"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		b := behaviorIsolated
		if v.Behavior != "" {
			if b, err = parseBehavior(v.Behavior); err != nil {
				return nil, fmt.Errorf("tokenizer: %s: %s.behavior: %w", where, field, err)
			}
		}
		return punctuationPre{b}, nil
	case "BertPreTokenizer":
		return bertPre{}, nil
	}
	return nil, fmt.Errorf("tokenizer: %s: %s.type: unsupported pre-tokenizer %q", where, field, typ)
}

func metaspaceFrom(where, field, replacement string, scheme *string, addPrefixSpace *bool) (metaspacePre, error) {
	if replacement == "" {
		replacement = "▁"
	}
	r, size := utf8.DecodeRuneInString(replacement)
	if size != len(replacement) || r == utf8.RuneError {
		return metaspacePre{}, fmt.Errorf("tokenizer: %s: %s.replacement: want one character, got %q", where, field, replacement)
	}
	m := metaspacePre{replacement: r, scheme: prependAlways}
	switch {
	case scheme != nil:
		s, err := parsePrependScheme(*scheme)
		if err != nil {
			return m, fmt.Errorf("tokenizer: %s: %s.prepend_scheme: %w", where, field, err)
		}
		m.scheme = s
	case addPrefixSpace != nil && !*addPrefixSpace:
		m.scheme = prependNever
	}
	return m, nil
}

func buildDecoder(where, field string, raw json.RawMessage) (decoder, error) {
	typ, err := componentType(where, field, raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		return byteLevelDec{}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "Strip":
		var v struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		r, size := utf8.DecodeRuneInString(v.Content)
		if size != len(v.Content) || size == 0 || v.Start < 0 || v.Stop < 0 {
			return nil, fmt.Errorf("tokenizer: %s: %s: want one content character and non-negative start/stop", where, field)
		}
		return stripDec{r, v.Start, v.Stop}, nil
	case "Replace":
		n, err := buildNormalizer(where, field, raw)
		if err != nil {
			return nil, err
		}
		return replaceDec{n.(replaceNorm)}, nil
	case "Metaspace":
		v := struct {
			Replacement    string  `json:"replacement"`
			PrependScheme  *string `json:"prepend_scheme"`
			AddPrefixSpace *bool   `json:"add_prefix_space"`
		}{}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		m, err := metaspaceFrom(where, field, v.Replacement, v.PrependScheme, v.AddPrefixSpace)
		if err != nil {
			return nil, err
		}
		return metaspaceDec{m.replacement, m.scheme}, nil
	case "WordPiece":
		v := struct {
			Prefix  *string `json:"prefix"`
			Cleanup *bool   `json:"cleanup"`
		}{}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		d := wordPieceDec{prefix: "##", cleanup: true}
		if v.Prefix != nil {
			d.prefix = *v.Prefix
		}
		if v.Cleanup != nil {
			d.cleanup = *v.Cleanup
		}
		return d, nil
	case "BPEDecoder":
		v := struct {
			Suffix *string `json:"suffix"`
		}{}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		d := bpeDec{suffix: "</w>"}
		if v.Suffix != nil {
			d.suffix = *v.Suffix
		}
		return d, nil
	case "Sequence":
		var v struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		var seq seqDec
		for i, r := range v.Decoders {
			d, err := buildDecoder(where, fmt.Sprintf("%s.decoders[%d]", field, i), r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, d)
		}
		return seq, nil
	}
	return nil, fmt.Errorf("tokenizer: %s: %s.type: unsupported decoder %q", where, field, typ)
}

func buildPostProcessor(where, field string, raw json.RawMessage) (postProcessor, error) {
	typ, err := componentType(where, field, raw)
	if err != nil {
		return nil, err
	}
	switch typ {
	case "ByteLevel":
		return identityProc{}, nil
	case "TemplateProcessing":
		var v struct {
			Single   []json.RawMessage `json:"single"`
			Pair     []json.RawMessage `json:"pair"`
			Specials map[string]struct {
				IDs []int64 `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		tp := templateProc{specials: map[string][]int32{}}
		for name, s := range v.Specials {
			for _, id := range s.IDs {
				if id < 0 || id > math.MaxInt32 {
					return nil, fmt.Errorf("tokenizer: %s: %s.special_tokens[%q]: id %d out of range", where, field, name, id)
				}
				tp.specials[name] = append(tp.specials[name], int32(id))
			}
		}
		parse := func(name string, items []json.RawMessage) ([]templatePiece, error) {
			var out []templatePiece
			for i, it := range items {
				var p struct {
					SpecialToken *struct {
						ID string `json:"id"`
					} `json:"SpecialToken"`
					Sequence *struct {
						ID string `json:"id"`
					} `json:"Sequence"`
				}
				if err := json.Unmarshal(it, &p); err != nil {
					return nil, fmt.Errorf("tokenizer: %s: %s.%s[%d]: %w", where, field, name, i, err)
				}
				switch {
				case p.SpecialToken != nil:
					if _, ok := tp.specials[p.SpecialToken.ID]; !ok {
						return nil, fmt.Errorf("tokenizer: %s: %s.%s[%d]: special token %q missing from special_tokens", where, field, name, i, p.SpecialToken.ID)
					}
					out = append(out, templatePiece{special: p.SpecialToken.ID})
				case p.Sequence != nil:
					out = append(out, templatePiece{isSeq: true, seqB: p.Sequence.ID == "B"})
				default:
					return nil, fmt.Errorf("tokenizer: %s: %s.%s[%d]: want SpecialToken or Sequence, got %s", where, field, name, i, it)
				}
			}
			return out, nil
		}
		if tp.single, err = parse("single", v.Single); err != nil {
			return nil, err
		}
		if tp.pair, err = parse("pair", v.Pair); err != nil {
			return nil, err
		}
		return tp, nil
	case "BertProcessing", "RobertaProcessing":
		var v struct {
			Sep []json.RawMessage `json:"sep"`
			Cls []json.RawMessage `json:"cls"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		id := func(name string, pair []json.RawMessage) (int32, error) {
			var n int64
			if len(pair) != 2 || json.Unmarshal(pair[1], &n) != nil || n < 0 || n > math.MaxInt32 {
				return 0, fmt.Errorf("tokenizer: %s: %s.%s: want [token, id]", where, field, name)
			}
			return int32(n), nil
		}
		sep, err := id("sep", v.Sep)
		if err != nil {
			return nil, err
		}
		cls, err := id("cls", v.Cls)
		if err != nil {
			return nil, err
		}
		return clsSepProc{cls: cls, sep: sep, doubleSep: typ == "RobertaProcessing"}, nil
	case "Sequence":
		var v struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := unmarshalField(where, field, raw, &v); err != nil {
			return nil, err
		}
		var seq seqProc
		for i, r := range v.Processors {
			p, err := buildPostProcessor(where, fmt.Sprintf("%s.processors[%d]", field, i), r)
			if err != nil {
				return nil, err
			}
			seq = append(seq, p)
		}
		return seq, nil
	}
	return nil, fmt.Errorf("tokenizer: %s: %s.type: unsupported post-processor %q", where, field, typ)
}
