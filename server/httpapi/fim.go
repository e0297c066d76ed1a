package httpapi

import "github.com/mkserve/mkserve/tokenizer"

// Fill-in-the-middle: /v1/completions with a suffix asks for the text
// between the prompt and the suffix. Code models learn it with three
// special tokens, in an order of their own; the server finds them in the
// tokenizer and writes the prompt as the model was trained (prefix, then
// suffix, then the middle to generate: PSM).

// fimFormat is a tokenizer's fill-in-the-middle tokens.
type fimFormat struct {
	prefix, suffix, middle string // the tokens written before the prefix, the suffix, and the middle
}

// fimFormats are the known token sets: Qwen2.5/Qwen3 coders, DeepSeek
// coders, StarCoder / CodeLlama style.
var fimFormats = []fimFormat{
	{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"},
	{"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"},
	{"<fim_prefix>", "<fim_suffix>", "<fim_middle>"},
}

// detectFIM is tok's fill-in-the-middle format (nil: it has none).
func detectFIM(tok *tokenizer.Tokenizer) *fimFormat {
	if tok == nil {
		return nil
	}
	for i := range fimFormats {
		f := &fimFormats[i]
		_, a := tok.TokenID(f.prefix)
		_, b := tok.TokenID(f.suffix)
		_, c := tok.TokenID(f.middle)
		if a && b && c {
			return f
		}
	}
	return nil
}

// render is the prompt that asks for the middle between prefix and suffix.
func (f *fimFormat) render(prefix, suffix string) string {
	return f.prefix + prefix + f.suffix + suffix + f.middle
}
