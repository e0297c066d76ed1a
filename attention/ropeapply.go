package attention

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/mkserve/mkserve/internal/par"
)

// maxCachedPos bounds the cos/sin tables: positions from maxCachedPos on are
// computed per call instead of cached. Tables are built in blocks of
// ropeBlock positions on first use, so memory follows the positions seen.
var maxCachedPos = 1 << 20

// ropeBlock is the number of positions per cached table block.
const ropeBlock = 256

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
	half := r.Dim / 2
	width := heads * headDim
	grain := max(1, (1<<14)/(heads*half)) // rows per task: ~16k rotations
	par.For(rows, grain, func() func(lo, hi int) {
		var cs, sn []float32 // scratch for uncached positions
		return func(lo, hi int) {
			for i := lo; i < hi; i++ {
				p := int(pos[i])
				var c, s []float32
				if p < len(t.blocks)*ropeBlock {
					b, off := t.block(p/ropeBlock), p%ropeBlock*half
					c, s = b.cos[off:off+half], b.sin[off:off+half]
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

// ropeTable holds cos/sin for the positions below maxCachedPos (as fixed
// when the table was made), in blocks computed on first use and published
// atomically; a block never changes once published.
type ropeTable struct {
	inv    []float32 // [Dim/2]
	attn   float32
	blocks []atomic.Pointer[ropeRows]
}

// ropeRows is one block of a table.
type ropeRows struct {
	cos, sin []float32 // [ropeBlock, Dim/2], already multiplied by the attention factor
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
	t := &ropeTable{
		inv:    make([]float32, len(inv)),
		attn:   float32(attn),
		blocks: make([]atomic.Pointer[ropeRows], maxCachedPos/ropeBlock),
	}
	for i, f := range inv {
		t.inv[i] = float32(f)
	}
	got, _ := ropeTables.LoadOrStore(k, t)
	return got.(*ropeTable)
}

// block returns block b (positions b·ropeBlock …), computing it if needed.
// Concurrent first uses may both compute it; one result wins.
func (t *ropeTable) block(b int) *ropeRows {
	if rs := t.blocks[b].Load(); rs != nil {
		return rs
	}
	half := len(t.inv)
	rs := &ropeRows{cos: make([]float32, ropeBlock*half), sin: make([]float32, ropeBlock*half)}
	for i := range ropeBlock {
		t.fill(rs.cos[i*half:(i+1)*half], rs.sin[i*half:(i+1)*half], b*ropeBlock+i)
	}
	if t.blocks[b].CompareAndSwap(nil, rs) {
		return rs
	}
	return t.blocks[b].Load()
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
