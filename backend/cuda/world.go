package cuda

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/transport"
)

// The expert-parallel world of processes (Options.World): this process is
// one rank, on its own GPU (or its share of one). Every rank runs the same
// steps (dist mirrors rank 0's calls), with attention and dense layers
// replicated; each MoE layer's experts are split in contiguous blocks over
// the ranks. A rank runs its block on every token (the grouped path with
// the routed ids outside its block dropped by kernels.MoELocalize, or the
// host path with those assignments left out) and the ranks' partial
// outputs [T, H] are summed by kernels.AllReduceSumF32 through workspaces
// mapped with CUDA IPC, in rank order, so that every rank keeps the same
// bits and routes the next layer alike. Shared experts run on every rank
// after the sum.

// worldTimeout bounds the handle exchange (a gRPC all-gather) when the
// all-reduce workspaces are made or grown.
var worldTimeout = 2 * time.Minute

// worldMinTokens sizes the first workspace: room for this many rows of the
// first MoE layer's width, so that decode graphs never need a larger one.
const worldMinTokens = 4096

// world is a Backend's expert-parallel world (nil without Options.World).
type world struct {
	comm  transport.Comm
	R, me int
	kind  string            // "ipc" or "nccl" (Options.WorldTransport)
	nccl  *kernels.NCCLComm // kind "nccl"

	mu    sync.Mutex        // the fields below (used on the GPU goroutine)
	mine  *kernels.Buffer   // this rank's workspace
	peers []*kernels.Buffer // [R]: every rank's workspace (mine at me, the others mapped)
	cap   int64             // floats each workspace holds
	used  bool              // an all-reduce ran since the last check

	calls atomic.Int64 // all-reduces launched (tests)
}

func newWorld(c transport.Comm, kind string) (*world, error) {
	R := c.Size()
	if R < 1 || R > kernels.AllReduceMaxRanks {
		return nil, fmt.Errorf("cuda: a world of %d processes: the all-reduce takes 1..%d ranks", R, kernels.AllReduceMaxRanks)
	}
	switch kind {
	case "":
		kind = "ipc"
	case "ipc", "nccl":
	default:
		return nil, fmt.Errorf("cuda: world transport %q (ipc or nccl)", kind)
	}
	return &world{comm: c, R: R, me: c.Rank(), kind: kind}, nil
}

// experts is this rank's block [lo, hi) of E experts: expert e lives on
// rank e·R/E (kernels.MoEBlockPlacement's split).
func (w *world) experts(E int) (lo, hi int) {
	return (w.me*E + w.R - 1) / w.R, ((w.me+1)*E + w.R - 1) / w.R
}

// ExpertShard implements backend.ExpertSharder: in a world, this rank's
// block of a layer's E experts (the loader uploads only those); else all.
func (be *Backend) ExpertShard(E int) (lo, hi int) {
	if be.world == nil {
		return 0, E
	}
	return be.world.experts(E)
}

// WorldRank is this backend's rank and the world's size (0, 1 without a world).
func (be *Backend) WorldRank() (rank, size int) {
	if be.world == nil {
		return 0, 1
	}
	return be.world.me, be.world.R
}

// ensure makes the workspaces hold n floats (rows of width H), collectively:
// every rank makes the same calls, so every rank grows at the same one. On
// the GPU goroutine.
func (w *world) ensure(be *Backend, d *kernels.Device, n, H int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n <= w.cap {
		return
	}
	be.graphGuard("making the expert-parallel all-reduce workspace")
	capN := max(n, worldMinTokens*H, 2*w.cap)
	bytes, err := d.AllReduceWorkspace(capN)
	must("world workspace", err)
	// Every earlier all-reduce of this rank has ended, and (once the
	// exchange below returns) every peer's too: no one reads the old
	// workspaces any more.
	must("world workspace", d.Sync())
	mine, err := d.Malloc(bytes)
	must("world workspace", err)
	must("world workspace", kernels.Upload(d, mine, make([]int32, bytes/4))) // synchronous
	h, err := d.IPCHandle(mine)
	must("world workspace", err)
	msg := binary.LittleEndian.AppendUint64(h[:], uint64(capN))
	ctx, cancel := context.WithTimeout(context.Background(), worldTimeout)
	all, err := transport.AllGatherBytes(ctx, w.comm, msg)
	cancel()
	if err != nil {
		mine.Free()
		panicf("MoE", "rank %d of %d: exchanging all-reduce workspaces: %v", w.me, w.R, err)
	}
	peers := make([]*kernels.Buffer, w.R)
	for r, m := range all {
		if len(m) != kernels.IPCHandleBytes+8 || int64(binary.LittleEndian.Uint64(m[kernels.IPCHandleBytes:])) != capN {
			panicf("MoE", "rank %d of %d: rank %d's workspace message (%d bytes) disagrees with %d floats", w.me, w.R, r, len(m), capN)
		}
		if r == w.me {
			peers[r] = mine
			continue
		}
		var ph kernels.IPCHandle
		copy(ph[:], m)
		if peers[r], err = d.OpenIPC(ph, bytes); err != nil {
			panicf("MoE", "rank %d of %d: mapping rank %d's all-reduce workspace: %v", w.me, w.R, r, err)
		}
	}
	for r, b := range w.peers {
		if b != nil && r != w.me {
			must("world workspace", b.Free())
		}
	}
	if w.mine != nil {
		must("world workspace", w.mine.Free())
	}
	w.mine, w.peers, w.cap = mine, peers, capN
	be.gr.stale.Store(true) // graphs hold the old workspaces' addresses
}

// allReduce sums buf [n] f32 over the world's ranks in place. On the GPU goroutine.
func (w *world) allReduce(be *Backend, d *kernels.Device, buf *kernels.Buffer, n, H int64) {
	if w.nccl != nil {
		must("all-reduce (NCCL)", w.nccl.AllReduceSumF32(d, nil, buf, buf, int(n)))
		w.calls.Add(1)
		return
	}
	w.ensure(be, d, n, H)
	w.mu.Lock()
	args := kernels.AllReduceArgs{Me: w.me, WS: w.peers, Cap: w.cap}
	w.used = true
	w.mu.Unlock()
	must("all-reduce", d.AllReduceSumF32(nil, &args, buf, buf, n))
	w.calls.Add(1)
}

// check reports an all-reduce that timed out since the last check (the
// world is then broken for good). On the GPU goroutine, after a sync.
func (w *world) check(d *kernels.Device) error {
	if w == nil {
		return nil
	}
	if w.nccl != nil {
		if err := w.nccl.Check(d); err != nil {
			return fmt.Errorf("cuda: rank %d of %d: the world's NCCL transport: %w", w.me, w.R, err)
		}
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.used || w.mine == nil {
		return nil
	}
	w.used = false
	if err := d.AllReduceCheck(w.mine); err != nil {
		return fmt.Errorf("cuda: rank %d of %d: the expert-parallel all-reduce stopped (a peer process is gone or stuck): %w",
			w.me, w.R, err)
	}
	return nil
}

// worldCPAttention attends a context-parallel span (rs) in a world of
// processes: every process has written all of the span's k/v (the KV cache
// is replicated), this one attends only its zigzag share of the query rows
// (chunks me and 2R−1−me of 2R, which balances the causal work) with the
// prefill kernel, the span's other rows of out are zeroed, and the
// all-reduce fills them in from their owners (x + 0 is exact, so out is what
// one process attending every row would have written). q is bf16 [T, H*D].
// Every process makes the same calls. On the GPU goroutine.
func (be *Backend) worldCPAttention(d *kernels.Device, out, q *kernels.Buffer, pl *kvLayer, rs ringSpan,
	a kernels.AttnArgs, sinks *kernels.Buffer, T int) error {
	w, s := be.world, rs.span
	width := a.Heads * a.VHeadDim
	rows := view(out, int64(s.Offset*width)*4, int64(s.Len*width)*4)
	if err := d.FillF32(nil, rows, s.Len*width, 0); err != nil {
		return err
	}
	// The span's block table and, per chunk of this rank, one sequence's
	// record (q rows [Offset+Lo, Offset+Hi) at positions from Past+Lo: start,
	// end, past, table 0), in one array through be.stepArrays: every layer of
	// the step sends the same, and each synchronous upload would wait for
	// all the GPU work queued before it.
	chunks := kernels.RingZigzag(s.Len, w.R)[w.me]
	meta := append([]int32(nil), rs.blocks...)
	for _, c := range chunks {
		meta = append(meta, int32(s.Offset+c.Lo), int32(s.Offset+c.Hi), int32(s.Past+c.Lo), 0)
	}
	mb := be.stepArrays.get(be, d, meta)
	nb := int64(len(rs.blocks))
	blocks := view(mb, 0, max(nb, 1)*4)
	for i, c := range chunks {
		if c.Len() == 0 {
			continue
		}
		rec := (nb + 4*int64(i)) * 4 // the chunk's record, bytes into mb
		err := d.FlashAttention(nil, out, q, pl.k, pl.v, view(mb, rec, 8), view(mb, rec+8, 4), view(mb, rec+12, 4), blocks,
			sinks, kernels.FlashArgs{Batch: 1, MaxQLen: c.Len(), Tokens: T, Heads: a.Heads, KVHeads: a.KVHeads,
				HeadDim: a.HeadDim, VHeadDim: a.VHeadDim, BlockSize: a.BlockSize, PoolRows: pl.blocks * a.BlockSize,
				NumBlocks: len(rs.blocks), Scale: a.Scale, Window: a.Window, Causal: true, Out: kernels.F32})
		if err != nil {
			return fmt.Errorf("context-parallel span %d, rows [%d, %d) of rank %d of %d: %w", s.ID, c.Lo, c.Hi, w.me, w.R, err)
		}
	}
	w.allReduce(be, d, rows, int64(s.Len*width), int64(width))
	return nil
}
