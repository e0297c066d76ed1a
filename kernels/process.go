package kernels

import (
	"fmt"
	"math"
)

// Logits processing before sampling (mk_logits_process_f32): a row's bias
// (SampleRow.BiasIDs / BiasVals) added, then the tokens outside its mask
// (SampleRow.Allowed) set to −Inf, in place — what constrained decoding and
// logit_bias need, so those rows sample on the device like the others.

var logitsProcessF32 func(s, logits, proc uint64, procWords, nproc, rows, vocab int64) int32

func init() {
	registerSymbols(symbol{"mk_logits_process_f32", &logitsProcessF32})
}

// Processed reports whether r changes its logits before sampling.
func (r *SampleRow) Processed() bool { return r.Allowed != nil || len(r.BiasIDs) > 0 }

// PackProcess packs the rows that change their logits (Processed; checked
// for a vocabulary of vocab) into the words mk_logits_process_f32 reads,
// and returns how many rows it lists (0: none, proc nil).
func PackProcess(rows []SampleRow, vocab int) (proc []int32, n int, err error) {
	words := 0
	for i := range rows {
		r := &rows[i]
		if !r.Processed() {
			continue
		}
		if err := r.check(vocab); err != nil {
			return nil, 0, fmt.Errorf("kernels: PackProcess: row %d: %w", i, err)
		}
		n++
		words += 4 + 2*len(r.Allowed) + 2*len(r.BiasIDs)
	}
	if n == 0 {
		return nil, 0, nil
	}
	if words > math.MaxInt32 || n > 65535 {
		return nil, 0, fmt.Errorf("kernels: PackProcess: %d rows, %d words (at most 65535 rows, 2^31 words)", n, words)
	}
	proc = make([]int32, 4*n, words)
	k := 0
	for i := range rows {
		r := &rows[i]
		if !r.Processed() {
			continue
		}
		h := proc[4*k : 4*k+4]
		k++
		h[0], h[1] = int32(i), -1
		if r.Allowed != nil {
			h[1] = int32(len(proc))
			for _, w := range r.Allowed {
				proc = append(proc, int32(uint32(w)), int32(uint32(w>>32)))
			}
		}
		h[2], h[3] = int32(len(proc)), int32(len(r.BiasIDs))
		proc = append(proc, r.BiasIDs...)
		for _, v := range r.BiasVals {
			proc = append(proc, int32(math.Float32bits(v)))
		}
	}
	return proc, n, nil
}

// ProcessHost is mk_logits_process_f32 for one row of logits [V] on the
// host: the reference.
func ProcessHost(logits []float32, r *SampleRow) {
	for i, t := range r.BiasIDs {
		logits[t] += r.BiasVals[i]
	}
	if r.Allowed != nil {
		ninf := float32(math.Inf(-1))
		for t := range logits {
			if r.Allowed[t>>6]&(1<<(t&63)) == 0 {
				logits[t] = ninf
			}
		}
	}
}

// ProcessLogitsF32 changes, in place, the listed rows of logits [rows,
// vocab] (float32) on stream s: proc holds procWords words from
// PackProcess listing nproc rows.
func (d *Device) ProcessLogitsF32(s *Stream, logits, proc *Buffer, procWords, nproc, rows, vocab int) error {
	const op = "ProcessLogitsF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "vocab", vocab, "nproc", nproc); err != nil {
		return err
	}
	if vocab > SampleMaxVocab || nproc > rows || procWords < 4*nproc {
		return fmt.Errorf("kernels: %s: %d rows listed of %d, vocab %d (at most %d), %d words", op, nproc, rows, vocab,
			SampleMaxVocab, procWords)
	}
	if err := needAll(op, 4, "logits", logits, int64(rows)*int64(vocab), "proc", proc, int64(procWords)); err != nil {
		return err
	}
	return d.lib.check("mk_logits_process_f32", logitsProcessF32(s.handle(), logits.ptr, proc.ptr, int64(procWords),
		int64(nproc), int64(rows), int64(vocab)))
}
