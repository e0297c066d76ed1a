package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/attention"
)

// ringCase is one ring attention test: a sequence of n positions split
// zigzag over ranks.
type ringCase struct {
	name              string
	n, ranks          int
	heads, kvHeads    int
	headDim, vHeadDim int
	causal            bool
	window            int
	sinks             bool
	out               DType
}

// ringInputs are a case's random global inputs (rows = positions).
type ringInputs struct {
	qBits, kBits, vBits []uint16
	q, k, v             []float32
	sinks               []float32
	scale               float32
	spans               [][2]RingSpan
}

func makeRingInputs(r *rand.Rand, c ringCase) *ringInputs {
	in := &ringInputs{scale: float32(1 / math.Sqrt(float64(c.headDim))), spans: RingZigzag(c.n, c.ranks)}
	in.qBits, in.q = randBF16(r, c.n*c.heads*c.headDim, 1)
	in.kBits, in.k = randBF16(r, c.n*c.kvHeads*c.headDim, 1)
	in.vBits, in.v = randBF16(r, c.n*c.kvHeads*c.vHeadDim, 1)
	if c.sinks {
		in.sinks = make([]float32, c.heads)
		for i := range in.sinks {
			in.sinks[i] = float32(r.NormFloat64() * 2)
		}
	}
	return in
}

// ringRef is the float64 reference over the whole sequence: out [n,
// heads*vHeadDim] (sinks in the denominator) and lse [n, heads] (natural
// log of the visible scores' exp sum, sinks excluded).
func ringRef(c ringCase, in *ringInputs) (out, lse []float64) {
	H, KV, D, DV, G := c.heads, c.kvHeads, c.headDim, c.vHeadDim, c.heads/c.kvHeads
	out = make([]float64, c.n*H*DV)
	lse = make([]float64, c.n*H)
	var wg sync.WaitGroup
	for h := range H {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kvh := h / G
			sc := make([]float64, c.n)
			for i := range c.n {
				lo, hi := 0, c.n-1
				if c.causal {
					hi = i
					if c.window > 0 {
						lo = max(0, i-c.window+1)
					}
				}
				qv := in.q[(i*H+h)*D:][:D]
				m := math.Inf(-1)
				for j := lo; j <= hi; j++ {
					kv := in.k[(j*KV+kvh)*D:][:D]
					var s float64
					for e := range D {
						s += float64(qv[e]) * float64(kv[e])
					}
					sc[j] = s * float64(in.scale)
					m = math.Max(m, sc[j])
				}
				var den float64
				o := out[(i*H+h)*DV:][:DV]
				for j := lo; j <= hi; j++ {
					w := math.Exp(sc[j] - m)
					den += w
					vv := in.v[(j*KV+kvh)*DV:][:DV]
					for e := range DV {
						o[e] += w * float64(vv[e])
					}
				}
				lse[i*H+h] = m + math.Log(den)
				if in.sinks != nil {
					den += math.Exp(float64(in.sinks[h]) - m)
				}
				for e := range DV {
					o[e] /= den
				}
			}
		}()
	}
	wg.Wait()
	return out, lse
}

// gatherRows copies the rows of spans (in order) of x [n, width].
func gatherRows[T any](x []T, width int, sp [2]RingSpan) []T {
	var out []T
	for _, s := range sp {
		out = append(out, x[s.Lo*width:s.Hi*width]...)
	}
	return out
}

// ringMode is how ringRun runs a case.
type ringMode int

const (
	ringDouble   ringMode = iota // RingAttention with the two receive buffers
	ringGather                   // RingAttention with gather buffers
	ringSeparate                 // RingSeparate (the baseline)
)

func (m ringMode) String() string { return [...]string{"ring", "gather", "separate"}[m] }

// ringRun uploads every rank's shards, poisons outputs and receive buffers
// with NaN, runs the case as mode says, and returns out and lse in global
// row order, plus the RingCheck error.
func ringRun(t *testing.T, g *GPU, c ringCase, in *ringInputs, mode ringMode, faultRank int,
	timeout time.Duration) (out []float32, lse []float32, werr error) {
	t.Helper()
	H, KV, D, DV := c.heads, c.kvHeads, c.headDim, c.vHeadDim
	a := RingArgs{QSpans: in.spans, Heads: H, KVHeads: KV, HeadDim: D, VHeadDim: DV, Scale: in.scale,
		Window: c.window, Causal: c.causal, Out: c.out, Timeout: timeout, faultRank: faultRank}
	maxLk := 0
	for _, s := range in.spans {
		maxLk = max(maxLk, spanRows(s))
	}
	out = make([]float32, c.n*H*DV)
	lse = make([]float32, c.n*H)
	onGPU(t, g, func(ar *arena) {
		ranks := make([]RingRank, c.ranks)
		for r, sp := range in.spans {
			lq := spanRows(sp)
			rk := &ranks[r]
			rk.Q = put(ar, gatherRows(in.qBits, H*D, sp))
			rk.K = put(ar, gatherRows(in.kBits, KV*D, sp))
			rk.V = put(ar, gatherRows(in.vBits, KV*DV, sp))
			if mode == ringGather && c.ranks > 1 {
				rk.KGather = put(ar, bf16Fill((c.ranks-1)*max(maxLk, 1)*KV*D, bf16NaN))
				rk.VGather = put(ar, bf16Fill((c.ranks-1)*max(maxLk, 1)*KV*DV, bf16NaN))
			} else {
				for i := range 2 {
					rk.KBuf[i] = put(ar, bf16Fill(max(maxLk, 1)*KV*D, bf16NaN))
					rk.VBuf[i] = put(ar, bf16Fill(max(maxLk, 1)*KV*DV, bf16NaN))
				}
			}
			if c.out == F32 {
				rk.Out = put(ar, fill32(max(lq, 1)*H*DV, float32(math.NaN())))
			} else {
				rk.Out = put(ar, bf16Fill(max(lq, 1)*H*DV, bf16NaN))
			}
			rk.LSE = put(ar, fill32(max(lq, 1)*H, float32(math.NaN())))
		}
		var sinks *Buffer
		if in.sinks != nil {
			sinks = put(ar, in.sinks)
		}
		if ar.err != nil {
			return
		}
		ws, err := ar.d.NewRingWorkspace(a)
		if err != nil {
			ar.check(err)
			return
		}
		ar.bufs = append(ar.bufs, ws)
		if mode == ringSeparate {
			ar.check(ar.d.RingSeparate(nil, ranks, sinks, ws, a))
		} else {
			ar.check(ar.d.RingAttention(nil, ranks, sinks, ws, a))
		}
		if ar.err != nil {
			return
		}
		werr = ar.d.RingCheck(ws)
		for r, sp := range in.spans {
			lq := spanRows(sp)
			var o []float32
			if c.out == F32 {
				o = get[float32](ar, ranks[r].Out, lq*H*DV)
			} else {
				o = bf16ToF32s(get[uint16](ar, ranks[r].Out, lq*H*DV))
			}
			l := get[float32](ar, ranks[r].LSE, lq*H)
			off := 0
			for _, s := range sp {
				copy(out[s.Lo*H*DV:s.Hi*H*DV], o[off*H*DV:(off+s.Len())*H*DV])
				copy(lse[s.Lo*H:s.Hi*H], l[off*H:(off+s.Len())*H])
				off += s.Len()
			}
		}
	})
	return out, lse, werr
}

// checkLSE fails unless every lse is within 1e-2 (absolute) of want.
func checkLSE(t *testing.T, name string, got []float32, want []float64) {
	t.Helper()
	worst := 0.0
	for i := range got {
		d := math.Abs(float64(got[i]) - want[i])
		if math.IsNaN(d) {
			t.Errorf("%s: lse %d is %v, want %v", name, i, got[i], want[i])
			return
		}
		worst = math.Max(worst, d)
	}
	if worst > 1e-2 {
		t.Errorf("%s: lse max abs error %.3g > 1e-2", name, worst)
		return
	}
	t.Logf("%s: lse max abs error %.3g", name, worst)
}

func ringCases() []ringCase {
	return []ringCase{
		{name: "r1_n1000_gqa4_d128", n: 1000, ranks: 1, heads: 4, kvHeads: 1, headDim: 128, vHeadDim: 128, causal: true, out: BF16},
		{name: "r2_n777_gqa4_d128_f32", n: 777, ranks: 2, heads: 8, kvHeads: 2, headDim: 128, vHeadDim: 128, causal: true, out: F32},
		{name: "r4_n2061_gqa8_d128", n: 2048 + 13, ranks: 4, heads: 8, kvHeads: 1, headDim: 128, vHeadDim: 128, causal: true, out: BF16},
		{name: "r8_n1000_mha_d128_f32", n: 1000, ranks: 8, heads: 4, kvHeads: 4, headDim: 128, vHeadDim: 128, causal: true, out: F32},
		{name: "r4_n777_noncausal_gqa4", n: 777, ranks: 4, heads: 4, kvHeads: 1, headDim: 128, vHeadDim: 128, out: BF16},
		{name: "r8_n1000_noncausal_gqa1_d64", n: 1000, ranks: 8, heads: 2, kvHeads: 2, headDim: 64, vHeadDim: 64, out: F32},
		{name: "r2_n1000_window100_sinks_d64", n: 1000, ranks: 2, heads: 8, kvHeads: 2, headDim: 64, vHeadDim: 64, causal: true,
			window: 100, sinks: true, out: F32},
		{name: "r4_n1000_window300_sinks_gqa8", n: 1000, ranks: 4, heads: 8, kvHeads: 1, headDim: 64, vHeadDim: 64, causal: true,
			window: 300, sinks: true, out: BF16},
		{name: "r4_n777_mla_192_128", n: 777, ranks: 4, heads: 4, kvHeads: 4, headDim: 192, vHeadDim: 128, causal: true, out: F32},
		{name: "r8_n2061_gqa8_sinks", n: 2048 + 13, ranks: 8, heads: 8, kvHeads: 1, headDim: 128, vHeadDim: 128, causal: true,
			sinks: true, out: BF16},
		{name: "r4_n1500_window200_sinks_gqa4_d128", n: 1500, ranks: 4, heads: 8, kvHeads: 2, headDim: 128, vHeadDim: 128,
			causal: true, window: 200, sinks: true, out: BF16},
		{name: "r8_n3000_noncausal_gqa8_d128_f32", n: 3000, ranks: 8, heads: 8, kvHeads: 1, headDim: 128, vHeadDim: 128,
			out: F32},
		{name: "r8_n13_empty_chunks", n: 13, ranks: 8, heads: 4, kvHeads: 2, headDim: 128, vHeadDim: 128, causal: true, out: F32},
		{name: "r2_n300_d256_gqa2", n: 300, ranks: 2, heads: 4, kvHeads: 2, headDim: 256, vHeadDim: 256, causal: true, out: F32},
		{name: "r4_n500_d20_unaligned", n: 500, ranks: 4, heads: 3, kvHeads: 1, headDim: 20, vHeadDim: 20, causal: true, out: F32},
		// Chunks in whole 128-key tiles (every tile of a chunk full: the
		// kernels' unmasked tile path at chunk edges).
		{name: "r2_n1024_tiles_gqa4_d128", n: 1024, ranks: 2, heads: 8, kvHeads: 2, headDim: 128, vHeadDim: 128, causal: true,
			out: BF16},
		{name: "r8_n2048_tiles_gqa2_d128_f32", n: 2048, ranks: 8, heads: 4, kvHeads: 2, headDim: 128, vHeadDim: 128,
			causal: true, out: F32},
		{name: "r4_n2048_tiles_noncausal_sinks", n: 2048, ranks: 4, heads: 4, kvHeads: 1, headDim: 128, vHeadDim: 128,
			sinks: true, out: BF16},
	}
}

// ringWG reports whether the gather ring and the separate ring of case c
// run on the wgmma kernel (ring.cu's ring_wg: head dims 128/128, unless
// MK_RING_WG=0).
func ringWG(c ringCase) bool {
	return c.headDim == 128 && c.vHeadDim == 128 && os.Getenv("MK_RING_WG") != "0"
}

func TestRingAttention(t *testing.T) {
	g := testGPU(t)
	for _, c := range ringCases() {
		t.Run(c.name, func(t *testing.T) {
			in := makeRingInputs(newRNG(t), c)
			wantOut, wantLSE := ringRef(c, in)
			var ringOut, ringLSE []float32
			for _, mode := range []ringMode{ringDouble, ringGather, ringSeparate} {
				got, lse, werr := ringRun(t, g, c, in, mode, 0, 0)
				if werr != nil {
					t.Fatalf("%v: %v", mode, werr)
				}
				checkClose(t, mode.String()+" out", got, wantOut, 1e-2)
				checkLSE(t, mode.String(), lse, wantLSE)
				switch mode {
				case ringDouble:
					ringOut, ringLSE = got, lse
				case ringGather:
					if ringWG(c) {
						break // the wgmma kernel (128-key tiles): close to the reference, not the same bits
					}
					// The same tiles folded in the same order: the same bits.
					checkSameBits(t, "gather out against ring", got, ringOut)
					checkSameBits(t, "gather lse against ring", lse, ringLSE)
				}
			}
		})
	}
}

// checkSameBits fails unless got and want are equal bit for bit.
func checkSameBits(t *testing.T, name string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", name, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s: value %d is %v, want %v (bit for bit)", name, i, got[i], want[i])
			return
		}
	}
}

// TestRingWatchdog disables rank 1's communication CTAs: the launch must end
// (not hang) and RingCheck must name a waiting rank and role; the next
// launch on the same workspace must succeed.
func TestRingWatchdog(t *testing.T) {
	g := testGPU(t)
	// n = 1024: chunks of whole 128-key tiles.
	c := ringCase{n: 1024, ranks: 4, heads: 4, kvHeads: 1, headDim: 128, vHeadDim: 128, causal: true, out: F32}
	in := makeRingInputs(newRNG(t), c)
	want, _ := ringRef(c, in)
	for _, mode := range []ringMode{ringDouble, ringGather} {
		start := time.Now()
		_, _, werr := ringRun(t, g, c, in, mode, 2, 50*time.Millisecond)
		el := time.Since(start)
		var te *RingTimeoutError
		if !errors.As(werr, &te) {
			t.Fatalf("%v with rank 1's comm disabled: got %v, want a *RingTimeoutError", mode, werr)
		}
		if te.Step < 1 || te.Rank < 0 || te.Rank >= c.ranks || (te.Role != "compute" && te.Role != "comm") ||
			!strings.Contains(te.Error(), "rank") {
			t.Errorf("%v: implausible record: %+v", mode, te)
		}
		t.Logf("%v: watchdog after %v: %v", mode, el, te)
		if el > 20*time.Second {
			t.Errorf("%v: the faulty launch took %v", mode, el)
		}
		got, _, werr := ringRun(t, g, c, in, mode, 0, 0)
		if werr != nil {
			t.Fatalf("%v: healthy launch after a fault: %v", mode, werr)
		}
		checkClose(t, mode.String()+" after fault", got, want, 1e-2)
	}
}

// TestRingPreferGather pins the measured choice of receive buffers.
func TestRingPreferGather(t *testing.T) {
	for _, c := range []struct {
		keys, ranks int
		want        bool
	}{
		{16384, 1, false}, {16384, 2, true}, {16384, 8, true}, {65536, 8, true}, {131072, 8, true}, {100, 1, false},
	} {
		if got := RingPreferGather(c.keys, c.ranks); got != c.want {
			t.Errorf("RingPreferGather(%d, %d) = %v, want %v", c.keys, c.ranks, got, c.want)
		}
	}
}

// TestRingZigzag checks RingZigzag against attention.ZigzagSplit.
func TestRingZigzag(t *testing.T) {
	for _, n := range []int{0, 1, 13, 777, 1000, 2061} {
		for _, R := range []int{1, 2, 4, 8} {
			got, want := RingZigzag(n, R), attention.ZigzagSplit(n, R)
			for r := range R {
				for i := range 2 {
					if got[r][i].Lo != want[r][i].Lo || got[r][i].Hi != want[r][i].Hi {
						t.Fatalf("n %d R %d rank %d span %d: %v, want %v", n, R, r, i, got[r][i], want[r][i])
					}
				}
			}
		}
	}
}

// TestRingArgsCheck needs no GPU: bad shapes are errors naming the field.
func TestRingArgsCheck(t *testing.T) {
	ok := RingArgs{QSpans: RingZigzag(100, 2), Heads: 8, KVHeads: 2, HeadDim: 128, VHeadDim: 128, Scale: 0.1,
		Causal: true, Out: BF16}
	if err := ok.check("T"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		mod  func(a *RingArgs)
		want string
	}{
		{func(a *RingArgs) { a.QSpans = nil }, "ranks"},
		{func(a *RingArgs) { a.QSpans = RingZigzag(100, 9) }, "ranks"},
		{func(a *RingArgs) { a.KVSpans = RingZigzag(100, 4) }, "kv span"},
		{func(a *RingArgs) { a.QSpans = [][2]RingSpan{{{5, 3}, {0, 0}}} }, "query span"},
		{func(a *RingArgs) { a.Heads = 6; a.KVHeads = 4 }, "KVHeads"},
		{func(a *RingArgs) { a.HeadDim = 300 }, "HeadDim"},
		{func(a *RingArgs) { a.Window = 10; a.Causal = false }, "Window"},
		{func(a *RingArgs) { a.Scale = float32(math.Inf(1)) }, "Scale"},
		{func(a *RingArgs) { a.Out = 7 }, "Out"},
		{func(a *RingArgs) { a.Timeout = -1 }, "Timeout"},
	} {
		a := ok
		c.mod(&a)
		if err := a.check("T"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got %v, want an error containing %q", err, c.want)
		}
	}
	// Gather buffers: all ranks or none (rank-local: me and me+1, the
	// entries it reads).
	b := &Buffer{}
	for _, c := range []struct {
		ranks []RingRank
		me    int
		want  bool
		err   string
	}{
		{[]RingRank{{}, {}}, -1, false, ""},
		{[]RingRank{{KGather: b, VGather: b}, {KGather: b, VGather: b}}, -1, true, ""},
		{[]RingRank{{KGather: b, VGather: b}}, -1, false, ""}, // one rank: nothing to receive
		{[]RingRank{{KGather: b, VGather: b}, {}}, -1, false, "1 of 2 ranks"},
		{[]RingRank{{VGather: b}, {}, {}}, -1, false, "1 of 3 ranks"},
		{[]RingRank{{KGather: b, VGather: b}, {KGather: b, VGather: b}}, 0, true, ""},
		{[]RingRank{{}, {KGather: b, VGather: b}, {KGather: b, VGather: b}}, 1, true, ""}, // rank 0's entry unread
		{[]RingRank{{KGather: b, VGather: b}, {}, {}}, 1, false, ""},
		{[]RingRank{{KGather: b, VGather: b}, {KGather: b, VGather: b}, {}}, 1, false, "1 of 2 ranks"},
		{[]RingRank{{KGather: b, VGather: b}}, 0, false, ""}, // one rank: nothing to receive
	} {
		got, err := ringUsesGather("T", c.ranks, c.me)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%d ranks, me %d: got %v, want an error containing %q", len(c.ranks), c.me, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%d ranks, me %d: got %v, %v, want %v", len(c.ranks), c.me, got, err, c.want)
		}
	}
}
