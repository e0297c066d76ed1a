package moe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mkserve/mkserve/transport"
)

// EP runs an MoE layer as an emulated expert-parallel world of R ranks in one
// process: each rank is a goroutine with its own transport.Comm and computes
// only the experts its Table row gives it, through views of those experts'
// weights.
//
// One Forward:
//
//  1. the T tokens are split contiguously over the ranks (rank r's "source"
//     tokens; the first T mod R ranks get one more);
//  2. dispatch: every rank sends each (token, slot) to the owner chosen by
//     Table.Pick(token, expert) with AllToAllV; a row on the wire is
//     [token, slot, expert, weight, x[token] (H values)], the three integers
//     stored as float32 bit patterns;
//  3. each rank groups what it received by expert and runs its experts,
//     multiplying each result by its routing weight;
//  4. combine: the results go back by AllToAllV in the order received, and
//     the source rank sums each token's K results in slot order.
//
// The result equals Experts.Forward up to GEMM blocking. Calls are
// serialised by a mutex: one Forward at a time per EP.
type EP struct {
	// Timeout bounds one Forward (a rank that never arrives becomes an error);
	// zero means no bound beyond the caller's context. NewEP sets 30 s; set
	// it before the first Forward.
	Timeout time.Duration

	mu     sync.Mutex
	table  *Table
	ex     *Experts
	ranks  []epRank
	comms  []transport.Comm
	broken bool // the world aborted; make a new one before the next call

	load     *Load
	rankRows []atomic.Uint64 // [R] rows computed per rank
}

// epRank is one rank's share of the experts.
type epRank struct {
	set   *expertSet
	local []int32 // [E] global expert → local id, or -1
}

// epHeader is the number of metadata words before each dispatched row.
const epHeader = 4

// NewEP builds an expert-parallel world for ex laid out by table (a snapshot
// of table is taken; later changes to it have no effect).
func NewEP(table *Table, ex *Experts) (*EP, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	if err := ex.Validate(); err != nil {
		return nil, err
	}
	if table.NumExperts() != ex.E {
		return nil, fmt.Errorf("moe: ep: table has %d experts, layer has %d", table.NumExperts(), ex.E)
	}
	if ex.E > math.MaxInt32 {
		return nil, fmt.Errorf("moe: ep: %d experts do not fit the int32 wire format", ex.E)
	}
	t := table.clone()
	R := t.Ranks()
	p := &EP{
		Timeout:  30 * time.Second,
		table:    t,
		ex:       ex,
		ranks:    make([]epRank, R),
		comms:    transport.NewLocalWorld(R),
		load:     NewLoad(ex.E),
		rankRows: make([]atomic.Uint64, R),
	}
	for r := range R {
		p.ranks[r] = newEPRank(t, ex, r)
	}
	return p, nil
}

// Ranks is the world size R.
func (p *EP) Ranks() int { return len(p.ranks) }

// Load returns the tokens routed to each expert so far (one per token-slot,
// counted at dispatch, so a call that then fails still counts), [E],
// cumulative over Forward calls.
func (p *EP) Load() []uint64 { return p.load.Snapshot() }

// RankLoad returns the rows each rank has computed so far, [R].
func (p *EP) RankLoad() []uint64 {
	out := make([]uint64, len(p.rankRows))
	for r := range p.rankRows {
		out[r] = p.rankRows[r].Load()
	}
	return out
}

// ResetLoad zeroes both load counters.
func (p *EP) ResetLoad() {
	p.load.Reset()
	for r := range p.rankRows {
		p.rankRows[r].Store(0)
	}
}

// Forward is ForwardContext with a background context.
func (p *EP) Forward(out, x []float32, T, K int, ids []int32, w []float32) error {
	return p.ForwardContext(context.Background(), out, x, T, K, ids, w)
}

// ForwardContext computes out [T, H] = Σ_k w[t,k]·expert_{ids[t,k]}(x[t]) for
// x [T, H], ids and w [T, K] across the emulated ranks. out is overwritten.
// Bad shapes or ids give an error before any rank starts.
func (p *EP) ForwardContext(ctx context.Context, out, x []float32, T, K int, ids []int32, w []float32) error {
	if err := p.ex.checkCall(out, x, T, K, ids, w); err != nil {
		return fmt.Errorf("moe: ep: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	H := p.ex.H
	clear(out[:T*H])
	if T == 0 || K == 0 {
		return nil
	}
	p.load.Add(ids[:T*K])
	if p.broken {
		p.comms = transport.NewLocalWorld(len(p.ranks))
		p.broken = false
	}
	if p.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		defer cancel()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	R := len(p.ranks)
	errs := make([]error, R)
	var wg sync.WaitGroup
	for r := range R {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.rankForward(ctx, r, out, x, T, K, ids, w); err != nil {
				errs[r] = err
				cancel()
			}
		}()
	}
	wg.Wait()
	// Report the root cause, not the ranks that were aborted because of it.
	secondary := func(err error) bool {
		return errors.Is(err, transport.ErrAborted) || errors.Is(err, context.Canceled)
	}
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		if first == nil || (secondary(first) && !secondary(err)) {
			first = err
		}
	}
	if first != nil {
		p.broken = true
		return fmt.Errorf("moe: ep: %w", first)
	}
	return nil
}

// srcRange is rank r's contiguous share [lo, hi) of T tokens.
func srcRange(T, R, r int) (lo, hi int) {
	b, m := T/R, T%R
	lo = r*b + min(r, m)
	hi = lo + b
	if r < m {
		hi++
	}
	return lo, hi
}

// rankForward is one rank's part of a Forward.
func (p *EP) rankForward(ctx context.Context, r int, out, x []float32, T, K int, ids []int32, w []float32) error {
	return epRankForward(ctx, p.table, p.ex.H, &p.ranks[r], p.comms[r], &p.rankRows[r], out, x, T, K, ids, w)
}

// newEPRank holds rank r's experts of ex as table places them.
func newEPRank(t *Table, ex *Experts, r int) epRank {
	rk := epRank{set: &expertSet{H: ex.H, I: ex.I, act: ex.Act}, local: make([]int32, ex.E)}
	for e := range rk.local {
		rk.local[e] = -1
	}
	for _, e := range t.Local(r) {
		rk.local[e] = int32(len(rk.set.gateUp))
		rk.set.add(ex, e)
	}
	return rk
}

// epRankForward is rank comm.Rank()'s part of an expert-parallel forward:
// it dispatches its share of the tokens (srcRange) to their experts' ranks,
// runs the rows that arrive for its own experts (rk), and combines its
// tokens' results into out[t0*H : t1*H]. rows counts the rows it computed.
func epRankForward(ctx context.Context, table *Table, H int, rk *epRank, comm transport.Comm, rows *atomic.Uint64,
	out, x []float32, T, K int, ids []int32, w []float32) error {
	R, r := comm.Size(), comm.Rank()
	stride := epHeader + H
	t0, t1 := srcRange(T, R, r)

	// Dispatch: pack each of my (token, slot) pairs for its owner rank.
	dst := make([]int32, (t1-t0)*K)
	count := make([]int, R)
	for i := range dst {
		t := t0 + i/K
		d := table.Pick(t, int(ids[t*K+i%K]))
		if d < 0 {
			return fmt.Errorf("rank %d: no owner for expert %d", r, ids[t*K+i%K])
		}
		dst[i] = int32(d)
		count[d]++
	}
	send := make([][]float32, R)
	sent := make([][]int32, R) // [dst] → my slot indices, in send order
	for d := range R {
		send[d] = make([]float32, 0, count[d]*stride)
		sent[d] = make([]int32, 0, count[d])
	}
	for i, d := range dst {
		t, k := t0+i/K, i%K
		send[d] = append(send[d],
			math.Float32frombits(uint32(t)),
			math.Float32frombits(uint32(k)),
			math.Float32frombits(uint32(ids[t*K+k])),
			w[t*K+k])
		send[d] = append(send[d], x[t*H:t*H+H]...)
		sent[d] = append(sent[d], int32(i))
	}
	recv, err := comm.AllToAllV(ctx, send)
	if err != nil {
		return fmt.Errorf("rank %d: dispatch: %w", r, err)
	}

	// Experts: run what arrived, grouped by my local expert.
	n := 0
	for s, buf := range recv {
		if len(buf)%stride != 0 {
			return fmt.Errorf("rank %d: dispatch from rank %d has %d values, not a multiple of row size %d", r, s, len(buf), stride)
		}
		n += len(buf) / stride
	}
	in := make([][]float32, n)
	eid := make([]int32, n)
	wt := make([]float32, n)
	from := make([]int, R+1) // rows from source s are [from[s], from[s+1])
	i := 0
	for s, buf := range recv {
		lo, hi := srcRange(T, R, s)
		for o := 0; o < len(buf); o += stride {
			t := int(math.Float32bits(buf[o]))
			k := int(math.Float32bits(buf[o+1]))
			e := int(math.Float32bits(buf[o+2]))
			if t < lo || t >= hi || k >= K {
				return fmt.Errorf("rank %d: row from rank %d names token %d slot %d, outside its tokens [%d, %d) or K = %d", r, s, t, k, lo, hi, K)
			}
			if e >= len(rk.local) || rk.local[e] < 0 {
				return fmt.Errorf("rank %d: row from rank %d for expert %d, which this rank does not hold", r, s, e)
			}
			eid[i] = rk.local[e]
			wt[i] = buf[o+3]
			in[i] = buf[o+epHeader : o+stride : o+stride]
			i++
		}
		from[s+1] = i
	}
	rows.Add(uint64(n))
	y := getBuf(n * H)
	defer putBuf(y)
	rk.set.run(y, in, eid, wt)

	// Combine: results go home in the order they came.
	back := make([][]float32, R)
	for s := range R {
		back[s] = y[from[s]*H : from[s+1]*H]
	}
	res, err := comm.AllToAllV(ctx, back)
	if err != nil {
		return fmt.Errorf("rank %d: combine: %w", r, err)
	}
	slots := getBuf((t1 - t0) * K * H)
	defer putBuf(slots)
	for d := range R {
		if len(res[d]) != len(sent[d])*H {
			return fmt.Errorf("rank %d: combine from rank %d has %d values, want %d rows of %d", r, d, len(res[d]), len(sent[d]), H)
		}
		for j, slot := range sent[d] {
			copy(slots[int(slot)*H:int(slot)*H+H], res[d][j*H:j*H+H])
		}
	}
	sumSlots(out[t0*H:t1*H], slots, t1-t0, K, H)
	return nil
}

// EPRank is one rank of an expert-parallel world whose ranks are separate
// processes joined by a transport.Comm (transport.JoinGRPC between
// processes; one process per GPU): it holds only its own experts. Every
// rank calls Forward with the same batch (replicated activations), so no
// token needs dispatching: each rank computes the weighted outputs of the
// (token, slot) pairs whose expert the table places on it (Table.Pick: one
// owner per pair, replicas included), and one exchange of the partial sums
// gives every rank the same total, summed in rank order so that all ranks
// hold bit-identical results. One exchange per layer (the in-process EP
// needs two plus a gather). Not safe for concurrent use.
type EPRank struct {
	table *Table
	ex    *Experts // shapes only: the weights used are rk's
	rk    epRank
	comm  transport.Comm
	rows  atomic.Uint64
}

// NewEPRank keeps the experts of ex that table places on comm.Rank() (a
// snapshot of table is taken).
func NewEPRank(table *Table, ex *Experts, comm transport.Comm) (*EPRank, error) {
	if err := table.Validate(); err != nil {
		return nil, err
	}
	if err := ex.Validate(); err != nil {
		return nil, err
	}
	if table.NumExperts() != ex.E || table.Ranks() != comm.Size() {
		return nil, fmt.Errorf("moe: ep rank: table of %d experts on %d ranks, layer of %d experts, world of %d ranks",
			table.NumExperts(), table.Ranks(), ex.E, comm.Size())
	}
	t := table.clone()
	return &EPRank{table: t, ex: ex, rk: newEPRank(t, ex, comm.Rank()), comm: comm}, nil
}

// Rows is the number of expert rows this rank has computed.
func (p *EPRank) Rows() uint64 { return p.rows.Load() }

// Forward computes out [T, H] = Σ_k w[t,k]·expert_{ids[t,k]}(x[t]) for the
// batch every rank passes alike (x [T, H], ids and w [T, K]). A failed
// exchange aborts the world (transport.ErrAborted from then on).
func (p *EPRank) Forward(ctx context.Context, out, x []float32, T, K int, ids []int32, w []float32) error {
	if err := p.ex.checkCall(out, x, T, K, ids, w); err != nil {
		return fmt.Errorf("moe: ep rank: %w", err)
	}
	H, R, r := p.ex.H, p.comm.Size(), p.comm.Rank()
	clear(out[:T*H])
	if T == 0 || K == 0 {
		return nil
	}
	// My (token, slot) pairs, in order.
	var rows [][]float32
	var eid []int32
	var wt []float32
	var tok []int32
	for i, e := range ids[:T*K] {
		t := i / K
		d := p.table.Pick(t, int(e))
		if d < 0 {
			return fmt.Errorf("moe: ep rank %d: no owner for expert %d", r, e)
		}
		if d != r {
			continue
		}
		if p.rk.local[e] < 0 {
			return fmt.Errorf("moe: ep rank %d: picked for expert %d, which it does not hold", r, e)
		}
		rows = append(rows, x[t*H:t*H+H:t*H+H])
		eid = append(eid, p.rk.local[e])
		wt = append(wt, w[i])
		tok = append(tok, int32(t))
	}
	p.rows.Add(uint64(len(rows)))
	partial := make([]float32, T*H)
	if n := len(rows); n > 0 {
		y := getBuf(n * H)
		p.rk.set.run(y, rows, eid, wt)
		for j, t := range tok { // slot order within each token, as Experts.Forward sums
			dst := partial[int(t)*H : int(t)*H+H]
			for c, v := range y[j*H : j*H+H] {
				dst[c] += v
			}
		}
		putBuf(y)
	}
	send := make([][]float32, R)
	for d := range R {
		if d != r {
			send[d] = partial
		}
	}
	recv, err := p.comm.AllToAllV(ctx, send)
	if err != nil {
		return fmt.Errorf("moe: ep rank %d: exchange: %w", r, err)
	}
	recv[r] = partial
	for s := range R { // rank order: every rank adds the same numbers in the same order
		if len(recv[s]) != T*H {
			return fmt.Errorf("moe: ep rank %d: rank %d sent %d values, want %d", r, s, len(recv[s]), T*H)
		}
		for i, v := range recv[s] {
			out[i] += v
		}
	}
	return nil
}
