package attention

import (
	"errors"
	"fmt"
	"math"
	"runtime"

	"github.com/mkserve/mkserve/internal/fastmath"
	"github.com/mkserve/mkserve/internal/par"
	"github.com/mkserve/mkserve/linalg"
)

// Params describes one attention computation.
type Params struct {
	NumHeads, NumKVHeads, HeadDim, VHeadDim int
	Scale                                   float32 // multiplies q·k before the softmax
	// Window is the sliding window: the query at position i sees keys j with
	// i-Window < j <= i; 0 means full causal attention.
	Window int
	// Sinks are per-head sink logits [NumHeads] joined to the softmax
	// denominator and then dropped (gpt-oss), or nil. They are not scaled.
	Sinks []float32
}

// Validate reports the first field of p that Causal cannot use.
func (p *Params) Validate() error {
	switch {
	case p == nil:
		return errors.New("attention params: nil")
	case p.NumHeads <= 0 || p.NumKVHeads <= 0:
		return fmt.Errorf("attention params: NumHeads %d and NumKVHeads %d must be positive", p.NumHeads, p.NumKVHeads)
	case p.NumHeads%p.NumKVHeads != 0:
		return fmt.Errorf("attention params: NumHeads %d is not a multiple of NumKVHeads %d", p.NumHeads, p.NumKVHeads)
	case p.HeadDim <= 0 || p.VHeadDim <= 0:
		return fmt.Errorf("attention params: HeadDim %d and VHeadDim %d must be positive", p.HeadDim, p.VHeadDim)
	case !(p.Scale > 0) || math.IsInf(float64(p.Scale), 0):
		return fmt.Errorf("attention params: Scale %v must be positive and finite", p.Scale)
	case p.Window < 0:
		return fmt.Errorf("attention params: Window %d must not be negative", p.Window)
	case p.Sinks != nil && len(p.Sinks) != p.NumHeads:
		return fmt.Errorf("attention params: %d sinks for %d heads", len(p.Sinks), p.NumHeads)
	}
	return nil
}

// Causal writes out [Tq, NumHeads*VHeadDim] for queries q [Tq, NumHeads*HeadDim]
// at positions past..past+Tq-1 of a sequence whose keys k [past+Tq, NumKVHeads*HeadDim]
// and values v [past+Tq, NumKVHeads*VHeadDim] are all given. GQA: query head h
// uses kv head h/(NumHeads/NumKVHeads).
//
// Per (query row, head): scores s_j = Scale·(q·k_j) over the visible keys,
// p = softmax([s..., sink]) with the max subtracted, the sink column dropped,
// out = Σ p_j v_j; everything is float32, the scores through linalg.DotRow
// and the values through linalg.AccumRows (AVX2 where the CPU has it). Work
// is spread over all cores by
// (query row, kv head, slice of its query heads). A row's result does not
// depend on how the sequence is split into calls: decoding token by token
// gives bit-for-bit the rows of one prefill call.
//
// Causal panics if p is invalid (see Params.Validate), if Tq or past is
// negative, or if a slice length is not exactly what the shapes say: these
// are programming errors; configs are checked with Params.Validate at load.
func Causal(out, q, k, v []float32, Tq, past int, p *Params) {
	n := past + Tq
	if p != nil && p.Validate() == nil && n > 0 {
		KV, D, Dv := p.NumKVHeads, p.HeadDim, p.VHeadDim
		if len(k) != n*KV*D || len(v) != n*KV*Dv {
			panic(fmt.Sprintf("attention.Causal: len(k) = %d, len(v) = %d, want %d and %d (Tq=%d past=%d heads=%d/%d dims=%d/%d)",
				len(k), len(v), n*KV*D, n*KV*Dv, Tq, past, p.NumHeads, KV, D, Dv))
		}
	}
	CausalPaged(out, q, &Pool{K: k, V: v, Blocks: []int32{0}, BlockSize: max(n, 1)}, Tq, past, p)
}

// Pool is a sequence's keys and values in a paged pool: position j's key is
// row Blocks[j/BlockSize]·BlockSize + j%BlockSize of K [rows, KV·HeadDim],
// its value the same row of V [rows, KV·VHeadDim] — or, with
// ValuesInKeys, the first VHeadDim columns of each kv head's key in that
// row of K (V unused): MLA's latent cache, where the latent is both the
// value and the first part of the key.
//
// K16 and V16, when K16 is set, hold the pool in bf16 instead (the upper
// halves of float32s; K and V unused): the same sums on the widened
// values, half the bytes read.
type Pool struct {
	K, V         []float32
	K16, V16     []uint16
	Blocks       []int32
	BlockSize    int
	ValuesInKeys bool
}

// keyLen and valueLen are the elements of the pool's keys and values.
func (kv *Pool) keyLen() int {
	if kv.K16 != nil {
		return len(kv.K16)
	}
	return len(kv.K)
}
func (kv *Pool) valueLen() int {
	if kv.K16 != nil {
		return len(kv.V16)
	}
	return len(kv.V)
}

// dot sets dst[j] to q's dot product with the key at element offset off
// of the pool plus j·ld, j < n (linalg.DotRow).
func (kv *Pool) dot(dst, q []float32, off, ld, n, D int) {
	if kv.K16 != nil {
		linalg.DotRowBF16(dst, q, kv.K16[off:], ld, n, D)
		return
	}
	linalg.DotRow(dst, q, kv.K[off:], ld, n, D)
}

// accum adds the n value rows of kv head kh from pool row r0, weighted by
// w, to o (linalg.AccumRows; KV heads, head dims D / Dv).
func (kv *Pool) accum(o, w []float32, r0, kh, KV, D, Dv, n int) {
	off, ld, k := (r0*KV+kh)*Dv, KV*Dv, false
	if kv.ValuesInKeys {
		off, ld, k = (r0*KV+kh)*D, KV*D, true
	}
	switch {
	case kv.K16 != nil && k:
		linalg.AccumRowsBF16(o, w, kv.K16[off:], ld, n, Dv)
	case kv.K16 != nil:
		linalg.AccumRowsBF16(o, w, kv.V16[off:], ld, n, Dv)
	case k:
		linalg.AccumRows(o, w, kv.K[off:], ld, n, Dv)
	default:
		linalg.AccumRows(o, w, kv.V[off:], ld, n, Dv)
	}
}

// CausalPaged is Causal reading keys and values in place from a paged pool
// (no gathered copy of the history): the same values bit for bit, the
// scores and value sums taken a block's run of rows at a time. It panics
// like Causal, and when a visible position's block or row lies outside
// the table or the pool.
func CausalPaged(out, q []float32, kv *Pool, Tq, past int, p *Params) {
	if err := p.Validate(); err != nil {
		panic("attention.Causal: " + err.Error())
	}
	if Tq < 0 || past < 0 {
		panic(fmt.Sprintf("attention.Causal: Tq %d and past %d must not be negative", Tq, past))
	}
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	n := past + Tq
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"out", len(out), Tq * H * Dv},
		{"q", len(q), Tq * H * D},
	} {
		if c.got != c.want {
			panic(fmt.Sprintf("attention.Causal: len(%s) = %d, want %d (Tq=%d past=%d heads=%d/%d dims=%d/%d)",
				c.name, c.got, c.want, Tq, past, H, KV, D, Dv))
		}
	}
	if Tq == 0 {
		return
	}
	bs := kv.BlockSize
	if bs <= 0 || (n+bs-1)/bs > len(kv.Blocks) {
		panic(fmt.Sprintf("attention.Causal: %d positions in blocks of %d, a table of %d blocks", n, bs, len(kv.Blocks)))
	}
	rows := kv.keyLen() / (KV * D)
	if kv.ValuesInKeys {
		if Dv > D {
			panic(fmt.Sprintf("attention.Causal: values in keys need VHeadDim %d ≤ HeadDim %d", Dv, D))
		}
	} else {
		rows = min(rows, kv.valueLen()/(KV*Dv))
	}
	nb := (n + bs - 1) / bs
	for bi, b := range kv.Blocks[:nb] {
		used := min(bs, n-bi*bs) // rows of the block the sequence fills
		if b < 0 || int(b)*bs+used > rows {
			panic(fmt.Sprintf("attention.Causal: block %d (%d rows used) is outside a pool of %d rows", b, used, rows))
		}
	}
	group := H / KV
	// Split each GQA group into slices so that decode (Tq=1) still has
	// enough tasks for all cores; the per-head arithmetic is the same
	// whatever the split.
	split := 1
	for split < group && Tq*KV*split < 4*runtime.GOMAXPROCS(0) {
		split *= 2
	}
	split = min(split, group)
	per := (group + split - 1) / split // heads per task
	split = (group + per - 1) / per
	tasks := Tq * KV * split
	work := n // keys a row sees, at most
	if p.Window > 0 {
		work = min(n, p.Window)
	}
	grain := max(1, (1<<16)/max(1, work*per*(D+Dv)))
	par.For(tasks, grain, func() func(lo, hi int) {
		scores := make([]float32, per*work) // [heads of a task, visible keys]
		return func(lo, hi int) {
			for task := lo; task < hi; task++ {
				t := task / (KV * split)
				kh := task / split % KV
				h0 := kh*group + task%split*per
				h1 := min(h0+per, (kh+1)*group)
				attendRow(out, q, kv, t, past, kh, h0, h1, p, scores)
			}
		}
	})
}

// runs calls f(j0, r0, c) for the runs of consecutive positions
// [j0, j0+c) in [lo, hi] that one block holds, r0 being j0's pool row.
func (kv *Pool) runs(lo, hi int, f func(j0, r0, c int)) {
	bs := kv.BlockSize
	for j := lo; j <= hi; {
		c := min(hi+1-j, bs-j%bs)
		f(j, int(kv.Blocks[j/bs])*bs+j%bs, c)
		j += c
	}
}

// Gather copies positions [0, n) of kv into contiguous keys [n, kw] and
// values [n, vw] (kw, vw: the pool's row widths; with ValuesInKeys, one kv
// head: each value the first vw columns of its key).
func (kv *Pool) Gather(n, kw, vw int) (k, v []float32) {
	k, v = make([]float32, n*kw), make([]float32, n*vw)
	if n > 0 {
		kv.runs(0, n-1, func(j0, r0, c int) {
			rowsOf(k[j0*kw:(j0+c)*kw], kv.K, kv.K16, r0*kw)
			if !kv.ValuesInKeys {
				rowsOf(v[j0*vw:(j0+c)*vw], kv.V, kv.V16, r0*vw)
				return
			}
			for j := range c {
				rowsOf(v[(j0+j)*vw:(j0+j+1)*vw], kv.K, kv.K16, (r0+j)*kw)
			}
		})
	}
	return k, v
}

// rowsOf fills dst with the elements of f (or, when f is nil, the widened
// bf16 elements of b) from off on.
func rowsOf(dst, f []float32, b []uint16, off int) {
	if f != nil {
		copy(dst, f[off:])
		return
	}
	linalg.WidenBF16(dst, b[off:off+len(dst)])
}

// attendRow computes query row t for heads h0..h1-1, all of kv head kh.
func attendRow(out, q []float32, kv *Pool, t, past, kh, h0, h1 int, p *Params, scores []float32) {
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	i := past + t
	lo := 0
	if p.Window > 0 {
		lo = max(0, i-p.Window+1)
	}
	m := i + 1 - lo // visible keys
	nh := h1 - h0
	sc := scores[:nh*m]
	// Scores of each head against the visible keys (rows KV·D apart within a block).
	for hh := range nh {
		s := sc[hh*m : (hh+1)*m]
		qr := q[(t*H+h0+hh)*D:][:D]
		kv.runs(lo, i, func(j0, r0, c int) {
			kv.dot(s[j0-lo:], qr, (r0*KV+kh)*D, KV*D, c, D)
		})
		for j := range s {
			s[j] *= p.Scale
		}
	}
	// Softmax per head, the sink joining the denominator.
	for hh := range nh {
		s := sc[hh*m : (hh+1)*m]
		mx := float32(math.Inf(-1))
		for _, x := range s {
			mx = max(mx, x)
		}
		var sink float32
		if p.Sinks != nil {
			sink = p.Sinks[h0+hh]
			mx = max(mx, sink)
		}
		fastmath.ExpSub(s, s, mx) // exp32(x - mx), four at a time
		var sum float32
		for _, e := range s {
			sum += e
		}
		if p.Sinks != nil {
			sum += exp32(sink - mx)
		}
		inv := 1 / sum
		for j := range s {
			s[j] *= inv
		}
		// Weighted sum of the values (rows KV·Dv apart within a block, or
		// KV·D in the keys), in key order.
		o := out[(t*H+h0+hh)*Dv:][:Dv]
		clear(o)
		kv.runs(lo, i, func(j0, r0, c int) {
			kv.accum(o, s[j0-lo:], r0, kh, KV, D, Dv, c)
		})
	}
}

// exp32 is e^x rounded to float32.
func exp32(x float32) float32 { return fastmath.Exp32(x) }
