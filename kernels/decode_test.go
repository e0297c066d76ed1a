package kernels

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// pagedSeq is one sequence of a paged attention test: ctx tokens in the
// cache, and the last `rows` positions of it queried.
type pagedSeq struct{ ctx, rows int }

// pagedCase is one paged attention configuration.
type pagedCase struct {
	name         string
	h, kv, d, dv int
	bs, window   int
	sinks        bool
	seqs         []pagedSeq
	work         string // "plan": PagedAttnWorkspace; "none": no workspace; "short": maxKeys hint 1/4 of the truth; "long": twice the next power of two (a decode graph plans for its key bucket); "huge": 32768 (most key ranges empty)
	vk           bool   // values inside the keys: no V pool, each kv head's first dv key columns
}

var pagedCases = []pagedCase{
	{name: "d16_mha_bs16", h: 4, kv: 4, d: 16, dv: 16, bs: 16, seqs: []pagedSeq{{1, 1}, {17, 1}}},
	{name: "d16_g3_sinks", h: 6, kv: 2, d: 16, dv: 16, bs: 16, sinks: true, seqs: []pagedSeq{{17, 3}, {5, 5}}},
	{name: "d24_dv8_window", h: 4, kv: 4, d: 24, dv: 8, bs: 7, window: 5, seqs: []pagedSeq{{17, 4}, {3, 3}}},
	{name: "d32_g4_bs7", h: 8, kv: 2, d: 32, dv: 32, bs: 7, seqs: []pagedSeq{{17, 1}, {1000, 1}, {1, 1}}},
	{name: "d64_g8_window_sinks", h: 8, kv: 1, d: 64, dv: 64, bs: 16, window: 100, sinks: true,
		seqs: []pagedSeq{{1000, 2}, {60, 1}}},
	{name: "d32_g32_headchunks", h: 32, kv: 1, d: 32, dv: 32, bs: 16, sinks: true, seqs: []pagedSeq{{300, 1}, {17, 2}}},
	{name: "d64_g16_sinks", h: 32, kv: 2, d: 64, dv: 64, bs: 16, sinks: true, seqs: []pagedSeq{{1000, 1}, {17, 2}}},
	{name: "d128_g4_ctx8192", h: 32, kv: 8, d: 128, dv: 128, bs: 16, seqs: []pagedSeq{{8192, 1}}},
	{name: "d128_g4_mixed", h: 32, kv: 8, d: 128, dv: 128, bs: 16,
		seqs: []pagedSeq{{1, 1}, {8192, 2}, {17, 1}, {1000, 1}}},
	{name: "d128_g4_ctx8192_bs7_nowork", h: 32, kv: 8, d: 128, dv: 128, bs: 7, work: "none",
		seqs: []pagedSeq{{8192, 1}}},
	{name: "d128_g4_ctx8192_shorthint", h: 32, kv: 8, d: 128, dv: 128, bs: 16, work: "short", sinks: true,
		seqs: []pagedSeq{{8192, 1}, {300, 1}}},
	{name: "d24_mha_bs4_longhint", h: 4, kv: 4, d: 24, dv: 24, bs: 4, work: "long",
		seqs: []pagedSeq{{13, 1}, {10, 1}, {258, 1}, {1, 1}}},
	{name: "d128_g4_longhint", h: 32, kv: 8, d: 128, dv: 128, bs: 16, work: "long", sinks: true,
		seqs: []pagedSeq{{300, 1}, {17, 1}}},
	{name: "d192_dv128_g8_sinks", h: 16, kv: 2, d: 192, dv: 128, bs: 7, sinks: true,
		seqs: []pagedSeq{{1000, 1}, {8192, 1}}},
	{name: "d256_g2_window", h: 4, kv: 2, d: 256, dv: 256, bs: 16, window: 700, seqs: []pagedSeq{{2000, 2}}},
	{name: "prefill_rows_d128_window", h: 8, kv: 2, d: 128, dv: 128, bs: 16, window: 64,
		seqs: []pagedSeq{{300, 300}}},
	{name: "prefill_rows_d64_g1", h: 4, kv: 4, d: 64, dv: 64, bs: 7, seqs: []pagedSeq{{200, 200}, {40, 10}}},
	// The tensor-core kernel's ring: one range per row (no workspace) ending
	// in every position of a 2-4 stage ring, mid-tile and on a tile's end.
	{name: "d128_g4_midstage_nowork", h: 32, kv: 8, d: 128, dv: 128, bs: 16, work: "none",
		seqs: []pagedSeq{{209, 1}, {130, 1}, {64, 1}, {65, 1}, {1, 1}, {128, 1}, {193, 1}, {256, 1}, {320, 2}}},
	{name: "d128_g8_onekey_sinks", h: 16, kv: 2, d: 128, dv: 128, bs: 16, sinks: true,
		seqs: []pagedSeq{{1, 1}, {2, 1}, {1, 1}}},
	{name: "d128_g4_hugehint_sinks", h: 32, kv: 8, d: 128, dv: 128, bs: 16, work: "huge", sinks: true,
		seqs: []pagedSeq{{100, 1}, {1, 1}, {700, 1}}},
	{name: "d128_g8_window300_bs7", h: 8, kv: 1, d: 128, dv: 128, bs: 7, window: 300,
		seqs: []pagedSeq{{2000, 1}, {250, 1}, {301, 1}}},
	{name: "d128_g4_ctx4100_nowork", h: 8, kv: 2, d: 128, dv: 128, bs: 16, work: "none", seqs: []pagedSeq{{4100, 1}}},
	{name: "d40_dv24_g6_nowork", h: 12, kv: 2, d: 40, dv: 24, bs: 16, work: "none", seqs: []pagedSeq{{700, 1}, {70, 2}}},
	// Past 256: paged_attn_big (MLA's absorbed form: one KV head of the
	// 512-wide latent and a 64-wide rope key, values the latent).
	{name: "mla_d576_dv512_g16", h: 16, kv: 1, d: 576, dv: 512, bs: 16, seqs: []pagedSeq{{1000, 1}, {17, 2}, {1, 1}}},
	{name: "mla_d576_dv512_g128_ctx4096", h: 128, kv: 1, d: 576, dv: 512, bs: 64, seqs: []pagedSeq{{4096, 1}}},
	{name: "mla_d576_dv512_g20_rows_nowork", h: 20, kv: 1, d: 576, dv: 512, bs: 7, work: "none",
		seqs: []pagedSeq{{70, 70}, {33, 1}}},
	{name: "mla_d576_dv512_hugehint", h: 16, kv: 1, d: 576, dv: 512, bs: 16, work: "huge", seqs: []pagedSeq{{100, 1}, {1, 1}}},
	{name: "mla_d576_dv512_g128_batch", h: 128, kv: 1, d: 576, dv: 512, bs: 16,
		seqs: []pagedSeq{{300, 1}, {2000, 1}, {33, 1}, {1, 1}, {64, 1}}},
	{name: "mla_d576_dv512_kv2_g40_window_sinks", h: 80, kv: 2, d: 576, dv: 512, bs: 16, window: 100, sinks: true,
		seqs: []pagedSeq{{500, 2}, {40, 1}}},
	// Values inside the keys (no V pool): MLA's latent cache on its kernel,
	// and the other kernels' strides at other dims, one and two kv heads.
	{name: "mla_d576_dv512_g128_vk", h: 128, kv: 1, d: 576, dv: 512, bs: 16, vk: true,
		seqs: []pagedSeq{{300, 1}, {2000, 1}, {33, 1}, {1, 1}}},
	{name: "mla_d576_dv512_g16_vk_longhint", h: 16, kv: 1, d: 576, dv: 512, bs: 7, vk: true, work: "long",
		seqs: []pagedSeq{{129, 1}, {40, 2}}},
	{name: "d64_dv32_g8_vk", h: 8, kv: 1, d: 64, dv: 32, bs: 16, vk: true, seqs: []pagedSeq{{500, 1}, {17, 3}}},
	{name: "d128_g4_kv2_vk_sinks", h: 8, kv: 2, d: 128, dv: 128, bs: 16, vk: true, sinks: true,
		seqs: []pagedSeq{{1000, 1}, {5, 1}}},
	{name: "big_d320_dv264_g4_window_sinks", h: 8, kv: 2, d: 320, dv: 264, bs: 7, window: 100, sinks: true,
		seqs: []pagedSeq{{300, 2}, {50, 1}}},
	{name: "big_d768_dv512_g3_sinks", h: 3, kv: 1, d: 768, dv: 512, bs: 16, sinks: true, seqs: []pagedSeq{{129, 1}}},
}

// pagedKernels are the kernels TestPagedAttnBF16 runs every case on: the
// CUDA-core one, the tensor-core one with its ring depth picked per shape
// and forced to 2 and 4 stages, and the warp-split one (on the cases with
// its head dims: d64, d128, d192/dv128; the others fall back to auto's
// choice). Past 256: "simt" runs paged_attn_big, "warp" (auto's choice)
// paged_attn_mla at MLA's 576/512 and paged_attn_big at other dims.
var pagedKernels = []struct {
	name   string
	v      PagedVariant
	stages int
}{{"simt", PagedSIMT, 0}, {"mma", PagedMMA, 0}, {"mma_s2", PagedMMA, 2}, {"mma_s4", PagedMMA, 4}, {"warp", PagedWarp, 0}}

// TestPagedAttnBF16 runs every case on every kernel of pagedKernels (the
// tensor-core one only where VHeadDim ≤ 128) against a float64 reference on
// the bf16 K/V.
func TestPagedAttnBF16(t *testing.T) {
	g := testGPU(t)
	defer g.Do(func(d *Device) error {
		return errors.Join(d.SetPagedVariant(PagedAuto), d.SetPagedStages(0))
	})
	for _, k := range pagedKernels {
		for _, c := range pagedCases {
			if k.v == PagedMMA && c.dv > 128 {
				continue
			}
			t.Run(k.name+"/"+c.name, func(t *testing.T) { testPaged(t, g, c, k.v, k.stages) })
		}
	}
}

func testPaged(t *testing.T, g *GPU, c pagedCase, variant PagedVariant, stages int) {
	r := newRNG(t)
	kw, vw := c.kv*c.d, c.kv*c.dv
	// Block tables of shuffled block ids, with spare blocks in the pool.
	var need int
	for _, s := range c.seqs {
		need += (s.ctx + c.bs - 1) / c.bs
	}
	nblocks := need + 5
	perm := r.Perm(nblocks)
	var blocks []int32
	tabOff := make([]int, len(c.seqs))
	for i, s := range c.seqs {
		tabOff[i] = len(blocks)
		for range (s.ctx + c.bs - 1) / c.bs {
			blocks = append(blocks, int32(perm[0]))
			perm = perm[1:]
		}
	}
	poolRows := nblocks * c.bs
	kBits, kVals := randBF16(r, poolRows*kw, 1)
	vBits, vVals := randBF16(r, poolRows*vw, 1)
	// vrow is kv head kh's value at pool row slot: in V, or inside the key.
	vrow := func(slot, kh int) []float32 { return vVals[slot*vw+kh*c.dv:][:c.dv] }
	if c.vk {
		vBits = nil
		vrow = func(slot, kh int) []float32 { return kVals[slot*kw+kh*c.d:][:c.dv] }
	}
	// Query rows: every sequence's last s.rows positions, in shuffled q rows.
	type qrow struct{ seq, pos int }
	var qs []qrow
	for i, s := range c.seqs {
		for p := s.ctx - s.rows; p < s.ctx; p++ {
			qs = append(qs, qrow{i, p})
		}
	}
	n := len(qs)
	rowOf := r.Perm(n)
	rows, pos, table := make([]int32, n), make([]int32, n), make([]int32, n)
	maxKeys := 0
	for b, x := range qs {
		rows[b], pos[b], table[b] = int32(rowOf[b]), int32(x.pos), int32(tabOff[x.seq])
		keys := x.pos + 1
		if c.window > 0 {
			keys = min(keys, c.window)
		}
		maxKeys = max(maxKeys, keys)
	}
	q := make([]float32, n*c.h*c.d)
	for i := range q {
		q[i] = float32(r.NormFloat64())
	}
	var sinks []float32
	if c.sinks {
		sinks = make([]float32, c.h)
		for i := range sinks {
			sinks[i] = float32(r.NormFloat64() * 2)
		}
	}
	scale := float32(1 / math.Sqrt(float64(c.d)))
	a := AttnArgs{Heads: c.h, KVHeads: c.kv, HeadDim: c.d, VHeadDim: c.dv, BlockSize: c.bs, Scale: scale, Window: c.window}

	var got []float32
	var gotB []uint16
	onGPU(t, g, func(ar *arena) {
		pk := put(ar, kBits)
		var pv *Buffer
		if !c.vk {
			pv = put(ar, vBits)
		}
		qb, rb, pb, tb, bb := put(ar, q), put(ar, rows), put(ar, pos), put(ar, table), put(ar, blocks)
		out := put(ar, f32Fill(n*c.h*c.dv, float32(math.NaN())))
		poison := make([]uint16, n*c.h*c.dv)
		for i := range poison {
			poison[i] = 0x7fc1 // a NaN no rounding gives
		}
		outb := put(ar, poison)
		var sb, wb *Buffer
		if sinks != nil {
			sb = put(ar, sinks)
		}
		hint := pagedHint(c.work, maxKeys)
		ar.check(ar.d.SetPagedVariant(variant))
		ar.check(ar.d.SetPagedStages(stages))
		wb = pagedWork(t, ar, c.work, n, maxKeys, hint, a)
		if ar.err != nil {
			return
		}
		ar.check(ar.d.PagedAttnBF16(nil, out, outb, qb, pk, pv, rb, pb, tb, bb, sb, wb, n, hint, a))
		got = get[float32](ar, out, n*c.h*c.dv)
		gotB = get[uint16](ar, outb, n*c.h*c.dv)
	})
	// The bf16 output is out rounded (RN), bit for bit, everywhere.
	for i, v := range got {
		if w := tensor.F32ToBF16(v); gotB[i] != w {
			t.Fatalf("outBF16[%d] = %#04x, out %g rounds to %#04x", i, gotB[i], v, w)
		}
	}

	want := make([]float64, n*c.h*c.dv)
	G := c.h / c.kv
	for b, x := range qs {
		lo := 0
		if c.window > 0 {
			lo = max(0, x.pos-c.window+1)
		}
		base := tabOff[x.seq]
		slot := func(j int) int { return int(blocks[base+j/c.bs])*c.bs + j%c.bs }
		sc := make([]float64, x.pos+1)
		for h := 0; h < c.h; h++ {
			kh := h / G
			qr := q[(rowOf[b]*c.h+h)*c.d:][:c.d]
			m := math.Inf(-1)
			for j := lo; j <= x.pos; j++ {
				kr := kVals[slot(j)*kw+kh*c.d:][:c.d]
				var s float64
				for i := range c.d {
					s += float64(qr[i]) * float64(kr[i])
				}
				sc[j] = s * float64(scale)
				m = math.Max(m, sc[j])
			}
			if sinks != nil {
				m = math.Max(m, float64(sinks[h]))
			}
			var l float64
			o := want[(rowOf[b]*c.h+h)*c.dv:][:c.dv]
			for j := lo; j <= x.pos; j++ {
				p := math.Exp(sc[j] - m)
				l += p
				vr := vrow(slot(j), kh)
				for i := range c.dv {
					o[i] += p * float64(vr[i])
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
	checkClose(t, "out", got, want, 1e-2)
	// Per row too: a wrong short row hides in the L2 norm of a long batch.
	for b := range n {
		r0 := rowOf[b] * c.h * c.dv
		checkClose(t, fmt.Sprintf("row %d (pos %d)", b, qs[b].pos), got[r0:r0+c.h*c.dv], want[r0:r0+c.h*c.dv], 1e-2)
		if t.Failed() {
			return
		}
	}
}

// pagedHint is the maxKeys hint a test's work mode passes for rows whose
// longest attends maxKeys keys.
func pagedHint(mode string, maxKeys int) int {
	switch mode {
	case "short":
		return max(1, maxKeys/4)
	case "long":
		hint := 2
		for hint < 2*maxKeys {
			hint *= 2
		}
		return hint
	case "huge":
		return 32768
	}
	return maxKeys
}

// pagedWork is a NaN-poisoned workspace of PagedAttnWorkspace's size for
// the hint (nil for work mode "none", or when no split pays off).
func pagedWork(t *testing.T, ar *arena, mode string, n, maxKeys, hint int, a AttnArgs) *Buffer {
	if mode == "none" || ar.err != nil {
		return nil
	}
	ws, err := ar.d.PagedAttnWorkspace(n, hint, a)
	ar.check(err)
	t.Logf("%d rows, max keys %d (hint %d): workspace %d bytes", n, maxKeys, hint, ws)
	if ws <= 0 {
		return nil
	}
	return put(ar, f32Fill(int(ws/4), float32(math.NaN())))
}

func f32Fill(n int, v float32) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// TestKVWriteBF16 writes random float32 rows into a poisoned bf16 pool at
// shuffled slots (some skipped) and checks every written element bit for bit
// (round to nearest even) and every other element untouched; with vw 0 (the
// values inside the keys) only keys, without a V pool; widths that are
// multiples of 4 (the kernel that moves four values a thread) and widths
// that are not (one value a thread).
func TestKVWriteBF16(t *testing.T) {
	g := testGPU(t)
	for _, w := range [][2]int{{3 * 24, 3 * 8}, {3 * 24, 0}, {70, 6}, {66, 0}} {
		t.Run(fmt.Sprintf("kw=%d_vw=%d", w[0], w[1]), func(t *testing.T) { testKVWrite(t, g, w[0], w[1]) })
	}
}

func testKVWrite(t *testing.T, g *GPU, kw, vw int) {
	r := newRNG(t)
	const n, poolRows = 37, 100
	k, v := make([]float32, n*kw), make([]float32, n*vw)
	for i := range k {
		k[i] = float32(r.NormFloat64() * 3)
	}
	for i := range v {
		v[i] = float32(r.NormFloat64() * 3)
	}
	perm := r.Perm(poolRows)
	slots := make([]int32, n)
	for i := range slots {
		slots[i] = int32(perm[i])
		if i%5 == 2 {
			slots[i] = -1
		}
	}
	const poison = 0x7fc1
	var gk, gv []uint16
	onGPU(t, g, func(ar *arena) {
		pk, kb, sb := put(ar, bf16Fill(poolRows*kw, poison)), put(ar, k), put(ar, slots)
		var pv, vb *Buffer
		if vw > 0 {
			pv, vb = put(ar, bf16Fill(poolRows*vw, poison)), put(ar, v)
		}
		if ar.err != nil {
			return
		}
		ar.check(ar.d.KVWriteBF16(nil, pk, pv, kb, vb, sb, n, kw, vw))
		gk = get[uint16](ar, pk, poolRows*kw)
		if vw > 0 {
			gv = get[uint16](ar, pv, poolRows*vw)
		}
	})
	wk, wv := bf16Fill(poolRows*kw, poison), bf16Fill(poolRows*vw, poison)
	for i, s := range slots {
		if s < 0 {
			continue
		}
		for c := range kw {
			wk[int(s)*kw+c] = tensor.F32ToBF16(k[i*kw+c])
		}
		for c := range vw {
			wv[int(s)*vw+c] = tensor.F32ToBF16(v[i*vw+c])
		}
	}
	for _, x := range []struct {
		name      string
		got, want []uint16
		w         int
	}{{"k", gk, wk, kw}, {"v", gv, wv, vw}} {
		if len(x.got) != len(x.want) {
			t.Fatalf("pool %s: %d elements read back, want %d", x.name, len(x.got), len(x.want))
		}
		for i := range x.want {
			if x.got[i] != x.want[i] {
				t.Fatalf("pool %s row %d col %d: %#04x, want %#04x", x.name, i/x.w, i%x.w, x.got[i], x.want[i])
			}
		}
	}
}

// TestPagedAttnArgs checks that bad shapes are errors, not launches.
func TestPagedAttnArgs(t *testing.T) {
	g := testGPU(t)
	onGPU(t, g, func(ar *arena) {
		buf := ar.alloc(1 << 20)
		if ar.err != nil {
			return
		}
		for _, a := range []AttnArgs{
			{Heads: 4, KVHeads: 3, HeadDim: 16, VHeadDim: 16, BlockSize: 16},
			{Heads: 4, KVHeads: 4, HeadDim: 12, VHeadDim: 16, BlockSize: 16},
			{Heads: 4, KVHeads: 4, HeadDim: 16, VHeadDim: 520, BlockSize: 16},
			{Heads: 4, KVHeads: 4, HeadDim: 776, VHeadDim: 16, BlockSize: 16},
			{Heads: 4, KVHeads: 4, HeadDim: 16, VHeadDim: 16, BlockSize: 0},
		} {
			if err := ar.d.PagedAttnBF16(nil, buf, nil, buf, buf, buf, buf, buf, buf, buf, nil, nil, 1, 1, a); err == nil {
				t.Errorf("%+v: no error", a)
			}
		}
		if err := ar.d.PagedAttnBF16(nil, buf, nil, buf, buf, buf, buf, buf, buf, buf, nil, nil, 1<<20, 1,
			AttnArgs{Heads: 4, KVHeads: 4, HeadDim: 16, VHeadDim: 16, BlockSize: 16}); err == nil {
			t.Errorf("1M rows in a 1 MiB buffer: no error")
		}
		ar.check(ar.d.SetPagedVariant(PagedMMA))
		if err := ar.d.PagedAttnBF16(nil, buf, nil, buf, buf, buf, buf, buf, buf, buf, nil, nil, 1, 1,
			AttnArgs{Heads: 4, KVHeads: 4, HeadDim: 16, VHeadDim: 256, BlockSize: 16}); err == nil {
			t.Errorf("tensor-core kernel with VHeadDim 256: no error")
		}
		ar.check(ar.d.SetPagedVariant(PagedAuto))
		if err := ar.d.SetPagedVariant(4); err == nil {
			t.Errorf("variant 4: no error")
		}
		for _, n := range []int{-1, 1, 5} {
			if err := ar.d.SetPagedStages(n); err == nil {
				t.Errorf("%d stages: no error", n)
			}
		}
		if err := ar.d.lib.check("mk_paged_attn_stages", pagedAttnStages(1)); err == nil {
			t.Errorf("library: 1 stage: no error")
		}
		ar.check(ar.d.SetPagedStages(0))
	})
}
