package tokenizer

import "strings"

// TokenBytes returns the bytes token id adds to decoded text when it
// follows other text (decoders drop a leading space only at the very start):
// raw bytes, so a byte-level token that holds part of a UTF-8 sequence
// gives just that part. Special tokens, ids outside the vocabulary and
// tokenizers whose decoder TokenBytes does not model (ok false from
// HasTokenBytes) give nil. Constrained sampling (package grammar) checks
// candidate tokens with these bytes. The table is built on first use.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	t.bytesOnce.Do(t.buildTokenBytes)
	if id < 0 || int(id) >= len(t.tokBytes) {
		return nil
	}
	return t.tokBytes[id]
}

// SpecialTokenBytes is TokenBytes, except that a special token gives its
// content (what Decode writes for it when special tokens are kept): for
// constrained output whose text holds special tokens (gpt-oss's harmony
// markers in a forced tool call).
func (t *Tokenizer) SpecialTokenBytes(id int32) []byte {
	if tok, special, ok := t.IDToken(id); ok && special {
		return []byte(tok)
	}
	return t.TokenBytes(id)
}

// HasTokenBytes reports whether TokenBytes knows this tokenizer's decoder
// (byte-level, byte fallback, metaspace, replace, strip and fuse stages
// and sequences of them; not a tokenizer without a decoder, whose Decode
// joins tokens with spaces).
func (t *Tokenizer) HasTokenBytes() bool {
	_, ok := midPiece(t.dec, "", false)
	return ok
}

func (t *Tokenizer) buildTokenBytes() {
	t.tokBytes = make([][]byte, t.vocabSize)
	for id := range t.tokBytes {
		tok, special, ok := t.IDToken(int32(id))
		if !ok || special {
			continue
		}
		if s, ok := midPiece(t.dec, tok, false); ok && s != "" {
			t.tokBytes[id] = []byte(s)
		}
	}
}

// midPiece runs one token string that follows other text through decoder
// d: the piece it contributes, as bytes held in a string. fused tells that
// an earlier stage joined the tokens, after which a strip stage acts on
// the ends of the whole text only. ok is false for a decoder not modelled.
func midPiece(d decoder, tok string, fused bool) (string, bool) {
	switch d := d.(type) {
	case byteLevelDec:
		return string(appendByteLevelDecoded(nil, tok)), true
	case byteFallbackDec:
		if b, ok := parseByteToken(tok); ok {
			return string([]byte{b}), true
		}
		return tok, true
	case fuseDec:
		return tok, true
	case replaceDec:
		s, err := d.r.normalize(tok)
		if err != nil {
			return tok, true
		}
		return s, true
	case metaspaceDec:
		return strings.ReplaceAll(tok, string(d.replacement), " "), true
	case stripDec:
		if fused {
			return tok, true
		}
		return stripDec.decodeChain(d, []string{tok})[0], true
	case seqDec:
		s := tok
		for _, x := range d {
			var ok bool
			if s, ok = midPiece(x, s, fused); !ok {
				return "", false
			}
			if _, f := x.(fuseDec); f {
				fused = true
			}
			if _, f := x.(byteLevelDec); f {
				fused = true // byte-level decoding joins the tokens too
			}
		}
		return s, true
	}
	return "", false
}
