package kernels

import (
	"errors"
	"math"
	"slices"
	"testing"
	"unsafe"
)

// The wrappers of ABI 10's entry points against recording stand-ins for
// the library's functions, on the CPU: each call must reach the C function
// with its arguments in the C order (a wrong order or a bad internal check
// would otherwise show only on the GPU machine).

// fakeDevice is an active Device whose lib reports success.
func fakeDevice() *Device { return &Device{lib: &lib{}, active: true} }

// fakeBuf is a device buffer stand-in at address p with n bytes.
func fakeBuf(p uint64, n int64) *Buffer { return &Buffer{ptr: p, bytes: n} }

func TestMarshalGemvBF16Multi(t *testing.T) {
	var got []uint64
	old := gemvMulti
	defer func() { gemvMulti = old }()
	gemvMulti = func(s, a uint64, m, k int64, c0, b0, bias0 uint64, n0 int64, c1, b1, bias1 uint64, n1 int64, c2, b2,
		bias2 uint64, n2 int64) int32 {
		got = []uint64{s, a, uint64(m), uint64(k), c0, b0, bias0, uint64(n0), c1, b1, bias1, uint64(n1), c2, b2, bias2, uint64(n2)}
		return 0
	}
	d := fakeDevice()
	a := fakeBuf(0x1000, 2*2048*2)
	outs := []GemvOut{
		{C: fakeBuf(0x2000, 2*64*4), B: fakeBuf(0x3000, 64*2048*2), N: 64},
		{C: fakeBuf(0x4000, 2*16*4), B: fakeBuf(0x5000, 16*2048*2), Bias: fakeBuf(0x6000, 16*4), N: 16},
	}
	if err := d.GemvBF16Multi(nil, a, 2, 2048, outs); err != nil {
		t.Fatal(err)
	}
	want := []uint64{0, 0x1000, 2, 2048, 0x2000, 0x3000, 0, 64, 0x4000, 0x5000, 0x6000, 16, 0, 0, 0, 0}
	if !slices.Equal(got, want) {
		t.Fatalf("mk_gemv_bf16_multi got %#x, want %#x", got, want)
	}
	outs[1].B = fakeBuf(0x5000, 16*2048) // too small
	if err := d.GemvBF16Multi(nil, a, 2, 2048, outs); err == nil {
		t.Error("a short B gave no error")
	}
}

func TestMarshalNormRoPEF32(t *testing.T) {
	var got []uint64
	d := fakeDevice()
	d.lib.normRopeF32 = func(s, out, x, w uint64, heads int64, out2, x2, w2 uint64, heads2 int64, pos uint64, tt, headDim,
		rotDim int64, style int32, invFreq uint64, attn, eps uint32, flags int32, outBF16 uint64) int32 {
		got = []uint64{s, out, x, w, uint64(heads), out2, x2, w2, uint64(heads2), pos, uint64(tt), uint64(headDim),
			uint64(rotDim), uint64(style), invFreq, uint64(attn), uint64(eps), uint64(flags), outBF16}
		return 0
	}
	const T, D = 3, 128
	parts := []NormRoPEPart{
		{Out: fakeBuf(0x10, T*32*D*4), X: fakeBuf(0x20, T*32*D*4), W: fakeBuf(0x30, D*4), Heads: 32},
		{Out: fakeBuf(0x40, T*4*D*4), X: fakeBuf(0x50, T*4*D*4), Heads: 4},
	}
	pos, inv := fakeBuf(0x60, T*4), fakeBuf(0x70, 64*4)
	for _, fast := range []bool{false, true} {
		if err := d.NormRoPEF32(nil, parts, pos, T, D, 128, RoPEInterleaved, inv, 1.5, 1e-6, fast); err != nil {
			t.Fatal(err)
		}
		flags := uint64(0)
		if fast {
			flags = 1
		}
		want := []uint64{0, 0x10, 0x20, 0x30, 32, 0x40, 0x50, 0, 4, 0x60, T, D, 128, uint64(RoPEInterleaved), 0x70,
			uint64(math.Float32bits(1.5)), uint64(math.Float32bits(1e-6)), flags, 0}
		if !slices.Equal(got, want) {
			t.Fatalf("fast %v: mk_norm_rope_f32 got %#x, want %#x", fast, got, want)
		}
	}
	if err := d.NormRoPEF32(nil, parts[:1], pos, T, D, 128, RoPENeoX, inv, 1, 1e-6, false); err != nil || got[8] != 0 || got[5] != 0 {
		t.Fatalf("one part: err %v, second part %#x heads %d", err, got[5], got[8])
	}
	parts[0].OutBF16 = fakeBuf(0x80, T*32*D*2)
	if err := d.NormRoPEF32(nil, parts, pos, T, D, 128, RoPENeoX, inv, 1, 1e-6, true); err != nil || got[18] != 0x80 {
		t.Fatalf("OutBF16: err %v, out_bf16 %#x", err, got[18])
	}
	parts[0].OutBF16 = fakeBuf(0x80, T*32*D*2-2)
	if err := d.NormRoPEF32(nil, parts, pos, T, D, 128, RoPENeoX, inv, 1, 1e-6, true); err == nil {
		t.Fatalf("OutBF16 one element short: no error")
	}
}

func TestMarshalAddRMSNormF32(t *testing.T) {
	var got []uint64
	d := fakeDevice()
	d.lib.addRMSNormF32 = func(s, sum, out, x, r, w uint64, rows, cols int64, eps uint32, outb uint64) int32 {
		got = []uint64{s, sum, out, x, r, w, uint64(rows), uint64(cols), uint64(eps), outb}
		return 0
	}
	n := int64(2 * 2048 * 4)
	b := func(p uint64) *Buffer { return fakeBuf(p, n) }
	for _, ob := range []*Buffer{nil, fakeBuf(0x70, n/2)} {
		if err := d.AddRMSNormF32(nil, b(0x10), b(0x20), b(0x30), b(0x40), fakeBuf(0x50, 2048*4), ob, 2, 2048, 1e-5); err != nil {
			t.Fatal(err)
		}
		want := []uint64{0, 0x10, 0x20, 0x30, 0x40, 0x50, 2, 2048, uint64(math.Float32bits(1e-5)), 0}
		if ob != nil {
			want[9] = 0x70
		}
		if !slices.Equal(got, want) {
			t.Fatalf("mk_add_rmsnorm_f32 got %#x, want %#x", got, want)
		}
	}
	if err := d.AddRMSNormF32(nil, b(0x10), b(0x20), b(0x30), b(0x40), fakeBuf(0x50, 2048*4), fakeBuf(0x70, 8), 2, 2048, 1e-5); err == nil {
		t.Error("a short outb gave no error")
	}
}

func TestNeedAllArgs(t *testing.T) {
	b := fakeBuf(0x10, 64)
	for _, c := range []struct {
		kv []any
		ok bool
	}{
		{[]any{"a", b, int64(16)}, true},
		{[]any{"a", b, 16}, true},
		{[]any{"a", b, 17}, false},
		{[]any{"a", b, int32(1)}, false},
		{[]any{"a", b}, false},
		{[]any{"a", (*Buffer)(nil), 1}, false},
	} {
		if err := needAll("op", 4, c.kv...); (err == nil) != c.ok {
			t.Errorf("needAll %v: %v", c.kv, err)
		}
	}
}

// TestMarshalPagedAttnBF16: ABI 11's out_bf16 reaches the C function right
// after out (0 without one), and a short one is refused.
func TestMarshalPagedAttnBF16(t *testing.T) {
	var got []uint64
	old := pagedAttnBF16
	defer func() { pagedAttnBF16 = old }()
	pagedAttnBF16 = func(s, out, outBF16, q, poolK, poolV, rows, pos, table, blocks uint64, n int64,
		heads, kvHeads, headDim, vHeadDim, blockSize int32, scaleBits uint32, window int32, sinks uint64,
		maxKeys int32, work, workSize uint64) int32 {
		got = []uint64{s, out, outBF16, q, poolK, poolV, rows, pos, table, blocks, uint64(n), uint64(heads),
			uint64(kvHeads), uint64(headDim), uint64(vHeadDim), uint64(blockSize), uint64(scaleBits), uint64(window),
			sinks, uint64(maxKeys), work, workSize}
		return 0
	}
	d := fakeDevice()
	a := AttnArgs{Heads: 4, KVHeads: 2, HeadDim: 64, VHeadDim: 64, BlockSize: 16, Scale: 0.125}
	const n = 3
	out, outb := fakeBuf(0x100, n*4*64*4), fakeBuf(0x200, n*4*64*2)
	q, pk, pv := fakeBuf(0x300, n*4*64*4), fakeBuf(0x400, 64*2*64*2), fakeBuf(0x500, 64*2*64*2)
	rows, pos, table, blocks := fakeBuf(0x600, n*4), fakeBuf(0x700, n*4), fakeBuf(0x800, n*4), fakeBuf(0x900, 8*4)
	work := fakeBuf(0xa00, 4096)
	call := func(ob *Buffer) error {
		return d.PagedAttnBF16(nil, out, ob, q, pk, pv, rows, pos, table, blocks, nil, work, n, 40, a)
	}
	if err := call(outb); err != nil {
		t.Fatal(err)
	}
	want := []uint64{0, 0x100, 0x200, 0x300, 0x400, 0x500, 0x600, 0x700, 0x800, 0x900, n, 4, 2, 64, 64, 16,
		uint64(math.Float32bits(0.125)), 0, 0, 40, 0xa00, 4096}
	if !slices.Equal(got, want) {
		t.Fatalf("mk_paged_attn_bf16 got %#x, want %#x", got, want)
	}
	if err := call(nil); err != nil || got[2] != 0 {
		t.Errorf("without out_bf16: err %v, argument %#x", err, got[2])
	}
	if err := call(fakeBuf(0x200, 4*64)); err == nil {
		t.Error("a short out_bf16 gave no error")
	}
}

// TestMarshalMoERouteExperts: mk_moe_route_experts gets the routing's and
// the experts' arguments in its C order, and a router whose expert count
// differs from the weights' is refused before the call.
func TestMarshalMoERouteExperts(t *testing.T) {
	var got []uint64
	old := moeRouteExperts
	defer func() { moeRouteExperts = old }()
	moeRouteExperts = func(s, out, x, ids, weights, logits, scoreBias uint64, tt int64, k, e, flags, groups, topkGroups int32,
		scaling uint32, h, i int64, gateUp, gateUpBias, down, downBias uint64, act int32, alpha, limit uint32, counts, ws,
		wsBytes uint64) int32 {
		got = []uint64{s, out, x, ids, weights, logits, scoreBias, uint64(tt), uint64(k), uint64(e), uint64(flags),
			uint64(groups), uint64(topkGroups), uint64(scaling), uint64(h), uint64(i), gateUp, gateUpBias, down, downBias,
			uint64(act), uint64(alpha), uint64(limit), counts, ws, wsBytes}
		return 0
	}
	d := fakeDevice()
	const T, K, E, H, I = 2, 8, 256, 64, 32
	r := MoERouter{Experts: E, TopK: K, Sigmoid: true, NormTopK: true, Groups: 8, TopKGroups: 4, Scaling: 2.5}
	ex := &MoEExperts{E: E, H: H, I: I, GateUp: fakeBuf(0x60, E*2*I*H*2), Down: fakeBuf(0x70, E*H*I*2),
		DownBias: fakeBuf(0x80, E*H*4), Clamped: true, Alpha: 1.5, Limit: 7}
	out, x := fakeBuf(0x10, T*H*4), fakeBuf(0x20, T*H*2)
	ids, w, logits, sb := fakeBuf(0x30, T*K*4), fakeBuf(0x40, T*K*4), fakeBuf(0x50, T*E*4), fakeBuf(0x58, E*4)
	counts, ws := fakeBuf(0x90, E*8), fakeBuf(0xa0, 1<<20)
	if err := d.MoERouteExpertsRun(nil, out, x, ids, w, logits, sb, T, r, ex, counts, ws); err != nil {
		t.Fatal(err)
	}
	want := []uint64{0, 0x10, 0x20, 0x30, 0x40, 0x50, 0x58, T, K, E, uint64(moeSigmoid | moeNormTopK), 8, 4,
		uint64(math.Float32bits(2.5)), H, I, 0x60, 0, 0x70, 0x80, 1, uint64(math.Float32bits(1.5)),
		uint64(math.Float32bits(7)), 0x90, 0xa0, 1 << 20}
	if !slices.Equal(got, want) {
		t.Fatalf("mk_moe_route_experts got %#x, want %#x", got, want)
	}
	got = nil
	r.Experts = 128
	if err := d.MoERouteExpertsRun(nil, out, x, ids, w, logits, sb, T, r, ex, counts, ws); err == nil || got != nil {
		t.Errorf("128 router experts for 256 weights: err %v, called %v", err, got != nil)
	}
}

// TestMarshalGemmSkinnyBF16: mk_gemm_skinny_bf16's arguments in C order,
// the bias and workspace optional, and shapes the kernel does not take
// refused before the call.
func TestMarshalGemmSkinnyBF16(t *testing.T) {
	var got []uint64
	old := gemmSkinny
	defer func() { gemmSkinny = old }()
	gemmSkinny = func(s, c, a, b, bias uint64, m, n, k int64, work, workBytes uint64) int32 {
		got = []uint64{s, c, a, b, bias, uint64(m), uint64(n), uint64(k), work, workBytes}
		return 0
	}
	d := fakeDevice()
	c, a, b, bias := fakeBuf(0x100, 32*512*4), fakeBuf(0x200, 32*2048*2), fakeBuf(0x300, 512*2048*2), fakeBuf(0x400, 512*4)
	work := fakeBuf(0x500, 8*32*512*4)
	if err := d.GemmSkinnyBF16(nil, c, a, b, bias, work, 32, 512, 2048); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{0, 0x100, 0x200, 0x300, 0x400, 32, 512, 2048, 0x500, 8 * 32 * 512 * 4}; !slices.Equal(got, want) {
		t.Fatalf("mk_gemm_skinny_bf16 got %#x, want %#x", got, want)
	}
	if err := d.GemmSkinnyBF16(nil, c, a, b, nil, nil, 3, 512, 2048); err != nil || got[4] != 0 || got[5] != 3 ||
		got[8] != 0 || got[9] != 0 {
		t.Errorf("without a bias and workspace: err %v, arguments %#x", err, got)
	}
	got = nil
	for _, bad := range []struct{ m, n, k int }{{65, 512, 2048}, {32, 500, 2048}, {32, 512, 2044}} {
		if err := d.GemmSkinnyBF16(nil, c, a, b, nil, nil, bad.m, bad.n, bad.k); err == nil || got != nil {
			t.Errorf("M=%d N=%d K=%d: err %v, called %v", bad.m, bad.n, bad.k, err, got != nil)
		}
	}
}

// TestMarshalMoEGemvMode: SetMoEGemvMode passes the mode, mirrors it for
// MoEGemv / MoEGemvOneLaunchOn, and refuses modes the library lacks; the
// watchdog record of mk_moe_decode_check becomes a *MoEDecodeError.
func TestMarshalMoEGemvMode(t *testing.T) {
	oldSet, oldCheck, oldNow := moeGemvSet, moeDecodeCheck, moeGemvNow.Load()
	defer func() { moeGemvSet, moeDecodeCheck = oldSet, oldCheck; moeGemvNow.Store(oldNow) }()
	var set []int32
	moeGemvSet = func(on int32) int32 { set = append(set, on); return 0 }
	d := fakeDevice()
	for _, m := range []MoEGemvMode{MoEGemvOneLaunch, MoEGemvResident, MoEGemvTwo, MoEGemvOff, MoEGemvAuto} {
		if err := d.SetMoEGemvMode(m); err != nil {
			t.Fatal(err)
		}
		forced := m != MoEGemvOff && m != MoEGemvAuto
		if got := MoEGemv(1, 8, 768); got != forced {
			t.Errorf("mode %d: MoEGemv(1, 8, 768) = %v", m, got)
		}
		if got := MoEGemv(2, 2, MoEGemvAutoInter); got != forced {
			t.Errorf("mode %d: MoEGemv(2, 2, %d) = %v", m, MoEGemvAutoInter, got)
		}
		// Auto: one token over long expert rows only.
		if got := MoEGemv(1, 2, MoEGemvAutoInter); got != (m != MoEGemvOff) {
			t.Errorf("mode %d: MoEGemv(1, 2, %d) = %v", m, MoEGemvAutoInter, got)
		}
		if got := MoEGemv(1, 2, MoEGemvAutoInter-8); got != forced {
			t.Errorf("mode %d: MoEGemv(1, 2, %d) = %v", m, MoEGemvAutoInter-8, got)
		}
		if MoEGemv(5, 1, 1<<14) || MoEGemv(4, 9, 1<<14) || MoEGemv(1, 33, 1<<14) {
			t.Errorf("mode %d: MoEGemv beyond 4 tokens or 32 assignments", m)
		}
		if got := MoEGemvOneLaunchOn(); got != (m == MoEGemvOneLaunch) {
			t.Errorf("mode %d: MoEGemvOneLaunchOn = %v", m, got)
		}
	}
	for _, bad := range []MoEGemvMode{4, -2} {
		if err := d.SetMoEGemvMode(bad); err == nil {
			t.Errorf("mode %d accepted", bad)
		}
	}
	if !slices.Equal(set, []int32{2, 3, 1, 0, -1}) {
		t.Errorf("mk_moe_gemv got %v, want [2 3 1 0 -1]", set)
	}
	rec := []int32{0, 0, 0, 0}
	moeDecodeCheck = func(r *int32) int32 {
		copy(unsafe.Slice(r, 4), rec)
		return 0
	}
	if err := d.MoEDecodeCheck(); err != nil {
		t.Fatalf("quiet record: %v", err)
	}
	rec = []int32{1, 17, 300, 528}
	var me *MoEDecodeError
	if err := d.MoEDecodeCheck(); !errors.As(err, &me) || *me != (MoEDecodeError{CTA: 17, Seen: 300, Grid: 528}) {
		t.Fatalf("record %v: got %v", rec, err)
	}
}
