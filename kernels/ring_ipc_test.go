package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// Ring attention with one launch per rank (RingAttentionRankLocal):
// TestRingRankLocalStreams runs R ranks on R streams of one process and
// compares them bit for bit with the emulated single launch;
// TestRingIPC runs two ranks in two processes (one GPU, then two), the
// watchdog with an idle peer, and times the rank-local ring against the same
// rank's flash attention with all keys local.

// ringIPCEnv carries the JSON of a ringIPCCase to TestRingIPCChild.
const ringIPCEnv = "MKSERVE_TEST_RING_IPC"

// ringIPCCase is one rank-local run; exported fields: the child gets a copy.
type ringIPCCase struct {
	Name              string
	N, Ranks          int // positions (split zigzag) and ranks
	Heads, KVHeads    int
	HeadDim, VHeadDim int
	Causal            bool
	Window            int
	Sinks             bool
	F32               bool // F32 output, else BF16
	Epochs            int  // calls in a row on the same workspaces (epochs 1..Epochs), fresh inputs each, no host sync between them
	ChildDevice       int  // TestRingIPC: the child's GPU ordinal (the parent uses device 0)
	Idle              bool // TestRingIPC: the child maps the handles but never launches (watchdog)
	TimeoutMs         int  // each wait's bound (0: 10 s)
	TimeN             int  // > 0: then time TimeN more calls, and the flash baseline (causal cases)
	FlashRef          bool // check against FlashAttention with all keys local instead of the CPU reference (large N)
	CTAs              int  // CTAs per launch (0: all co-resident)
	Gather            bool // gather buffers (RingAttention's gather kind, mk_ring_attn_rank_gather) instead of two receive buffers
	Seed              uint64
}

func (c ringIPCCase) ring() ringCase {
	out := BF16
	if c.F32 {
		out = F32
	}
	return ringCase{name: c.Name, n: c.N, ranks: c.Ranks, heads: c.Heads, kvHeads: c.KVHeads, headDim: c.HeadDim,
		vHeadDim: c.VHeadDim, causal: c.Causal, window: c.Window, sinks: c.Sinks, out: out}
}

// inputs draws epoch ep's global inputs from c.Seed (the same in every process).
func (c ringIPCCase) inputs(ep int) *ringInputs {
	return makeRingInputs(rand.New(rand.NewPCG(c.Seed, uint64(ep))), c.ring())
}

func (c ringIPCCase) args() RingArgs {
	rc := c.ring()
	to := 10 * time.Second
	if c.TimeoutMs > 0 {
		to = time.Duration(c.TimeoutMs) * time.Millisecond
	}
	return RingArgs{QSpans: RingZigzag(c.N, c.Ranks), Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		VHeadDim: c.VHeadDim, Scale: float32(1 / math.Sqrt(float64(c.HeadDim))), Window: c.Window,
		Causal: c.Causal, Out: rc.out, Timeout: to, CTAs: c.CTAs}
}

// ringSharedLayout places what a rank's peers write into it in ONE
// allocation (one IPC handle): the workspace, then KBuf[0], KBuf[1],
// VBuf[0], VBuf[1] (256-byte aligned); off are the parts' offsets. With
// gather, KBuf[0] and VBuf[0] are the gather buffers ((R−1)·maxLk rows)
// and KBuf[1], VBuf[1] 256 unused bytes.
func ringSharedLayout(wsBytes int64, a RingArgs, gather bool) (off [5]int64, sizes [5]int64, total int64) {
	maxLk := 1
	for _, s := range a.kv() {
		maxLk = max(maxLk, spanRows(s))
	}
	kb := int64(maxLk * a.KVHeads * a.HeadDim * 2)
	vb := int64(maxLk * a.KVHeads * a.VHeadDim * 2)
	sizes = [5]int64{wsBytes, kb, kb, vb, vb}
	if gather {
		R := int64(max(len(a.QSpans)-1, 1))
		sizes = [5]int64{wsBytes, R * kb, 256, R * vb, 256}
	}
	for i, n := range sizes {
		off[i] = total
		total += (n + 255) &^ 255
	}
	return off, sizes, total
}

// ringShared is one rank's shared allocation and its parts (views).
type ringShared struct {
	all        *Buffer
	ws         *Buffer
	kbuf, vbuf [2]*Buffer // with gather, [0] are the gather buffers
	gather     bool
}

// ringSharedViews cuts b (a rank's shared allocation, its own or mapped) into its parts.
func ringSharedViews(a *arena, b *Buffer, wsBytes int64, args RingArgs, gather bool) ringShared {
	sh := ringShared{all: b, gather: gather}
	if a.err != nil || b == nil {
		return sh
	}
	off, sizes, _ := ringSharedLayout(wsBytes, args, gather)
	var v [5]*Buffer
	for i := range v {
		var err error
		v[i], err = b.View(off[i], sizes[i])
		a.check(err)
	}
	sh.ws, sh.kbuf, sh.vbuf = v[0], [2]*Buffer{v[1], v[2]}, [2]*Buffer{v[3], v[4]}
	return sh
}

// ringLocalMem is one rank's memory for c's epochs: the shared allocation
// (workspace control words zeroed, receive buffers NaN) and per epoch its
// shards, NaN-poisoned Out and LSE, and the sinks.
type ringLocalMem struct {
	sh    ringShared
	ep    []RingRank // [Epochs]: Q, K, V, Out, LSE (KBuf, VBuf: sh's)
	sinks []*Buffer  // [Epochs], nil entries without sinks
}

func newRingLocalMem(a *arena, c ringIPCCase, args RingArgs, wsBytes int64, me int, ins []*ringInputs) *ringLocalMem {
	m := &ringLocalMem{}
	_, sizes, total := ringSharedLayout(wsBytes, args, c.Gather)
	m.sh = ringSharedViews(a, a.alloc(total), wsBytes, args, c.Gather)
	if a.err != nil {
		return m
	}
	a.check(Upload(a.d, m.sh.ws, make([]byte, ringCtlBytes)))
	for i := range 2 {
		a.check(Upload(a.d, m.sh.kbuf[i], bf16Fill(int(sizes[1+i]/2), bf16NaN)))
		a.check(Upload(a.d, m.sh.vbuf[i], bf16Fill(int(sizes[3+i]/2), bf16NaN)))
	}
	H, KV, D, DV := c.Heads, c.KVHeads, c.HeadDim, c.VHeadDim
	sp := args.QSpans[me]
	lq := spanRows(sp)
	for _, in := range ins {
		rk := RingRank{KBuf: m.sh.kbuf, VBuf: m.sh.vbuf}
		if c.Gather {
			rk = RingRank{KGather: m.sh.kbuf[0], VGather: m.sh.vbuf[0]}
		}
		rk.Q = put(a, gatherRows(in.qBits, H*D, sp))
		rk.K = put(a, gatherRows(in.kBits, KV*D, sp))
		rk.V = put(a, gatherRows(in.vBits, KV*DV, sp))
		if c.F32 {
			rk.Out = put(a, fill32(max(lq, 1)*H*DV, float32(math.NaN())))
		} else {
			rk.Out = put(a, bf16Fill(max(lq, 1)*H*DV, bf16NaN))
		}
		rk.LSE = put(a, fill32(max(lq, 1)*H, float32(math.NaN())))
		m.ep = append(m.ep, rk)
		var sk *Buffer
		if in.sinks != nil {
			sk = put(a, in.sinks)
		}
		m.sinks = append(m.sinks, sk)
	}
	return m
}

// ringRanksFor is the ranks argument of rank me's RingAttentionRankLocal:
// its own buffers, and the next rank's receive buffers as seen here.
func ringRanksFor(R, me int, mine RingRank, next ringShared) []RingRank {
	ranks := make([]RingRank, R)
	ranks[me] = mine
	n := (me + 1) % R
	switch {
	case n == me:
	case next.gather:
		ranks[n].KGather, ranks[n].VGather = next.kbuf[0], next.vbuf[0]
	default:
		ranks[n].KBuf, ranks[n].VBuf = next.kbuf, next.vbuf
	}
	return ranks
}

// ringRankOut downloads rank rk's output and lse (lq rows): as floats,
// and as bits (bf16 output: the uint16 patterns) for exact comparison.
func ringRankOut(a *arena, c ringIPCCase, rk RingRank, lq int) (out, lse []float32, outBits, lseBits []uint32) {
	n := lq * c.Heads * c.VHeadDim
	if c.F32 {
		out = get[float32](a, rk.Out, n)
		for _, v := range out {
			outBits = append(outBits, math.Float32bits(v))
		}
	} else {
		b := get[uint16](a, rk.Out, n)
		out = bf16ToF32s(b)
		for _, v := range b {
			outBits = append(outBits, uint32(v))
		}
	}
	lse = get[float32](a, rk.LSE, lq*c.Heads)
	for _, v := range lse {
		lseBits = append(lseBits, math.Float32bits(v))
	}
	return out, lse, outBits, lseBits
}

// sameBits fails unless got and want are identical.
func sameBits(t *testing.T, name string, got, want []uint32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", name, len(got), len(want))
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: element %d: bits %#x, want %#x", name, i, got[i], want[i])
			return
		}
	}
}

// checkRingRankRef checks rank me's out and lse against the float64
// reference over the whole sequence (ringRef's wantOut, wantLSE).
func checkRingRankRef(t *testing.T, name string, c ringIPCCase, in *ringInputs, wantOut, wantLSE []float64, me int,
	out, lse []float32) {
	t.Helper()
	sp := in.spans[me]
	checkClose(t, name+" out", out, gatherRows(wantOut, c.Heads*c.VHeadDim, sp), 1e-2)
	checkLSE(t, name, lse, gatherRows(wantLSE, c.Heads, sp))
}

// TestRingRankLocalStreams: R = 2, 3, 4 rank-local launches on R streams
// of ONE process, the peers' buffers being plain local ones; Epochs calls
// in a row on the same workspaces with no host synchronisation between
// them (the epoch flags order them). Co-residency: each launch gets at most
// SMs/R CTAs, and one CTA of the kernel fits per SM at least (checked by
// the library), so all R launches fit on the GPU at once. Every rank's
// output and lse must be bit-identical to the emulated single launch
// (RingAttention) on the same inputs, and the output within 1e-2 of the
// float64 reference.
func TestRingRankLocalStreams(t *testing.T) {
	g := testGPU(t)
	sms := g.Info().SMs
	cases := []ringIPCCase{
		{Name: "R2_n777_gqa4_d128_f32", N: 777, Ranks: 2, Heads: 8, KVHeads: 2, HeadDim: 128, VHeadDim: 128,
			Causal: true, F32: true, Epochs: 3},
		{Name: "R3_n1000_window300_sinks_gqa8_d64", N: 1000, Ranks: 3, Heads: 8, KVHeads: 1, HeadDim: 64,
			VHeadDim: 64, Causal: true, Window: 300, Sinks: true, Epochs: 3},
		{Name: "R4_n1000_noncausal_mha_d64_f32", N: 1000, Ranks: 4, Heads: 4, KVHeads: 4, HeadDim: 64, VHeadDim: 64,
			F32: true, Epochs: 3},
		{Name: "R4_n1200_gqa8_d128", N: 1200, Ranks: 4, Heads: 8, KVHeads: 1, HeadDim: 128, VHeadDim: 128,
			Causal: true, Epochs: 4},
		{Name: "R3_n500_mla_192_128_f32", N: 500, Ranks: 3, Heads: 4, KVHeads: 4, HeadDim: 192, VHeadDim: 128,
			Causal: true, F32: true, Epochs: 2},
		// Gather buffers (mk_ring_attn_rank_gather): the wgmma kernel at
		// head dims 128, ring_kernel's gather kind otherwise; several
		// epochs, so that a rank's slots are rewritten only after its
		// previous launch ended.
		{Name: "R2_n777_gqa4_d128_f32_gather", N: 777, Ranks: 2, Heads: 8, KVHeads: 2, HeadDim: 128, VHeadDim: 128,
			Causal: true, F32: true, Epochs: 3, Gather: true},
		{Name: "R4_n1500_window200_sinks_gqa4_d128_gather", N: 1500, Ranks: 4, Heads: 8, KVHeads: 2, HeadDim: 128,
			VHeadDim: 128, Causal: true, Window: 200, Sinks: true, Epochs: 4, Gather: true},
		{Name: "R3_n1000_noncausal_gqa8_d128_gather", N: 1000, Ranks: 3, Heads: 8, KVHeads: 1, HeadDim: 128,
			VHeadDim: 128, Epochs: 3, Gather: true},
		{Name: "R3_n1000_window300_sinks_gqa8_d64_gather", N: 1000, Ranks: 3, Heads: 8, KVHeads: 1, HeadDim: 64,
			VHeadDim: 64, Causal: true, Window: 300, Sinks: true, Epochs: 3, Gather: true},
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			R := c.Ranks
			if sms/R < 4 {
				t.Skipf("%d SMs: %d co-resident launches of SMs/R CTAs need at least 4 CTAs each", sms, R)
			}
			c.CTAs = sms / R
			c.TimeoutMs = 5000
			c.Seed = uint64(time.Now().UnixNano())
			t.Logf("seed %d, %d CTAs per rank", c.Seed, c.CTAs)
			ins := make([]*ringInputs, c.Epochs)
			for ep := range ins {
				ins[ep] = c.inputs(ep + 1)
			}
			args := c.args()
			onGPU(t, g, func(a *arena) {
				wsBytes, err := a.d.RingWorkspace(args)
				if a.check(err); a.err != nil {
					return
				}
				mem := make([]*ringLocalMem, R)
				ws := make([]*Buffer, R)
				streams := make([]*Stream, R)
				for q := range R {
					mem[q] = newRingLocalMem(a, c, args, wsBytes, q, ins)
					ws[q] = mem[q].sh.ws
					s, err := a.d.NewStream()
					a.check(err)
					streams[q] = s
					if s != nil {
						defer s.Destroy()
					}
				}
				if a.err != nil {
					return
				}
				for ep := 1; ep <= c.Epochs; ep++ {
					for q := range R {
						ranks := ringRanksFor(R, q, mem[q].ep[ep-1], mem[(q+1)%R].sh)
						a.check(a.d.RingAttentionRankLocal(streams[q], q, ranks, mem[q].sinks[ep-1], ws, args, ep))
					}
				}
				if a.err != nil {
					return
				}
				// (Errorf and return, never Fatal: this runs on the GPU's goroutine.)
				failed := false
				for q := range R {
					if err := a.d.RingCheck(ws[q]); err != nil {
						t.Errorf("rank %d: %v", q, err)
						failed = true
					}
				}
				if failed {
					return
				}
				// The emulated launch on the same inputs, into fresh poisoned outputs.
				emuWS, err := a.d.NewRingWorkspace(args)
				if a.check(err); a.err != nil {
					return
				}
				a.bufs = append(a.bufs, emuWS)
				for ep := 1; ep <= c.Epochs && a.err == nil; ep++ {
					emu := make([]RingRank, R)
					for q := range R {
						emu[q] = mem[q].ep[ep-1]
						lq := spanRows(args.QSpans[q])
						if c.F32 {
							emu[q].Out = put(a, fill32(max(lq, 1)*c.Heads*c.VHeadDim, float32(math.NaN())))
						} else {
							emu[q].Out = put(a, bf16Fill(max(lq, 1)*c.Heads*c.VHeadDim, bf16NaN))
						}
						emu[q].LSE = put(a, fill32(max(lq, 1)*c.Heads, float32(math.NaN())))
					}
					if a.err != nil {
						return
					}
					a.check(a.d.RingAttention(nil, emu, mem[0].sinks[ep-1], emuWS, args))
					if a.err != nil {
						return
					}
					if err := a.d.RingCheck(emuWS); err != nil {
						t.Errorf("epoch %d emulated: %v", ep, err)
						return
					}
					wantOut, wantLSE := ringRef(c.ring(), ins[ep-1])
					for q := range R {
						lq := spanRows(args.QSpans[q])
						name := fmt.Sprintf("epoch %d rank %d", ep, q)
						out, lse, ob, lb := ringRankOut(a, c, mem[q].ep[ep-1], lq)
						_, _, eob, elb := ringRankOut(a, c, emu[q], lq)
						sameBits(t, name+" out vs emulated", ob, eob)
						sameBits(t, name+" lse vs emulated", lb, elb)
						checkRingRankRef(t, name, c, ins[ep-1], wantOut, wantLSE, q, out, lse)
					}
				}
			})
		})
	}
}

// TestRingIPC: ranks 0 and 1 of a ring attention in two processes (this
// one and the test binary re-executed as TestRingIPCChild), on one GPU and,
// when there are two, on two. They swap one IPC handle each (the
// workspace and receive buffers in one allocation), then run Epochs calls
// in a row with no synchronisation but the epoch flags, and each checks its
// own output per epoch (relative L2 ≤ 1e-2 against the float64 reference,
// or against FlashAttention with all keys local for the large timing
// cases). Watchdog cases: the child maps the handles but never launches;
// the parent's launch must end with a *RingTimeoutError naming rank 0 and
// a role, waiting for a chunk, instead of hanging. TimeN > 0: both ranks
// then time TimeN more calls (CUDA events; TIMING lines in the log) and the
// same rank's FlashAttention over the same work with all keys local.
func TestRingIPC(t *testing.T) {
	g := testGPU(t)
	ndev, err := DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	base := []ringIPCCase{
		{Name: "n1000_gqa4_d128_f32", N: 1000, Ranks: 2, Heads: 8, KVHeads: 2, HeadDim: 128, VHeadDim: 128,
			Causal: true, F32: true, Epochs: 3, TimeN: 20},
		{Name: "n777_gqa8_d64_window200_sinks", N: 777, Ranks: 2, Heads: 8, KVHeads: 1, HeadDim: 64, VHeadDim: 64,
			Causal: true, Window: 200, Sinks: true, Epochs: 3},
		{Name: "watchdog", N: 500, Ranks: 2, Heads: 4, KVHeads: 1, HeadDim: 128, VHeadDim: 128, Causal: true,
			F32: true, Epochs: 1, Idle: true, TimeoutMs: 200},
		{Name: "n16384_gqa4_d128_timing", N: 16384, Ranks: 2, Heads: 16, KVHeads: 4, HeadDim: 128, VHeadDim: 128,
			Causal: true, Epochs: 2, TimeN: 20, FlashRef: true},
		// The gather kind (the wgmma kernel): the same checks, the watchdog
		// and the timing against flash_wg with all keys local.
		{Name: "n1000_gqa4_d128_f32_gather", N: 1000, Ranks: 2, Heads: 8, KVHeads: 2, HeadDim: 128, VHeadDim: 128,
			Causal: true, F32: true, Epochs: 3, TimeN: 20, Gather: true},
		{Name: "watchdog_gather", N: 500, Ranks: 2, Heads: 4, KVHeads: 1, HeadDim: 128, VHeadDim: 128, Causal: true,
			F32: true, Epochs: 1, Idle: true, TimeoutMs: 200, Gather: true},
		{Name: "n16384_gqa4_d128_timing_gather", N: 16384, Ranks: 2, Heads: 16, KVHeads: 4, HeadDim: 128,
			VHeadDim: 128, Causal: true, Epochs: 2, TimeN: 20, FlashRef: true, Gather: true},
	}
	var cases []ringIPCCase
	for _, dev := range []int{0, 1} {
		for _, c := range base {
			c.ChildDevice = dev
			c.Name = [2]string{"one_gpu_", "two_gpus_"}[dev] + c.Name
			cases = append(cases, c)
		}
	}
	sms := g.Info().SMs
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.ChildDevice >= ndev {
				t.Skipf("needs %d GPUs (peer access between them), this machine has %d", c.ChildDevice+1, ndev)
			}
			if c.ChildDevice == 0 {
				c.CTAs = sms / 2 // both launches fit at once, should the two contexts run concurrently (MPS)
			}
			c.Seed = uint64(time.Now().UnixNano())
			t.Logf("seed %d", c.Seed)
			runIPCPair(t, "TestRingIPCChild", ringIPCEnv, c, c.ChildDevice, func(peer lineIO) {
				runRingIPCRank(t, g, c, 0, peer)
			})
		})
	}
}

// TestRingIPCChild is rank 1 of TestRingIPC (skipped when run on its own).
func TestRingIPCChild(t *testing.T) {
	var c ringIPCCase
	peer := ipcChild(t, ringIPCEnv, &c)
	g := testGPU(t) // device c.ChildDevice: the parent set testDeviceEnv
	runRingIPCRank(t, g, c, 1, peer)
}

// ringFlashLocal prepares rank me's queries (q, its rows) attending every
// key of the sequence held locally, in one FlashAttention over its two
// spans (two sequences of the batch, at their positions): the "single-GPU
// work split" baseline of the rank-local ring. Causal cases only.
func ringFlashLocal(a *arena, c ringIPCCase, args RingArgs, in *ringInputs, me int, q, sinks *Buffer) (
	launch func(s *Stream) error, out *Buffer) {
	sp := args.QSpans[me]
	lq := spanRows(sp)
	pk, pv := put(a, in.kBits), put(a, in.vBits)
	qStart := put(a, []int32{0, int32(sp[0].Len()), int32(lq)})
	past := put(a, []int32{int32(sp[0].Lo), int32(sp[1].Lo)})
	table := put(a, []int32{0, 0})
	if c.F32 {
		out = put(a, fill32(max(lq, 1)*c.Heads*c.VHeadDim, float32(math.NaN())))
	} else {
		out = put(a, bf16Fill(max(lq, 1)*c.Heads*c.VHeadDim, bf16NaN))
	}
	fa := FlashArgs{Batch: 2, MaxQLen: max(sp[0].Len(), sp[1].Len(), 1), Tokens: lq, Heads: c.Heads,
		KVHeads: c.KVHeads, HeadDim: c.HeadDim, VHeadDim: c.VHeadDim, PoolRows: c.N, Scale: args.Scale,
		Window: c.Window, Causal: true, Out: args.Out}
	return func(s *Stream) error {
		return a.d.FlashAttention(s, out, q, pk, pv, qStart, past, table, nil, sinks, fa)
	}, out
}

// runRingIPCRank is one process's rank me of TestRingIPC.
func runRingIPCRank(t *testing.T, g *GPU, c ringIPCCase, me int, peer lineIO) {
	idle := c.Idle && me == 1
	ins := make([]*ringInputs, c.Epochs)
	for ep := range ins {
		ins[ep] = c.inputs(ep + 1)
	}
	args := c.args()
	lq := spanRows(args.QSpans[me])
	onGPU(t, g, func(a *arena) {
		wsBytes, err := a.d.RingWorkspace(args)
		if a.check(err); a.err != nil {
			return
		}
		mem := newRingLocalMem(a, c, args, wsBytes, me, ins)
		_, _, total := ringSharedLayout(wsBytes, args, c.Gather)
		mapped := swapIPC(a, peer, mem.sh.all, total)
		if a.err != nil {
			return
		}
		other := ringSharedViews(a, mapped, wsBytes, args, c.Gather)
		ws := make([]*Buffer, 2)
		ws[me], ws[1-me] = mem.sh.ws, other.ws
		s, err := a.d.NewStream()
		a.check(err)
		if s != nil {
			defer s.Destroy()
		}
		call := func(ep int) error {
			i := min(ep, c.Epochs) - 1 // timed calls past Epochs reuse the last epoch's buffers
			return a.d.RingAttentionRankLocal(s, me, ringRanksFor(2, me, mem.ep[i], other), mem.sinks[i], ws, args, ep)
		}
		var lastBits []uint32
		if !idle && a.err == nil {
			start := time.Now()
			for ep := 1; ep <= c.Epochs && a.err == nil; ep++ {
				a.check(call(ep))
			}
			var cerr error
			if a.err == nil {
				cerr = a.d.RingCheck(mem.sh.ws)
			}
			took := time.Since(start)
			switch {
			case a.err != nil:
			case c.Idle:
				var te *RingTimeoutError
				switch {
				case !errors.As(cerr, &te):
					t.Errorf("rank %d with an idle peer: RingCheck = %v, want a *RingTimeoutError", me, cerr)
				case te.Rank != me || (te.Role != "compute" && te.Role != "comm") || te.Step != 1 ||
					te.WaitedFor != "chunk arrival" || te.Seen >= te.Want:
					t.Errorf("rank %d with an idle peer: %v (%+v), want rank %d waiting at step 1 for a chunk", me, te,
						*te, me)
				default:
					t.Logf("rank %d: watchdog after %v: %v", me, took, te)
				}
				if took > 5*time.Second {
					t.Errorf("the watchdog took %v with a %v timeout", took, args.Timeout)
				}
			case cerr != nil:
				t.Errorf("rank %d: %v", me, cerr)
			default:
				t.Logf("rank %d: %d calls in %v", me, c.Epochs, took)
				for ep := 1; ep <= c.Epochs; ep++ {
					name := fmt.Sprintf("rank %d epoch %d", me, ep)
					out, lse, ob, _ := ringRankOut(a, c, mem.ep[ep-1], lq)
					lastBits = ob
					if !c.FlashRef {
						wantOut, wantLSE := ringRef(c.ring(), ins[ep-1])
						checkRingRankRef(t, name, c, ins[ep-1], wantOut, wantLSE, me, out, lse)
						continue
					}
					launch, fo := ringFlashLocal(a, c, args, ins[ep-1], me, mem.ep[ep-1].Q, mem.sinks[ep-1])
					if a.err != nil {
						break
					}
					a.check(launch(nil))
					var want []float64
					if c.F32 {
						for _, v := range get[float32](a, fo, lq*c.Heads*c.VHeadDim) {
							want = append(want, float64(v))
						}
					} else {
						for _, v := range bf16ToF32s(get[uint16](a, fo, lq*c.Heads*c.VHeadDim)) {
							want = append(want, float64(v))
						}
					}
					checkClose(t, name+" vs flash (all keys local)", out, want, 1e-2)
				}
			}
		}
		if c.TimeN > 0 && !c.Idle {
			ringIPCTiming(t, a, c, args, me, peer, s, call, mem, ins[c.Epochs-1], lastBits)
		}
		closeIPC(t, a, peer, mapped)
	})
}

// ringIPCTiming times c.TimeN rank-local calls (epochs Epochs+1…, the last
// epoch's inputs again, both ranks at once after a handshake: the epoch
// flags pace them) and
// then, one rank after the other, c.TimeN FlashAttention calls of the same
// rank's queries over all keys held locally. The same number of pipe swaps
// happens on both ranks whatever fails, so neither waits for the other.
func ringIPCTiming(t *testing.T, a *arena, c ringIPCCase, args RingArgs, me int, peer lineIO, s *Stream,
	call func(ep int) error, mem *ringLocalMem, in *ringInputs, lastBits []uint32) {
	var ringMs, flashMs float64
	// Start the timed calls together: without this a rank that reached
	// them first timed its wait for the other's first chunk too (the tenth
	// pass saw rank 0 at 5.39 ms/call against rank 1's 1.93 on two GPUs).
	if _, err := peer.swap("ring timing start"); err != nil {
		t.Error(err)
	}
	if a.err == nil && !t.Failed() {
		var err error
		ringMs, err = a.d.TimeCalls(s, c.TimeN, func(i int) error { return call(c.Epochs + 1 + i) })
		a.check(err)
		if a.err == nil {
			if err := a.d.RingCheck(mem.sh.ws); err != nil {
				t.Errorf("rank %d timed calls: %v", me, err)
			} else {
				// Same inputs as the last checked epoch: the same bits.
				_, _, ob, _ := ringRankOut(a, c, mem.ep[c.Epochs-1], spanRows(args.QSpans[me]))
				sameBits(t, fmt.Sprintf("rank %d after the timed calls", me), ob, lastBits)
			}
		}
	}
	if _, err := peer.swap("ring timed"); err != nil {
		t.Error(err)
	}
	for turn := range 2 {
		if turn == me && c.Causal && a.err == nil && !t.Failed() {
			last := mem.ep[c.Epochs-1]
			launch, _ := ringFlashLocal(a, c, args, in, me, last.Q, mem.sinks[c.Epochs-1])
			if a.err == nil {
				a.check(launch(s)) // warm-up
				var err error
				flashMs, err = a.d.TimeCalls(s, c.TimeN, func(int) error { return launch(s) })
				a.check(err)
			}
		}
		if _, err := peer.swap(fmt.Sprintf("flash %d timed", turn)); err != nil {
			t.Error(err)
		}
	}
	if a.err != nil || ringMs == 0 {
		return
	}
	if flashMs > 0 {
		t.Logf("TIMING %s rank %d of 2 (n %d, %d query rows): ring rank-local %.4f ms/call, flash all keys local "+
			"%.4f ms/call, overhead ring/local-1 = %+.1f%%", c.Name, me, c.N, spanRows(args.QSpans[me]), ringMs,
			flashMs, 100*(ringMs/flashMs-1))
	} else {
		t.Logf("TIMING %s rank %d of 2: ring rank-local %.4f ms/call (no flash baseline: not causal)", c.Name, me,
			ringMs)
	}
}
