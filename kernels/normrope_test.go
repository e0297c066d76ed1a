package kernels

import (
	"fmt"
	"math"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// normRoPERef is the float64 reference of NormRoPEF32 for one part: the
// norm per head (w nil: none), then the rotation at each row's position.
func normRoPERef(x, w, inv []float32, pos []int32, heads, headDim, rotDim int, style RoPEStyle, attn, eps float64) []float64 {
	half := rotDim / 2
	want := make([]float64, len(x))
	for rh := 0; rh < len(x)/headDim; rh++ {
		seg := x[rh*headDim : (rh+1)*headDim]
		v := make([]float64, headDim)
		ss := 0.0
		for _, a := range seg {
			ss += float64(a) * float64(a)
		}
		inv2 := 1 / math.Sqrt(ss/float64(headDim)+eps)
		for j, a := range seg {
			v[j] = float64(a)
			if w != nil {
				v[j] = float64(w[j]) * float64(a) * inv2
			}
		}
		o := want[rh*headDim : (rh+1)*headDim]
		copy(o, v)
		ang0 := float64(pos[rh/heads])
		for j := 0; j < half; j++ {
			ang := float64(float32(ang0) * inv[j])
			cs, sn := math.Cos(ang)*attn, math.Sin(ang)*attn
			i1, i2 := j, j+half
			if style == RoPEInterleaved {
				i1, i2 = 2*j, 2*j+1
			}
			o[i1] = v[i1]*cs - v[i2]*sn
			o[i2] = v[i2]*cs + v[i1]*sn
		}
	}
	return want
}

// TestNormRoPEF32: the fused per-head RMSNorm + RoPE of two parts in one
// launch (q and k: different head counts and weights) against a float64
// reference, exact and fast, on fresh random inputs with NaN-poisoned
// outputs: both styles, partial rotary, an attention factor, head dims that
// are not multiples of 32, no norm (w nil), one part alone; the exact form
// also against the two kernels it replaces (RMSNormF32 with group =
// headDim, then RoPEF32); the first part's bf16 copy (OutBF16) is its
// float32 output rounded to nearest even, bit for bit.
func TestNormRoPEF32(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		t, heads, heads2, headDim, rotDim int
		style                             RoPEStyle
		attn                              float32
		norm                              bool
	}{
		{1, 32, 4, 128, 128, RoPENeoX, 1, true},
		{5, 4, 2, 128, 64, RoPEInterleaved, 1.25, true},
		{3, 8, 8, 64, 64, RoPENeoX, 1, false},
		{2, 2, 1, 256, 256, RoPENeoX, 1, true},
		{7, 3, 0, 80, 80, RoPENeoX, 0.9, true},
		{4, 5, 3, 96, 32, RoPENeoX, 1, true},
		{1100, 32, 4, 128, 128, RoPENeoX, 1, true},         // 16 heads a CTA from 1024 rows
		{1030, 20, 3, 64, 48, RoPEInterleaved, 1.1, false}, // 23 heads: a partial last chunk
	}
	for _, c := range cases {
		for _, fast := range []bool{false, true} {
			name := fmt.Sprintf("T%d_h%d+%d_d%d_rot%d_style%d_norm%v_fast%v", c.t, c.heads, c.heads2, c.headDim, c.rotDim,
				c.style, c.norm, fast)
			t.Run(name, func(t *testing.T) {
				r := newRNG(t)
				const eps = 1e-6
				inv := make([]float32, c.rotDim/2)
				for j := range inv {
					inv[j] = float32(math.Pow(1e6, -2*float64(j)/float64(c.rotDim)))
				}
				pos := make([]int32, c.t)
				for i := range pos {
					pos[i] = int32(r.IntN(40000))
				}
				heads := []int{c.heads}
				if c.heads2 > 0 {
					heads = append(heads, c.heads2)
				}
				xs, ws, wants := make([][]float32, len(heads)), make([][]float32, len(heads)), make([][]float64, len(heads))
				for i, h := range heads {
					xs[i] = randF32(r, c.t*h*c.headDim, 2)
					if c.norm {
						ws[i] = randF32(r, c.headDim, 0.5)
					}
					wants[i] = normRoPERef(xs[i], ws[i], inv, pos, h, c.headDim, c.rotDim, c.style, float64(c.attn), eps)
				}
				got := make([][]float32, len(heads))
				var two []float32
				var gotB []uint16
				onGPU(t, g, func(a *arena) {
					pb, ib := put(a, pos), put(a, inv)
					parts := make([]NormRoPEPart, len(heads))
					for i, h := range heads {
						n := c.t * h * c.headDim
						parts[i] = NormRoPEPart{Out: put(a, f32Fill(n, float32(math.NaN()))), X: put(a, xs[i]), Heads: h}
						if c.norm {
							parts[i].W = put(a, ws[i])
						}
					}
					n0 := c.t * c.heads * c.headDim
					parts[0].OutBF16 = put(a, bf16Fill(n0, 0x7fc1)) // NaN
					ref := put(a, f32Fill(n0, float32(math.NaN())))
					if a.err != nil {
						return
					}
					if c.norm {
						a.check(a.d.RMSNormF32(nil, ref, parts[0].X, parts[0].W, c.t*c.heads, c.headDim, c.headDim, eps))
					} else {
						a.check(a.d.Copy(ref, parts[0].X, int64(n0)*4))
					}
					a.check(a.d.RoPEF32(nil, ref, pb, c.t, c.heads, c.headDim, c.rotDim, c.style, ib, c.attn))
					a.check(a.d.NormRoPEF32(nil, parts, pb, c.t, c.headDim, c.rotDim, c.style, ib, c.attn, eps, fast))
					for i, h := range heads {
						got[i] = get[float32](a, parts[i].Out, c.t*h*c.headDim)
					}
					two = get[float32](a, ref, n0)
					gotB = get[uint16](a, parts[0].OutBF16, n0)
				})
				for i, v := range got[0] {
					if want := tensor.F32ToBF16(v); gotB[i] != want {
						t.Fatalf("OutBF16[%d] = %#04x, want %#04x (float32 %g rounded)", i, gotB[i], want, v)
					}
				}
				for i := range heads {
					checkClose(t, fmt.Sprintf("part %d vs float64", i), got[i], wants[i], 1e-5)
				}
				if !fast {
					two64 := make([]float64, len(two))
					for i, v := range two {
						two64[i] = float64(v)
					}
					checkClose(t, "part 0 vs RMSNormF32 + RoPEF32", got[0], two64, 1e-6)
				}
			})
		}
	}
	// Bad shapes are errors, not launches.
	onGPU(t, g, func(a *arena) {
		buf := a.alloc(1 << 20)
		if a.err != nil {
			return
		}
		for _, s := range [][3]int{{4, 257, 2}, {4, 64, 65}, {4, 64, 3}, {0, 64, 64}} {
			parts := []NormRoPEPart{{Out: buf, X: buf, Heads: s[0]}}
			if err := a.d.NormRoPEF32(nil, parts, buf, 1, s[1], s[2], RoPENeoX, buf, 1, 1e-6, false); err == nil {
				t.Errorf("heads %d headDim %d rotDim %d: no error", s[0], s[1], s[2])
			}
		}
		second := []NormRoPEPart{{Out: buf, X: buf, Heads: 1}, {Out: buf, X: buf, Heads: 1, OutBF16: buf}}
		if err := a.d.NormRoPEF32(nil, second, buf, 1, 64, 64, RoPENeoX, buf, 1, 1e-6, true); err == nil {
			t.Errorf("OutBF16 on the second part: no error")
		}
		three := []NormRoPEPart{{Out: buf, X: buf, Heads: 1}, {Out: buf, X: buf, Heads: 1}, {Out: buf, X: buf, Heads: 1}}
		for _, parts := range [][]NormRoPEPart{nil, three} {
			if err := a.d.NormRoPEF32(nil, parts, buf, 1, 64, 64, RoPENeoX, buf, 1, 1e-6, true); err == nil {
				t.Errorf("%d parts: no error", len(parts))
			}
		}
	})
}
