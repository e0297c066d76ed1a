package attention

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
)

// maxCachedPos bounds the cos/sin tables: positions from maxCachedPos on are
// computed per call instead of cached (a table row costs Dim·4 bytes).
var maxCachedPos = 1 << 17

// Apply rotates, in place, the first r.Dim dimensions of every head of
// x [rows, heads*headDim], row i at position pos[i] (pos has rows entries).
// Angles are float32(invFreq)·float32(pos) and cos/sin are scaled by the
// attention factor in float32, as transformers does; the rotation itself is
// float32. Safe for concurrent use.
//
// Apply panics if r is invalid (see Validate), if r.Dim > headDim, if the
// slice lengths disagree with rows, heads and headDim, or if a position is
// negative: all are programming errors of the caller.
func (r *RoPE) Apply(x []float32, rows, heads, headDim int, pos []int32) {
	if err := r.Validate(); err != nil {
		panic("attention: RoPE.Apply: " + err.Error())
	}
	if rows < 0 || heads <= 0 || headDim <= 0 || r.Dim > headDim {
		panic(fmt.Sprintf("attention: RoPE.Apply: bad shape rows=%d heads=%d headDim=%d (rope dim %d)",
			rows, heads, headDim, r.Dim))
	}
	if len(x) != rows*heads*headDim || len(pos) != rows {
		panic(fmt.Sprintf("attention: RoPE.Apply: len(x)=%d len(pos)=%d, want %d and %d",
			len(x), len(pos), rows*heads*headDim, rows))
	}
	maxPos := int32(-1)
	for _, p := range pos {
		if p < 0 {
			panic(fmt.Sprintf("attention: RoPE.Apply: negative position %d", p))
		}
		maxPos = max(maxPos, p)
	}
	if rows == 0 {
		return
	}
	t := tableFor(r)
	rs := t.rows(min(int(maxPos)+1, maxCachedPos))
	half := r.Dim / 2
	width := heads * headDim
	grain := max(1, (1<<14)/(heads*half)) // rows per task: ~16k rotations
	parallelFor(rows, grain, func() func(lo, hi int) {
		var cs, sn []float32 // scratch for uncached positions
		return func(lo, hi int) {
			for i := lo; i < hi; i++ {
				p := int(pos[i])
				var c, s []float32
				if p < rs.n {
					c, s = rs.cos[p*half:(p+1)*half], rs.sin[p*half:(p+1)*half]
				} else {
					if cs == nil {
						cs, sn = make([]float32, half), make([]float32, half)
					}
					t.fill(cs, sn, p)
					c, s = cs, sn
				}
				rotateRow(x[i*width:(i+1)*width], heads, headDim, r.Style, c, s)
			}
		}
	})
}

// rotateRow rotates the first 2·len(c) dims of every head of one row.
// The products are rounded separately (no fused multiply-add), as in
// transformers' q*cos + rotate_half(q)*sin.
func rotateRow(row []float32, heads, headDim int, style RoPEStyle, c, s []float32) {
	half := len(c)
	for h := 0; h < heads; h++ {
		v := row[h*headDim : h*headDim+2*half]
		if style == NeoX {
			a, b := v[:half], v[half:2*half]
			for i := range half {
				x1, x2 := a[i], b[i]
				a[i] = float32(x1*c[i]) - float32(x2*s[i])
				b[i] = float32(x2*c[i]) + float32(x1*s[i])
			}
			continue
		}
		for i := range half {
			x1, x2 := v[2*i], v[2*i+1]
			v[2*i] = float32(x1*c[i]) - float32(x2*s[i])
			v[2*i+1] = float32(x2*c[i]) + float32(x1*s[i])
		}
	}
}

// ropeKey identifies the cos/sin table of a RoPE: every parameter that
// changes the frequencies (Style does not).
type ropeKey struct {
	dim      int
	theta    float64
	scaling  RoPEScaling // with Truncate cleared
	truncate bool
}

// ropeTable holds cos/sin rows [n, Dim/2] for positions 0..n-1, grown on
// demand. Readers take an immutable snapshot; growth publishes a new one.
type ropeTable struct {
	inv  []float32 // [Dim/2]
	attn float32
	mu   sync.Mutex // serialises growth
	snap atomic.Pointer[ropeRows]
}

// ropeRows is one immutable snapshot of a table.
type ropeRows struct {
	n        int
	cos, sin []float32 // [n, Dim/2], already multiplied by the attention factor
}

var ropeTables sync.Map // ropeKey → *ropeTable

// tableFor returns the shared table for r's parameters.
func tableFor(r *RoPE) *ropeTable {
	k := ropeKey{dim: r.Dim, theta: r.Theta, scaling: r.Scaling, truncate: true}
	if r.Scaling.Truncate != nil {
		k.truncate = *r.Scaling.Truncate
	}
	k.scaling.Truncate = nil
	if k.scaling.Type == "default" {
		k.scaling.Type = ""
	}
	if t, ok := ropeTables.Load(k); ok {
		return t.(*ropeTable)
	}
	inv, attn := r.Freqs()
	t := &ropeTable{inv: make([]float32, len(inv)), attn: float32(attn)}
	for i, f := range inv {
		t.inv[i] = float32(f)
	}
	t.snap.Store(&ropeRows{})
	got, _ := ropeTables.LoadOrStore(k, t)
	return got.(*ropeTable)
}

// rows returns a snapshot covering at least positions 0..n-1.
func (t *ropeTable) rows(n int) *ropeRows {
	if rs := t.snap.Load(); rs.n >= n {
		return rs
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.snap.Load()
	if old.n >= n {
		return old
	}
	size := min(max(n, 2*old.n, 256), max(n, maxCachedPos))
	half := len(t.inv)
	rs := &ropeRows{n: size, cos: make([]float32, size*half), sin: make([]float32, size*half)}
	copy(rs.cos, old.cos)
	copy(rs.sin, old.sin)
	for p := old.n; p < size; p++ {
		t.fill(rs.cos[p*half:(p+1)*half], rs.sin[p*half:(p+1)*half], p)
	}
	t.snap.Store(rs)
	return rs
}

// fill writes cos and sin [Dim/2] for position p.
func (t *ropeTable) fill(cos, sin []float32, p int) {
	fp := float32(p)
	for i, f := range t.inv {
		a := float64(f * fp) // float32 product, as inv_freq @ position_ids
		cos[i] = float32(math.Cos(a)) * t.attn
		sin[i] = float32(math.Sin(a)) * t.attn
	}
}
