package attention

import (
	"fmt"
	"math"

	"github.com/mkserve/mkserve/internal/par"
	"github.com/mkserve/mkserve/linalg"
)

// Ring attention (context parallelism): R ranks each hold a slice of a long
// sequence's queries and keys; the key/value slices travel around the ring,
// and every rank attends its queries to the slice in hand, merging partial
// results by their log-sum-exp. This file is the CPU reference of that
// schedule: the zigzag split, the partial attention with its log-sum-exp,
// the merge, and the whole ring (RingCausal), which must equal Causal.

// Span is the half-open position range [Lo, Hi).
type Span struct{ Lo, Hi int }

// Len is Hi − Lo.
func (s Span) Len() int { return s.Hi - s.Lo }

// ZigzagSplit cuts positions [0, n) into 2R contiguous chunks whose sizes
// differ by at most one and gives rank r chunks R−1−r and R+r (early chunk
// first). Under a causal mask an early chunk is cheap and a late one
// expensive, so pairing them gives every rank nearly the same work. The
// pairs run outward from the middle so that, as key/value slices travel
// from rank r to r+1, a slice's late chunk is seen only by the ranks from
// its own to R−1, before the ring wraps: the GPU ring stops forwarding it
// there (kernels/ring.cu, hop_rows). ranks must be positive; chunks may be
// empty when n < 2R.
func ZigzagSplit(n, ranks int) [][]Span {
	if ranks <= 0 || n < 0 {
		panic(fmt.Sprintf("attention.ZigzagSplit: n %d, ranks %d", n, ranks))
	}
	c := 2 * ranks
	bound := func(i int) int { return i * n / c }
	out := make([][]Span, ranks)
	for r := range ranks {
		out[r] = []Span{{bound(ranks - 1 - r), bound(ranks - r)}, {bound(ranks + r), bound(ranks + r + 1)}}
	}
	return out
}

// Gather copies the rows of spans (in order) out of x [n, width].
func Gather(x []float32, width int, spans []Span) []float32 {
	var out []float32
	for _, s := range spans {
		out = append(out, x[s.Lo*width:s.Hi*width]...)
	}
	return out
}

// Positions lists the positions of spans, offset by base, in order.
func Positions(spans []Span, base int) []int32 {
	var out []int32
	for _, s := range spans {
		for i := s.Lo; i < s.Hi; i++ {
			out = append(out, int32(base+i))
		}
	}
	return out
}

// Partial attends queries q [len(qpos), NumHeads*HeadDim] at positions qpos
// to the keys k [len(kpos), NumKVHeads*HeadDim] and values v [len(kpos),
// NumKVHeads*VHeadDim] at positions kpos (any subset of the sequence, in any
// order), under the causal mask (key j visible to query i when j ≤ i and,
// with a window, j > i − Window; causal false: every key visible). It writes
// out [rows, NumHeads*VHeadDim], softmax-normalised over the visible keys of
// this subset only, and lse [rows, NumHeads] = log Σ exp(score) over them
// (−Inf and a zero row when none is visible). Sinks are not applied here:
// Finish applies them once all partials are merged.
func Partial(out, lse, q []float32, qpos []int32, k, v []float32, kpos []int32, p *Params, causal bool) {
	if err := p.Validate(); err != nil {
		panic("attention.Partial: " + err.Error())
	}
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	nq, nk := len(qpos), len(kpos)
	if len(out) != nq*H*Dv || len(lse) != nq*H || len(q) != nq*H*D || len(k) != nk*KV*D || len(v) != nk*KV*Dv {
		panic(fmt.Sprintf("attention.Partial: out %d, lse %d, q %d, k %d, v %d for %d queries, %d keys, heads %d/%d, dims %d/%d",
			len(out), len(lse), len(q), len(k), len(v), nq, nk, H, KV, D, Dv))
	}
	group := H / KV
	par.For(nq*H, max(1, (1<<14)/max(1, nk*(D+Dv))), func() func(lo, hi int) {
		s := make([]float64, nk)
		acc := make([]float64, Dv)
		return func(lo, hi int) {
			for task := lo; task < hi; task++ {
				t, h := task/H, task%H
				kh := h / group
				i := int(qpos[t])
				qr := q[(t*H+h)*D:][:D]
				mx := math.Inf(-1)
				for j := range nk {
					s[j] = math.Inf(-1)
					kp := int(kpos[j])
					if causal && (kp > i || (p.Window > 0 && kp <= i-p.Window)) {
						continue
					}
					s[j] = float64(linalg.Dot(qr, k[(j*KV+kh)*D:][:D]) * p.Scale)
					mx = max(mx, s[j])
				}
				o := out[(t*H+h)*Dv:][:Dv]
				if math.IsInf(mx, -1) {
					clear(o)
					lse[t*H+h] = float32(math.Inf(-1))
					continue
				}
				clear(acc)
				var sum float64
				for j := range nk {
					if math.IsInf(s[j], -1) {
						continue
					}
					e := math.Exp(s[j] - mx)
					sum += e
					vr := v[(j*KV+kh)*Dv:][:Dv]
					for c := range acc {
						acc[c] += e * float64(vr[c])
					}
				}
				for c := range o {
					o[c] = float32(acc[c] / sum)
				}
				lse[t*H+h] = float32(mx + math.Log(sum))
			}
		}
	})
}

// Merge folds the partial result (out2, lse2) into (out, lse), both
// [rows, heads, dv] and [rows, heads]: out = (e^lse·out + e^lse2·out2) /
// (e^lse + e^lse2), lse = log(e^lse + e^lse2), computed around the larger
// of the two so nothing overflows; a −Inf side contributes nothing.
func Merge(out, lse, out2, lse2 []float32, dv int) {
	if len(out) != len(out2) || len(lse) != len(lse2) || len(out) != len(lse)*dv {
		panic(fmt.Sprintf("attention.Merge: out %d/%d, lse %d/%d, dv %d", len(out), len(out2), len(lse), len(lse2), dv))
	}
	for i := range lse {
		a, b := float64(lse[i]), float64(lse2[i])
		if math.IsInf(b, -1) {
			continue
		}
		o, o2 := out[i*dv:][:dv], out2[i*dv:][:dv]
		if math.IsInf(a, -1) {
			copy(o, o2)
			lse[i] = lse2[i]
			continue
		}
		m := max(a, b)
		wa, wb := math.Exp(a-m), math.Exp(b-m)
		inv := 1 / (wa + wb)
		for c := range o {
			o[c] = float32((wa*float64(o[c]) + wb*float64(o2[c])) * inv)
		}
		lse[i] = float32(m + math.Log(wa+wb))
	}
}

// Finish applies sinks [heads] (or nothing when nil) to merged results:
// the sink joins the softmax denominator, so out = out / (1 + e^(sink −
// lse)). Rows that saw no key stay zero.
func Finish(out, lse, sinks []float32, heads, dv int) {
	if sinks == nil {
		return
	}
	for i := range lse {
		l := float64(lse[i])
		if math.IsInf(l, -1) {
			continue
		}
		f := float32(1 / (1 + math.Exp(float64(sinks[i%heads])-l)))
		for c := range dv {
			out[i*dv+c] *= f
		}
	}
}

// RingCausal computes what Causal computes — out [Tq, NumHeads*VHeadDim]
// for queries at positions past..past+Tq−1 over keys and values at
// positions 0..past+Tq−1 — the way R context-parallel ranks do: the Tq new
// positions are split zigzag (ZigzagSplit), each rank keeping its queries
// and its slice of the new keys; the cached keys 0..past−1 are split
// zigzag too. For R steps every rank attends its queries to the key slice
// in hand (its own at step 0, then the one received from its left
// neighbour) and merges by log-sum-exp; sinks are applied at the end.
// causal false attends every query to every key.
func RingCausal(out, q, k, v []float32, Tq, past, ranks int, p *Params, causal bool) {
	if err := p.Validate(); err != nil {
		panic("attention.RingCausal: " + err.Error())
	}
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	n := past + Tq
	if len(out) != Tq*H*Dv || len(q) != Tq*H*D || len(k) != n*KV*D || len(v) != n*KV*Dv {
		panic(fmt.Sprintf("attention.RingCausal: out %d, q %d, k %d, v %d for Tq %d past %d", len(out), len(q), len(k), len(v), Tq, past))
	}
	qs := ZigzagSplit(Tq, ranks)
	ps := ZigzagSplit(past, ranks)
	// What rank r holds: its queries, and its key/value slice (cached part
	// then new part).
	type slice struct {
		kpos []int32
		k, v []float32
	}
	kv := make([]slice, ranks)
	for r := range ranks {
		newSpans := make([]Span, len(qs[r]))
		for i, s := range qs[r] {
			newSpans[i] = Span{past + s.Lo, past + s.Hi}
		}
		spans := append(append([]Span{}, ps[r]...), newSpans...)
		kv[r] = slice{kpos: Positions(spans, 0), k: Gather(k, KV*D, spans), v: Gather(v, KV*Dv, spans)}
	}
	for r := range ranks {
		qpos := Positions(qs[r], past)
		nq := len(qpos)
		if nq == 0 {
			continue
		}
		qr := Gather(q, H*D, qs[r])
		acc, accL := make([]float32, nq*H*Dv), make([]float32, nq*H)
		for i := range accL {
			accL[i] = float32(math.Inf(-1))
		}
		part, partL := make([]float32, nq*H*Dv), make([]float32, nq*H)
		for step := range ranks {
			src := kv[(r-step+ranks)%ranks] // the slice in hand at this step
			Partial(part, partL, qr, qpos, src.k, src.v, src.kpos, p, causal)
			Merge(acc, accL, part, partL, Dv)
		}
		Finish(acc, accL, p.Sinks, H, Dv)
		// Scatter the rank's rows back to their places.
		off := 0
		for _, s := range qs[r] {
			copy(out[s.Lo*H*Dv:s.Hi*H*Dv], acc[off:off+s.Len()*H*Dv])
			off += s.Len() * H * Dv
		}
	}
}
