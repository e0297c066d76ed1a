package kernels

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"

	"github.com/mkserve/mkserve/internal/logprob"
)

// Sampling on the device (sample.cu, mk_sample.h), with the semantics of
// the engine's host sampler (engine/sampler.go), and SampleHost, the same
// semantics on the host as the reference.

// Sizes of the sampling ABI (mk_sample.h).
const (
	SampleMetaWords   = 16 // int32 words of one row's header in the packed metadata
	SampleResultWords = 44 // int32 words of one row's result
	SampleMaxTop      = 20 // most alternatives (top log-probs) per row
	SampleMaxVocab    = 1 << 20
)

var (
	sampleF32        func(s, out, logits, meta uint64, metaWords int64, scratch uint64, rows, vocab int64) int32
	sampleGreedyF32  func(s, out, logits, work uint64, rows, vocab int64) int32
	sampleGreedyWork func(rows, vocab int64) int64
	sampleDrawF32    func(s, out, logits, meta uint64, metaWords int64, work uint64, rows, vocab, kmax int64, cuts int32) int32
	sampleDrawWork   func(rows, vocab, kmax int64) int64
	sampleDrawKMax   func(vocab int64) int32
)

func init() {
	registerSymbols(symbol{"mk_sample_f32", &sampleF32}, symbol{"mk_sample_greedy_f32", &sampleGreedyF32},
		symbol{"mk_sample_greedy_work", &sampleGreedyWork}, symbol{"mk_sample_draw_f32", &sampleDrawF32},
		symbol{"mk_sample_draw_work", &sampleDrawWork}, symbol{"mk_sample_draw_kmax", &sampleDrawKMax})
}

// SampleGreedyMaxRows is the most rows SampleGreedyF32 takes.
const SampleGreedyMaxRows = 65535

// GreedyOnly reports whether every row is greedy without penalties or top
// log-probs: what SampleGreedyF32 can answer.
func GreedyOnly(rows []SampleRow) bool {
	return splittable(rows, func(r *SampleRow) bool { return r.Temperature == 0 })
}

// splittable reports whether rows fit the split kernels (at most
// SampleGreedyMaxRows, no penalties or top log-probs) and each passes ok.
func splittable(rows []SampleRow, ok func(r *SampleRow) bool) bool {
	if len(rows) == 0 || len(rows) > SampleGreedyMaxRows {
		return false
	}
	for i := range rows {
		r := &rows[i]
		if r.TopLogprobs != 0 || r.penalised() || !ok(r) {
			return false
		}
	}
	return true
}

// DrawSplit reports whether SampleDrawF32 can answer rows of vocab logits:
// every row greedy, drawing over the whole vocabulary (no top-k, top-p or
// min-p), or with a top-k of at most SampleDrawKMax(vocab) (any top-p and
// min-p), and with allowCuts also rows with top-p or min-p but no top-k;
// none with penalties or top log-probs. kmax and cuts are SampleDrawF32's
// arguments: the largest top-k (SampleDrawKMax(vocab) when the call has
// such cut rows), and whether it has them.
func (d *Device) DrawSplit(rows []SampleRow, vocab int, allowCuts bool) (ok bool, kmax int, cuts bool) {
	lim := d.SampleDrawKMax(vocab)
	ok = splittable(rows, func(r *SampleRow) bool {
		switch {
		case r.Temperature == 0 || (r.TopK == 0 && r.TopP >= 1 && r.MinP == 0):
			return true
		case r.TopK > 0 && r.TopK <= lim:
			kmax = max(kmax, r.TopK)
			return true
		case r.TopK == 0 && allowCuts:
			cuts = true
			return true
		}
		return false
	})
	if cuts {
		kmax = lim
	}
	return ok, kmax, cuts
}

// SampleDrawKMax is the largest top-k SampleDrawF32 takes for vocab logits
// a row (the library's answer; no device call).
func (d *Device) SampleDrawKMax(vocab int) int { return int(sampleDrawKMax(int64(vocab))) }

// SampleDrawWork is the bytes of device memory SampleDrawF32 needs.
func (d *Device) SampleDrawWork(rows, vocab, kmax int) int64 {
	return sampleDrawWork(int64(rows), int64(vocab), int64(kmax))
}

// SampleDrawF32 is SampleF32 for rows that DrawSplit accepts (kmax and cuts
// its answers), each row's passes split over CTAs: out gets each row's
// token, log-probability and 0 alternatives; meta is PackSample's
// (metaWords words); work holds SampleDrawWork(rows, vocab, kmax) bytes.
func (d *Device) SampleDrawF32(s *Stream, out, logits, meta *Buffer, metaWords int, work *Buffer, rows, vocab, kmax int, cuts bool) error {
	const op = "SampleDrawF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "vocab", vocab, "metaWords", metaWords); err != nil {
		return err
	}
	if rows > SampleGreedyMaxRows || vocab > SampleMaxVocab || metaWords < rows*SampleMetaWords {
		return fmt.Errorf("kernels: %s: %d rows (at most %d) of vocab %d (at most %d), %d metadata words", op, rows,
			SampleGreedyMaxRows, vocab, SampleMaxVocab, metaWords)
	}
	if kmax < 0 || kmax > d.SampleDrawKMax(vocab) || (cuts && kmax == 0) {
		return fmt.Errorf("kernels: %s: top-k up to %d: at most %d for vocab %d (and at least 1 with cut rows: %v)", op, kmax,
			d.SampleDrawKMax(vocab), vocab, cuts)
	}
	if err := needAll(op, 4, "out", out, int64(rows)*SampleResultWords, "logits", logits, int64(rows)*int64(vocab),
		"meta", meta, int64(metaWords)); err != nil {
		return err
	}
	if err := need(op, "work", work, d.SampleDrawWork(rows, vocab, kmax), 1); err != nil {
		return err
	}
	return d.lib.check("mk_sample_draw_f32", sampleDrawF32(s.handle(), out.ptr, logits.ptr, meta.ptr, int64(metaWords),
		work.ptr, int64(rows), int64(vocab), int64(kmax), b2i(cuts)))
}

// SampleGreedyWork is the bytes of device memory SampleGreedyF32 needs for
// rows rows of vocab logits (the library's answer; no device call).
func (d *Device) SampleGreedyWork(rows, vocab int) int64 {
	return sampleGreedyWork(int64(rows), int64(vocab))
}

// SampleGreedyF32 is SampleF32 for rows that are all greedy without
// penalties or top log-probs (GreedyOnly), each row's reduction split over
// CTAs: out gets each row's token, log-probability and 0 alternatives (words
// 0–2 of SampleResultWords); work holds SampleGreedyWork(rows, vocab) bytes.
func (d *Device) SampleGreedyF32(s *Stream, out, logits, work *Buffer, rows, vocab int) error {
	const op = "SampleGreedyF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "vocab", vocab); err != nil {
		return err
	}
	if rows > SampleGreedyMaxRows || vocab > SampleMaxVocab {
		return fmt.Errorf("kernels: %s: %d rows (at most %d) of vocab %d (at most %d)", op, rows, SampleGreedyMaxRows, vocab, SampleMaxVocab)
	}
	if err := needAll(op, 4, "out", out, int64(rows)*SampleResultWords, "logits", logits, int64(rows)*int64(vocab)); err != nil {
		return err
	}
	if err := need(op, "work", work, d.SampleGreedyWork(rows, vocab), 1); err != nil {
		return err
	}
	return d.lib.check("mk_sample_greedy_f32", sampleGreedyF32(s.handle(), out.ptr, logits.ptr, work.ptr, int64(rows), int64(vocab)))
}

// SampleRow is one row's sampling request; its fields are those of
// backend.SampleRow (a value of one converts to the other), whose doc is
// the contract.
type SampleRow struct {
	Temperature       float32
	TopK              int
	TopP              float32
	MinP              float32
	RepetitionPenalty float32
	PresencePenalty   float32
	FrequencyPenalty  float32
	Seen              []int32
	Output            []int32
	Counts            []int32
	U                 float64
	TopLogprobs       int
	Allowed           []uint64
	BiasIDs           []int32
	BiasVals          []float32
}

// SampleOut is one row's result; its fields are those of
// backend.SampleResult.
type SampleOut struct {
	Token   int32
	Logprob float32
	TopIDs  []int32
	TopLogp []float32
}

// penalised reports whether a penalty changes any logit of r.
func (r *SampleRow) penalised() bool {
	return (r.RepetitionPenalty != 1 && len(r.Seen) > 0) ||
		((r.PresencePenalty != 0 || r.FrequencyPenalty != 0) && len(r.Output) > 0)
}

// check validates r for a vocabulary of vocab tokens.
func (r *SampleRow) check(vocab int) error {
	switch {
	case !(r.Temperature >= 0) || math.IsInf(float64(r.Temperature), 1):
		return fmt.Errorf("temperature %v, want finite >= 0", r.Temperature)
	case r.TopK < 0 || r.TopK > math.MaxInt32:
		return fmt.Errorf("top-k %d, want >= 0", r.TopK)
	case !(r.TopP > 0):
		return fmt.Errorf("top-p %v, want in (0, 1]", r.TopP)
	case !(r.MinP >= 0 && r.MinP <= 1):
		return fmt.Errorf("min-p %v, want in [0, 1]", r.MinP)
	case !(r.RepetitionPenalty > 0) || math.IsInf(float64(r.RepetitionPenalty), 1):
		return fmt.Errorf("repetition penalty %v, want finite > 0", r.RepetitionPenalty)
	case math.IsNaN(float64(r.PresencePenalty)) || math.IsNaN(float64(r.FrequencyPenalty)):
		return fmt.Errorf("presence/frequency penalty %v/%v", r.PresencePenalty, r.FrequencyPenalty)
	case len(r.Counts) != len(r.Output):
		return fmt.Errorf("%d counts for %d output tokens", len(r.Counts), len(r.Output))
	case !(r.U >= 0 && r.U < 1):
		return fmt.Errorf("U = %v, want in [0, 1)", r.U)
	case r.TopLogprobs < 0 || r.TopLogprobs > SampleMaxTop:
		return fmt.Errorf("top logprobs %d, want in [0, %d]", r.TopLogprobs, SampleMaxTop)
	}
	if r.Allowed != nil {
		if len(r.Allowed) != (vocab+63)/64 {
			return fmt.Errorf("a mask of %d words for vocabulary %d (want %d)", len(r.Allowed), vocab, (vocab+63)/64)
		}
		any := false
		for i, w := range r.Allowed {
			if i == len(r.Allowed)-1 && vocab%64 != 0 {
				w &= 1<<(vocab%64) - 1
			}
			any = any || w != 0
		}
		if !any {
			return errors.New("a mask that allows no token")
		}
	}
	if len(r.BiasVals) != len(r.BiasIDs) {
		return fmt.Errorf("%d bias values for %d ids", len(r.BiasVals), len(r.BiasIDs))
	}
	if len(r.BiasIDs) > 1 {
		ids := slices.Clone(r.BiasIDs)
		slices.Sort(ids)
		for i := 1; i < len(ids); i++ {
			if ids[i] == ids[i-1] {
				return fmt.Errorf("bias token id %d twice", ids[i])
			}
		}
	}
	for _, v := range r.BiasVals {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 1) {
			return fmt.Errorf("bias %v, want finite or -Inf", v)
		}
	}
	for _, l := range [][]int32{r.Seen, r.Output, r.BiasIDs} {
		for _, t := range l {
			if t < 0 || int(t) >= vocab {
				return fmt.Errorf("token id %d outside the vocabulary [0, %d)", t, vocab)
			}
		}
	}
	return nil
}

// PackSample checks rows for a vocabulary of vocab tokens and packs them
// into the metadata words mk_sample_f32 reads (headers, then the token
// lists). pen reports whether any row has a penalty in effect (then the
// call needs a scratch buffer of rows*vocab floats).
func PackSample(rows []SampleRow, vocab int) (meta []int32, pen bool, err error) {
	if len(rows) == 0 || vocab < 1 || vocab > SampleMaxVocab {
		return nil, false, fmt.Errorf("kernels: PackSample: %d rows of vocabulary %d (want >= 1 rows, vocabulary in [1, %d])",
			len(rows), vocab, SampleMaxVocab)
	}
	words := len(rows) * SampleMetaWords
	for i := range rows {
		r := &rows[i]
		if err := r.check(vocab); err != nil {
			return nil, false, fmt.Errorf("kernels: PackSample: row %d: %w", i, err)
		}
		words += len(r.Seen) + 2*len(r.Output)
	}
	if words > math.MaxInt32 {
		return nil, false, fmt.Errorf("kernels: PackSample: %d metadata words, more than 2^31", words)
	}
	meta = make([]int32, len(rows)*SampleMetaWords, words)
	f := func(v float32) int32 { return int32(math.Float32bits(v)) }
	for i := range rows {
		r := &rows[i]
		h := meta[i*SampleMetaWords : (i+1)*SampleMetaWords]
		ub := math.Float64bits(r.U)
		h[0], h[1], h[2], h[3] = f(r.Temperature), int32(r.TopK), f(r.TopP), f(r.MinP)
		h[4], h[5], h[6] = f(r.RepetitionPenalty), f(r.PresencePenalty), f(r.FrequencyPenalty)
		h[7], h[8] = int32(len(r.Seen)), int32(len(meta))
		meta = append(meta, r.Seen...)
		h[9], h[10] = int32(len(r.Output)), int32(len(meta))
		meta = append(meta, r.Output...)
		meta = append(meta, r.Counts...)
		h[11], h[12], h[13] = int32(r.TopLogprobs), int32(uint32(ub)), int32(uint32(ub>>32))
		pen = pen || r.penalised()
	}
	return meta, pen, nil
}

// SampleF32 samples one token per row of logits [rows, vocab] (float32,
// not modified) on stream s: meta holds metaWords words from PackSample,
// out gets rows*SampleResultWords int32 words (UnpackSample reads them),
// scratch is nil or rows*vocab floats (required when a row has penalties).
func (d *Device) SampleF32(s *Stream, out, logits, meta *Buffer, metaWords int, scratch *Buffer, rows, vocab int) error {
	const op = "SampleF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "vocab", vocab, "metaWords", metaWords); err != nil {
		return err
	}
	if vocab > SampleMaxVocab || metaWords < rows*SampleMetaWords {
		return fmt.Errorf("kernels: %s: vocab %d (at most %d), %d metadata words for %d rows", op, vocab, SampleMaxVocab, metaWords, rows)
	}
	n := int64(rows) * int64(vocab)
	if err := needAll(op, 4, "out", out, int64(rows)*SampleResultWords, "logits", logits, n, "meta", meta, int64(metaWords)); err != nil {
		return err
	}
	var sp uint64
	if scratch != nil {
		if err := need(op, "scratch", scratch, n, 4); err != nil {
			return err
		}
		sp = scratch.ptr
	}
	return d.lib.check("mk_sample_f32", sampleF32(s.handle(), out.ptr, logits.ptr, meta.ptr, int64(metaWords), sp,
		int64(rows), int64(vocab)))
}

// UnpackSample reads rows results from the words SampleF32 wrote.
func UnpackSample(words []int32, rows int) ([]SampleOut, error) {
	if len(words) < rows*SampleResultWords {
		return nil, fmt.Errorf("kernels: UnpackSample: %d words for %d rows", len(words), rows)
	}
	out := make([]SampleOut, rows)
	for i := range out {
		w := words[i*SampleResultWords : (i+1)*SampleResultWords]
		if w[0] < 0 {
			return nil, fmt.Errorf("kernels: SampleF32 row %d: the device reported %s (code %d)", i,
				map[bool]string{true: "bad metadata", false: "an internal inconsistency"}[w[0] == -1], w[0])
		}
		n := int(w[2])
		if n < 0 || n > SampleMaxTop {
			return nil, fmt.Errorf("kernels: SampleF32 row %d: %d alternatives", i, n)
		}
		o := SampleOut{Token: w[0], Logprob: math.Float32frombits(uint32(w[1]))}
		if n > 0 {
			o.TopIDs = make([]int32, n)
			o.TopLogp = make([]float32, n)
			for k := 0; k < n; k++ {
				o.TopIDs[k] = w[3+k]
				o.TopLogp[k] = math.Float32frombits(uint32(w[3+SampleMaxTop+k]))
			}
		}
		out[i] = o
	}
	return out, nil
}

// SampleHost samples one row of logits [V] on the host: engine/sampler.go's
// sample, draw, drawAll and logprobOf followed literally (math.Exp where the
// engine uses its fastExp, ~2e-10 apart), with U given. margin is the
// smallest relative distance of any threshold decision it took (the draw's
// running mass to U·mass, top-p's cumulative to top-p, min-p's probability
// to min-p): results of another implementation may differ where margin is
// at the rounding level. Where the engine would index out of range (no
// token left to draw from, e.g. a +Inf logit), SampleHost returns the argmax.
func SampleHost(logits []float32, r *SampleRow) (out SampleOut, margin float64) {
	margin = math.Inf(1)
	w := append([]float32(nil), logits...)
	if r.RepetitionPenalty != 1 {
		for _, t := range r.Seen {
			if w[t] > 0 {
				w[t] /= r.RepetitionPenalty
			} else {
				w[t] *= r.RepetitionPenalty
			}
		}
	}
	if r.PresencePenalty != 0 || r.FrequencyPenalty != 0 {
		for i, t := range r.Output {
			pen := r.FrequencyPenalty*float32(r.Counts[i]) + r.PresencePenalty
			w[t] -= pen
		}
	}
	var tok int32
	if r.Temperature == 0 {
		tok = int32(hostArgmax(w))
	} else {
		tok = hostDraw(w, r, &margin)
	}
	out = hostLogprobs(logits, tok, r.TopLogprobs)
	return out, margin
}

// hostArgmax is engine.Argmax: the first largest value, NaN never wins.
func hostArgmax(v []float32) int {
	best := -1
	for i, x := range v {
		if x != x {
			continue
		}
		if best < 0 || x > v[best] {
			best = i
		}
	}
	return max(best, 0)
}

func relDist(a, b, scale float64) float64 {
	if scale == 0 {
		return math.Abs(a - b)
	}
	return math.Abs(a-b) / math.Abs(scale)
}

// hostDraw is the engine's draw (and drawAll).
func hostDraw(w []float32, r *SampleRow, margin *float64) int32 {
	inv := 1 / r.Temperature
	maxv := float32(math.Inf(-1))
	for _, x := range w {
		if x > maxv {
			maxv = x
		}
	}
	if math.IsInf(float64(maxv), -1) || math.IsNaN(float64(maxv)) {
		return int32(hostArgmax(w))
	}
	probs := make([]float64, len(w))
	var total float64
	for i, x := range w {
		q := 0.0
		if z := float64((x - maxv) * inv); z > -40 {
			q = math.Exp(z)
		}
		probs[i] = q
		total += q
	}
	if r.TopK == 0 && r.TopP >= 1 && r.MinP == 0 {
		u := r.U * total
		before := 0.0
		for i, q := range probs {
			u -= q
			if u < 0 && q > 0 {
				*margin = min(*margin, relDist(before+q, r.U*total, total), relDist(before, r.U*total, total))
				return int32(i)
			}
			before += q
		}
		return int32(hostArgmax(w))
	}
	var order []int32
	for tau := 1.0 / 64; ; tau /= 64 {
		order = order[:0]
		var mass float64
		for i, q := range probs {
			if q >= tau && q > 0 {
				order = append(order, int32(i))
				mass += q
			}
		}
		enoughK := r.TopK > 0 && len(order) >= r.TopK
		enoughP := r.TopK == 0 && mass >= float64(r.TopP)*total
		enoughMin := r.TopK == 0 && r.TopP >= 1 && tau <= float64(r.MinP)
		if enoughK || enoughP || enoughMin || tau < 1e-300 || len(order) == len(probs) {
			break
		}
	}
	sort.Slice(order, func(a, b int) bool {
		qa, qb := probs[order[a]], probs[order[b]]
		return qa > qb || (qa == qb && order[a] < order[b])
	})
	norm := total
	if r.TopK > 0 && r.TopK < len(order) {
		order = order[:r.TopK]
	}
	if r.TopK > 0 {
		norm = 0
		for _, t := range order {
			norm += probs[t]
		}
	}
	n := len(order)
	if r.MinP > 0 {
		for n > 1 && probs[order[n-1]] < float64(r.MinP) {
			n--
		}
		if n < len(order) {
			*margin = min(*margin, relDist(probs[order[n]], float64(r.MinP), float64(r.MinP)))
		}
		*margin = min(*margin, relDist(probs[order[n-1]], float64(r.MinP), float64(r.MinP)))
	}
	if r.TopP < 1 {
		var c float64
		for i := 0; i < n; i++ {
			prev := c
			c += probs[order[i]] / norm
			if c >= float64(r.TopP) {
				*margin = min(*margin, relDist(c, float64(r.TopP), 1), relDist(prev, float64(r.TopP), 1))
				n = i + 1
				break
			}
		}
	}
	if n == 0 {
		return int32(hostArgmax(w)) // the engine would index order[-1] here
	}
	var mass float64
	for _, t := range order[:n] {
		mass += probs[t]
	}
	u := r.U * mass
	before := 0.0
	for _, t := range order[:n] {
		u -= probs[t]
		if u < 0 {
			*margin = min(*margin, relDist(before+probs[t], r.U*mass, mass), relDist(before, r.U*mass, mass))
			return t
		}
		before += probs[t]
	}
	*margin = min(*margin, relDist(before, r.U*mass, mass))
	return order[n-1]
}

// hostLogprobs is the engine's logprobs of tok (logprob.Of).
func hostLogprobs(logits []float32, tok int32, top int) SampleOut {
	lp, ids, lps := logprob.Of(logits, tok, top)
	return SampleOut{Token: tok, Logprob: lp, TopIDs: ids, TopLogp: lps}
}

// b2i is 1 for true, else 0 (a C flag).
func b2i(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
