package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

func TestGemm(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		m, n, k int
		ct      DType
		offA    int64 // bytes A starts into its allocation (misaligned when not a multiple of 16)
	}{
		{1, 7, 3, BF16, 0},
		{37, 45, 67, BF16, 0},
		{37, 45, 67, F32, 0},
		{16, 1000, 333, F32, 0},
		{257, 513, 129, BF16, 0},
		{128, 256, 512, F32, 0},
		{1, 4096, 4096, BF16, 0},
		{33, 65, 17, F32, 2},
		{5, 96, 200, BF16, 8},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("M%d_N%d_K%d_%v_off%d", c.m, c.n, c.k, c.ct, c.offA), func(t *testing.T) {
			r := newRNG(t)
			aBits, a := randBF16(r, c.m*c.k, 1)
			bBits, b := randBF16(r, c.n*c.k, 1)
			want := make([]float64, c.m*c.n)
			for i := 0; i < c.m; i++ {
				for j := 0; j < c.n; j++ {
					var s float64
					for p := 0; p < c.k; p++ {
						s += float64(a[i*c.k+p]) * float64(b[j*c.k+p])
					}
					want[i*c.n+j] = s
				}
			}
			var got []float32
			onGPU(t, g, func(ar *arena) {
				abuf := ar.alloc(int64(2*len(aBits)) + c.offA)
				var av *Buffer
				if abuf != nil {
					var err error
					av, err = abuf.View(c.offA, int64(2*len(aBits)))
					ar.check(err)
					if err == nil {
						ar.check(Upload(ar.d, av, aBits))
					}
				}
				bbuf := put(ar, bBits)
				var cbuf *Buffer
				if c.ct == F32 {
					cbuf = put(ar, fill32(c.m*c.n, float32(math.NaN())))
				} else {
					cbuf = put(ar, bf16Fill(c.m*c.n, bf16NaN))
				}
				if ar.err != nil {
					return
				}
				ar.check(ar.d.Gemm(nil, cbuf, c.ct, av, bbuf, c.m, c.n, c.k))
				if c.ct == F32 {
					got = get[float32](ar, cbuf, c.m*c.n)
				} else {
					got = bf16ToF32s(get[uint16](ar, cbuf, c.m*c.n))
				}
			})
			tol := 1e-2
			if c.ct == F32 {
				tol = 1e-4
			}
			checkClose(t, "C", got, want, tol)
		})
	}
	_ = g.Do(func(d *Device) error {
		lt, fb, err := d.GemmStats()
		t.Logf("GEMMs so far: %d through cuBLASLt, %d through the cublasGemmEx fallback (err %v)", lt, fb, err)
		return nil
	})
}

// randF32 draws n normal float32 values times scale (not bf16-exact).
func randF32(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

// refGemm is c0 + a [m,k] · b [n,k]ᵀ in float64 (c0 nil for zero).
func refGemm(a, b, c0 []float32, m, n, k int) []float64 {
	want := make([]float64, m*n)
	for i := 0; i < m; i++ {
		for j := 0; j < n; j++ {
			var s float64
			if c0 != nil {
				s = float64(c0[i*n+j])
			}
			for p := 0; p < k; p++ {
				s += float64(a[i*k+p]) * float64(b[j*k+p])
			}
			want[i*n+j] = s
		}
	}
	return want
}

// TestGemmF32: full-FP32 GEMM against a float64 reference on inputs that are
// not bf16- or TF32-exact; 1e-5 fails a TF32 path (~3e-4 on such inputs).
func TestGemmF32(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		m, n, k int
		offA    int64 // bytes A starts into its allocation
	}{
		{1, 7, 3, 0}, {37, 45, 67, 0}, {16, 1000, 333, 0}, {128, 256, 512, 0}, {1, 4096, 4096, 0}, {33, 65, 17, 4},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("M%d_N%d_K%d_off%d", c.m, c.n, c.k, c.offA), func(t *testing.T) {
			r := newRNG(t)
			a, b := randF32(r, c.m*c.k, 1), randF32(r, c.n*c.k, 1)
			want := refGemm(a, b, nil, c.m, c.n, c.k)
			var got []float32
			onGPU(t, g, func(ar *arena) {
				abuf := ar.alloc(int64(4*len(a)) + c.offA)
				if ar.err != nil {
					return
				}
				av, err := abuf.View(c.offA, int64(4*len(a)))
				ar.check(err)
				if err != nil {
					return
				}
				ar.check(Upload(ar.d, av, a))
				bbuf, cbuf := put(ar, b), put(ar, fill32(c.m*c.n, float32(math.NaN())))
				if ar.err != nil {
					return
				}
				ar.check(ar.d.GemmF32(nil, cbuf, av, bbuf, c.m, c.n, c.k))
				got = get[float32](ar, cbuf, c.m*c.n)
			})
			checkClose(t, "C", got, want, 1e-5)
		})
	}
}

// TestGemmSplit: SplitBF16 gives exactly bf16(x) and bf16(x − hi); GemmAdd
// accumulates into C; Gemm(hi) + GemmAdd(lo) reproduces a float32 x times a
// bf16 weight to 1e-4, where hi alone is ~2e-3 off.
func TestGemmSplit(t *testing.T) {
	g := testGPU(t)
	for _, c := range []struct{ m, n, k int }{{1, 7, 3}, {37, 45, 67}, {5, 96, 200}, {64, 512, 1024}, {1, 4096, 4096}} {
		t.Run(fmt.Sprintf("M%d_N%d_K%d", c.m, c.n, c.k), func(t *testing.T) {
			r := newRNG(t)
			x := randF32(r, c.m*c.k, 1)
			wBits, w := randBF16(r, c.n*c.k, 1)
			c0 := randF32(r, c.m*c.n, 10)
			var hi, lo []uint16
			var split, hiOnly, acc []float32
			onGPU(t, g, func(ar *arena) {
				xb, wb := put(ar, x), put(ar, wBits)
				hb, lb := ar.alloc(int64(2*len(x))), ar.alloc(int64(2*len(x)))
				cs, ch := put(ar, fill32(c.m*c.n, float32(math.NaN()))), put(ar, fill32(c.m*c.n, float32(math.NaN())))
				ca := put(ar, c0)
				if ar.err != nil {
					return
				}
				ar.check(ar.d.SplitBF16(nil, hb, lb, xb, len(x)))
				ar.check(ar.d.Gemm(nil, cs, F32, hb, wb, c.m, c.n, c.k))
				ar.check(ar.d.GemmAdd(nil, cs, F32, lb, wb, c.m, c.n, c.k))
				ar.check(ar.d.Gemm(nil, ch, F32, hb, wb, c.m, c.n, c.k))
				ar.check(ar.d.GemmAdd(nil, ca, F32, hb, wb, c.m, c.n, c.k))
				hi, lo = get[uint16](ar, hb, len(x)), get[uint16](ar, lb, len(x))
				split, hiOnly, acc = get[float32](ar, cs, c.m*c.n), get[float32](ar, ch, c.m*c.n), get[float32](ar, ca, c.m*c.n)
			})
			for i, v := range x {
				wh := tensor.F32ToBF16(v)
				wl := tensor.F32ToBF16(v - tensor.BF16ToF32(wh))
				if hi[i] != wh || lo[i] != wl {
					t.Fatalf("x[%d] = %v: hi, lo = %#04x, %#04x, want %#04x, %#04x", i, v, hi[i], lo[i], wh, wl)
				}
			}
			want := refGemm(x, w, nil, c.m, c.n, c.k)
			checkClose(t, "hi·wᵀ + lo·wᵀ", split, want, 1e-4)
			checkClose(t, "hi·wᵀ alone (logged for comparison)", hiOnly, want, 2e-2)
			checkClose(t, "c0 + hi·wᵀ (GemmAdd)", acc, refGemm(bf16ToF32s(hi), w, c0, c.m, c.n, c.k), 1e-4)
		})
	}
}

func (t DType) String() string {
	if t == F32 {
		return "f32"
	}
	return "bf16"
}

func fill32(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func TestRMSNorm(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		rows, cols, group int
		inPlace           bool
		eps               float32
	}{
		{3, 4096, 4096, false, 1e-6},
		{7, 5 * 128, 128, false, 1e-6},
		{5, 2 * 1100, 1100, false, 1e-5},
		{33, 97, 97, false, 1e-5},
		{1, 3000, 3000, true, 1e-6},
		{4, 3 * 64, 64, true, 1e-6},
		{9, 2 * 2880, 2880, false, 1e-5},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("r%d_c%d_g%d_inplace%v", c.rows, c.cols, c.group, c.inPlace), func(t *testing.T) {
			r := newRNG(t)
			xBits, x := randBF16(r, c.rows*c.cols, 1.5)
			wBits := make([]uint16, c.group)
			w := make([]float32, c.group)
			for i := range wBits {
				wBits[i] = tensor.F32ToBF16(float32(1 + 0.2*r.NormFloat64()))
				w[i] = tensor.BF16ToF32(wBits[i])
			}
			want := make([]float64, len(x))
			for s := 0; s < len(x)/c.group; s++ {
				seg := x[s*c.group : (s+1)*c.group]
				var ss float64
				for _, v := range seg {
					ss += float64(v) * float64(v)
				}
				inv := 1 / math.Sqrt(ss/float64(c.group)+float64(c.eps))
				for j, v := range seg {
					want[s*c.group+j] = float64(v) * inv * float64(w[j])
				}
			}
			var got []float32
			onGPU(t, g, func(a *arena) {
				xb, wb := put(a, xBits), put(a, wBits)
				out := xb
				if !c.inPlace {
					out = put(a, bf16Fill(len(x), bf16NaN))
				}
				if a.err != nil {
					return
				}
				a.check(a.d.RMSNorm(nil, out, xb, wb, c.rows, c.cols, c.group, c.eps))
				got = bf16ToF32s(get[uint16](a, out, len(x)))
			})
			checkClose(t, "out", got, want, 1e-2)
		})
	}
}

func TestAddRMSNorm(t *testing.T) {
	g := testGPU(t)
	for _, c := range []struct{ rows, cols int }{{3, 4096}, {5, 2880}, {1, 97}, {17, 7168}, {2, 1}} {
		t.Run(fmt.Sprintf("r%d_c%d", c.rows, c.cols), func(t *testing.T) {
			r := newRNG(t)
			const eps = 1e-6
			residBits, resid := randBF16(r, c.rows*c.cols, 3)
			xBits, x := randBF16(r, c.rows*c.cols, 1)
			wBits, w := randBF16(r, c.cols, 0.3)
			wantResid := make([]uint16, len(resid))
			want := make([]float64, len(resid))
			for i := 0; i < c.rows; i++ {
				var ss float64
				for j := 0; j < c.cols; j++ {
					k := i*c.cols + j
					wantResid[k] = tensor.F32ToBF16(resid[k] + x[k])
					h := float64(tensor.BF16ToF32(wantResid[k]))
					ss += h * h
				}
				inv := 1 / math.Sqrt(ss/float64(c.cols)+eps)
				for j := 0; j < c.cols; j++ {
					k := i*c.cols + j
					want[k] = float64(tensor.BF16ToF32(wantResid[k])) * inv * float64(w[j])
				}
			}
			var got []float32
			var gotResid []uint16
			onGPU(t, g, func(a *arena) {
				rb, xb, wb := put(a, residBits), put(a, xBits), put(a, wBits)
				out := put(a, bf16Fill(len(resid), bf16NaN))
				if a.err != nil {
					return
				}
				a.check(a.d.AddRMSNorm(nil, rb, xb, wb, out, c.rows, c.cols, eps))
				got = bf16ToF32s(get[uint16](a, out, len(resid)))
				gotResid = get[uint16](a, rb, len(resid))
			})
			for i := range wantResid {
				if gotResid[i] != wantResid[i] {
					t.Fatalf("resid[%d] = %#04x, want %#04x (bf16 of %v + %v)", i, gotResid[i], wantResid[i], resid[i], x[i])
				}
			}
			checkClose(t, "out", got, want, 1e-2)
		})
	}
}

func TestEmbedding(t *testing.T) {
	g := testGPU(t)
	for _, c := range []struct{ n, hidden, vocab int }{{9, 4096, 1000}, {5, 33, 77}, {1, 8, 3}, {40, 2880, 301}} {
		t.Run(fmt.Sprintf("n%d_h%d_v%d", c.n, c.hidden, c.vocab), func(t *testing.T) {
			r := newRNG(t)
			table, _ := randBF16(r, c.vocab*c.hidden, 1)
			ids := make([]int32, c.n)
			for i := range ids {
				ids[i] = int32(r.IntN(c.vocab))
			}
			if c.n > 3 { // out-of-range ids give NaN rows
				ids[1], ids[2], ids[3] = -1, int32(c.vocab), math.MaxInt32
			}
			const poison = 0x1234 // finite, so an unwritten NaN row is caught
			var got []uint16
			onGPU(t, g, func(a *arena) {
				tb, ib := put(a, table), put(a, ids)
				out := put(a, bf16Fill(c.n*c.hidden, poison))
				if a.err != nil {
					return
				}
				a.check(a.d.Embedding(nil, out, tb, ib, c.n, c.hidden, c.vocab))
				got = get[uint16](a, out, c.n*c.hidden)
			})
			for i, id := range ids {
				for j := 0; j < c.hidden; j++ {
					v := got[i*c.hidden+j]
					if id < 0 || int(id) >= c.vocab {
						if !math.IsNaN(float64(tensor.BF16ToF32(v))) {
							t.Fatalf("row %d (bad id %d) col %d = %#04x, want NaN", i, id, j, v)
						}
					} else if want := table[int(id)*c.hidden+j]; v != want {
						t.Fatalf("row %d (id %d) col %d = %#04x, want %#04x", i, id, j, v, want)
					}
				}
			}
		})
	}
}

func sigmoid(z float64) float64 { return 1 / (1 + math.Exp(-z)) }

func TestSwiGLU(t *testing.T) {
	g := testGPU(t)
	type variant struct {
		name        string
		clamped     bool
		interleaved bool
	}
	const alpha, limit = 1.702, 7.0
	for _, v := range []variant{{"silu", false, false}, {"oss", true, false}, {"oss_interleaved", true, true}} {
		for _, c := range []struct{ t, i int }{{7, 1000}, {1, 1}, {33, 2880}, {4, 4097}} {
			t.Run(fmt.Sprintf("%s_T%d_I%d", v.name, c.t, c.i), func(t *testing.T) {
				r := newRNG(t)
				scale := 2.0
				if v.clamped {
					scale = 6 // reaches both clamps
				}
				inBits, in := randBF16(r, 2*c.t*c.i, scale)
				want := make([]float64, c.t*c.i)
				for row := 0; row < c.t; row++ {
					for j := 0; j < c.i; j++ {
						base := row * 2 * c.i
						gate, up := float64(in[base+j]), float64(in[base+c.i+j])
						if v.interleaved {
							gate, up = float64(in[base+2*j]), float64(in[base+2*j+1])
						}
						var o float64
						if v.clamped {
							gate = math.Min(gate, limit)
							up = math.Max(math.Min(up, limit), -limit)
							o = (up + 1) * gate * sigmoid(alpha*gate)
						} else {
							o = gate * sigmoid(gate) * up
						}
						want[row*c.i+j] = o
					}
				}
				var got []float32
				onGPU(t, g, func(a *arena) {
					ib := put(a, inBits)
					out := put(a, bf16Fill(c.t*c.i, bf16NaN))
					if a.err != nil {
						return
					}
					if v.clamped {
						a.check(a.d.SwiGLUClamped(nil, out, ib, c.t, c.i, alpha, limit, v.interleaved))
					} else {
						a.check(a.d.SwiGLU(nil, out, ib, c.t, c.i))
					}
					got = bf16ToF32s(get[uint16](a, out, c.t*c.i))
				})
				checkClose(t, "out", got, want, 1e-2)
			})
		}
	}
}

func TestRoPE(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		t, heads, headDim, rotDim int
		style                     RoPEStyle
		attn                      float32
	}{
		{9, 5, 64, 64, RoPENeoX, 1},
		{9, 5, 64, 64, RoPEInterleaved, 1},
		{3, 4, 64, 32, RoPENeoX, 1.25},
		{3, 4, 64, 32, RoPEInterleaved, 1.25},
		{17, 3, 80, 80, RoPENeoX, 1},
		{1, 1, 6, 2, RoPEInterleaved, 0.9},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("T%d_h%d_d%d_rot%d_style%d", c.t, c.heads, c.headDim, c.rotDim, c.style), func(t *testing.T) {
			r := newRNG(t)
			half := c.rotDim / 2
			inv := make([]float32, half)
			for j := range inv {
				inv[j] = float32(math.Pow(10000, -2*float64(j)/float64(c.rotDim)))
			}
			pos := make([]int32, c.t)
			for i := range pos {
				pos[i] = int32(r.IntN(100000))
			}
			pos[0] = 0
			xBits, x := randBF16(r, c.t*c.heads*c.headDim, 1)
			want := make([]float64, len(x))
			for i := range x {
				want[i] = float64(x[i])
			}
			for row := 0; row < c.t; row++ {
				for h := 0; h < c.heads; h++ {
					base := (row*c.heads + h) * c.headDim
					for j := 0; j < half; j++ {
						ang := float64(float32(pos[row]) * inv[j])
						cs, sn := math.Cos(ang)*float64(c.attn), math.Sin(ang)*float64(c.attn)
						i1, i2 := base+j, base+j+half
						if c.style == RoPEInterleaved {
							i1, i2 = base+2*j, base+2*j+1
						}
						x1, x2 := float64(x[i1]), float64(x[i2])
						want[i1] = x1*cs - x2*sn
						want[i2] = x2*cs + x1*sn
					}
				}
			}
			var got []uint16
			onGPU(t, g, func(a *arena) {
				xb, pb, ib := put(a, xBits), put(a, pos), put(a, inv)
				if a.err != nil {
					return
				}
				a.check(a.d.RoPE(nil, xb, pb, c.t, c.heads, c.headDim, c.rotDim, c.style, ib, c.attn))
				got = get[uint16](a, xb, len(x))
			})
			// Dims past rotDim stay bit-for-bit; rotated ones match to bf16 rounding.
			for row := 0; row < c.t; row++ {
				for h := 0; h < c.heads; h++ {
					for j := c.rotDim; j < c.headDim; j++ {
						k := (row*c.heads+h)*c.headDim + j
						if got[k] != xBits[k] {
							t.Fatalf("row %d head %d dim %d (not rotated) changed: %#04x, was %#04x", row, h, j, got[k], xBits[k])
						}
					}
				}
			}
			checkClose(t, "x", bf16ToF32s(got), want, 1e-2)
		})
	}
}

// TestConvert: f32→bf16 (RN, specials included) and bf16→f32, bit for bit,
// at lengths with and without a tail of the 8-value vector steps, and on
// views off by a few elements (the unaligned, scalar path).
func TestConvert(t *testing.T) {
	g := testGPU(t)
	for _, c := range []struct{ n, off int }{{1, 0}, {1001, 0}, {1<<20 + 3, 0}, {4096, 0}, {1001, 1}, {4099, 3}} {
		n, off := c.n, c.off
		t.Run(fmt.Sprintf("%d_off%d", n, off), func(t *testing.T) {
			r := newRNG(t)
			src := make([]float32, n)
			for i := range src {
				src[i] = float32(r.NormFloat64() * math.Pow(10, 60*r.Float64()-30))
			}
			special := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 0,
				float32(math.Copysign(0, -1)), math.MaxFloat32, math.SmallestNonzeroFloat32, 1.00390625, 1.01171875}
			for i, v := range special {
				if i < n {
					src[n-1-i] = v
				}
			}
			bsrc := make([]uint16, n)
			for i := range bsrc {
				bsrc[i] = uint16(r.Uint32())
			}
			var toBF []uint16
			var toF []float32
			onGPU(t, g, func(a *arena) {
				fs, bs := put(a, append(make([]float32, off), src...)), put(a, bsrc)
				bo, fo := put(a, bf16Fill(n+off, bf16NaN)), put(a, fill32(n, float32(math.NaN())))
				if a.err != nil {
					return
				}
				if off > 0 { // views off by off elements: the scalar path
					var err error
					if fs, err = fs.View(int64(4*off), int64(4*n)); err != nil {
						a.err = err
						return
					}
					if bo, err = bo.View(int64(2*off), int64(2*n)); err != nil {
						a.err = err
						return
					}
				}
				a.check(a.d.ConvertF32ToBF16(nil, bo, fs, n))
				a.check(a.d.ConvertBF16ToF32(nil, fo, bs, n))
				toBF = get[uint16](a, bo, n)
				toF = get[float32](a, fo, n)
			})
			for i, v := range src {
				want := tensor.F32ToBF16(v)
				isNaN := math.IsNaN(float64(v))
				if gotNaN := math.IsNaN(float64(tensor.BF16ToF32(toBF[i]))); isNaN != gotNaN || (!isNaN && toBF[i] != want) {
					t.Fatalf("f32→bf16 of %g (%#08x) = %#04x, want %#04x", v, math.Float32bits(v), toBF[i], want)
				}
			}
			for i, b := range bsrc {
				want := tensor.BF16ToF32(b)
				if math.IsNaN(float64(want)) {
					if !math.IsNaN(float64(toF[i])) {
						t.Fatalf("bf16→f32 of NaN %#04x = %g", b, toF[i])
					}
				} else if math.Float32bits(toF[i]) != math.Float32bits(want) {
					t.Fatalf("bf16→f32 of %#04x = %#08x, want %#08x", b, math.Float32bits(toF[i]), math.Float32bits(want))
				}
			}
		})
	}
}

// TestGemmHeads: a Linear per head against float64, bf16 and float32
// operands, overwriting and accumulating, shapes of MLA's absorbed
// projections (q_nope·W_UK: K 128 → N 512; latent outputs through W_UV:
// K 512 → N 128) and odd ones.
func TestGemmHeads(t *testing.T) {
	g := testGPU(t)
	for _, c := range []struct {
		m, n, k, heads int
		abt            DType
		acc            bool
	}{
		{1, 512, 128, 128, BF16, false},
		{3, 128, 512, 16, BF16, false},
		{37, 24, 40, 4, BF16, true},
		{5, 17, 9, 3, F32, false},
		{64, 32, 16, 8, F32, true},
	} {
		t.Run(fmt.Sprintf("M%d_N%d_K%d_H%d_%v_acc%v", c.m, c.n, c.k, c.heads, c.abt, c.acc), func(t *testing.T) {
			r := newRNG(t)
			aBits, a := randBF16(r, c.m*c.heads*c.k, 1)
			bBits, b := randBF16(r, c.heads*c.n*c.k, 1)
			c0 := randF32(r, c.m*c.heads*c.n, 1)
			want := make([]float64, len(c0))
			for i := range c.m {
				for h := range c.heads {
					for j := range c.n {
						var s float64
						if c.acc {
							s = float64(c0[(i*c.heads+h)*c.n+j])
						}
						for p := range c.k {
							s += float64(a[(i*c.heads+h)*c.k+p]) * float64(b[(h*c.n+j)*c.k+p])
						}
						want[(i*c.heads+h)*c.n+j] = s
					}
				}
			}
			var got []float32
			onGPU(t, g, func(ar *arena) {
				var abuf, bbuf *Buffer
				if c.abt == F32 {
					abuf, bbuf = put(ar, a), put(ar, b)
				} else {
					abuf, bbuf = put(ar, aBits), put(ar, bBits)
				}
				init := c0
				if !c.acc {
					init = fill32(len(c0), float32(math.NaN()))
				}
				cbuf := put(ar, init)
				if ar.err != nil {
					return
				}
				ar.check(ar.d.GemmHeads(nil, cbuf, c.abt, abuf, bbuf, c.m, c.n, c.k, c.heads, c.acc))
				got = get[float32](ar, cbuf, len(c0))
			})
			tol := 1e-4
			if c.abt == BF16 {
				tol = 1e-3 // float32 accumulation of exact bf16 products
			}
			checkClose(t, "C", got, want, tol)
		})
	}
	onGPU(t, g, func(ar *arena) {
		b := put(ar, make([]float32, 8))
		if err := ar.d.GemmHeads(nil, b, F32, b, b, 1, 2, 2, 3, false); err == nil {
			t.Error("GemmHeads with too small buffers: no error")
		}
	})
}

// TestCopyColsF32: strided column copies against a Go reference, bit for
// bit, with every other destination element left as it was (NaN-poisoned):
// the four-wide row kernel (widths, strides and offsets multiples of 4),
// the one-wide row kernel (a width, an offset or a view off by one), a
// broadcast source head (SrcHead 0), and views whose pointers are not
// 16-byte aligned — into float32 (CopyColsF32) and into bf16, each value
// rounded to nearest even (CopyColsBF16).
func TestCopyColsF32(t *testing.T) {
	g := testGPU(t)
	cases := []struct {
		name    string
		c       ColCopy
		dstView int // elements the destination view starts in (0: none)
	}{
		{"v4", ColCopy{Rows: 37, Heads: 5, Width: 8, DstLd: 64, DstOff: 4, DstHead: 12, SrcLd: 40, SrcOff: 0, SrcHead: 8}, 0},
		{"v4_broadcast", ColCopy{Rows: 9, Heads: 128, Width: 64, DstLd: 128 * 192, DstOff: 128, DstHead: 192, SrcLd: 64, SrcOff: 0, SrcHead: 0}, 0},
		{"odd_width", ColCopy{Rows: 11, Heads: 3, Width: 6, DstLd: 20, DstOff: 2, DstHead: 6, SrcLd: 18, SrcOff: 0, SrcHead: 6}, 0},
		{"odd_offset", ColCopy{Rows: 7, Heads: 4, Width: 8, DstLd: 40, DstOff: 1, DstHead: 9, SrcLd: 32, SrcOff: 0, SrcHead: 8}, 0},
		{"unaligned_view", ColCopy{Rows: 5, Heads: 2, Width: 16, DstLd: 32, DstOff: 0, DstHead: 16, SrcLd: 32, SrcOff: 0, SrcHead: 16}, 1},
		{"one_row", ColCopy{Rows: 1, Heads: 128, Width: 128, DstLd: 128 * 256, DstOff: 0, DstHead: 256, SrcLd: 128 * 128, SrcOff: 0, SrcHead: 128}, 0},
	}
	for _, tc := range cases {
		for _, out := range []DType{F32, BF16} {
			t.Run(fmt.Sprintf("%s_%v", tc.name, out), func(t *testing.T) {
				r := newRNG(t)
				c := tc.c
				end := func(ld, off, hs int) int { return (c.Rows-1)*ld + (c.Heads-1)*hs + off + c.Width }
				nd, ns := end(c.DstLd, c.DstOff, c.DstHead), end(c.SrcLd, c.SrcOff, c.SrcHead)
				src := randF32(r, ns, 3)
				want := fill32(nd, float32(math.NaN()))
				for row := 0; row < c.Rows; row++ {
					for h := 0; h < c.Heads; h++ {
						for k := 0; k < c.Width; k++ {
							v := src[row*c.SrcLd+h*c.SrcHead+c.SrcOff+k]
							if out == BF16 {
								v = tensor.BF16ToF32(tensor.F32ToBF16(v))
							}
							want[row*c.DstLd+h*c.DstHead+c.DstOff+k] = v
						}
					}
				}
				got := make([]float32, nd)
				onGPU(t, g, func(a *arena) {
					var dst *Buffer
					size := int64(4)
					if out == BF16 {
						dst, size = put(a, bf16Fill(nd+tc.dstView, bf16NaN)), 2
					} else {
						dst = put(a, fill32(nd+tc.dstView, float32(math.NaN())))
					}
					sb := put(a, src)
					if a.err != nil {
						return
					}
					dv := dst
					if tc.dstView > 0 {
						var err error
						if dv, err = dst.View(size*int64(tc.dstView), size*int64(nd)); err != nil {
							a.err = err
							return
						}
					}
					if out == BF16 {
						a.check(a.d.CopyColsBF16(nil, dv, sb, c))
						for i, b := range get[uint16](a, dst, nd+tc.dstView)[tc.dstView:] {
							got[i] = tensor.BF16ToF32(b)
						}
						return
					}
					a.check(a.d.CopyColsF32(nil, dv, sb, c))
					copy(got, get[float32](a, dst, nd+tc.dstView)[tc.dstView:])
				})
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
						t.Fatalf("element %d: %g, want %g", i, got[i], want[i])
					}
				}
			})
		}
	}
}
