package kernels

import (
	"fmt"
	"runtime"
	"time"
)

// The all-reduce over ranks in separate processes (allreduce.cu,
// mk_allreduce.h): each rank launches its own kernel on its own GPU (or its
// share of one), reading the peers' data through workspaces mapped with
// CUDA IPC. The serving engine's expert-parallel world sums the ranks'
// partial MoE outputs with it.

var (
	allReduceWorkspace func(n int64, bytes *int64) int32
	allReduceRank      func(s uint64, ranks, me int32, ws *uint64, src, dst uint64, n, cap int64, ctas int32,
		timeoutNs int64) int32
	allReduceCheck func(ws uint64, rec *int32) int32
)

func init() {
	registerSymbols(
		symbol{"mk_allreduce_workspace", &allReduceWorkspace},
		symbol{"mk_allreduce_f32_rank", &allReduceRank},
		symbol{"mk_allreduce_check", &allReduceCheck},
	)
}

// AllReduceMaxRanks is the most ranks one all-reduce takes (MK_AR_MAX_RANKS).
const AllReduceMaxRanks = 8

// AllReduceDefaultTimeout bounds each wait of the all-reduce when
// AllReduceArgs.Timeout is 0.
const AllReduceDefaultTimeout = 30 * time.Second

const allReduceErrWords = 6 // MK_AR_ERR_WORDS

// AllReduceArgs is one rank's view of an all-reduce world.
type AllReduceArgs struct {
	Me  int       // this rank
	WS  []*Buffer // [ranks]: every rank's workspace, WS[Me] this process's own, the others from OpenIPC
	Cap int64     // floats each workspace holds (AllReduceWorkspace(Cap) bytes)
	// CTAs of each launch (0: one per SM, fewer for small n). Ranks sharing
	// a GPU in one process need at most SMs/ranks each, to be co-resident.
	CTAs    int
	Timeout time.Duration // each wait's bound (0: AllReduceDefaultTimeout)
}

// AllReduceWorkspace is the bytes of one rank's workspace for vectors of up
// to n floats. A workspace must be zero-filled before any rank's first call.
func (d *Device) AllReduceWorkspace(n int64) (int64, error) {
	if err := d.ready("AllReduceWorkspace"); err != nil {
		return 0, err
	}
	var b int64
	err := d.lib.check("mk_allreduce_workspace", allReduceWorkspace(n, &b))
	return b, err
}

// AllReduceSumF32 sets dst [n] f32 = Σ_r src_r over the ranks of a (rank
// order, so every rank gets the same bits); src and dst are this rank's and
// may be the same buffer. Every rank must make the same sequence of calls;
// the epoch lives on the device, so the call can be captured in a graph.
// A wait longer than the timeout ends the kernel: AllReduceCheck reports it.
// Asynchronous on s.
func (d *Device) AllReduceSumF32(s *Stream, a *AllReduceArgs, src, dst *Buffer, n int64) error {
	const op = "AllReduceSumF32"
	if err := d.ready(op); err != nil {
		return err
	}
	R := len(a.WS)
	if R < 1 || R > AllReduceMaxRanks || a.Me < 0 || a.Me >= R {
		return fmt.Errorf("kernels: %s: rank %d of %d (1..%d ranks)", op, a.Me, R, AllReduceMaxRanks)
	}
	if n < 0 || n > a.Cap {
		return fmt.Errorf("kernels: %s: %d floats, workspaces hold %d", op, n, a.Cap)
	}
	need, err := d.AllReduceWorkspace(a.Cap)
	if err != nil {
		return err
	}
	ptrs := make([]uint64, R)
	for r, w := range a.WS {
		if err := w.fits(fmt.Sprintf("%s workspace %d", op, r), need); err != nil {
			return err
		}
		ptrs[r] = w.ptr
	}
	var sp, dp uint64
	if n > 0 {
		if err := src.fits(op+" src", 4*n); err != nil {
			return err
		}
		if err := dst.fits(op+" dst", 4*n); err != nil {
			return err
		}
		sp, dp = src.ptr, dst.ptr
	}
	if d.muted() {
		return nil
	}
	to := a.Timeout
	if to == 0 {
		to = AllReduceDefaultTimeout
	}
	rc := allReduceRank(s.handle(), int32(R), int32(a.Me), &ptrs[0], sp, dp, n, a.Cap, int32(a.CTAs), to.Nanoseconds())
	runtime.KeepAlive(ptrs)
	return d.lib.check("mk_allreduce_f32_rank", rc)
}

// AllReduceTimeoutError is the all-reduce watchdog's report: rank Rank
// waited longer than the timeout for rank Peer (the world is broken: the
// workspaces cannot be used again).
type AllReduceTimeoutError struct {
	Rank, Peer int
	WaitedFor  string // "its data" or "it to finish reading the previous call"
	Seen, Want int    // the flag's epoch and the epoch waited for
}

func (e *AllReduceTimeoutError) Error() string {
	return fmt.Sprintf("kernels: all-reduce watchdog: rank %d timed out waiting for rank %d (%s; epoch %d, want %d)",
		e.Rank, e.Peer, e.WaitedFor, e.Seen, e.Want)
}

// AllReduceCheck waits for the device, then returns an
// *AllReduceTimeoutError when a call on workspace ws (this rank's own) has
// timed out, else nil. The record is not cleared: the world stays broken.
func (d *Device) AllReduceCheck(ws *Buffer) error {
	const op = "AllReduceCheck"
	if err := d.ready(op); err != nil {
		return err
	}
	if err := ws.fits(op+" workspace", 4*allReduceErrWords); err != nil {
		return err
	}
	rec := make([]int32, allReduceErrWords)
	if err := d.lib.check("mk_allreduce_check", allReduceCheck(ws.ptr, &rec[0])); err != nil {
		return err
	}
	return allReduceRecord(rec)
}

// allReduceRecord reads the error record (mk_allreduce.h): nil when unset.
func allReduceRecord(rec []int32) error {
	if rec[0] == 0 {
		return nil
	}
	e := &AllReduceTimeoutError{Rank: int(rec[1]), Peer: int(rec[3]), Seen: int(rec[4]), Want: int(rec[5])}
	switch rec[2] {
	case 0:
		e.WaitedFor = "it to finish reading the previous call"
	case 1:
		e.WaitedFor = "its data"
	default:
		e.WaitedFor = fmt.Sprintf("phase %d", rec[2])
	}
	return e
}
