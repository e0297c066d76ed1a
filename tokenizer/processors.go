package tokenizer

import (
	sugar "github.com/sugarme/tokenizer"
)

// postProcessor adds the special tokens a model expects around one or two
// sequences (HF's PostProcessor with add_special_tokens=true). Without
// special tokens the sequences are just concatenated. Implementations also
// satisfy sugarme's tokenizer.PostProcessor through postAdapter.
type postProcessor interface {
	process(a, b []int32, pair bool) []int32
	added(pair bool) int
}

// postAdapter exposes a postProcessor as sugarme's tokenizer.PostProcessor.
type postAdapter struct{ p postProcessor }

var _ sugar.PostProcessor = postAdapter{}

// AddedTokens implements sugarme's tokenizer.PostProcessor.
func (a postAdapter) AddedTokens(isPair bool) int { return a.p.added(isPair) }

// Process implements sugarme's tokenizer.PostProcessor. Only ids (and
// matching type ids) are produced; mkserve tracks no offsets.
func (a postAdapter) Process(enc, pair *sugar.Encoding, addSpecial bool) *sugar.Encoding {
	ia := toInt32s(enc.Ids)
	var ib []int32
	if pair != nil {
		ib = toInt32s(pair.Ids)
	}
	var ids []int32
	if addSpecial {
		ids = a.p.process(ia, ib, pair != nil)
	} else {
		ids = append(append(ids, ia...), ib...)
	}
	out := sugar.DefaultEncoding()
	out.Ids = make([]int, len(ids))
	out.TypeIds = make([]int, len(ids))
	for i, id := range ids {
		out.Ids[i] = int(id)
	}
	return out
}

func toInt32s(v []int) []int32 {
	out := make([]int32, len(v))
	for i, x := range v {
		out[i] = int32(x)
	}
	return out
}

// templatePiece is one element of a TemplateProcessing template: either a
// special token (by name) or sequence A/B.
type templatePiece struct {
	special string
	seqB    bool
	isSeq   bool
}

// templateProc is HF's TemplateProcessing.
type templateProc struct {
	single, pair []templatePiece
	specials     map[string][]int32
}

func (t templateProc) process(a, b []int32, pair bool) []int32 {
	tmpl := t.single
	if pair {
		tmpl = t.pair
	}
	var out []int32
	for _, p := range tmpl {
		switch {
		case p.isSeq && p.seqB:
			out = append(out, b...)
		case p.isSeq:
			out = append(out, a...)
		default:
			out = append(out, t.specials[p.special]...)
		}
	}
	return out
}

func (t templateProc) added(pair bool) int {
	tmpl := t.single
	if pair {
		tmpl = t.pair
	}
	n := 0
	for _, p := range tmpl {
		if !p.isSeq {
			n += len(t.specials[p.special])
		}
	}
	return n
}

// identityProc adds nothing (HF's ByteLevel post-processor only trims
// offsets).
type identityProc struct{}

func (identityProc) process(a, b []int32, pair bool) []int32 {
	return append(append([]int32{}, a...), b...)
}
func (identityProc) added(bool) int { return 0 }

// clsSepProc is BertProcessing ([CLS] A [SEP] B [SEP]) or, with
// doubleSep, RobertaProcessing (<s> A </s></s> B </s>).
type clsSepProc struct {
	cls, sep  int32
	doubleSep bool
}

func (c clsSepProc) process(a, b []int32, pair bool) []int32 {
	out := append([]int32{c.cls}, a...)
	out = append(out, c.sep)
	if pair {
		if c.doubleSep {
			out = append(out, c.sep)
		}
		out = append(out, b...)
		out = append(out, c.sep)
	}
	return out
}

func (c clsSepProc) added(pair bool) int {
	switch {
	case !pair:
		return 2
	case c.doubleSep:
		return 4
	}
	return 3
}

// seqProc applies processors in order (HF's Sequence processor): each sees
// the sequences the previous one produced; once one has joined a pair, the
// rest see a single sequence.
type seqProc []postProcessor

func (q seqProc) process(a, b []int32, pair bool) []int32 {
	for _, p := range q {
		if _, ok := p.(identityProc); ok {
			continue
		}
		a, b, pair = p.process(a, b, pair), nil, false
	}
	return identityProc{}.process(a, b, pair)
}

func (q seqProc) added(pair bool) int {
	n := 0
	for _, p := range q {
		if _, ok := p.(identityProc); ok {
			continue
		}
		n += p.added(pair)
		pair = false
	}
	return n
}
