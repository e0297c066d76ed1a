package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// flashCase is one FlashAttention test: a varlen batch (lens query rows
// per sequence at positions past..past+len-1) with its KV layout.
type flashCase struct {
	name              string
	lens, past        []int
	heads, kvHeads    int
	headDim, vHeadDim int
	blockSize         int // 0: contiguous
	causal            bool
	window            int
	sinks             bool
	out               DType
}

// flashInputs are a case's random inputs and index tables.
type flashInputs struct {
	qBits, kBits, vBits []uint16
	q, k, v             []float32 // the bf16 values
	qStart, past, table []int32
	blocks              []int32
	poolRows            int
	sinks               []float32
	rowOf               func(b, j int) int // pool row of key j of sequence b
	tokens, maxQ        int
	scale               float32
}

// makeFlashInputs draws q, the pools and sinks, and lays the keys out:
// contiguous with random gaps between sequences, or paged over shuffled
// physical blocks with spare blocks in the pool.
func makeFlashInputs(r *rand.Rand, c flashCase) *flashInputs {
	in := &flashInputs{scale: float32(1 / math.Sqrt(float64(c.headDim)))}
	B := len(c.lens)
	in.qStart = make([]int32, B+1)
	in.past = make([]int32, B)
	in.table = make([]int32, B)
	for b, n := range c.lens {
		in.qStart[b+1] = in.qStart[b] + int32(n)
		in.past[b] = int32(c.past[b])
		in.maxQ = max(in.maxQ, n)
	}
	in.tokens = int(in.qStart[B])
	in.maxQ = max(in.maxQ, 1)
	if c.blockSize == 0 {
		start := make([]int, B)
		rows := 0
		for b := range B {
			rows += r.IntN(5)
			start[b] = rows
			in.table[b] = int32(rows)
			rows += c.past[b] + c.lens[b]
		}
		in.poolRows = max(rows+r.IntN(5), 1)
		in.rowOf = func(b, j int) int { return start[b] + j }
	} else {
		bs := c.blockSize
		need := 0
		for b := range B {
			need += (c.past[b] + c.lens[b] + bs - 1) / bs
		}
		phys := need + 3
		perm := r.Perm(phys)
		lists := make([][]int32, B)
		next := 0
		for b := range B {
			in.table[b] = int32(len(in.blocks))
			for range (c.past[b] + c.lens[b] + bs - 1) / bs {
				in.blocks = append(in.blocks, int32(perm[next]))
				lists[b] = append(lists[b], int32(perm[next]))
				next++
			}
		}
		in.blocks = append(in.blocks, -1) // never read: one past the last sequence's blocks
		in.poolRows = phys * bs
		in.rowOf = func(b, j int) int { return int(lists[b][j/bs])*bs + j%bs }
	}
	tq := max(in.tokens, 1)
	in.qBits, in.q = randBF16(r, tq*c.heads*c.headDim, 1)
	in.kBits, in.k = randBF16(r, in.poolRows*c.kvHeads*c.headDim, 1)
	in.vBits, in.v = randBF16(r, in.poolRows*c.kvHeads*c.vHeadDim, 1)
	if c.sinks {
		in.sinks = make([]float32, c.heads)
		for i := range in.sinks {
			in.sinks[i] = float32(r.NormFloat64() * 2)
		}
	}
	return in
}

// flashRef is the float64 reference of FlashAttention on the bf16 values:
// out [tokens, heads*vHeadDim]. Sequences and heads run in parallel.
func flashRef(c flashCase, in *flashInputs) []float64 {
	H, D, DV, G := c.heads, c.headDim, c.vHeadDim, c.heads/c.kvHeads
	out := make([]float64, max(in.tokens, 1)*H*DV)
	var wg sync.WaitGroup
	for b := range c.lens {
		for h := range H {
			wg.Add(1)
			go func() {
				defer wg.Done()
				kvh := h / G
				nk := c.past[b] + c.lens[b]
				sc := make([]float64, nk)
				for i := range c.lens[b] {
					row := int(in.qStart[b]) + i
					p := c.past[b] + i
					lo, hi := 0, nk-1
					if c.causal {
						hi = p
						if c.window > 0 {
							lo = max(0, p-c.window+1)
						}
					}
					qv := in.q[(row*H+h)*D : (row*H+h)*D+D]
					m := math.Inf(-1)
					for j := lo; j <= hi; j++ {
						kr := in.rowOf(b, j)
						kv := in.k[(kr*c.kvHeads+kvh)*D : (kr*c.kvHeads+kvh)*D+D]
						var s float64
						for e := range D {
							s += float64(qv[e]) * float64(kv[e])
						}
						sc[j] = s * float64(in.scale)
						m = math.Max(m, sc[j])
					}
					if in.sinks != nil {
						m = math.Max(m, float64(in.sinks[h]))
					}
					var den float64
					o := out[(row*H+h)*DV : (row*H+h)*DV+DV]
					for j := lo; j <= hi; j++ {
						w := math.Exp(sc[j] - m)
						den += w
						vr := in.rowOf(b, j)
						vv := in.v[(vr*c.kvHeads+kvh)*DV : (vr*c.kvHeads+kvh)*DV+DV]
						for e := range DV {
							o[e] += w * float64(vv[e])
						}
					}
					if in.sinks != nil {
						den += math.Exp(float64(in.sinks[h]) - m)
					}
					for e := range DV {
						o[e] /= den
					}
				}
			}()
		}
	}
	wg.Wait()
	return out[:in.tokens*H*DV]
}

// runFlash uploads a case's inputs, poisons out with NaN, runs FlashAttention
// and returns out as float32.
func runFlash(t *testing.T, g *GPU, c flashCase, in *flashInputs) []float32 {
	t.Helper()
	n := in.tokens * c.heads * c.vHeadDim
	var got []float32
	onGPU(t, g, func(ar *arena) {
		var out *Buffer
		if c.out == F32 {
			out = put(ar, fill32(max(n, 1), float32(math.NaN())))
		} else {
			out = put(ar, bf16Fill(max(n, 1), bf16NaN))
		}
		q := put(ar, in.qBits)
		pk, pv := put(ar, in.kBits), put(ar, in.vBits)
		qs, past, table := put(ar, in.qStart), put(ar, in.past), put(ar, in.table)
		var blocks, sinks *Buffer
		if c.blockSize > 0 {
			blocks = put(ar, in.blocks)
		}
		if in.sinks != nil {
			sinks = put(ar, in.sinks)
		}
		if ar.err != nil {
			return
		}
		ar.check(ar.d.FlashAttention(nil, out, q, pk, pv, qs, past, table, blocks, sinks, FlashArgs{
			Batch: len(c.lens), MaxQLen: in.maxQ, Tokens: max(in.tokens, 1),
			Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim, VHeadDim: c.vHeadDim,
			BlockSize: c.blockSize, PoolRows: in.poolRows, NumBlocks: len(in.blocks),
			Scale: in.scale, Window: c.window, Causal: c.causal, Out: c.out,
		}))
		if c.out == F32 {
			got = get[float32](ar, out, n)
		} else {
			got = bf16ToF32s(get[uint16](ar, out, n))
		}
	})
	return got
}

// TestFlashAttention runs FlashAttention over varlen batches (causal and
// not, GQA, paged and contiguous keys, windows, sinks, head dims 16–256)
// against a float64 reference. The head-dim-128 and 192/128 (MLA) cases
// without a window or sinks run on the wgmma kernel (flash_wg), or with
// MK_FLASH_WG=0 (scripts/device.sh runs it so too) on the mma.sync one;
// MK_FLASH_WG192=0 keeps only the 192/128 ones on mma.sync.
func TestFlashAttention(t *testing.T) {
	g := testGPU(t)
	cases := []flashCase{
		{name: "d16_mha_contig", lens: []int{17}, past: []int{0}, heads: 2, kvHeads: 2, headDim: 16, vHeadDim: 16,
			causal: true, out: BF16},
		{name: "d24_gqa4_paged16_varlen", lens: []int{1, 17, 130}, past: []int{0, 5, 40}, heads: 8, kvHeads: 2,
			headDim: 24, vHeadDim: 24, blockSize: 16, causal: true, out: F32},
		{name: "d32_gqa8_paged7_sinks", lens: []int{130, 33}, past: []int{0, 100}, heads: 8, kvHeads: 1,
			headDim: 32, vHeadDim: 32, blockSize: 7, causal: true, sinks: true, out: F32},
		{name: "d32_gqa8_bigtiles", lens: []int{300, 0, 300}, past: []int{0, 3, 77}, heads: 64, kvHeads: 8,
			headDim: 32, vHeadDim: 32, blockSize: 16, causal: true, out: BF16},
		{name: "d64_window_sinks_paged16", lens: []int{200, 17}, past: []int{0, 50}, heads: 8, kvHeads: 1,
			headDim: 64, vHeadDim: 64, blockSize: 16, causal: true, window: 32, sinks: true, out: BF16},
		{name: "d64_gqa8_window_sinks_bigtiles", lens: []int{260, 140}, past: []int{0, 40}, heads: 64, kvHeads: 8,
			headDim: 64, vHeadDim: 64, blockSize: 16, causal: true, window: 100, sinks: true, out: F32},
		{name: "d128_gqa4_contig_1000", lens: []int{1000}, past: []int{0}, heads: 4, kvHeads: 1,
			headDim: 128, vHeadDim: 128, causal: true, out: F32},
		{name: "d128_noncausal_contig", lens: []int{130, 64}, past: []int{0, 30}, heads: 2, kvHeads: 2,
			headDim: 128, vHeadDim: 128, out: BF16},
		{name: "d128_gqa8_paged16_prefix", lens: []int{1000, 17, 1}, past: []int{24, 0, 999}, heads: 8, kvHeads: 1,
			headDim: 128, vHeadDim: 128, blockSize: 16, causal: true, out: F32},
		{name: "d128_gqa4_bigtiles_paged7", lens: []int{1000, 1000, 300}, past: []int{0, 13, 500}, heads: 16,
			kvHeads: 4, headDim: 128, vHeadDim: 128, blockSize: 7, causal: true, out: BF16},
		{name: "d128_gqa8_noncausal_paged16_past", lens: []int{700, 129, 1}, past: []int{300, 0, 77}, heads: 16,
			kvHeads: 2, headDim: 128, vHeadDim: 128, blockSize: 16, out: F32},
		{name: "d128_mha_causal_paged32_past", lens: []int{257, 383}, past: []int{129, 1000}, heads: 3, kvHeads: 3,
			headDim: 128, vHeadDim: 128, blockSize: 32, causal: true, out: BF16},
		{name: "d64_gqa8_gptoss_window128_sinks", lens: []int{700, 129, 5}, past: []int{300, 0, 1000}, heads: 16,
			kvHeads: 2, headDim: 64, vHeadDim: 64, blockSize: 16, causal: true, window: 128, sinks: true, out: BF16},
		{name: "d128_gqa4_window200_paged16", lens: []int{520, 77}, past: []int{0, 390}, heads: 8, kvHeads: 2,
			headDim: 128, vHeadDim: 128, blockSize: 16, causal: true, window: 200, out: F32},
		{name: "d128_gqa2_bigtiles_paged16", lens: []int{600, 300}, past: []int{0, 64}, heads: 32, kvHeads: 16,
			headDim: 128, vHeadDim: 128, blockSize: 16, causal: true, sinks: true, out: F32},
		{name: "d64_mha_bigtiles_contig", lens: []int{900}, past: []int{0}, heads: 40, kvHeads: 40,
			headDim: 64, vHeadDim: 64, causal: true, out: BF16},
		{name: "mla_192_128_paged16", lens: []int{150, 1}, past: []int{0, 300}, heads: 4, kvHeads: 4,
			headDim: 192, vHeadDim: 128, blockSize: 16, causal: true, out: F32},
		{name: "mla_192_128_bigtiles_contig", lens: []int{1000, 130}, past: []int{0, 0}, heads: 4, kvHeads: 4,
			headDim: 192, vHeadDim: 128, causal: true, out: BF16},
		{name: "mla_192_128_noncausal_paged7_past", lens: []int{300, 1, 129}, past: []int{200, 77, 0}, heads: 3,
			kvHeads: 3, headDim: 192, vHeadDim: 128, blockSize: 7, out: F32},
		{name: "mla_192_128_gqa2_paged16_prefix", lens: []int{700, 17}, past: []int{129, 1000}, heads: 8, kvHeads: 4,
			headDim: 192, vHeadDim: 128, blockSize: 16, causal: true, out: F32},
		{name: "d256_gqa2_paged16", lens: []int{130}, past: []int{7}, heads: 2, kvHeads: 1,
			headDim: 256, vHeadDim: 256, blockSize: 16, causal: true, out: F32},
		{name: "d40_pad64_contig", lens: []int{33, 70}, past: []int{0, 10}, heads: 3, kvHeads: 1,
			headDim: 40, vHeadDim: 40, causal: true, out: BF16},
		{name: "d20_unaligned_contig", lens: []int{33, 70}, past: []int{0, 10}, heads: 3, kvHeads: 1,
			headDim: 20, vHeadDim: 20, causal: true, out: F32},
		{name: "d64_v32_noncausal_paged7", lens: []int{65, 3}, past: []int{2, 60}, heads: 4, kvHeads: 2,
			headDim: 64, vHeadDim: 32, blockSize: 7, out: F32},
		{name: "d33_v17_odd_paged5", lens: []int{40}, past: []int{9}, heads: 2, kvHeads: 1,
			headDim: 33, vHeadDim: 17, blockSize: 5, causal: true, sinks: true, out: BF16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRNG(t)
			in := makeFlashInputs(r, c)
			want := flashRef(c, in)
			got := runFlash(t, g, c, in)
			checkClose(t, "out", got, want, 1e-2)
		})
	}
}

// TestFlashAttentionErrors checks that bad arguments come back as errors,
// from the Go checks and from the library's own checks.
func TestFlashAttentionErrors(t *testing.T) {
	g := testGPU(t)
	good := FlashArgs{Batch: 1, MaxQLen: 4, Tokens: 4, Heads: 2, KVHeads: 1, HeadDim: 16, VHeadDim: 16,
		PoolRows: 4, Scale: 0.25, Causal: true, Out: F32}
	err := g.Do(func(d *Device) error {
		buf, err := d.Malloc(1 << 16)
		if err != nil {
			return err
		}
		defer buf.Free()
		// Zeros: q_start [0, 0] is one empty sequence, so the good call reads nothing else.
		if err := Upload(d, buf, make([]uint32, (1<<16)/4)); err != nil {
			return err
		}
		small, err := buf.View(0, 8)
		if err != nil {
			return err
		}
		call := func(a FlashArgs, out, q *Buffer) error {
			return d.FlashAttention(nil, out, q, buf, buf, buf, buf, buf, buf, nil, a)
		}
		if err := call(good, buf, buf); err != nil {
			return fmt.Errorf("good arguments: %v", err)
		}
		bad := []struct {
			name string
			mod  func(a *FlashArgs)
			out  *Buffer
			q    *Buffer
			want string
		}{
			{"head dim 257", func(a *FlashArgs) { a.HeadDim = 257 }, buf, buf, "at most 256"},
			{"gqa", func(a *FlashArgs) { a.KVHeads = 3 }, buf, buf, "multiple of KVHeads"},
			{"window without causal", func(a *FlashArgs) { a.Causal = false; a.Window = 8 }, buf, buf, "needs Causal"},
			{"scale NaN", func(a *FlashArgs) { a.Scale = float32(math.NaN()) }, buf, buf, "Scale"},
			{"paged without blocks", func(a *FlashArgs) { a.BlockSize = 16 }, buf, buf, "NumBlocks"},
			{"zero batch", func(a *FlashArgs) { a.Batch = 0 }, buf, buf, "Batch"},
			{"small out", func(a *FlashArgs) {}, small, buf, "out holds"},
			{"nil q", func(a *FlashArgs) {}, buf, nil, "q is a nil"},
			{"out dtype", func(a *FlashArgs) { a.Out = 7 }, buf, buf, "Out=7"},
		}
		for _, b := range bad {
			a := good
			b.mod(&a)
			err := call(a, b.out, b.q)
			if err == nil || !strings.Contains(err.Error(), b.want) {
				return fmt.Errorf("%s: got %v, want an error containing %q", b.name, err, b.want)
			}
		}
		// The library's own checks (past the Go ones): head_dim 300, window without causal.
		p := buf.ptr
		rc := flashAttnBF16(0, p, 1, p, p, p, p, p, p, 0, 0, 1, 4, 2, 1, 300, 16, math.Float32bits(0.25), 0, 0, 1)
		var e *Error
		if err := d.lib.check("mk_flash_attn_bf16", rc); !errors.As(err, &e) || e.Code != codeArg ||
			!strings.Contains(e.Msg, "head_dim") {
			return fmt.Errorf("head_dim 300 in C: got %v", err)
		}
		rc = flashAttnBF16(0, p, 1, p, p, p, p, p, p, 0, 0, 1, 4, 2, 1, 16, 16, math.Float32bits(0.25), 4, 0, 0)
		if err := d.lib.check("mk_flash_attn_bf16", rc); !errors.As(err, &e) || e.Code != codeArg ||
			!strings.Contains(e.Msg, "window") {
			return fmt.Errorf("window without causal in C: got %v", err)
		}
		return d.Sync()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFlashArgsCheck runs everywhere (no GPU): the shape checks.
func TestFlashArgsCheck(t *testing.T) {
	good := FlashArgs{Batch: 2, MaxQLen: 8, Tokens: 10, Heads: 8, KVHeads: 2, HeadDim: 192, VHeadDim: 128,
		BlockSize: 16, PoolRows: 64, NumBlocks: 4, Scale: 0.1, Window: 4, Causal: true, Out: BF16}
	if err := good.check(); err != nil {
		t.Fatalf("good arguments: %v", err)
	}
	for _, c := range []struct {
		name string
		mod  func(a *FlashArgs)
	}{
		{"tokens", func(a *FlashArgs) { a.Tokens = 0 }},
		{"vhead 300", func(a *FlashArgs) { a.VHeadDim = 300 }},
		{"kv heads", func(a *FlashArgs) { a.KVHeads = 3 }},
		{"block size", func(a *FlashArgs) { a.BlockSize = -1 }},
		{"num blocks", func(a *FlashArgs) { a.NumBlocks = 0 }},
		{"window", func(a *FlashArgs) { a.Window = -2 }},
		{"non-causal window", func(a *FlashArgs) { a.Causal = false }},
		{"scale", func(a *FlashArgs) { a.Scale = 0 }},
		{"scale inf", func(a *FlashArgs) { a.Scale = float32(math.Inf(1)) }},
		{"batch", func(a *FlashArgs) { a.Batch = 70000 }},
		{"out", func(a *FlashArgs) { a.Out = 3 }},
	} {
		a := good
		c.mod(&a)
		if err := a.check(); err == nil {
			t.Errorf("%s: no error for %+v", c.name, a)
		}
	}
}
