package kernels

import (
	"fmt"
	"math"
	"testing"
)

// TestNormRoPEF32: the fused per-head RMSNorm + RoPE against the two
// kernels it replaces (RMSNormF32 with group = headDim, then RoPEF32) and a
// float64 reference, on fresh random inputs with NaN-poisoned outputs:
// both styles, partial rotary, an attention factor, head dims that are not
// multiples of 32, and no norm (w nil).
func TestNormRoPEF32(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		t, heads, headDim, rotDim int
		style                     RoPEStyle
		attn                      float32
		norm                      bool
	}{
		{1, 32, 128, 128, RoPENeoX, 1, true},
		{5, 4, 128, 64, RoPEInterleaved, 1.25, true},
		{3, 8, 64, 64, RoPENeoX, 1, false},
		{2, 2, 256, 256, RoPENeoX, 1, true},
		{7, 3, 80, 80, RoPENeoX, 0.9, true},
		{4, 5, 96, 32, RoPENeoX, 1, true},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("T%d_h%d_d%d_rot%d_style%d_norm%v", c.t, c.heads, c.headDim, c.rotDim, c.style, c.norm), func(t *testing.T) {
			r := newRNG(t)
			const eps = 1e-6
			half := c.rotDim / 2
			inv := make([]float32, half)
			for j := range inv {
				inv[j] = float32(math.Pow(1e6, -2*float64(j)/float64(c.rotDim)))
			}
			pos := make([]int32, c.t)
			for i := range pos {
				pos[i] = int32(r.IntN(40000))
			}
			n := c.t * c.heads * c.headDim
			x := randF32(r, n, 2)
			w := randF32(r, c.headDim, 0.5)
			// float64 reference: norm per head, then the rotation.
			want := make([]float64, n)
			for rh := 0; rh < c.t*c.heads; rh++ {
				seg := x[rh*c.headDim : (rh+1)*c.headDim]
				v := make([]float64, c.headDim)
				ss := 0.0
				for _, a := range seg {
					ss += float64(a) * float64(a)
				}
				inv2 := 1 / math.Sqrt(ss/float64(c.headDim)+eps)
				for j, a := range seg {
					v[j] = float64(a)
					if c.norm {
						v[j] = float64(w[j]) * float64(a) * inv2
					}
				}
				o := want[rh*c.headDim : (rh+1)*c.headDim]
				copy(o, v)
				ang0 := float64(pos[rh/c.heads])
				for j := 0; j < half; j++ {
					ang := float64(float32(ang0) * inv[j])
					cs, sn := math.Cos(ang)*float64(c.attn), math.Sin(ang)*float64(c.attn)
					i1, i2 := j, j+half
					if c.style == RoPEInterleaved {
						i1, i2 = 2*j, 2*j+1
					}
					o[i1] = v[i1]*cs - v[i2]*sn
					o[i2] = v[i2]*cs + v[i1]*sn
				}
			}
			var got, two []float32
			onGPU(t, g, func(a *arena) {
				xb, pb, ib, wb := put(a, x), put(a, pos), put(a, inv), put(a, w)
				out, ref := put(a, f32Fill(n, float32(math.NaN()))), put(a, f32Fill(n, float32(math.NaN())))
				if a.err != nil {
					return
				}
				var wArg *Buffer
				if c.norm {
					wArg = wb
					a.check(a.d.RMSNormF32(nil, ref, xb, wb, c.t*c.heads, c.headDim, c.headDim, eps))
				} else {
					a.check(a.d.Copy(ref, xb, int64(n)*4))
				}
				a.check(a.d.RoPEF32(nil, ref, pb, c.t, c.heads, c.headDim, c.rotDim, c.style, ib, c.attn))
				a.check(a.d.NormRoPEF32(nil, out, xb, wArg, pb, c.t, c.heads, c.headDim, c.rotDim, c.style, ib, c.attn, eps))
				got, two = get[float32](a, out, n), get[float32](a, ref, n)
			})
			checkClose(t, "fused vs float64", got, want, 1e-5)
			two64 := make([]float64, n)
			for i, v := range two {
				two64[i] = float64(v)
			}
			checkClose(t, "fused vs RMSNormF32 + RoPEF32", got, two64, 1e-6)
		})
	}
	// Bad shapes are errors, not launches.
	onGPU(t, g, func(a *arena) {
		buf := a.alloc(1 << 20)
		if a.err != nil {
			return
		}
		for _, s := range [][3]int{{4, 257, 2}, {4, 64, 65}, {4, 64, 3}} {
			if err := a.d.NormRoPEF32(nil, buf, buf, nil, buf, 1, s[0], s[1], s[2], RoPENeoX, buf, 1, 1e-6); err == nil {
				t.Errorf("heads %d headDim %d rotDim %d: no error", s[0], s[1], s[2])
			}
		}
	})
}
