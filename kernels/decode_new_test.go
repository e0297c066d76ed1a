package kernels

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// decodeCase is one configuration of PagedDecodeBF16: decode rows of
// contexts ctx (the new token is each row's last key), the rotation and the
// norms.
type decodeCase struct {
	name         string
	h, kv, d, dv int
	rot          int
	style        RoPEStyle
	attn         float32
	norm         bool
	bs, window   int
	sinks        bool
	ctx          []int
	noStore      int    // rows whose slot is -1 (attend the new key, store nothing): the first noStore
	work         string // as pagedCase's: "plan", "none", "long"
}

var decodeCases = []decodeCase{
	{name: "qwen3_d128_g8_norm", h: 32, kv: 4, d: 128, dv: 128, rot: 128, style: RoPENeoX, attn: 1, norm: true, bs: 16,
		ctx: []int{1, 17, 1000, 300, 64, 65}},
	{name: "gptoss_d64_window_sinks_yarn", h: 8, kv: 1, d: 64, dv: 64, rot: 64, style: RoPENeoX, attn: 1.3, bs: 16,
		window: 100, sinks: true, ctx: []int{500, 2, 101, 100}},
	{name: "d192_dv128_interleaved_partial_bs7", h: 16, kv: 2, d: 192, dv: 128, rot: 64, style: RoPEInterleaved,
		attn: 1, norm: true, bs: 7, ctx: []int{1000, 33, 1}},
	{name: "mixtral_d128_g4_ctx8192_longhint", h: 32, kv: 8, d: 128, dv: 128, rot: 128, style: RoPENeoX, attn: 1,
		bs: 16, work: "long", ctx: []int{8192}},
	{name: "d128_g16_headchunks_nostore", h: 32, kv: 2, d: 128, dv: 128, rot: 96, style: RoPENeoX, attn: 1,
		norm: true, bs: 16, sinks: true, noStore: 1, ctx: []int{700, 129, 16}},
	{name: "d128_nowork_norot", h: 8, kv: 2, d: 128, dv: 128, rot: 0, style: RoPENeoX, attn: 1, norm: true, bs: 16,
		work: "none", ctx: []int{4100, 3}},
	// A graph's bucket hint over short rows (most ranges empty), and rows
	// whose pool keys are whole 64-key tiles (the new key joins the last
	// range: 1024 + 1 keys in 16 ranges of 64, not 17).
	{name: "qwen3_d128_g8_bucket_tiles", h: 32, kv: 4, d: 128, dv: 128, rot: 128, style: RoPENeoX, attn: 1,
		norm: true, bs: 16, work: "long", ctx: []int{1025, 65, 1, 129, 2}},
}

// TestPagedDecodeBF16: the fused decode attention (norm + RoPE of q and
// the new keys, their KV write, split attention) against a float64
// reference on fresh random inputs: the pool's slot of each new key is
// poisoned with NaN first (reading it instead of the new key fails), the
// outputs too; the pool afterwards must hold the new keys (normed, rotated,
// bf16) and values at their slots and be unchanged elsewhere.
func TestPagedDecodeBF16(t *testing.T) {
	g := testGPU(t)
	for _, c := range decodeCases {
		t.Run(c.name, func(t *testing.T) { testPagedDecode(t, g, c) })
	}
	// Other kernels than the warp-split one do not fuse: Fits says so.
	err := g.Do(func(d *Device) error {
		a := AttnArgs{Heads: 32, KVHeads: 4, HeadDim: 128, VHeadDim: 128}
		if !d.PagedDecodeFits(a, 128) {
			return errors.New("PagedDecodeFits is false for Qwen3's shape")
		}
		if d.PagedDecodeFits(AttnArgs{Heads: 16, KVHeads: 1, HeadDim: 576, VHeadDim: 512}, 64) {
			return errors.New("PagedDecodeFits is true for MLA's dims")
		}
		if d.PagedDecodeFits(a, 130) || d.PagedDecodeFits(a, 63) {
			return errors.New("PagedDecodeFits is true for a bad rotDim")
		}
		if err := d.SetPagedVariant(PagedSIMT); err != nil {
			return err
		}
		fits := d.PagedDecodeFits(a, 128)
		if err := d.SetPagedVariant(PagedAuto); err != nil {
			return err
		}
		if fits {
			return errors.New("PagedDecodeFits is true with the CUDA-core kernel chosen")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func testPagedDecode(t *testing.T, g *GPU, c decodeCase) {
	r := newRNG(t)
	kw, vw := c.kv*c.d, c.kv*c.dv
	n := len(c.ctx)
	var need int
	for _, x := range c.ctx {
		need += (x + c.bs - 1) / c.bs
	}
	nblocks := need + 3
	perm := r.Perm(nblocks)
	var blocks []int32
	tabOff := make([]int, n)
	for i, x := range c.ctx {
		tabOff[i] = len(blocks)
		for range (x + c.bs - 1) / c.bs {
			blocks = append(blocks, int32(perm[0]))
			perm = perm[1:]
		}
	}
	slotOf := func(seq, j int) int { return int(blocks[tabOff[seq]+j/c.bs])*c.bs + j%c.bs }
	poolRows := nblocks * c.bs
	kBits, kVals := randBF16(r, poolRows*kw, 1)
	vBits, vVals := randBF16(r, poolRows*vw, 1)
	const poison = 0x7fc1 // a NaN no rounding gives
	for i, x := range c.ctx {
		s := slotOf(i, x-1)
		for j := range kw {
			kBits[s*kw+j] = poison
		}
		for j := range vw {
			vBits[s*vw+j] = poison
		}
	}
	kBefore, vBefore := append([]uint16(nil), kBits...), append([]uint16(nil), vBits...)
	// Token rows in shuffled order; row b is sequence b's new token.
	rowOf := r.Perm(n)
	rows, pos, table, rpos := make([]int32, n), make([]int32, n), make([]int32, n), make([]int32, n)
	slots := make([]int32, n)
	maxKeys := 0
	for b, x := range c.ctx {
		tok := rowOf[b]
		rows[b], pos[b], table[b] = int32(tok), int32(x-1), int32(tabOff[b])
		rpos[tok] = int32(x - 1)
		slots[tok] = int32(slotOf(b, x-1))
		if b < c.noStore {
			slots[tok] = -1
		}
		keys := x
		if c.window > 0 {
			keys = min(keys, c.window)
		}
		maxKeys = max(maxKeys, keys)
	}
	randF := func(m int, scale float64) []float32 {
		s := make([]float32, m)
		for i := range s {
			s[i] = float32(r.NormFloat64() * scale)
		}
		return s
	}
	q, kn, vn := randF(n*c.h*c.d, 1), randF(n*kw, 1), randF(n*vw, 1)
	var qw, kwt []float32
	if c.norm {
		qw, kwt = randF(c.d, 0.5), randF(c.d, 0.5)
		for i := range qw {
			qw[i] += 1
			kwt[i] += 1
		}
	}
	inv := make([]float32, max(1, c.rot/2))
	for j := range c.rot / 2 {
		inv[j] = float32(math.Pow(1e6, -2*float64(j)/float64(c.rot)))
	}
	var sinks []float32
	if c.sinks {
		sinks = randF(c.h, 2)
	}
	const eps = 1e-6
	scale := float32(1 / math.Sqrt(float64(c.d)))
	a := AttnArgs{Heads: c.h, KVHeads: c.kv, HeadDim: c.d, VHeadDim: c.dv, BlockSize: c.bs, Scale: scale, Window: c.window}

	var got []float32
	var gotB, kAfter, vAfter []uint16
	onGPU(t, g, func(ar *arena) {
		pk, pv := put(ar, kBits), put(ar, vBits)
		qb, kb, vb := put(ar, q), put(ar, kn), put(ar, vn)
		rb, pb, tb, bb, sl, rp := put(ar, rows), put(ar, pos), put(ar, table), put(ar, blocks), put(ar, slots), put(ar, rpos)
		out := put(ar, f32Fill(n*c.h*c.dv, float32(math.NaN())))
		ob := make([]uint16, n*c.h*c.dv)
		for i := range ob {
			ob[i] = poison
		}
		outb := put(ar, ob)
		nw := DecodeNew{K: kb, V: vb, Slots: sl, RoPEPos: rp, InvFreq: put(ar, inv), Tokens: n, RotDim: c.rot,
			Style: c.style, AttnFactor: c.attn, Eps: eps}
		if c.norm {
			nw.QNorm, nw.KNorm = put(ar, qw), put(ar, kwt)
		}
		var sb, wb *Buffer
		if sinks != nil {
			sb = put(ar, sinks)
		}
		hint := pagedHint(c.work, maxKeys)
		if !ar.d.PagedDecodeFits(a, c.rot) {
			ar.check(fmt.Errorf("PagedDecodeFits is false for %+v rot %d", a, c.rot))
		}
		wb = pagedWork(t, ar, c.work, n, maxKeys, hint, a)
		if ar.err != nil {
			return
		}
		ar.check(ar.d.PagedDecodeBF16(nil, out, outb, qb, pk, pv, rb, pb, tb, bb, sb, wb, n, hint, a, nw))
		got = get[float32](ar, out, n*c.h*c.dv)
		gotB = get[uint16](ar, outb, n*c.h*c.dv)
		kAfter = get[uint16](ar, pk, poolRows*kw)
		vAfter = get[uint16](ar, pv, poolRows*vw)
	})
	for i, v := range got {
		if w := tensor.F32ToBF16(v); gotB[i] != w {
			t.Fatalf("outBF16[%d] = %#04x, out %g rounds to %#04x", i, gotB[i], v, w)
		}
	}

	// The reference: q and the new keys normed and rotated in float64, the
	// keys (and values) rounded to bf16 as the pool holds them.
	var qwRef, kwRef []float32
	if c.norm {
		qwRef, kwRef = qw, kwt
	}
	qRef := normRoPERef(q, qwRef, inv, rpos, c.h, c.d, c.rot, c.style, float64(c.attn), eps)
	kRef := normRoPERef(kn, kwRef, inv, rpos, c.kv, c.d, c.rot, c.style, float64(c.attn), eps)
	bf := func(x float64) float64 { return float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(x)))) }
	want := make([]float64, n*c.h*c.dv)
	G := c.h / c.kv
	for b, x := range c.ctx {
		tok, p := rowOf[b], x-1
		lo := 0
		if c.window > 0 {
			lo = max(0, p-c.window+1)
		}
		key := func(j, kh, i int) float64 {
			if j == p {
				return bf(kRef[(tok*c.kv+kh)*c.d+i])
			}
			return float64(kVals[slotOf(b, j)*kw+kh*c.d+i])
		}
		val := func(j, kh, i int) float64 {
			if j == p {
				return bf(float64(vn[(tok*c.kv+kh)*c.dv+i]))
			}
			return float64(vVals[slotOf(b, j)*vw+kh*c.dv+i])
		}
		sc := make([]float64, p+1)
		for h := range c.h {
			kh := h / G
			qr := qRef[(tok*c.h+h)*c.d:][:c.d]
			m := math.Inf(-1)
			for j := lo; j <= p; j++ {
				var s float64
				for i := range c.d {
					s += qr[i] * key(j, kh, i)
				}
				sc[j] = s * float64(scale)
				m = math.Max(m, sc[j])
			}
			if sinks != nil {
				m = math.Max(m, float64(sinks[h]))
			}
			var l float64
			o := want[(tok*c.h+h)*c.dv:][:c.dv]
			for j := lo; j <= p; j++ {
				e := math.Exp(sc[j] - m)
				l += e
				for i := range c.dv {
					o[i] += e * val(j, kh, i)
				}
			}
			if sinks != nil {
				l += math.Exp(float64(sinks[h]) - m)
			}
			for i := range o {
				o[i] /= l
			}
		}
	}
	for b := range n {
		r0 := rowOf[b] * c.h * c.dv
		checkClose(t, fmt.Sprintf("row %d (ctx %d)", b, c.ctx[b]), got[r0:r0+c.h*c.dv], want[r0:r0+c.h*c.dv], 1e-2)
		if t.Failed() {
			return
		}
	}

	// The pool: each stored row's new key (a few bf16 ulps from the float64
	// reference: fast sincosf and rsqrtf) and value (exact), nothing else
	// changed.
	newRow := map[int]int{} // pool row → token
	for b, x := range c.ctx {
		if b >= c.noStore {
			newRow[slotOf(b, x-1)] = rowOf[b]
		}
	}
	var kGot []float32
	var kWant []float64
	for s := range poolRows {
		tok, ok := newRow[s]
		for j := range kw {
			i := s*kw + j
			if !ok {
				if kAfter[i] != kBefore[i] {
					t.Fatalf("pool K row %d col %d changed: %#04x → %#04x", s, j, kBefore[i], kAfter[i])
				}
				continue
			}
			kGot = append(kGot, tensor.BF16ToF32(kAfter[i]))
			kWant = append(kWant, kRef[tok*kw+j])
		}
		for j := range vw {
			i := s*vw + j
			w := vBefore[i]
			if ok {
				w = tensor.F32ToBF16(vn[tok*vw+j])
			}
			if vAfter[i] != w {
				t.Fatalf("pool V row %d col %d = %#04x, want %#04x (new row %v)", s, j, vAfter[i], w, ok)
			}
		}
	}
	checkClose(t, "stored keys", kGot, kWant, 1e-2)
}
