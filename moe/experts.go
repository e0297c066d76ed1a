package moe

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/mkserve/mkserve/internal/fastmath"
	"github.com/mkserve/mkserve/linalg"
)

// Experts holds one layer's expert weights on the host, float32, in the
// stacked layout of backend.MoELayer.
type Experts struct {
	E, H, I    int
	GateUp     []float32 // [E, 2*I, H]: per expert gate rows [0,I) then up rows [I,2I)
	GateUpBias []float32 // [E, 2*I] or nil
	Down       []float32 // [E, H, I]
	DownBias   []float32 // [E, H] or nil
	Act        Activation
	// GateUpW and DownW hold the same matrices in another form instead
	// of GateUp and Down (bf16, Q8 or FP4, whose rows of H and I values
	// must then be whole groups of linalg.Q8Group): the products are
	// linalg's for that form (bf16: the float32 ones bit for bit) and
	// fewer bytes stream per token. Each matrix is given one way or the
	// other.
	GateUpW, DownW linalg.Weights
}

// gateUp and down are the expert matrices whichever way they are held.
func (ex *Experts) gateUp() linalg.Weights {
	if ex.GateUp != nil {
		return linalg.Weights{F32: ex.GateUp}
	}
	return ex.GateUpW
}
func (ex *Experts) down() linalg.Weights {
	if ex.Down != nil {
		return linalg.Weights{F32: ex.Down}
	}
	return ex.DownW
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Validate reports the first field whose size does not match E, H, I.
func (ex *Experts) Validate() error {
	if ex == nil {
		return fmt.Errorf("moe: experts are nil")
	}
	if ex.E <= 0 || ex.H <= 0 || ex.I <= 0 {
		return fmt.Errorf("moe: experts: E, H, I = %d, %d, %d, want all > 0", ex.E, ex.H, ex.I)
	}
	E, H, I := ex.E, ex.H, ex.I
	if ex.GateUpW.Forms()+btoi(ex.GateUp != nil) != 1 || ex.DownW.Forms()+btoi(ex.Down != nil) != 1 {
		return fmt.Errorf("moe: experts: give each of GateUp and Down once, in float32 or in one form of GateUpW and DownW")
	}
	if (ex.GateUpW.Grouped() && H%linalg.Q8Group != 0) || (ex.DownW.Grouped() && I%linalg.Q8Group != 0) {
		return fmt.Errorf("moe: experts: Q8 and FP4 rows must be a multiple of %d values long (H = %d, I = %d)", linalg.Q8Group, H, I)
	}
	if n := ex.gateUp().Len(); n != E*2*I*H {
		return fmt.Errorf("moe: experts: GateUp has %d values, want [E, 2*I, H] = %d", n, E*2*I*H)
	}
	if ex.GateUpBias != nil && len(ex.GateUpBias) != E*2*I {
		return fmt.Errorf("moe: experts: GateUpBias has %d values, want [E, 2*I] = %d", len(ex.GateUpBias), E*2*I)
	}
	if n := ex.down().Len(); n != E*H*I {
		return fmt.Errorf("moe: experts: Down has %d values, want [E, H, I] = %d", n, E*H*I)
	}
	if ex.DownBias != nil && len(ex.DownBias) != E*H {
		return fmt.Errorf("moe: experts: DownBias has %d values, want [E, H] = %d", len(ex.DownBias), E*H)
	}
	return ex.Act.Validate()
}

// checkCall reports a Forward call whose slices do not match T, K and E.
func (ex *Experts) checkCall(out, x []float32, T, K int, ids []int32, w []float32) error {
	if err := ex.Validate(); err != nil {
		return err
	}
	H := ex.H
	switch {
	case T < 0 || K < 0:
		return fmt.Errorf("moe: forward: T = %d, K = %d, want >= 0", T, K)
	case len(x) < T*H:
		return fmt.Errorf("moe: forward: x has %d values, want [T, H] = %d", len(x), T*H)
	case len(out) < T*H:
		return fmt.Errorf("moe: forward: out has %d values, want [T, H] = %d", len(out), T*H)
	case len(ids) < T*K:
		return fmt.Errorf("moe: forward: ids has %d values, want [T, K] = %d", len(ids), T*K)
	case len(w) < T*K:
		return fmt.Errorf("moe: forward: weights has %d values, want [T, K] = %d", len(w), T*K)
	}
	for i, e := range ids[:T*K] {
		if e < 0 || int(e) >= ex.E {
			return fmt.Errorf("moe: forward: ids[%d] (token %d, slot %d) = %d, want 0..%d", i, i/K, i%K, e, ex.E-1)
		}
	}
	return nil
}

// set is a view of all experts, indexed by global expert id.
func (ex *Experts) set() *expertSet {
	s := &expertSet{H: ex.H, I: ex.I, act: ex.Act}
	for e := range ex.E {
		s.add(ex, e)
	}
	return s
}

// Forward computes out = Σ_k w[t,k]·expert_{ids[t,k]}(x[t]) for x [T, H],
// ids and w [T, K]; out [T, H] is overwritten, not accumulated.
//
// Tokens are grouped by expert; each expert runs two GEMMs (linalg.MatMulT)
// on its gathered rows (in tiles of at most 512 rows), experts running
// concurrently; the weighted results are summed per token in slot order
// k = 0..K-1, so the result does not depend on scheduling.
//
// Forward panics when ex fails Validate, a slice is shorter than its shape or
// an id is out of range (ids come from Route, so that is a programming error).
func (ex *Experts) Forward(out, x []float32, T, K int, ids []int32, w []float32) {
	if err := ex.checkCall(out, x, T, K, ids, w); err != nil {
		panic(err.Error())
	}
	H := ex.H
	clear(out[:T*H])
	if T == 0 || K == 0 {
		return
	}
	s := ex.set()
	// Bound the slot buffer y [rows, H] by taking tokens in chunks.
	chunk := max(1, slotBudget/(H*K))
	y := getBuf(min(T, chunk) * K * H)
	defer putBuf(y)
	rows := make([][]float32, min(T, chunk)*K)
	for t0 := 0; t0 < T; t0 += chunk {
		t1 := min(t0+chunk, T)
		n := (t1 - t0) * K
		for i := range n {
			t := t0 + i/K
			rows[i] = x[t*H : t*H+H : t*H+H]
		}
		s.run(y[:n*H], rows[:n], ids[t0*K:t1*K], w[t0*K:t1*K])
		sumSlots(out[t0*H:t1*H], y[:n*H], t1-t0, K, H)
	}
}

// sumSlots sets out[t] = Σ_k y[t*K+k] for out [T, H], y [T*K, H].
func sumSlots(out, y []float32, T, K, H int) {
	parallelRange(T, T*K*H >= 1<<16, func(t0, t1 int) {
		for t := t0; t < t1; t++ {
			o := out[t*H : t*H+H]
			copy(o, y[t*K*H:t*K*H+H])
			for k := 1; k < K; k++ {
				r := y[(t*K+k)*H : (t*K+k)*H+H]
				for h := range o {
					o[h] += r[h]
				}
			}
		}
	})
}

// expertSet is a list of experts seen through per-expert weight views, so a
// rank of an expert-parallel world can hold only its own experts. Index i of
// every slice is one expert ("local id").
type expertSet struct {
	H, I       int
	act        Activation
	gateUp     []linalg.Weights // [2I, H] each
	gateUpBias [][]float32      // [2I] each, or nil
	down       []linalg.Weights // [H, I] each
	downBias   [][]float32      // [H] each, or nil
}

// add appends global expert e of ex (views, no copies).
func (s *expertSet) add(ex *Experts, e int) {
	H, I := ex.H, ex.I
	s.gateUp = append(s.gateUp, ex.gateUp().Block(e, 2*I*H))
	s.down = append(s.down, ex.down().Block(e, H*I))
	var gub, db []float32
	if ex.GateUpBias != nil {
		gub = sub(ex.GateUpBias, e, 2*I)
	}
	if ex.DownBias != nil {
		db = sub(ex.DownBias, e, H)
	}
	s.gateUpBias = append(s.gateUpBias, gub)
	s.downBias = append(s.downBias, db)
}

// sub is block e of size n of a, capped so it cannot reach the next block.
func sub(a []float32, e, n int) []float32 { return a[e*n : e*n+n : e*n+n] }

// slotBudget is the most float32 values Forward keeps in its per-slot
// result buffer (64 MiB); larger batches are taken in token chunks. A
// variable so tests can make chunks small.
var slotBudget = 1 << 24

// mTile caps the rows of one GEMM call so the per-worker buffers stay small.
const mTile = 512

// serialExperts runs experts one after another (each GEMM still parallel)
// instead of concurrently. Measured on 16 cores with the first MatMulT,
// concurrent experts won at every shape tried (decode 3.5–5x, prefill
// 1.5–2.6x), so it is off; a variable so benchmarks can compare.
var serialExperts = false

// run computes y[i] = w[i]·expert_{eid[i]}(rows[i]) for n rows: rows[i] [H],
// eid local ids, y [n, H] (overwritten).
func (s *expertSet) run(y []float32, rows [][]float32, eid []int32, w []float32) {
	n := len(rows)
	if n == 0 {
		return
	}
	E := len(s.gateUp)
	// Counting sort of rows by expert (stable: rows keep their order).
	off := make([]int32, E+1)
	for _, e := range eid[:n] {
		off[e+1]++
	}
	for e := range E {
		off[e+1] += off[e]
	}
	order := make([]int32, n)
	next := make([]int32, E)
	copy(next, off[:E])
	for i, e := range eid[:n] {
		order[next[e]] = int32(i)
		next[e]++
	}
	// Work items: (expert, row range) tiles, biggest first for balance.
	type item struct{ e, lo, hi int32 }
	var items []item
	for e := range E {
		for lo := off[e]; lo < off[e+1]; lo += mTile {
			items = append(items, item{int32(e), lo, min(lo+mTile, off[e+1])})
		}
	}
	// Tiles run concurrently; each GEMM is parallel as well, so a few big
	// tiles still fill the cores.
	workers := 1
	if p := runtime.GOMAXPROCS(0); p > 1 && len(items) > 1 && !serialExperts {
		workers = min(p, len(items))
		// Largest tiles first so one big tile does not finish last.
		for i := 1; i < len(items); i++ {
			for j := i; j > 0 && items[j].hi-items[j].lo > items[j-1].hi-items[j-1].lo; j-- {
				items[j], items[j-1] = items[j-1], items[j]
			}
		}
	}
	maxM := 0
	for _, it := range items {
		maxM = max(maxM, int(it.hi-it.lo))
	}
	var nextItem atomic.Int32
	work := func() {
		b := getBuf(maxM * (2*s.H + 3*s.I))
		defer putBuf(b)
		for {
			k := int(nextItem.Add(1)) - 1
			if k >= len(items) {
				return
			}
			it := items[k]
			s.tile(y, rows, order[it.lo:it.hi], w, int(it.e), b)
		}
	}
	if workers == 1 {
		work()
		return
	}
	// The caller is one of the workers (par.For does the same).
	var wg sync.WaitGroup
	for range workers - 1 {
		wg.Add(1)
		go func() { defer wg.Done(); work() }()
	}
	work()
	wg.Wait()
}

// tile runs expert e on rows idx (at most mTile) with scratch b.
func (s *expertSet) tile(y []float32, rows [][]float32, idx []int32, w []float32, e int, b []float32) {
	H, I, m := s.H, s.I, len(idx)
	xa := b[: m*H : m*H]          // [m, H] gathered input
	gu := b[m*H : m*(H+2*I)]      // [m, 2I] gate | up
	a := b[m*(H+2*I) : m*(H+3*I)] // [m, I] activation
	yo := b[m*(H+3*I) : m*(2*H+3*I)]
	for j, i := range idx {
		copy(xa[j*H:j*H+H], rows[i])
	}
	s.gateUp[e].MulT(gu, xa, m, 2*I, H)
	if bias := s.gateUpBias[e]; bias != nil {
		for j := range m {
			r := gu[j*2*I : j*2*I+2*I]
			for c := range r {
				r[c] += bias[c]
			}
		}
	}
	for j := range m {
		activate(s.act, a[j*I:j*I+I], gu[j*2*I:j*2*I+I], gu[j*2*I+I:j*2*I+2*I])
	}
	s.down[e].MulT(yo, a, m, H, I)
	db := s.downBias[e]
	for j, i := range idx {
		src := yo[j*H : j*H+H]
		dst := y[int(i)*H : int(i)*H+H]
		wt := w[i]
		if db != nil {
			for h := range dst {
				dst[h] = wt * (src[h] + db[h])
			}
		} else {
			for h := range dst {
				dst[h] = wt * src[h]
			}
		}
	}
}

// activate writes act(gate, up) into dst; all three are [I].
func activate(act Activation, dst, gate, up []float32) {
	switch act.Kind {
	case SwiGLU:
		for i, g := range gate {
			dst[i] = g / (1 + fastmath.Exp32(-g)) * up[i]
		}
	case ClampedSwiGLU:
		lim, alpha := act.Limit, act.Alpha
		for i, g := range gate {
			if g > lim {
				g = lim
			}
			u := up[i]
			if u > lim {
				u = lim
			} else if u < -lim {
				u = -lim
			}
			glu := g / (1 + fastmath.Exp32(-alpha*g))
			dst[i] = (u + 1) * glu
		}
	default:
		panic(fmt.Sprintf("moe: activation kind %d", act.Kind))
	}
}

// parallelRange runs f over [0, n) split across cores when par is true.
func parallelRange(n int, par bool, f func(lo, hi int)) {
	p := runtime.GOMAXPROCS(0)
	if !par || p <= 1 || n <= 1 {
		f(0, n)
		return
	}
	p = min(p, n)
	chunk := (n + p - 1) / p
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() { defer wg.Done(); f(lo, hi) }()
	}
	wg.Wait()
}

// bufPool recycles float32 scratch buffers between calls.
var bufPool sync.Pool

func getBuf(n int) []float32 {
	if p, ok := bufPool.Get().(*[]float32); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]float32, n)
}

func putBuf(b []float32) {
	b = b[:0]
	bufPool.Put(&b)
}
