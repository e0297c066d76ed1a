package kernels

import (
	"fmt"
	"math"
	"runtime"
	"time"
)

// Ring attention (ring.cu, mk_ring.h): R emulated context-parallel ranks,
// each holding a slice of one long sequence, in one persistent cooperative
// launch whose communication CTAs pass the KV chunks around the ring while
// its compute CTAs attend to the chunk in hand.

var (
	ringAttnBF16 func(s uint64, ranks int32, ptrs *uint64, qspans, kvspans *int32, outDType, heads, kvHeads,
		headDim, vHeadDim int32, scale uint32, window int32, sinks uint64, causal int32, ws, wsBytes uint64,
		timeoutNs int64, faultRank int32) int32
	ringAttnGatherBF16 func(s uint64, ranks int32, ptrs *uint64, qspans, kvspans *int32, outDType, heads, kvHeads,
		headDim, vHeadDim int32, scale uint32, window int32, sinks uint64, causal int32, ws, wsBytes uint64,
		timeoutNs int64, faultRank int32) int32
	ringSeparateBF16 func(s uint64, ranks int32, ptrs *uint64, qspans, kvspans *int32, outDType, heads, kvHeads,
		headDim, vHeadDim int32, scale uint32, window int32, sinks uint64, causal int32, ws, wsBytes uint64) int32
	ringAttnRank func(s uint64, ranks, me int32, ptrs *uint64, qspans, kvspans *int32, outDType, heads, kvHeads,
		headDim, vHeadDim int32, scale uint32, window int32, sinks uint64, causal int32, wss *uint64, wsBytes uint64,
		ctas int32, timeoutNs int64, epoch int32) int32
	ringAttnRankGather func(s uint64, ranks, me int32, ptrs *uint64, qspans, kvspans *int32, outDType, heads,
		kvHeads, headDim, vHeadDim int32, scale uint32, window int32, sinks uint64, causal int32, wss *uint64,
		wsBytes uint64, ctas int32, timeoutNs int64, epoch int32) int32
	ringWorkspace func(ranks int32, qspans *int32, heads, kvHeads, headDim, vHeadDim int32, bytes *uint64) int32
	ringCheck     func(ws uint64, rec *int32) int32
)

func init() {
	registerSymbols(
		symbol{"mk_ring_attn_bf16", &ringAttnBF16},
		symbol{"mk_ring_attn_gather_bf16", &ringAttnGatherBF16},
		symbol{"mk_ring_separate_bf16", &ringSeparateBF16},
		symbol{"mk_ring_attn_rank", &ringAttnRank},
		symbol{"mk_ring_attn_rank_gather", &ringAttnRankGather},
		symbol{"mk_ring_workspace", &ringWorkspace},
		symbol{"mk_ring_check", &ringCheck},
	)
}

// RingMaxRanks is the most ranks one ring launch takes.
const RingMaxRanks = 8

// RingDefaultTimeout bounds each wait on a ring flag when RingArgs.Timeout is 0.
const RingDefaultTimeout = time.Second

// timeoutNs is the bound on each wait, in nanoseconds (Timeout, or the default).
func (a *RingArgs) timeoutNs() int64 {
	if a.Timeout == 0 {
		return RingDefaultTimeout.Nanoseconds()
	}
	return a.Timeout.Nanoseconds()
}

// causal is the kernels' causal flag.
func (a *RingArgs) causal() int32 {
	if a.Causal {
		return 1
	}
	return 0
}

// Layout of mk_ring.h's per-rank pointer array and error record.
const (
	ringNPtr     = 9
	ringErrWords = 8
	ringCtlBytes = 4096 // error record, control words and the rank-local remote flags (zeroed by NewRingWorkspace)
)

// RingMaxEpoch bounds RingAttentionRankLocal's epoch (flags hold epoch·8 + step in an int32).
const RingMaxEpoch = math.MaxInt32/RingMaxRanks - 1

// RingSpan is the half-open position range [Lo, Hi).
type RingSpan struct{ Lo, Hi int }

// Len is Hi − Lo.
func (s RingSpan) Len() int { return s.Hi - s.Lo }

// RingRank is one rank's buffers. Its query rows are the positions of
// RingArgs.QSpans[r] (span 0's then span 1's), its key/value rows those of
// RingArgs.KVSpans[r].
//
//	Q    [Lq, Heads*HeadDim] bf16      K    [Lk, KVHeads*HeadDim] bf16   V [Lk, KVHeads*VHeadDim] bf16
//	KBuf [2] × [maxLk, KVHeads*HeadDim] VBuf [2] × [maxLk, KVHeads*VHeadDim] (receive buffers; R > 1)
//	Out  [Lq, Heads*VHeadDim] (Out)     LSE  [Lq, Heads] f32 or nil
//
// Or, instead of KBuf and VBuf, gather buffers that hold every other
// rank's chunk at once (R > 1; RingAttention only):
//
//	KGather [(R−1)·maxLk, KVHeads*HeadDim]   VGather [(R−1)·maxLk, KVHeads*VHeadDim]
//
// With gather buffers no chunk is overwritten during the call, so a compute
// CTA keeps one query tile's softmax state in registers across all R steps
// (one item per tile instead of R, no state round trip through the
// workspace) and waits only for each chunk to arrive; the chunks still
// travel rank to rank. It costs (R−1)/2 times the receive memory.
type RingRank struct {
	Q, K, V          *Buffer
	KBuf, VBuf       [2]*Buffer
	KGather, VGather *Buffer
	Out, LSE         *Buffer
}

// RingArgs describes one ring attention over len(QSpans) ranks.
type RingArgs struct {
	QSpans  [][2]RingSpan // per rank: the positions of its query rows
	KVSpans [][2]RingSpan // per rank: the positions of its key/value rows (nil: QSpans)

	Heads, KVHeads    int // Heads a multiple of KVHeads (GQA)
	HeadDim, VHeadDim int // 1..FlashMaxHeadDim; VHeadDim may differ (MLA)

	Scale  float32 // softmax scale, finite and > 0
	Window int     // sliding window in keys (0: none; causal only)
	Causal bool
	Out    DType // BF16 or F32

	Timeout time.Duration // bound on each wait for a flag (0: RingDefaultTimeout)
	CTAs    int           // RingAttentionRankLocal: CTAs of the launch (0: all co-resident); ignored elsewhere

	faultRank int // tests: rank+1 whose communication CTAs are disabled (0: none)
}

// RingZigzag splits positions [0, n) into 2·ranks contiguous chunks whose
// sizes differ by at most one and gives rank r chunks ranks−1−r and
// ranks+r (attention.ZigzagSplit's split), so causal work is balanced and
// a chunk's late half is seen only by ranks it reaches before the ring
// wraps (the kernel stops forwarding it there).
func RingZigzag(n, ranks int) [][2]RingSpan {
	c := 2 * ranks
	b := func(i int) int { return i * n / c }
	out := make([][2]RingSpan, ranks)
	for r := range ranks {
		out[r] = [2]RingSpan{{b(ranks - 1 - r), b(ranks - r)}, {b(ranks + r), b(ranks + r + 1)}}
	}
	return out
}

func spanRows(s [2]RingSpan) int { return s[0].Len() + s[1].Len() }

// kv is KVSpans or QSpans.
func (a *RingArgs) kv() [][2]RingSpan {
	if a.KVSpans != nil {
		return a.KVSpans
	}
	return a.QSpans
}

// spans flattens span lists to int32 [ranks*4].
func flatSpans(sp [][2]RingSpan) []int32 {
	out := make([]int32, 0, 4*len(sp))
	for _, s := range sp {
		out = append(out, int32(s[0].Lo), int32(s[0].Hi), int32(s[1].Lo), int32(s[1].Hi))
	}
	return out
}

// check validates the shapes.
func (a *RingArgs) check(op string) error {
	R := len(a.QSpans)
	if R < 1 || R > RingMaxRanks {
		return fmt.Errorf("kernels: %s: %d ranks, want 1..%d", op, R, RingMaxRanks)
	}
	if len(a.kv()) != R {
		return fmt.Errorf("kernels: %s: %d query span pairs but %d kv span pairs", op, R, len(a.kv()))
	}
	if err := dims(op, "Heads", a.Heads, "KVHeads", a.KVHeads, "HeadDim", a.HeadDim, "VHeadDim", a.VHeadDim); err != nil {
		return err
	}
	for r := range R {
		for i, list := range [][2]RingSpan{a.QSpans[r], a.kv()[r]} {
			for sp, s := range list {
				if s.Lo < 0 || s.Hi < s.Lo || s.Hi > math.MaxInt32 {
					return fmt.Errorf("kernels: %s: rank %d %s span %d [%d, %d) is not a range of positions",
						op, r, [2]string{"query", "kv"}[i], sp, s.Lo, s.Hi)
				}
			}
		}
	}
	switch {
	case a.Heads%a.KVHeads != 0:
		return fmt.Errorf("kernels: %s: Heads=%d is not a multiple of KVHeads=%d", op, a.Heads, a.KVHeads)
	case a.HeadDim > FlashMaxHeadDim || a.VHeadDim > FlashMaxHeadDim:
		return fmt.Errorf("kernels: %s: HeadDim=%d, VHeadDim=%d: at most %d", op, a.HeadDim, a.VHeadDim, FlashMaxHeadDim)
	case a.Window < 0 || a.Window > math.MaxInt32:
		return fmt.Errorf("kernels: %s: Window=%d must be in [0, 2^31)", op, a.Window)
	case a.Window > 0 && !a.Causal:
		return fmt.Errorf("kernels: %s: Window=%d needs Causal", op, a.Window)
	case !(a.Scale > 0) || math.IsInf(float64(a.Scale), 0):
		return fmt.Errorf("kernels: %s: Scale=%v must be finite and > 0", op, a.Scale)
	case a.Out != BF16 && a.Out != F32:
		return fmt.Errorf("kernels: %s: Out=%d is not BF16 or F32", op, a.Out)
	case a.Timeout < 0:
		return fmt.Errorf("kernels: %s: Timeout=%v must be >= 0", op, a.Timeout)
	case a.CTAs < 0 || a.CTAs > math.MaxInt32:
		return fmt.Errorf("kernels: %s: CTAs=%d must be >= 0", op, a.CTAs)
	}
	return nil
}

// RingWorkspace is the workspace bytes RingAttention and RingSeparate need for a.
func (d *Device) RingWorkspace(a RingArgs) (int64, error) {
	const op = "RingWorkspace"
	if err := d.ready(op); err != nil {
		return 0, err
	}
	if err := a.check(op); err != nil {
		return 0, err
	}
	qs := flatSpans(a.QSpans)
	var b uint64
	err := d.lib.check("mk_ring_workspace", ringWorkspace(int32(len(a.QSpans)), &qs[0], int32(a.Heads),
		int32(a.KVHeads), int32(a.HeadDim), int32(a.VHeadDim), &b))
	runtime.KeepAlive(qs)
	return int64(b), err
}

// NewRingWorkspace allocates a workspace for a with a cleared error record
// and cleared control words (as RingAttentionRankLocal's epoch 1 needs).
func (d *Device) NewRingWorkspace(a RingArgs) (*Buffer, error) {
	n, err := d.RingWorkspace(a)
	if err != nil {
		return nil, err
	}
	ws, err := d.Malloc(n)
	if err != nil {
		return nil, err
	}
	if err := Upload(d, ws, make([]byte, min(n, ringCtlBytes))); err != nil {
		ws.Free()
		return nil, err
	}
	return ws, nil
}

// ringCall checks the buffers and flattens the arguments of both launches.
// With me >= 0 (rank-local) only ranks[me] is checked in full, and the
// receive buffers of me and me+1; the other entries are ignored.
func (d *Device) ringCall(op string, ranks []RingRank, sinks, ws *Buffer, a *RingArgs, me int) (ptrs []uint64,
	qs, ks []int32, sk uint64, gather bool, err error) {
	if err := d.ready(op); err != nil {
		return nil, nil, nil, 0, false, err
	}
	if err := a.check(op); err != nil {
		return nil, nil, nil, 0, false, err
	}
	R := len(a.QSpans)
	if len(ranks) != R {
		return nil, nil, nil, 0, false, fmt.Errorf("kernels: %s: %d ranks of buffers for %d span pairs", op, len(ranks), R)
	}
	maxLk := 0
	for _, s := range a.kv() {
		maxLk = max(maxLk, spanRows(s))
	}
	if gather, err = ringUsesGather(op, ranks, me); err != nil {
		return nil, nil, nil, 0, false, err
	}
	H, KV, D, DV := int64(a.Heads), int64(a.KVHeads), int64(a.HeadDim), int64(a.VHeadDim)
	ptrs = make([]uint64, R*ringNPtr)
	for r, rk := range ranks {
		mine, next := me < 0 || r == me, me < 0 || r == (me+1)%R
		if !mine && !next {
			continue
		}
		lq, lk := int64(spanRows(a.QSpans[r])), int64(spanRows(a.kv()[r]))
		if !mine {
			lq, lk = 0, 0
		}
		name := func(s string) string { return fmt.Sprintf("rank %d %s", r, s) }
		p := ptrs[r*ringNPtr:]
		if lq > 0 {
			if err := need(op, name("Q"), rk.Q, lq*H*D, 2); err != nil {
				return nil, nil, nil, 0, false, err
			}
			if err := need(op, name("Out"), rk.Out, lq*H*DV, a.Out.size()); err != nil {
				return nil, nil, nil, 0, false, err
			}
			p[0], p[7] = rk.Q.ptr, rk.Out.ptr
			if rk.LSE != nil {
				if err := need(op, name("LSE"), rk.LSE, lq*H, 4); err != nil {
					return nil, nil, nil, 0, false, err
				}
				p[8] = rk.LSE.ptr
			}
		}
		if lk > 0 {
			if err := needAll(op, 2, name("K"), rk.K, lk*KV*D, name("V"), rk.V, lk*KV*DV); err != nil {
				return nil, nil, nil, 0, false, err
			}
			p[1], p[2] = rk.K.ptr, rk.V.ptr
		}
		if R > 1 && gather {
			rows := int64(R-1) * int64(max(maxLk, 1))
			if err := needAll(op, 2, name("KGather"), rk.KGather, rows*KV*D, name("VGather"), rk.VGather,
				rows*KV*DV); err != nil {
				return nil, nil, nil, 0, false, err
			}
			p[3], p[5] = rk.KGather.ptr, rk.VGather.ptr
		} else if R > 1 {
			for i := range 2 {
				if err := needAll(op, 2, name(fmt.Sprintf("KBuf[%d]", i)), rk.KBuf[i], int64(max(maxLk, 1))*KV*D,
					name(fmt.Sprintf("VBuf[%d]", i)), rk.VBuf[i], int64(max(maxLk, 1))*KV*DV); err != nil {
					return nil, nil, nil, 0, false, err
				}
				p[3+i], p[5+i] = rk.KBuf[i].ptr, rk.VBuf[i].ptr
			}
		}
	}
	if sinks != nil {
		if err := need(op, "sinks", sinks, H, 4); err != nil {
			return nil, nil, nil, 0, false, err
		}
		sk = sinks.ptr
	}
	if ws == nil || ws.ptr == 0 {
		return nil, nil, nil, 0, false, fmt.Errorf("kernels: %s: ws is a nil or freed buffer", op)
	}
	return ptrs, flatSpans(a.QSpans), flatSpans(a.kv()), sk, gather, nil
}

// RingPreferGather says which receive buffers a ring over `ranks` ranks
// and `keys` positions in all should get: gather buffers (true) or the two
// receive buffers (false). One rank receives nothing (false); with more,
// gather: measured on the H200 (2026-11-29, bench ring, 32 query heads,
// 8 kv heads, head dim 128, causal, --iters 5; docs/PERF.md, twelfth
// pass) once the gather kernel's spans were walked by one thread and its
// tile loop kept every ldmatrix prefetch (scripts/sass_ldsm.py: 1 of 80
// used within 2 instructions, as the two buffers'), gather took 6.71 /
// 6.83 / 7.03 ms at 16k positions for R = 2 / 4 / 8 against the two
// buffers' 6.90 / 7.18 / 7.80, 107.2 / 109.0 / 110.3 ms at 64k against
// 109.5 / 113.0 / 114.2, and 431 / 442 ms at 128k (R = 2 / 8) against
// 433 / 445. Callers bound the gather buffers' memory themselves
// (R·(R−1) chunks of keys and values against two per rank).
func RingPreferGather(keys, ranks int) bool { return ranks > 1 }

// ringUsesGather says whether ranks hold gather buffers (R > 1) rather
// than the two receive buffers: every rank's, or for a rank-local call (me
// >= 0) rank me's and the next rank's (the only entries it reads); an error
// when only some of those do.
func ringUsesGather(op string, ranks []RingRank, me int) (bool, error) {
	R := len(ranks)
	idx := make([]int, 0, R)
	if me >= 0 {
		idx = append(idx, me)
		if n := (me + 1) % R; n != me {
			idx = append(idx, n)
		}
	} else {
		for r := range ranks {
			idx = append(idx, r)
		}
	}
	ng := 0
	for _, r := range idx {
		if ranks[r].KGather != nil || ranks[r].VGather != nil {
			ng++
		}
	}
	if ng > 0 && ng != len(idx) {
		return false, fmt.Errorf("kernels: %s: %d of %d ranks have gather buffers (all or none)", op, ng, len(idx))
	}
	return ng > 0 && R > 1, nil
}

// RingAttention runs ring attention over len(ranks) emulated ranks in one
// persistent launch on stream s: every rank's queries attend the keys and
// values of all ranks (as one sequence at the spans' positions: causal,
// key j visible to position p when j ≤ p and, with a window, j > p−Window;
// non-causal, every key), GQA, sinks [Heads] f32 or nil joining the softmax
// denominator. Out gets the normalised output; LSE (if given) the natural-log
// log-sum-exp of each row's visible scores, sinks excluded (−Inf when none).
// ws is from NewRingWorkspace. The ranks' receive buffers choose the
// kernel: KBuf/VBuf the two-buffer ring, KGather/VGather (every rank) the
// ring into gather buffers (RingRank; RingPreferGather says which measured
// faster). The launch is asynchronous: RingCheck reports a watchdog
// timeout (a wait on a flag longer than a.Timeout).
func (d *Device) RingAttention(s *Stream, ranks []RingRank, sinks, ws *Buffer, a RingArgs) error {
	const op = "RingAttention"
	ptrs, qs, ks, sk, gather, err := d.ringCall(op, ranks, sinks, ws, &a, -1)
	if err != nil {
		return err
	}
	fn, name := ringAttnBF16, "mk_ring_attn_bf16"
	if gather {
		fn, name = ringAttnGatherBF16, "mk_ring_attn_gather_bf16"
	}
	rc := fn(s.handle(), int32(len(ranks)), &ptrs[0], &qs[0], &ks[0], int32(a.Out), int32(a.Heads),
		int32(a.KVHeads), int32(a.HeadDim), int32(a.VHeadDim), math.Float32bits(a.Scale), int32(a.Window), sk,
		a.causal(), ws.ptr, uint64(ws.bytes), a.timeoutNs(), int32(a.faultRank-1))
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(qs)
	runtime.KeepAlive(ks)
	return d.lib.check(name, rc)
}

// RingAttentionRankLocal runs rank me's part of a ring attention whose
// ranks are separate launches, normally one process per GPU: every rank
// calls it with the same a (spans, shapes, Scale, Window, Causal, Out) and
// the same epoch. ranks[me] holds this rank's buffers (as for RingAttention)
// and ranks[me+1 mod R] the next rank's receive buffers KBuf and VBuf as
// this process maps them (OpenIPC) — or, when ranks[me] and ranks[me+1]
// hold KGather and VGather, their gather buffers (the ring of
// RingAttention's gather kind: the wgmma kernel at head dims 128; every
// rank makes the same choice for all epochs of a set of workspaces); the
// other entries are ignored. ws[r] is
// rank r's workspace as mapped here (ws[me] this rank's own, from
// NewRingWorkspace; only me−1's, me's and me+1's are used). The launch holds
// only me's communication CTAs, which write me's chunks into rank me+1's
// receive buffers and raise flags in me+1's workspace, and me's compute
// CTAs; ranks[me].Out and LSE get what RingAttention computes for rank me,
// bit for bit. epoch numbers the calls on one set of workspaces: 1, 2, 3, …
// on every rank (at most RingMaxEpoch), so consecutive calls synchronise
// across ranks by themselves; every workspace must be zeroed (NewRingWorkspace
// does) before epoch 1, and again on every rank after a watchdog error.
// a.CTAs caps the launch's CTAs (several ranks on one GPU: at most a
// 1/R share each, so that all are co-resident). Each wait is bounded by
// a.Timeout: RingCheck(ws[me]) reports a *RingTimeoutError naming rank me
// (a peer that never launches: "chunk arrival" or "buffer release"). The
// peers' launches must be able to run at the same time as this one.
// Asynchronous on s.
func (d *Device) RingAttentionRankLocal(s *Stream, me int, ranks []RingRank, sinks *Buffer, ws []*Buffer,
	a RingArgs, epoch int) error {
	const op = "RingAttentionRankLocal"
	R := len(a.QSpans)
	if me < 0 || me >= R || len(ws) != R || len(ranks) != R {
		return fmt.Errorf("kernels: %s: rank %d of %d ranks with %d buffer sets and %d workspaces", op, me, R,
			len(ranks), len(ws))
	}
	if epoch < 1 || epoch > RingMaxEpoch {
		return fmt.Errorf("kernels: %s: epoch %d, want 1..%d", op, epoch, RingMaxEpoch)
	}
	if a.faultRank != 0 {
		return fmt.Errorf("kernels: %s: fault injection is for RingAttention", op)
	}
	wss := make([]uint64, R)
	for _, r := range []int{(me + R - 1) % R, me, (me + 1) % R} {
		if err := ws[r].fits(fmt.Sprintf("%s: rank %d workspace", op, r), ringCtlBytes); err != nil {
			return err
		}
		wss[r] = ws[r].ptr
	}
	ptrs, qs, ks, sk, gather, err := d.ringCall(op, ranks, sinks, ws[me], &a, me)
	if err != nil {
		return err
	}
	fn, name := ringAttnRank, "mk_ring_attn_rank"
	if gather {
		fn, name = ringAttnRankGather, "mk_ring_attn_rank_gather"
	}
	rc := fn(s.handle(), int32(R), int32(me), &ptrs[0], &qs[0], &ks[0], int32(a.Out), int32(a.Heads),
		int32(a.KVHeads), int32(a.HeadDim), int32(a.VHeadDim), math.Float32bits(a.Scale), int32(a.Window), sk,
		a.causal(), &wss[0], uint64(ws[me].bytes), int32(a.CTAs), a.timeoutNs(), int32(epoch))
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(qs)
	runtime.KeepAlive(ks)
	runtime.KeepAlive(wss)
	return d.lib.check(name, rc)
}

// RingSeparate computes what RingAttention computes from separate launches
// (the baseline): per step one attention launch for every rank writing
// normalised partial outputs and their log-sum-exp, the chunk copies, and a
// merge launch. Same arguments; the receive buffers are used the same way.
func (d *Device) RingSeparate(s *Stream, ranks []RingRank, sinks, ws *Buffer, a RingArgs) error {
	const op = "RingSeparate"
	ptrs, qs, ks, sk, gather, err := d.ringCall(op, ranks, sinks, ws, &a, -1)
	if err != nil {
		return err
	}
	if gather {
		return fmt.Errorf("kernels: %s: takes the two receive buffers, not gather buffers", op)
	}
	rc := ringSeparateBF16(s.handle(), int32(len(ranks)), &ptrs[0], &qs[0], &ks[0], int32(a.Out), int32(a.Heads),
		int32(a.KVHeads), int32(a.HeadDim), int32(a.VHeadDim), math.Float32bits(a.Scale), int32(a.Window), sk,
		a.causal(), ws.ptr, uint64(ws.bytes))
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(qs)
	runtime.KeepAlive(ks)
	return d.lib.check("mk_ring_separate_bf16", rc)
}

// RingTimeoutError is a ring launch's watchdog report: a CTA waited on a
// flag longer than the timeout and ended the kernel (its outputs are not
// valid).
type RingTimeoutError struct {
	Rank       int    // the rank whose CTA waited
	Role       string // "compute" or "comm"
	Step       int    // the ring step
	Tile       int    // compute: the query slot (tile*headGroups + headGroup); comm: the comm CTA's part
	WaitedFor  string // "chunk arrival", "buffer release" or "the slot's previous step"
	Seen, Want int    // the flag's value and the value waited for
}

func (e *RingTimeoutError) Error() string {
	return fmt.Sprintf("kernels: ring attention watchdog: rank %d %s CTA (tile %d) timed out at step %d waiting for %s "+
		"(flag %d, want %d)", e.Rank, e.Role, e.Tile, e.Step, e.WaitedFor, e.Seen, e.Want)
}

// RingCheck waits for all work on the device, then returns a
// *RingTimeoutError when a ring launch on ws timed out since the last check
// (and clears the record), else nil.
func (d *Device) RingCheck(ws *Buffer) error {
	const op = "RingCheck"
	if err := d.ready(op); err != nil {
		return err
	}
	if err := ws.fits(op+" workspace", 4*ringErrWords); err != nil {
		return err
	}
	rec := make([]int32, ringErrWords)
	if err := d.lib.check("mk_ring_check", ringCheck(ws.ptr, &rec[0])); err != nil {
		return err
	}
	if rec[0] == 0 {
		return nil
	}
	e := &RingTimeoutError{Rank: int(rec[1]), Role: "compute", Step: int(rec[3]), Tile: int(rec[4]),
		WaitedFor: "chunk arrival", Seen: int(rec[6]), Want: int(rec[7])}
	if rec[2] == 1 {
		e.Role = "comm"
	}
	switch rec[5] {
	case 1:
		e.WaitedFor = "buffer release"
	case 2:
		e.WaitedFor = "the slot's previous step"
	}
	return e
}
