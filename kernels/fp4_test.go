package kernels

import (
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/moe"
	"github.com/mkserve/mkserve/tensor"
)

// randMXFP4 draws an [n, k] bf16 matrix of MXFP4 values: every E2M1 code
// (both zeros included) times a power of two per group of 32, scales
// around 2^-4 ± 6 (some groups all zero).
func randMXFP4(r *rand.Rand, n, k int) []uint16 {
	out := make([]uint16, n*k)
	for g := 0; g < n*k/32; g++ {
		s := math.Ldexp(1, -4+r.IntN(13)-6)
		zero := r.IntN(50) == 0
		for i := range 32 {
			v := float32(0)
			if !zero {
				c := r.IntN(16)
				v = e2m1[c&7] * float32(s)
				if c&8 != 0 {
					v = -v
				}
			}
			out[g*32+i] = tensor.F32ToBF16(v)
		}
	}
	return out
}

// TestPackFP4 packs MXFP4-valued matrices and unpacks them bit for bit;
// values FP4 cannot hold, and shapes it does not take, are refused.
func TestPackFP4(t *testing.T) {
	r := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
	for _, sh := range [][2]int{{1, 64}, {3, 128}, {17, 2880}, {64, 192}} {
		n, k := sh[0], sh[1]
		src := randMXFP4(r, n, k)
		codes, scales, ok := PackFP4(src, n, k)
		if !ok {
			t.Fatalf("[%d, %d]: an MXFP4 matrix was refused", n, k)
		}
		if cb, sb := FP4Sizes(n, k); int64(len(codes)) != cb || int64(len(scales)) != sb {
			t.Fatalf("[%d, %d]: %d code and %d scale bytes, want %d and %d", n, k, len(codes), len(scales), cb, sb)
		}
		got := UnpackFP4(codes, scales, n, k)
		for i := range src {
			// ±0 both unpack as +0 or -0 by the code; compare values.
			if tensor.BF16ToF32(got[i]) != tensor.BF16ToF32(src[i]) {
				t.Fatalf("[%d, %d] element %d: %v, packed from %v", n, k, i, tensor.BF16ToF32(got[i]), tensor.BF16ToF32(src[i]))
			}
		}
	}
	// Every value of a block lands in its own nibble.
	seen := map[[2]uint8]bool{}
	for v := range FP4BlockValues {
		s := fp4Slots[v]
		if seen[s] || s[0] >= 32 || (s[1] != 0 && s[1] != 4) {
			t.Fatalf("value %d at byte %d shift %d: taken or out of the block", v, s[0], s[1])
		}
		seen[s] = true
	}
	src := randMXFP4(r, 4, 128)
	bad := slices.Clone(src)
	bad[200] = tensor.F32ToBF16(tensor.BF16ToF32(bad[200])*1.25 + 0.01) // not E2M1 times the group's scale
	for _, c := range []struct {
		name string
		src  []uint16
		n, k int
	}{
		{"not E2M1", bad, 4, 128},
		{"K not a multiple of 64", src[:4*96], 4, 96},
		{"short source", src[:100], 4, 128},
		{"scale too small", []uint16(slices.Repeat([]uint16{tensor.F32ToBF16(float32(math.Ldexp(1, -133)))}, 64)), 1, 64},
	} {
		if _, _, ok := PackFP4(c.src, c.n, c.k); ok {
			t.Errorf("%s: packed", c.name)
		}
	}
}

// TestFP4Dequant dequantizes packed matrices on the GPU: the bf16 values
// bit for bit (dst poisoned first).
func TestFP4Dequant(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	for _, sh := range [][2]int{{1, 64}, {33, 2880}, {256, 768}} {
		n, k := sh[0], sh[1]
		src := randMXFP4(r, n, k)
		codes, scales, ok := PackFP4(src, n, k)
		if !ok {
			t.Fatal("refused")
		}
		var got []uint16
		onGPU(t, g, func(a *arena) {
			m := &FP4{Codes: put(a, codes), Scales: put(a, scales), N: n, K: k}
			dst := put(a, bf16Fill(n*k, 0x7fc1))
			a.check(a.d.FP4DequantBF16(nil, dst, m))
			got = get[uint16](a, dst, n*k)
		})
		want := UnpackFP4(codes, scales, n, k)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("[%d, %d] element %d: %#04x, want %#04x", n, k, i, got[i], want[i])
			}
		}
	}
}

// TestMoEExpertsFP4 runs the routed experts with FP4 weights (the GEMV
// kernels of up to 32 tokens, in chunks of at most 8 tokens and 32
// assignments, and the dequantized grouped GEMMs beyond) against
// the float64 loop on the same values: relative L2 ≤ 1e-2, out and
// workspace poisoned, counters checked; with biases, gpt-oss's clamped
// SwiGLU, a hot expert, experts no token picks, and a rank's block.
func TestMoEExpertsFP4(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	oss := moe.Activation{Kind: moe.ClampedSwiGLU, Alpha: 1.702, Limit: 7}
	// path: the one fp4_path picks (checked unless MK_FP4_PATH forces one).
	cases := []struct {
		moeCase
		path FP4Path
	}{
		{moeCase{name: "E8_K2_T1", cfg: softmaxRouter(8, 2), T: 1, H: 64, I: 64, hot: -1}, FP4Gemv},
		{moeCase{name: "E32_K4_T3_oss", cfg: softmaxRouter(32, 4), T: 3, H: 128, I: 192, hot: -1, biases: true, clamped: true}, FP4Gemv},
		{moeCase{name: "E16_K4_T8_hot", cfg: softmaxRouter(16, 4), T: 8, H: 256, I: 128, hot: 5}, FP4Gemv},
		{moeCase{name: "E128_K8_T4", cfg: softmaxRouter(128, 8), T: 4, H: 320, I: 64, hot: -1, cold: 100}, FP4Gemv},
		{moeCase{name: "E32_K4_T9_oss", cfg: softmaxRouter(32, 4), T: 9, H: 128, I: 192, hot: -1, biases: true, clamped: true}, FP4Gemm},
		{moeCase{name: "E512_K8_T30_hot", cfg: softmaxRouter(512, 8), T: 30, H: 128, I: 64, hot: 3}, FP4Gemm},
		{moeCase{name: "E32_K4_T32", cfg: softmaxRouter(32, 4), T: 32, H: 128, I: 64, hot: -1}, FP4Gemm},
		{moeCase{name: "E32_K4_T33_oss", cfg: softmaxRouter(32, 4), T: 33, H: 128, I: 192, hot: -1, biases: true, clamped: true}, FP4Gemm},
		{moeCase{name: "E16_K2_T300_cold", cfg: softmaxRouter(16, 2), T: 300, H: 192, I: 128, hot: -1, cold: 12}, FP4Dequant},
		{moeCase{name: "E8_K2_T200_oss", cfg: softmaxRouter(8, 2), T: 200, H: 128, I: 128, hot: -1, biases: true, clamped: true}, FP4Dequant},
		// More experts than a warp: the dequantization's expert list spans warps.
		{moeCase{name: "E128_K4_T48", cfg: softmaxRouter(128, 4), T: 48, H: 128, I: 64, hot: -1}, FP4Gemm},
		{moeCase{name: "E128_K4_T600", cfg: softmaxRouter(128, 4), T: 600, H: 64, I: 128, hot: -1, biases: true}, FP4Dequant},
		{moeCase{name: "E512_K8_T64", cfg: softmaxRouter(512, 8), T: 64, H: 64, I: 128, hot: -1, biases: true}, FP4Gemm},
		{moeCase{name: "E32_K4_T5_block", cfg: softmaxRouter(32, 4), T: 5, H: 128, I: 64, hot: -1, biases: true, lo: 8, hi: 24}, FP4Gemv},
		{moeCase{name: "E32_K4_T40_block", cfg: softmaxRouter(32, 4), T: 40, H: 128, I: 64, hot: -1, lo: 8, hi: 24}, FP4Gemm},
	}
	_, forced := os.LookupEnv("MK_FP4_PATH")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			act := moe.Activation{Kind: moe.SwiGLU}
			if c.clamped {
				act = oss
			}
			if got := runMoEFP4Case(t, g, r, c.moeCase, act); !forced && got != c.path {
				t.Errorf("path %v, want %v", got, c.path)
			}
		})
	}
}

// TestMoEFP4Path: the path rule (moe_fp4.cuh's fp4_path) at its edges, or
// with MK_FP4_PATH set, the forced path wherever it is allowed.
func TestMoEFP4Path(t *testing.T) {
	g := testGPU(t)
	forced := map[string]FP4Path{"gemv": FP4Gemv, "gemm": FP4Gemm, "dequant": FP4Dequant}
	f, isForced := forced[os.Getenv("MK_FP4_PATH")]
	cases := []struct {
		T, K, E int
		want    FP4Path
	}{
		{1, 4, 128, FP4Gemv}, // gpt-oss-120b decoding one token
		{8, 4, 128, FP4Gemv}, // one chunk: 8 tokens, 32 assignments
		{4, 8, 128, FP4Gemv},
		{5, 8, 128, FP4Gemm}, // 40 assignments: two chunks
		{9, 4, 128, FP4Gemm},
		{32, 4, 32, FP4Gemm},
		{512, 4, 128, FP4Gemm}, // 16 rows an expert on average
		{513, 4, 128, FP4Dequant},
		{1, 33, 256, FP4Gemm}, // top-k beyond a warp's mask: no GEMV
		{16384, 4, 128, FP4Dequant},
	}
	got := make([]FP4Path, len(cases))
	var bad error
	onGPU(t, g, func(a *arena) {
		for i, c := range cases {
			var err error
			got[i], err = a.d.MoEFP4Path(c.T, c.K, c.E)
			a.check(err)
		}
		_, bad = a.d.MoEFP4Path(1, 5, 4)
	})
	for i, c := range cases {
		want := c.want
		if isForced && (f != FP4Gemv || c.K <= 32 && c.T <= min(8, 32/c.K)) {
			want = f
		}
		if got[i] != want {
			t.Errorf("T=%d K=%d E=%d: path %v, want %v", c.T, c.K, c.E, got[i], want)
		}
	}
	if bad == nil {
		t.Error("top-5 of 4 experts: no error")
	}
}

// runMoEFP4Case runs c on FP4 experts against the float64 loop and
// returns the path the device took.
func runMoEFP4Case(t *testing.T, g *GPU, r *rand.Rand, c moeCase, act moe.Activation) FP4Path {
	E, K, T, H, I := c.cfg.NumExperts, c.cfg.TopK, c.T, c.H, c.I
	logits, sbias := moeLogits(r, c)
	xb, x := randBF16(r, T*H, 1)
	gu16, dn16 := randMXFP4(r, E*2*I, H), randMXFP4(r, E*H, I)
	guC, guS, ok1 := PackFP4(gu16, E*2*I, H)
	dnC, dnS, ok2 := PackFP4(dn16, E*H, I)
	if !ok1 || !ok2 {
		t.Fatal("packing refused")
	}
	gu, dn := bf16ToF32s(gu16), bf16ToF32s(dn16)
	var gub, db []float32
	if c.biases {
		gub, db = randF32(r, E*2*I, 0.3), randF32(r, E*H, 0.3)
	}
	local := c.lo < c.hi
	ex := &MoEExperts{E: E, H: H, I: I, Clamped: c.clamped, Alpha: act.Alpha, Limit: act.Limit}
	countsIn := make([]int64, E)
	var out, w []float32
	var ids []int32
	var counts []int64
	var wsBytes int64
	var path FP4Path
	onGPU(t, g, func(a *arena) {
		ex.GateUpFP4 = &FP4{Codes: put(a, guC), Scales: put(a, guS), N: E * 2 * I, K: H}
		ex.DownFP4 = &FP4{Codes: put(a, dnC), Scales: put(a, dnS), N: E * H, K: I}
		if c.biases {
			ex.GateUpBias, ex.DownBias = put(a, gub), put(a, db)
		}
		lb, xbuf := put(a, logits), put(a, xb)
		var sb *Buffer
		if sbias != nil {
			sb = put(a, sbias)
		}
		ib, wb := put(a, make([]int32, T*K)), put(a, f32Fill(T*K, float32(math.NaN())))
		ob := put(a, f32Fill(T*H, float32(math.NaN())))
		cb := put(a, countsIn)
		if a.err != nil {
			return
		}
		run, runCounts := ex, cb
		if local {
			l, err := ex.Block(c.lo, c.hi)
			a.check(err)
			run, runCounts = l, nil
		}
		var err error
		wsBytes, _, err = a.d.MoEWorkspace(T, K, run)
		a.check(err)
		path, err = a.d.MoEFP4Path(T, K, run.E)
		a.check(err)
		if a.err != nil {
			return
		}
		ws := put(a, bf16Fill(int(wsBytes/2), 0xffff))
		a.check(a.d.MoERoute(nil, ib, wb, lb, sb, T, moeRouter(c.cfg)))
		ids = get[int32](a, ib, T*K)
		if local {
			a.check(a.d.MoELocalize(nil, ib, T*K, c.lo, c.hi, nil, 0))
		}
		a.check(a.d.MoEExpertsRun(nil, ob, xbuf, ib, wb, T, K, run, runCounts, ws))
		out = get[float32](a, ob, T*H)
		w = get[float32](a, wb, T*K)
		counts = get[int64](a, cb, E)
	})
	t.Logf("path %v, workspace %d bytes", path, wsBytes)
	checkMoERun(t, "FP4 MoE", c, moeRun{logits: logits, sbias: sbias, ids: ids, w: w, counts: counts, countsIn: countsIn,
		out: out, x: x, gu: gu, gub: gub, dn: dn, db: db}, act)
	return path
}

// BenchmarkPackFP4 packs a gpt-oss expert's gate/up matrix [5760, 2880].
func BenchmarkPackFP4(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	const n, k = 5760, 2880
	src := randMXFP4(r, n, k)
	b.SetBytes(int64(n * k * 2))
	for b.Loop() {
		if _, _, ok := PackFP4(src, n, k); !ok {
			b.Fatal("refused")
		}
	}
}

// FuzzPackFP4: whatever bf16 bits come in, PackFP4 either refuses them or
// packs values that UnpackFP4 gives back exactly (a zero's sign aside).
func FuzzPackFP4(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	seed := randMXFP4(r, 1, 64)
	b := make([]byte, 128)
	for i, v := range seed {
		b[2*i], b[2*i+1] = byte(v), byte(v>>8)
	}
	f.Add(b)
	f.Add(make([]byte, 128))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := len(data) / 128
		if n == 0 {
			return
		}
		src := make([]uint16, n*64)
		for i := range src {
			src[i] = uint16(data[2*i]) | uint16(data[2*i+1])<<8
		}
		codes, scales, ok := PackFP4(src, n, 64)
		if !ok {
			return
		}
		got := UnpackFP4(codes, scales, n, 64)
		for i := range src {
			if tensor.BF16ToF32(got[i]) != tensor.BF16ToF32(src[i]) {
				t.Fatalf("element %d: %#04x packed, %#04x unpacked", i, src[i], got[i])
			}
		}
	})
}

// TestRepackMXFP4: an MXFP4 matrix as checkpoints store it, repacked,
// unpacks to the values its own decoding gives (every code, scales from
// 1 to 240); scales outside that range and K not a multiple of 64 are
// refused.
func TestRepackMXFP4(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, sh := range [][2]int{{1, 64}, {7, 2880}, {33, 192}} {
		n, k := sh[0], sh[1]
		blocks := make([]byte, n*k/2)
		scales := make([]byte, n*k/32)
		for i := range blocks {
			blocks[i] = byte(r.IntN(256))
		}
		for i := range scales {
			scales[i] = byte(1 + r.IntN(240))
		}
		codes, sc, ok := RepackMXFP4(blocks, scales, n, k)
		if !ok {
			t.Fatalf("[%d, %d]: refused", n, k)
		}
		want, got := DecodeMXFP4(blocks, scales, n, k), UnpackFP4(codes, sc, n, k)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("[%d, %d] element %d: %#04x, want %#04x", n, k, i, got[i], want[i])
			}
		}
	}
	blocks, scales := make([]byte, 64), []byte{127, 127, 127, 127}
	if _, _, ok := RepackMXFP4(blocks, scales, 2, 64); !ok {
		t.Error("a zero matrix was refused")
	}
	for name, c := range map[string]struct {
		sc   []byte
		n, k int
	}{"scale 0": {[]byte{127, 0, 127, 127}, 2, 64}, "scale 241": {[]byte{241, 127, 127, 127}, 2, 64}, "K 32": {scales, 4, 32}} {
		if _, _, ok := RepackMXFP4(blocks, c.sc, c.n, c.k); ok {
			t.Errorf("%s: repacked", name)
		}
	}
}

// TestQuantizeMXFP4: MXFP4's own values come back exactly through
// QuantizeMXFP4 and DecodeMXFP4; another value goes to its nearest
// neighbour of the group's scale.
func TestQuantizeMXFP4(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	src := randMXFP4(r, 5, 128)
	v := bf16ToF32s(src)
	blocks, scales := QuantizeMXFP4(v, 5, 128)
	for i, b := range DecodeMXFP4(blocks, scales, 5, 128) {
		if tensor.BF16ToF32(b) != v[i] {
			t.Fatalf("element %d: %v, want %v", i, tensor.BF16ToF32(b), v[i])
		}
	}
	g := make([]float32, 32)
	g[0], g[1], g[2] = 6, 2.4, -0.3 // scale 1: 2.4 → 2, -0.3 → -0.5 (0.2 from it, 0.3 from 0)
	blocks, scales = QuantizeMXFP4(g, 1, 32)
	d := DecodeMXFP4(blocks, scales, 1, 32)
	if scales[0] != 127 || tensor.BF16ToF32(d[0]) != 6 || tensor.BF16ToF32(d[1]) != 2 || tensor.BF16ToF32(d[2]) != -0.5 {
		t.Errorf("scale %d, values %v %v %v", scales[0], tensor.BF16ToF32(d[0]), tensor.BF16ToF32(d[1]), tensor.BF16ToF32(d[2]))
	}
}

// TestMoEExpertsBlock: a rank's block of experts views each buffer at the
// block's first expert, one expert's bytes times the block's size, in
// both forms (no device: the views' addresses alone).
func TestMoEExpertsBlock(t *testing.T) {
	const E, H, I, lo, hi = 8, 128, 64, 2, 5
	buf := func(bytes int64) *Buffer { return &Buffer{ptr: 1 << 20, bytes: bytes} }
	at := func(b *Buffer) [2]int64 { return [2]int64{int64(b.ptr - 1<<20), b.bytes} }
	bf := &MoEExperts{E: E, H: H, I: I, GateUp: buf(E * 2 * I * H * 2), Down: buf(E * H * I * 2), DownBias: buf(E * H * 4)}
	l, err := bf.Block(lo, hi)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(hi - lo)
	if l.E != hi-lo || at(l.GateUp) != [2]int64{lo * 2 * I * H * 2, n * 2 * I * H * 2} ||
		at(l.Down) != [2]int64{lo * H * I * 2, n * H * I * 2} || at(l.DownBias) != [2]int64{lo * H * 4, n * H * 4} || l.GateUpBias != nil {
		t.Errorf("bf16 block: %+v", l)
	}
	gc, gs := FP4Sizes(E*2*I, H)
	dc, ds := FP4Sizes(E*H, I)
	f := &MoEExperts{E: E, H: H, I: I, GateUpFP4: &FP4{Codes: buf(gc), Scales: buf(gs), N: E * 2 * I, K: H},
		DownFP4: &FP4{Codes: buf(dc), Scales: buf(ds), N: E * H, K: I}}
	if l, err = f.Block(lo, hi); err != nil {
		t.Fatal(err)
	}
	if at(l.GateUpFP4.Codes) != [2]int64{lo * 2 * I * H / 2, n * 2 * I * H / 2} || at(l.GateUpFP4.Scales) != [2]int64{lo * 2 * I * H / 32, n * 2 * I * H / 32} ||
		l.GateUpFP4.N != int(n)*2*I || at(l.DownFP4.Codes) != [2]int64{lo * H * I / 2, n * H * I / 2} || l.DownFP4.N != int(n)*H {
		t.Errorf("FP4 block: %+v %+v", l.GateUpFP4, l.DownFP4)
	}
	for _, r := range [][2]int{{-1, 2}, {3, 3}, {0, 9}} {
		if _, err := f.Block(r[0], r[1]); err == nil {
			t.Errorf("block %v of %d experts: no error", r, E)
		}
		if _, err := f.DownFP4.Rows(r[0]*H, r[1]*H); err == nil {
			t.Errorf("rows %v·%d of %d: no error", r, H, E*H)
		}
	}
	if r, err := f.DownFP4.Rows(H+3, 2*H); err != nil || r.N != H-3 || at(r.Codes) != [2]int64{(H + 3) * I / 2, (H - 3) * I / 2} ||
		at(r.Scales) != [2]int64{(H + 3) * I / 32, (H - 3) * I / 32} {
		t.Errorf("rows [%d, %d): %+v, %v", H+3, 2*H, r, err)
	}
}

// TestFP4PathString: the names bench moe prints, and an unknown path.
func TestFP4PathString(t *testing.T) {
	for _, c := range []struct {
		p    FP4Path
		want string
	}{{FP4Gemv, "gemv"}, {FP4Gemm, "gemm"}, {FP4Dequant, "dequant"}, {3, "FP4Path(3)"}, {-1, "FP4Path(-1)"}} {
		if got := c.p.String(); got != c.want {
			t.Errorf("%d: %q, want %q", int32(c.p), got, c.want)
		}
	}
}
