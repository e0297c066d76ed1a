package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/tensor"
)

// TestWeight converts random BF16, F16 and F32 host tensors whose values are
// built from sign, exponent and mantissa here, independently of package tensor.
func TestWeight(t *testing.T) {
	r := newRand(t)
	type enc func(i int) (bits []byte, want float64)
	bf16 := func(int) ([]byte, float64) {
		s, e, m := r.IntN(2), r.IntN(60)-30, r.IntN(128)
		v := math.Ldexp(1+float64(m)/128, e)
		if s == 1 {
			v = -v
		}
		return binary.LittleEndian.AppendUint16(nil, uint16(s<<15|(e+127)<<7|m)), v
	}
	f16 := func(i int) ([]byte, float64) {
		s, m := r.IntN(2), r.IntN(1024)
		var v float64
		var bits int
		if i%5 == 0 { // subnormal
			v, bits = math.Ldexp(float64(m)/1024, -14), s<<15|m
		} else {
			e := r.IntN(30) - 14
			v, bits = math.Ldexp(1+float64(m)/1024, e), s<<15|(e+15)<<10|m
		}
		if s == 1 {
			v = -v
		}
		return binary.LittleEndian.AppendUint16(nil, uint16(bits)), v
	}
	f32 := func(int) ([]byte, float64) {
		v := float32(r.NormFloat64() * 100)
		return binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)), float64(v)
	}
	cases := []struct {
		dtype     tensor.DType
		enc       enc
		shape     []int
		wantShape []int
	}{
		{tensor.BF16, bf16, []int{7, 5}, []int{7, 5}},
		{tensor.F16, f16, []int{3, 4, 6}, []int{12, 6}},
		{tensor.F32, f32, []int{9}, []int{9}},
		{tensor.BF16, bf16, []int{2, 3, 2, 4}, []int{12, 4}},
		{tensor.F16, f16, []int{}, []int{1}},
		// Big enough to be converted in several chunks.
		{tensor.BF16, bf16, []int{3, weightChunk/2 + 5}, []int{3, weightChunk/2 + 5}},
	}
	be := New(Options{})
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s%v", c.dtype, c.shape), func(t *testing.T) {
			n := tensor.NumElements(c.shape)
			var raw []byte
			want := make([]float64, n)
			for i := range want {
				var b []byte
				b, want[i] = c.enc(i)
				raw = append(raw, b...)
			}
			w, err := be.Weight(&tensor.Host{Name: "w", DType: c.dtype, Shape: c.shape, Data: raw})
			if err != nil {
				t.Fatal(err)
			}
			checkShape(t, "weight", w, c.wantShape...)
			checkClose(t, "weight", data(t, w), want, 0)
		})
	}
}

func TestWeightErrors(t *testing.T) {
	be := New(Options{})
	for _, c := range []struct {
		name string
		h    *tensor.Host
		want string
	}{
		{"nil", nil, "nil host tensor"},
		{"dtype", &tensor.Host{Name: "w.q", DType: tensor.I8, Shape: []int{2}, Data: []byte{1, 2}}, `"w.q": dtype I8`},
		{"bytes", &tensor.Host{Name: "w.b", DType: tensor.BF16, Shape: []int{2, 2}, Data: make([]byte, 6)}, `"w.b": 6 bytes`},
		{"negative", &tensor.Host{Name: "w.n", DType: tensor.F32, Shape: []int{-1, 2}}, `"w.n": negative`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := be.Weight(c.h)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one mentioning %s", err, c.want)
			}
		})
	}
}

func TestToHostCopies(t *testing.T) {
	r := newRand(t)
	x := randT(r, 3, 4)
	h := New(Options{}).ToHost(x)
	want := f64(x.Data())
	h[0] += 1
	checkClose(t, "tensor after ToHost write", x.Data(), want, 0)
}

func TestEmbed(t *testing.T) {
	r := newRand(t)
	be := New(Options{})
	table := randT(r, 11, 6)
	ids := []int32{3, 0, 10, 3, 7}
	got := be.Embed(table, ids)
	checkShape(t, "embed", got, 5, 6)
	var want []float64
	for _, id := range ids {
		want = append(want, f64(table.Data()[int(id)*6:int(id)*6+6])...)
	}
	checkClose(t, "embed", data(t, got), want, 0)
	mustPanic(t, "cpu.Embed: ids[1] = 11", func() { be.Embed(table, []int32{0, 11}) })
	mustPanic(t, "cpu.Embed: ids[0] = -1", func() { be.Embed(table, []int32{-1}) })
}

func TestLinear(t *testing.T) {
	be := New(Options{})
	for _, c := range []struct {
		T, N, K int
		bias    bool
	}{{1, 1, 1, false}, {1, 33, 17, true}, {5, 7, 64, false}, {9, 40, 100, true}, {64, 96, 80, true}} {
		t.Run(fmt.Sprintf("T%d_N%d_K%d_bias%v", c.T, c.N, c.K, c.bias), func(t *testing.T) {
			r := newRand(t)
			x, w := randT(r, c.T, c.K), randT(r, c.N, c.K)
			var b *Tensor
			var bv []float32
			if c.bias {
				b = FromFloat32([]int{c.N}, randVec(r, c.N, 1))
				bv = b.Data()
			}
			xin := slices.Clone(x.Data())
			var got backend.Tensor
			if b != nil {
				got = be.Linear(x, w, b)
			} else {
				got = be.Linear(x, w, nil)
			}
			checkShape(t, "linear", got, c.T, c.N)
			checkClose(t, "linear", data(t, got), refLinear(x.Data(), w.Data(), bv, c.T, c.N, c.K), 1e-5)
			checkClose(t, "input after linear", x.Data(), f64(xin), 0)
		})
	}
	r := newRand(t)
	mustPanic(t, "cpu.Linear: x has shape [2 5], want 4 columns", func() { be.Linear(randT(r, 2, 5), randT(r, 3, 4), nil) })
	mustPanic(t, "cpu.Linear: bias has shape [4], want [3]", func() {
		be.Linear(randT(r, 2, 4), randT(r, 3, 4), FromFloat32([]int{4}, randVec(r, 4, 1)))
	})
}

func TestRMSNorm(t *testing.T) {
	be := New(Options{})
	for _, c := range []struct {
		T, G, n int
		eps     float32
		scale   float32
	}{{1, 1, 8, 1e-6, 3}, {3, 1, 100, 0.05, 0.2}, {5, 4, 16, 1e-5, 3}, {40, 8, 128, 1e-6, 1}} {
		t.Run(fmt.Sprintf("T%d_G%d_n%d", c.T, c.G, c.n), func(t *testing.T) {
			r := newRand(t)
			eps := float64(c.eps)
			x := FromFloat32([]int{c.T, c.G * c.n}, randVec(r, c.T*c.G*c.n, c.scale))
			w := FromFloat32([]int{c.n}, randVec(r, c.n, 2))
			got := be.RMSNorm(x, w, c.eps)
			checkShape(t, "rmsnorm", got, c.T, c.G*c.n)
			want := make([]float64, c.T*c.G*c.n)
			for g := 0; g < c.T*c.G; g++ {
				xs := x.Data()[g*c.n : (g+1)*c.n]
				ss := 0.0
				for _, v := range xs {
					ss += float64(v) * float64(v)
				}
				rs := 1 / math.Sqrt(ss/float64(c.n)+eps)
				for i, v := range xs {
					want[g*c.n+i] = float64(v) * rs * float64(w.Data()[i])
				}
			}
			checkClose(t, "rmsnorm", data(t, got), want, 1e-6)
		})
	}
	r := newRand(t)
	mustPanic(t, "cpu.RMSNorm: x has shape [2 10], not a multiple of len(w) = 4", func() {
		be.RMSNorm(randT(r, 2, 10), FromFloat32([]int{4}, randVec(r, 4, 1)), 1e-5)
	})
}

func TestElementwise(t *testing.T) {
	be := New(Options{})
	for _, n := range []int{1, 17, 300, parallelMin + 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			r := newRand(t)
			a := FromFloat32([]int{n}, randVec(r, n, 4))
			b := FromFloat32([]int{n}, randVec(r, n, 4))
			sum := make([]float64, n)
			clamped := make([]float64, n)
			for i := range sum {
				sum[i] = float64(a.Data()[i] + b.Data()[i])
				clamped[i] = math.Max(-1.5, math.Min(1.5, float64(a.Data()[i])))
			}
			checkClose(t, "add", data(t, be.Add(a, b)), sum, 0)
			checkClose(t, "clamp", data(t, be.Clamp(a, 1.5)), clamped, 0)
		})
	}
	nan := float32(math.NaN())
	got := data(t, be.Clamp(FromFloat32([]int{1, 4}, []float32{nan, float32(math.Inf(1)), -9, 0.5}), 2))
	if !math.IsNaN(float64(got[0])) || got[1] != 2 || got[2] != -2 || got[3] != 0.5 {
		t.Fatalf("clamp of NaN, +Inf, -9, 0.5 to 2 = %v", got)
	}
	r := newRand(t)
	mustPanic(t, "cpu.Add: shapes [2 3] and [3 2] differ", func() { be.Add(randT(r, 2, 3), randT(r, 3, 2)) })
}

func TestSwiGLU(t *testing.T) {
	be := New(Options{})
	for _, c := range []struct{ T, I int }{{1, 1}, {3, 7}, {50, 700}} {
		t.Run(fmt.Sprintf("T%d_I%d", c.T, c.I), func(t *testing.T) {
			r := newRand(t)
			x := FromFloat32([]int{c.T, 2 * c.I}, randVec(r, c.T*2*c.I, 6))
			got := be.SwiGLU(x)
			checkShape(t, "swiglu", got, c.T, c.I)
			want := make([]float64, c.T*c.I)
			for tt := 0; tt < c.T; tt++ {
				for i := 0; i < c.I; i++ {
					g, u := float64(x.Data()[tt*2*c.I+i]), float64(x.Data()[tt*2*c.I+c.I+i])
					want[tt*c.I+i] = silu(g) * u
				}
			}
			checkClose(t, "swiglu", data(t, got), want, 1e-6)
		})
	}
	mustPanic(t, "cpu.SwiGLU: x has shape [2 3], want an even", func() { be.SwiGLU(randT(newRand(t), 2, 3)) })
}

func TestSplitConcatCols(t *testing.T) {
	be := New(Options{})
	for _, c := range []struct {
		T, heads int
		sizes    []int
	}{{1, 1, []int{4}}, {3, 2, []int{3, 5}}, {4, 8, []int{128, 64, 0, 16}}, {100, 4, []int{32, 32}}} {
		t.Run(fmt.Sprintf("T%d_h%d_%v", c.T, c.heads, c.sizes), func(t *testing.T) {
			r := newRand(t)
			sum := 0
			for _, s := range c.sizes {
				sum += s
			}
			C := c.heads * sum
			x := randT(r, c.T, C)
			parts := be.SplitCols(x, c.heads, c.sizes...)
			if len(parts) != len(c.sizes) {
				t.Fatalf("%d parts, want %d", len(parts), len(c.sizes))
			}
			off := 0
			for i, s := range c.sizes {
				checkShape(t, fmt.Sprintf("part %d", i), parts[i], c.T, c.heads*s)
				want := make([]float64, 0, c.T*c.heads*s)
				for tt := 0; tt < c.T; tt++ {
					for h := 0; h < c.heads; h++ {
						base := tt*C + h*sum + off
						want = append(want, f64(x.Data()[base:base+s])...)
					}
				}
				checkClose(t, fmt.Sprintf("part %d", i), data(t, parts[i]), want, 0)
				off += s
			}
			back := be.ConcatCols(c.heads, parts, c.sizes)
			checkShape(t, "concat", back, c.T, C)
			checkClose(t, "concat of split", data(t, back), f64(x.Data()), 0)
		})
	}
}

// TestConcatColsBroadcast joins per-head parts with a single shared head, as
// MLA does with its rotary key.
func TestConcatColsBroadcast(t *testing.T) {
	be := New(Options{})
	r := newRand(t)
	const T, heads, a, b = 3, 4, 5, 2
	pa, pb := randT(r, T, heads*a), randT(r, T, b) // pb: one head for all
	got := be.ConcatCols(heads, []backend.Tensor{pa, pb}, []int{a, b})
	checkShape(t, "concat", got, T, heads*(a+b))
	var want []float64
	for tt := 0; tt < T; tt++ {
		for h := 0; h < heads; h++ {
			want = append(want, f64(pa.Data()[tt*heads*a+h*a:tt*heads*a+h*a+a])...)
			want = append(want, f64(pb.Data()[tt*b:tt*b+b])...)
		}
	}
	checkClose(t, "concat", data(t, got), want, 0)
	mustPanic(t, "cpu.ConcatCols: parts[1] has shape [3 3]", func() {
		be.ConcatCols(heads, []backend.Tensor{pa, randT(r, T, 3)}, []int{a, b})
	})
	mustPanic(t, "cpu.ConcatCols: parts[1] has 2 rows", func() {
		be.ConcatCols(heads, []backend.Tensor{pa, randT(r, 2, b)}, []int{a, b})
	})
}

// TestRoPE checks NeoX rotation with default scaling against angles
// pos·θ^(-2i/dim) computed in float64 here.
func TestRoPE(t *testing.T) {
	be := New(Options{})
	for _, c := range []struct{ T, heads, hd, dim int }{{1, 1, 8, 8}, {5, 3, 16, 8}, {7, 2, 64, 64}} {
		t.Run(fmt.Sprintf("T%d_h%d_hd%d_dim%d", c.T, c.heads, c.hd, c.dim), func(t *testing.T) {
			r := newRand(t)
			rope := &attention.RoPE{Dim: c.dim, Theta: 10000, Style: attention.NeoX}
			x := randT(r, c.T, c.heads*c.hd)
			xin := slices.Clone(x.Data())
			pos := make([]int32, c.T)
			for i := range pos {
				pos[i] = int32(r.IntN(60))
			}
			got := be.RoPE(x, c.heads, c.hd, rope, pos)
			checkShape(t, "rope", got, c.T, c.heads*c.hd)
			want := f64(xin)
			half := c.dim / 2
			for tt := 0; tt < c.T; tt++ {
				for h := 0; h < c.heads; h++ {
					base := tt*c.heads*c.hd + h*c.hd
					for i := 0; i < half; i++ {
						ang := float64(pos[tt]) * math.Pow(10000, -2*float64(i)/float64(c.dim))
						x1, x2 := float64(xin[base+i]), float64(xin[base+i+half])
						want[base+i] = x1*math.Cos(ang) - x2*math.Sin(ang)
						want[base+i+half] = x2*math.Cos(ang) + x1*math.Sin(ang)
					}
				}
			}
			checkClose(t, "rope", data(t, got), want, 2e-5)
			checkClose(t, "input after rope", x.Data(), f64(xin), 0)
		})
	}
}

func TestMLP(t *testing.T) {
	be := New(Options{})
	for _, c := range []struct{ T, H, I int }{{1, 8, 4}, {7, 24, 40}, {33, 64, 48}} {
		t.Run(fmt.Sprintf("T%d_H%d_I%d", c.T, c.H, c.I), func(t *testing.T) {
			r := newRand(t)
			x, gu, down := randT(r, c.T, c.H), randT(r, 2*c.I, c.H), randT(r, c.H, c.I)
			got := be.MLP(x, &backend.MLP{GateUp: gu, Down: down})
			checkShape(t, "mlp", got, c.T, c.H)
			want, scale := refMLP(x.Data(), gu.Data(), down.Data(), c.T, c.H, c.I)
			checkScaled(t, "mlp", data(t, got), want, scale, 1e-5)
		})
	}
}

func TestRows(t *testing.T) {
	be := New(Options{})
	r := newRand(t)
	x := randT(r, 6, 5)
	rows := []int{5, 0, 2, 2}
	got := be.Rows(x, rows)
	checkShape(t, "rows", got, 4, 5)
	var want []float64
	for _, i := range rows {
		want = append(want, f64(x.Data()[i*5:i*5+5])...)
	}
	checkClose(t, "rows", data(t, got), want, 0)
	mustPanic(t, "cpu.Rows: rows[0] = 6", func() { be.Rows(x, []int{6}) })
}

func TestForeignTensorPanics(t *testing.T) {
	be := New(Options{})
	mustPanic(t, "cpu.Add: a is <nil>", func() { be.Add(nil, randT(newRand(t), 1, 1)) })
	mustPanic(t, "cpu.FromFloat32: shape [2 2] for 3 values", func() { FromFloat32([]int{2, 2}, make([]float32, 3)) })
}

// TestWeightBF16Storage: a BF16 matrix stays bf16 (a vector, an F32 matrix
// and Options.F32Weights stay float32), reads back as its float32 values,
// and Linear and Embed give the float32 weight's results bit for bit.
func TestWeightBF16Storage(t *testing.T) {
	vals := []uint16{0x3f80, 0xbf80, 0x4049, 0x0000, 0x3e00, 0xc2f7, 0x3c23, 0x7f7f, 0x0080, 0x4120, 0xbe4d, 0x3f00}
	raw := make([]byte, 2*len(vals))
	for i, v := range vals {
		raw[2*i], raw[2*i+1] = byte(v), byte(v>>8)
	}
	host := func(shape ...int) *tensor.Host {
		return &tensor.Host{Name: "w", DType: tensor.BF16, Shape: shape, Data: raw}
	}
	bfBe, f32Be := New(Options{}), New(Options{F32Weights: true})
	w, err := bfBe.Weight(host(3, 4))
	if err != nil {
		t.Fatal(err)
	}
	wf, err := f32Be.Weight(host(3, 4))
	if err != nil {
		t.Fatal(err)
	}
	if bt := w.(*Tensor); bt.bf == nil || bt.data != nil {
		t.Fatalf("BF16 [3, 4] weight: bf %d values, data %d: want bf16 storage", len(bt.bf), len(bt.data))
	}
	if ft := wf.(*Tensor); ft.bf != nil {
		t.Fatal("F32Weights: BF16 matrix kept in bf16")
	}
	if v, _ := bfBe.Weight(host(12)); v.(*Tensor).bf != nil {
		t.Fatal("BF16 vector kept in bf16, want float32")
	}
	want := f32Be.ToHost(wf)
	if got := bfBe.ToHost(w); !slices.Equal(got, want) {
		t.Fatalf("ToHost = %v, want %v", got, want)
	}
	x := FromFloat32([]int{2, 4}, []float32{0.5, -1.25, 3, 0.125, 7, -0.75, 1.5, 2})
	if got, want := bfBe.ToHost(bfBe.Linear(x, w, nil)), f32Be.ToHost(f32Be.Linear(x, wf, nil)); !slices.Equal(got, want) {
		t.Fatalf("Linear = %v, want %v", got, want)
	}
	if got, want := bfBe.ToHost(bfBe.Embed(w, []int32{2, 0})), f32Be.ToHost(f32Be.Embed(wf, []int32{2, 0})); !slices.Equal(got, want) {
		t.Fatalf("Embed = %v, want %v", got, want)
	}
	if got, want := bfBe.ToHost(bfBe.Add(w, w)), f32Be.ToHost(f32Be.Add(wf, wf)); !slices.Equal(got, want) {
		t.Fatalf("Add on a bf16 weight = %v, want %v", got, want)
	}
}

func TestHeadLinear(t *testing.T) {
	bfBe, f32Be := New(Options{}), New(Options{F32Weights: true})
	for _, c := range []struct{ T, heads, N, K int }{{1, 1, 1, 1}, {1, 4, 16, 8}, {3, 8, 5, 12}, {17, 16, 32, 24}} {
		t.Run(fmt.Sprintf("T%d_H%d_N%d_K%d", c.T, c.heads, c.N, c.K), func(t *testing.T) {
			r := newRand(t)
			x := randVec(r, c.T*c.heads*c.K, 1)
			// bf16 weights: every value exactly representable, so both backends hold the same numbers.
			wv := randVec(r, c.heads*c.N*c.K, 1)
			raw := make([]byte, 2*len(wv))
			for i, v := range wv {
				b := math.Float32bits(v) >> 16
				raw[2*i], raw[2*i+1] = byte(b), byte(b>>8)
				wv[i] = math.Float32frombits(b << 16)
			}
			host := &tensor.Host{Name: "w", DType: tensor.BF16, Shape: []int{c.heads * c.N, c.K}, Data: raw}
			// The reference: each head on its own through refLinear.
			want := make([]float64, c.T*c.heads*c.N)
			for h := range c.heads {
				xh := make([]float32, c.T*c.K)
				for tt := range c.T {
					copy(xh[tt*c.K:(tt+1)*c.K], x[(tt*c.heads+h)*c.K:])
				}
				ref := refLinear(xh, wv[h*c.N*c.K:(h+1)*c.N*c.K], nil, c.T, c.N, c.K)
				for tt := range c.T {
					copy(want[(tt*c.heads+h)*c.N:(tt*c.heads+h+1)*c.N], ref[tt*c.N:(tt+1)*c.N])
				}
			}
			var outs [][]float32
			for _, be := range []*Backend{bfBe, f32Be} {
				w, err := be.Weight(host)
				if err != nil {
					t.Fatal(err)
				}
				got := headLinear(x, w.(*Tensor).weights(), c.T, c.heads, c.N, c.K)
				checkClose(t, "headLinear", got, want, 1e-5)
				outs = append(outs, got)
			}
			if !slices.Equal(outs[0], outs[1]) {
				t.Fatal("headLinear with bf16-stored weights differs from the widened float32 weights")
			}
		})
	}
}
