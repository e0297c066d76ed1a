package kernels

import (
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"
)

// The persistent fused MoE layer (moe_fused.cu, mk_moe_fused.h): one MoE
// layer's routed experts over R emulated expert-parallel ranks in one
// persistent cooperative launch whose CTAs dispatch tokens to the ranks
// holding their experts, run the expert GEMMs as rows arrive, and combine
// the returned outputs at each token's source rank.

var (
	moeFusedWorkspace func(ranks int32, tokens *int64, slots *int32, k, e int32, h, i int64, withSep int32,
		ctlBytes *uint64, rankBytes *uint64, tileM *int32, tile int32, maxRows int64) int32
	moeFused func(s uint64, ranks int32, ptrs *uint64, tokens *int64, slots *int32, k, e int32, h, i int64,
		place uint64, act int32, alpha, limit uint32, ctl, ctlBytes uint64, rankBytes *uint64, ctas,
		dispatchCTAs int32, timeoutNs int64, faultRank, tile int32, maxRows int64, router *moeFusedRouter) int32
	moeFusedSeparate func(s uint64, ranks int32, ptrs *uint64, tokens *int64, slots *int32, k, e int32, h, i int64,
		place uint64, act int32, alpha, limit uint32, ctl, ctlBytes uint64, rankBytes *uint64, tile int32,
		maxRows int64, router *moeFusedRouter) int32
	moeFusedCheck func(ctl uint64, rec *int32) int32
	moeFusedRank  func(s uint64, ranks, me int32, ptrs *uint64, tokens *int64, slots *int32, k, e int32, h, i int64,
		place uint64, act int32, alpha, limit uint32, ctl, ctlBytes uint64, rankBytes *uint64, ctas,
		dispatchCTAs int32, timeoutNs int64, epoch, tile int32, maxRows int64, router *moeFusedRouter) int32
)

// moeFusedRouter is mk_moe_fused_router (88 bytes; moe_fused.cu asserts the
// size): the router of a fused call that routes its tokens itself.
type moeFusedRouter struct {
	logits                    [MoEFusedMaxRanks]uint64
	scoreBias                 uint64
	flags, groups, topKGroups int32
	scaling                   uint32
}

func init() {
	registerSymbols(
		symbol{"mk_moe_fused_workspace", &moeFusedWorkspace},
		symbol{"mk_moe_fused", &moeFused},
		symbol{"mk_moe_fused_separate", &moeFusedSeparate},
		symbol{"mk_moe_fused_check", &moeFusedCheck},
		symbol{"mk_moe_fused_rank", &moeFusedRank},
	)
}

// MoEFusedMaxRanks is the most ranks one fused launch takes.
const MoEFusedMaxRanks = 8

// MoEFusedMaxSlots is the most expert slots one rank holds.
const MoEFusedMaxSlots = 4096

// MoEFusedDefaultTimeout bounds each wait of the fused kernel when MoEFusedArgs.Timeout is 0.
const MoEFusedDefaultTimeout = time.Second

// Layout of mk_moe_fused.h's per-rank pointer array and error record.
const (
	moeFusedNPtr     = 9
	moeFusedErrWords = 8
)

// MoEReplica is one copy of an expert: local slot Slot of rank Rank.
type MoEReplica struct{ Rank, Slot int }

// MoEPlacement says which ranks hold which experts. Replicas[e] lists the
// copies of expert e (at least one; a hot expert may have several); rank r
// holds Slots[r] local slots, each the copy of exactly one expert.
type MoEPlacement struct {
	Slots    []int          // [ranks]
	Replicas [][]MoEReplica // [experts]
}

// MoEBlockPlacement places E experts on R ranks in contiguous blocks whose
// sizes differ by at most one, one copy each.
func MoEBlockPlacement(E, R int) *MoEPlacement {
	p := &MoEPlacement{Slots: make([]int, R), Replicas: make([][]MoEReplica, E)}
	for e := range E {
		r := e * R / E
		p.Replicas[e] = []MoEReplica{{r, p.Slots[r]}}
		p.Slots[r]++
	}
	return p
}

// Replicate adds a copy of expert e in a new slot of rank r.
func (p *MoEPlacement) Replicate(e, r int) {
	p.Replicas[e] = append(p.Replicas[e], MoEReplica{r, p.Slots[r]})
	p.Slots[r]++
}

// SlotExperts is, per rank, the expert each local slot holds ([ranks][slots]).
func (p *MoEPlacement) SlotExperts() [][]int {
	out := make([][]int, len(p.Slots))
	for r, n := range p.Slots {
		out[r] = make([]int, n)
		for i := range out[r] {
			out[r][i] = -1
		}
	}
	for e, reps := range p.Replicas {
		for _, c := range reps {
			if c.Rank >= 0 && c.Rank < len(out) && c.Slot >= 0 && c.Slot < len(out[c.Rank]) {
				out[c.Rank][c.Slot] = e
			}
		}
	}
	return out
}

// Check validates the placement: every expert has a copy, every slot holds
// exactly one copy.
func (p *MoEPlacement) Check() error {
	R := len(p.Slots)
	if R < 1 || R > MoEFusedMaxRanks {
		return fmt.Errorf("kernels: MoEPlacement: %d ranks, want 1..%d", R, MoEFusedMaxRanks)
	}
	used := make([][]bool, R)
	for r, n := range p.Slots {
		if n < 0 || n > MoEFusedMaxSlots {
			return fmt.Errorf("kernels: MoEPlacement: rank %d has %d slots, want 0..%d", r, n, MoEFusedMaxSlots)
		}
		used[r] = make([]bool, n)
	}
	for e, reps := range p.Replicas {
		if len(reps) == 0 {
			return fmt.Errorf("kernels: MoEPlacement: expert %d has no copy", e)
		}
		for _, c := range reps {
			if c.Rank < 0 || c.Rank >= R || c.Slot < 0 || c.Slot >= p.Slots[c.Rank] {
				return fmt.Errorf("kernels: MoEPlacement: expert %d at rank %d slot %d, outside the ranks' slots", e, c.Rank, c.Slot)
			}
			if used[c.Rank][c.Slot] {
				return fmt.Errorf("kernels: MoEPlacement: rank %d slot %d holds two copies", c.Rank, c.Slot)
			}
			used[c.Rank][c.Slot] = true
		}
	}
	for r := range used {
		for s, u := range used[r] {
			if !u {
				return fmt.Errorf("kernels: MoEPlacement: rank %d slot %d holds no expert", r, s)
			}
		}
	}
	return nil
}

// Table is the kernel's routing table, int32 [ranks*experts]: for source
// rank r and expert e, (rank << 16) | slot of the copy serving r's rows of
// e. Go picks the copy: one on r itself if there is one, else copy
// r mod (number of copies), so the sources spread over the replicas.
func (p *MoEPlacement) Table() ([]int32, error) {
	if err := p.Check(); err != nil {
		return nil, err
	}
	R, E := len(p.Slots), len(p.Replicas)
	t := make([]int32, R*E)
	for r := range R {
		for e, reps := range p.Replicas {
			c := reps[r%len(reps)]
			for _, x := range reps {
				if x.Rank == r {
					c = x
					break
				}
			}
			t[r*E+e] = int32(c.Rank<<16 | c.Slot)
		}
	}
	return t, nil
}

// MoEFusedRank is one rank's buffers.
//
//	X       [T_r, H] bf16          IDs [T_r, K] int32 (global expert ids)   Weights [T_r, K] f32
//	        (IDs and Weights are written by the call when MoEFusedArgs.Router is set)
//	Logits  [T_r, Experts] f32: the router's logits (only with MoEFusedArgs.Router)
//	Out     [T_r, H] f32 (written)  Shared [T_r, H] f32 or nil (added to Out: shared experts' output)
//	GateUp  [Slots_r, 2I, H] bf16 (gate rows then up rows)   Down [Slots_r, H, I] bf16
//	Counts  [Slots_r] int64 or nil (+= rows each slot received)   WS: the rank's workspace
type MoEFusedRank struct {
	X, IDs, Weights, Out, Shared *Buffer
	Logits                       *Buffer
	GateUp, Down                 *Buffer
	Counts                       *Buffer
	WS                           *Buffer
}

// MoEFusedTiles are the row tiles MoEFusedArgs.Tile may force (0 picks).
var MoEFusedTiles = []int{16, 64, 128}

// MoEFusedArgs describes one fused MoE layer over len(Tokens) ranks.
type MoEFusedArgs struct {
	Tokens  []int   // [ranks] tokens per rank (may be 0)
	Slots   []int   // [ranks] local expert slots per rank (MoEPlacement.Slots)
	Table   *Buffer // int32 [ranks*Experts] on the device (MoEPlacement.Table)
	Experts int
	TopK    int
	H, I    int // multiples of 8

	Clamped      bool // gpt-oss's clamped SwiGLU with Alpha and Limit; else silu(gate)*up
	Alpha, Limit float32

	// Tile is the row tile every (rank, slot) is padded to and the GEMM
	// tiles that go with it: 0 picks by rows per active slot; 16 or 64 the
	// mma.sync tiles (two 128-thread CTAs a multiprocessor at 64); 128 the
	// sm_90a wgmma tiles (128×256, TMA, one 384-thread CTA a
	// multiprocessor). The workspace, the launch and every later call on
	// the same workspaces take the same Tile.
	Tile int
	// MaxRows > 0 sizes each rank's receive side for at most MaxRows
	// (token, k) rows (plus tile padding) instead of all of every rank's
	// (0: that worst case, 8× the balanced share at 8 ranks). A layer that
	// routes more rows to a rank than its workspace holds computes nothing:
	// MoEFusedCheck returns a *MoEFusedCapacityError. Same rule as Tile.
	MaxRows int

	// Router, when set, makes the call route each rank's tokens itself
	// (MoERoute's launch before the plan, on the call's stream) from
	// MoEFusedRank.Logits, with ScoreBias ([Experts] f32 or nil), into IDs
	// and Weights. Router.Experts and Router.TopK must be Experts and TopK.
	Router    *MoERouter
	ScoreBias *Buffer

	CTAs         int           // CTAs of the persistent launch (0: every co-resident one)
	DispatchCTAs int           // CTAs that start with the dispatch role (0: all)
	Timeout      time.Duration // bound on each wait (0: MoEFusedDefaultTimeout)

	faultRank int // tests: source rank+1 whose dispatch is disabled, ranks+1: a stage never fills (0: none)
}

func (a *MoEFusedArgs) check(op string) error {
	R := len(a.Tokens)
	if R < 1 || R > MoEFusedMaxRanks {
		return fmt.Errorf("kernels: %s: %d ranks, want 1..%d", op, R, MoEFusedMaxRanks)
	}
	if len(a.Slots) != R {
		return fmt.Errorf("kernels: %s: %d ranks of tokens but %d of slots", op, R, len(a.Slots))
	}
	if err := dims(op, "Experts", a.Experts, "TopK", a.TopK, "H", a.H, "I", a.I); err != nil {
		return err
	}
	switch {
	case a.TopK > a.Experts || a.Experts > 65535:
		return fmt.Errorf("kernels: %s: TopK=%d, Experts=%d (want TopK ≤ Experts ≤ 65535)", op, a.TopK, a.Experts)
	case a.H%8 != 0 || a.I%8 != 0:
		return fmt.Errorf("kernels: %s: H=%d and I=%d must be multiples of 8", op, a.H, a.I)
	case a.Tile != 0 && !slices.Contains(MoEFusedTiles, a.Tile):
		return fmt.Errorf("kernels: %s: Tile=%d, want 0 (pick), 16, 64 or 128", op, a.Tile)
	case a.MaxRows < 0:
		return fmt.Errorf("kernels: %s: MaxRows=%d must be >= 0", op, a.MaxRows)
	case a.CTAs < 0 || a.DispatchCTAs < 0 || a.Timeout < 0:
		return fmt.Errorf("kernels: %s: CTAs=%d, DispatchCTAs=%d, Timeout=%v must be >= 0", op, a.CTAs, a.DispatchCTAs, a.Timeout)
	}
	for r := range R {
		if a.Tokens[r] < 0 || a.Tokens[r] > 1<<24 {
			return fmt.Errorf("kernels: %s: rank %d has %d tokens (0..2^24)", op, r, a.Tokens[r])
		}
		if a.Slots[r] < 0 || a.Slots[r] > MoEFusedMaxSlots {
			return fmt.Errorf("kernels: %s: rank %d has %d slots (0..%d)", op, r, a.Slots[r], MoEFusedMaxSlots)
		}
	}
	return nil
}

func (a *MoEFusedArgs) flat() (tok []int64, sl []int32) {
	for r := range a.Tokens {
		tok = append(tok, int64(a.Tokens[r]))
		sl = append(sl, int32(a.Slots[r]))
	}
	return tok, sl
}

// MoEFusedWorkspace is the control workspace's bytes and each rank's
// workspace bytes for a, and the row tile. withSeparate sizes them for
// MoEFusedSeparate too. A rank's workspace is sized for the worst case
// (every (token, k) of every rank routed to it).
func (d *Device) MoEFusedWorkspace(a MoEFusedArgs, withSeparate bool) (ctl int64, rank []int64, tileM int, err error) {
	const op = "MoEFusedWorkspace"
	if err := d.ready(op); err != nil {
		return 0, nil, 0, err
	}
	if err := a.check(op); err != nil {
		return 0, nil, 0, err
	}
	tok, sl := a.flat()
	R := len(tok)
	// The memo's key: the arguments the sizes depend on (R ≤ MoEFusedMaxRanks).
	type key struct {
		tok                               [MoEFusedMaxRanks]int64
		sl                                [MoEFusedMaxRanks]int32
		r, k, e, h, i, sep, tile, maxRows int
	}
	kk := key{r: R, k: a.TopK, e: a.Experts, h: a.H, i: a.I, tile: a.Tile, maxRows: a.MaxRows}
	copy(kk.tok[:], tok)
	copy(kk.sl[:], sl)
	type sizes struct {
		ctl  int64
		rank []int64
		tm   int
	}
	sep := int32(0)
	if withSeparate {
		sep, kk.sep = 1, 1
	}
	v, err := query(d, op, kk, func() (sizes, error) {
		rb := make([]uint64, R)
		var cb uint64
		var tm int32
		rc := moeFusedWorkspace(int32(R), &tok[0], &sl[0], int32(a.TopK), int32(a.Experts), int64(a.H), int64(a.I), sep,
			&cb, &rb[0], &tm, int32(a.Tile), int64(a.MaxRows))
		runtime.KeepAlive(tok)
		runtime.KeepAlive(sl)
		if err := d.lib.check("mk_moe_fused_workspace", rc); err != nil {
			return sizes{}, err
		}
		s := sizes{ctl: int64(cb), rank: make([]int64, R), tm: int(tm)}
		for r := range rb {
			s.rank[r] = int64(rb[r])
		}
		return s, nil
	})
	if err != nil {
		return 0, nil, 0, err
	}
	return v.ctl, slices.Clone(v.rank), v.tm, nil
}

// NewMoEFusedControl allocates a control workspace with a cleared error record.
func (d *Device) NewMoEFusedControl(bytes int64) (*Buffer, error) {
	b, err := d.Malloc(bytes)
	if err != nil {
		return nil, err
	}
	if err := Upload(d, b, make([]int32, bytes/4)); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// moeFusedCall checks the buffers and flattens the arguments of the launches.
// me >= 0 (rank-local): only ranks[me] is checked in full, the others need
// only their WS.
func (d *Device) moeFusedCall(op string, ranks []MoEFusedRank, ctl *Buffer, a *MoEFusedArgs, sep bool, me int) (ptrs []uint64,
	tok []int64, sl []int32, rb []uint64, rt *moeFusedRouter, err error) {
	fail := func(err error) ([]uint64, []int64, []int32, []uint64, *moeFusedRouter, error) {
		return nil, nil, nil, nil, nil, err
	}
	if err := d.ready(op); err != nil {
		return fail(err)
	}
	if err := a.check(op); err != nil {
		return fail(err)
	}
	R := len(a.Tokens)
	if len(ranks) != R {
		return fail(fmt.Errorf("kernels: %s: %d ranks of buffers for %d ranks of tokens", op, len(ranks), R))
	}
	if err := need(op, "Table", a.Table, int64(R)*int64(a.Experts), 4); err != nil {
		return fail(err)
	}
	if ctl == nil || ctl.ptr == 0 {
		return fail(fmt.Errorf("kernels: %s: ctl is a nil or freed buffer", op))
	}
	_, need1, _, err := d.MoEFusedWorkspace(*a, sep)
	if err != nil {
		return fail(err)
	}
	H, I, K := int64(a.H), int64(a.I), int64(a.TopK)
	if a.Router != nil {
		if a.Router.Experts != a.Experts || a.Router.TopK != a.TopK {
			return fail(fmt.Errorf("kernels: %s: a router of %d experts, top-%d, for a layer of %d, top-%d", op,
				a.Router.Experts, a.Router.TopK, a.Experts, a.TopK))
		}
		rt = &moeFusedRouter{groups: int32(a.Router.Groups), topKGroups: int32(a.Router.TopKGroups),
			scaling: math.Float32bits(a.Router.Scaling)}
	} else if a.ScoreBias != nil {
		return fail(fmt.Errorf("kernels: %s: a score bias without a router", op))
	}
	ptrs = make([]uint64, R*moeFusedNPtr)
	rb = make([]uint64, R)
	for r, rk := range ranks {
		name := func(s string) string { return fmt.Sprintf("rank %d %s", r, s) }
		p := ptrs[r*moeFusedNPtr:]
		T, S := int64(a.Tokens[r]), int64(a.Slots[r])
		if me >= 0 && r != me {
			T, S = 0, 0 // a peer: its workspace only
		}
		if T > 0 {
			if err := needAll(op, 4, name("IDs"), rk.IDs, T*K, name("Weights"), rk.Weights, T*K, name("Out"), rk.Out, T*H); err != nil {
				return fail(err)
			}
			if err := need(op, name("X"), rk.X, T*H, 2); err != nil {
				return fail(err)
			}
			p[0], p[1], p[2], p[3] = rk.X.ptr, rk.IDs.ptr, rk.Weights.ptr, rk.Out.ptr
			if rt != nil {
				sb, flags, err := routeArgs(op+" "+name("router"), rk.IDs, rk.Weights, rk.Logits, a.ScoreBias, int(T), *a.Router)
				if err != nil {
					return fail(err)
				}
				rt.logits[r], rt.scoreBias, rt.flags = rk.Logits.ptr, sb, flags
			}
			if rk.Shared != nil {
				if err := need(op, name("Shared"), rk.Shared, T*H, 4); err != nil {
					return fail(err)
				}
				p[4] = rk.Shared.ptr
			}
		}
		if S > 0 {
			if err := needAll(op, 2, name("GateUp"), rk.GateUp, S*2*I*H, name("Down"), rk.Down, S*H*I); err != nil {
				return fail(err)
			}
			p[5], p[6] = rk.GateUp.ptr, rk.Down.ptr
			if rk.Counts != nil {
				if err := need(op, name("Counts"), rk.Counts, S, 8); err != nil {
					return fail(err)
				}
				p[7] = rk.Counts.ptr
			}
		}
		if rk.WS == nil {
			return fail(fmt.Errorf("kernels: %s: %s is nil", op, name("WS")))
		}
		if err := rk.WS.fits(op+" "+name("WS"), need1[r]); err != nil {
			return fail(err)
		}
		p[8] = rk.WS.ptr
		rb[r] = uint64(rk.WS.bytes)
	}
	tok, sl = a.flat()
	return ptrs, tok, sl, rb, rt, nil
}

// timeoutNs is the bound on each wait, in nanoseconds (Timeout, or the default).
func (a *MoEFusedArgs) timeoutNs() int64 {
	if a.Timeout == 0 {
		return MoEFusedDefaultTimeout.Nanoseconds()
	}
	return a.Timeout.Nanoseconds()
}

func (a *MoEFusedArgs) act() (int32, uint32, uint32) {
	if a.Clamped {
		return 1, math.Float32bits(a.Alpha), math.Float32bits(a.Limit)
	}
	return 0, math.Float32bits(a.Alpha), math.Float32bits(a.Limit)
}

// MoEFused runs one MoE layer's routed experts over len(ranks) emulated
// expert-parallel ranks on stream s: for every rank r and token t,
// Out_r[t] = Σ_k Weights_r[t,k] · expert_{IDs_r[t,k]}(X_r[t]) (+ Shared_r[t]),
// the expert served by the copy a.Table names; bf16 operands, float32
// accumulation, the activation rounded to bf16 between the GEMMs, the sum in
// k order (deterministic). A small plan launch precedes the one persistent
// launch (and, with a.Router, MoERoute's launch per rank precedes the plan). Counts (if given) accumulate rows per local slot. ctl is from
// NewMoEFusedControl and each rank's WS holds MoEFusedWorkspace bytes.
// Asynchronous: MoEFusedCheck reports a watchdog timeout.
func (d *Device) MoEFused(s *Stream, ranks []MoEFusedRank, ctl *Buffer, a MoEFusedArgs) error {
	const op = "MoEFused"
	ptrs, tok, sl, rb, rt, err := d.moeFusedCall(op, ranks, ctl, &a, false, -1)
	if err != nil {
		return err
	}
	if d.muted() {
		return nil
	}
	act, alpha, limit := a.act()
	rc := moeFused(s.handle(), int32(len(ranks)), &ptrs[0], &tok[0], &sl[0], int32(a.TopK), int32(a.Experts),
		int64(a.H), int64(a.I), a.Table.ptr, act, alpha, limit, ctl.ptr, uint64(ctl.bytes), &rb[0], int32(a.CTAs),
		int32(a.DispatchCTAs), a.timeoutNs(), int32(a.faultRank-1), int32(a.Tile), int64(a.MaxRows), rt)
	runtime.KeepAlive(rt)
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(tok)
	runtime.KeepAlive(sl)
	runtime.KeepAlive(rb)
	return d.lib.check("mk_moe_fused", rc)
}

// MoEFusedSeparate computes what MoEFused computes from separate launches
// (the baseline): the plan, a dispatch launch, the grouped experts
// (MoEExpertsRun's kernels) on each rank's received rows, and a combine
// launch. Workspaces must be sized with withSeparate; Counts are not updated.
func (d *Device) MoEFusedSeparate(s *Stream, ranks []MoEFusedRank, ctl *Buffer, a MoEFusedArgs) error {
	const op = "MoEFusedSeparate"
	ptrs, tok, sl, rb, rt, err := d.moeFusedCall(op, ranks, ctl, &a, true, -1)
	if err != nil {
		return err
	}
	if d.muted() {
		return nil
	}
	act, alpha, limit := a.act()
	rc := moeFusedSeparate(s.handle(), int32(len(ranks)), &ptrs[0], &tok[0], &sl[0], int32(a.TopK), int32(a.Experts),
		int64(a.H), int64(a.I), a.Table.ptr, act, alpha, limit, ctl.ptr, uint64(ctl.bytes), &rb[0], int32(a.Tile),
		int64(a.MaxRows), rt)
	runtime.KeepAlive(rt)
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(tok)
	runtime.KeepAlive(sl)
	runtime.KeepAlive(rb)
	return d.lib.check("mk_moe_fused_separate", rc)
}

// MoEFusedRankLocal runs rank me's part of one MoE layer whose ranks are
// separate launches, normally one process per GPU: every rank calls it with
// the same a (Tokens, Slots, Experts, TopK, H, I, the same Table contents)
// and the same epoch. mine holds this rank's buffers; ws[r] is rank r's
// workspace as this process sees it (OpenIPC of the peer's handle; ws[me]
// may be nil: mine.WS). The plan exchanges the routing through the peers'
// workspaces and the persistent launch runs only this rank's dispatch,
// expert GEMMs and combine, so mine.Out gets what MoEFused computes for rank
// me. epoch numbers the calls on one set of workspaces: 1, 2, 3, … on every
// rank; every workspace must be zeroed (or 0xff-filled) before epoch 1, and
// again on every rank after a watchdog error. Each wait is bounded by
// a.Timeout (a peer that never launches: a *MoEFusedTimeoutError from
// MoEFusedCheck naming it, role "plan" or "dispatch or combine"). The peers' launches
// must be able to run at the same time as this one. Asynchronous on s.
func (d *Device) MoEFusedRankLocal(s *Stream, me int, mine MoEFusedRank, ws []*Buffer, ctl *Buffer, a MoEFusedArgs,
	epoch int) error {
	const op = "MoEFusedRankLocal"
	R := len(a.Tokens)
	if me < 0 || me >= R || len(ws) != R {
		return fmt.Errorf("kernels: %s: rank %d of %d ranks with %d workspaces", op, me, R, len(ws))
	}
	if epoch < 1 || epoch > math.MaxInt32 {
		return fmt.Errorf("kernels: %s: epoch %d, want 1..2^31-1", op, epoch)
	}
	if a.faultRank != 0 {
		return fmt.Errorf("kernels: %s: fault injection is for MoEFused", op)
	}
	if ws[me] != nil && mine.WS != nil && ws[me].ptr != mine.WS.ptr {
		return fmt.Errorf("kernels: %s: ws[%d] is not mine.WS", op, me)
	}
	ranks := make([]MoEFusedRank, R)
	for r := range R {
		ranks[r].WS = ws[r]
	}
	ranks[me] = mine
	ptrs, tok, sl, rb, rt, err := d.moeFusedCall(op, ranks, ctl, &a, false, me)
	if err != nil {
		return err
	}
	if d.muted() {
		return nil
	}
	act, alpha, limit := a.act()
	rc := moeFusedRank(s.handle(), int32(R), int32(me), &ptrs[0], &tok[0], &sl[0], int32(a.TopK), int32(a.Experts),
		int64(a.H), int64(a.I), a.Table.ptr, act, alpha, limit, ctl.ptr, uint64(ctl.bytes), &rb[0], int32(a.CTAs),
		int32(a.DispatchCTAs), a.timeoutNs(), int32(epoch), int32(a.Tile), int64(a.MaxRows), rt)
	runtime.KeepAlive(rt)
	runtime.KeepAlive(ptrs)
	runtime.KeepAlive(tok)
	runtime.KeepAlive(sl)
	runtime.KeepAlive(rb)
	return d.lib.check("mk_moe_fused_rank", rc)
}

// MoEFusedTimeoutError is the fused kernel's watchdog report: a CTA waited
// longer than the timeout and ended the kernel (the outputs are not valid).
type MoEFusedTimeoutError struct {
	Rank       int    // the rank whose tile (gemm roles) or token (combine) was waited on; plan, dispatch: the peer
	Role       string // "compute (gemm1)", "compute (gemm2)", "combine"; rank-local: "plan", "dispatch or combine"
	Tile       int    // the row tile (compute) or token (combine); -1 (plan, dispatch)
	WaitedFor  string // "dispatch", "gemm1", "gemm2"; rank-local: "routing" (the peer's ids), "peer plan"
	Seen, Want int    // the counter's value and the value waited for
}

func (e *MoEFusedTimeoutError) Error() string {
	return fmt.Sprintf("kernels: fused MoE watchdog: rank %d %s (tile %d) timed out waiting for %s (counter %d, want %d)",
		e.Rank, e.Role, e.Tile, e.WaitedFor, e.Seen, e.Want)
}

// MoEFusedCapacityError: the plan found a rank routed more rows than its
// workspace holds (MoEFusedArgs.MaxRows); the layer computed nothing.
type MoEFusedCapacityError struct {
	Rank      int // the destination rank
	Rows, Cap int // the rows it needed (padded to the row tile) and the rows it holds
}

func (e *MoEFusedCapacityError) Error() string {
	return fmt.Sprintf("kernels: fused MoE: rank %d was routed %d rows (padded), its workspace holds %d (raise MaxRows)",
		e.Rank, e.Rows, e.Cap)
}

// MoEFusedCheck waits for all work on the device, then returns a
// *MoEFusedTimeoutError when a fused launch on ctl timed out since the last
// check, or a *MoEFusedCapacityError when a plan found a rank over its
// capacity (and clears the record), else nil. While the record is set,
// fused launches on ctl do nothing.
func (d *Device) MoEFusedCheck(ctl *Buffer) error {
	const op = "MoEFusedCheck"
	if err := d.ready(op); err != nil {
		return err
	}
	if err := ctl.fits(op+" control workspace", 4*moeFusedErrWords); err != nil {
		return err
	}
	rec := make([]int32, moeFusedErrWords)
	if err := d.lib.check("mk_moe_fused_check", moeFusedCheck(ctl.ptr, &rec[0])); err != nil {
		return err
	}
	return moeFusedRecord(rec)
}

// moeFusedRecord reads the error record (mk_moe_fused.h): nil when unset.
func moeFusedRecord(rec []int32) error {
	if rec[0] == 0 {
		return nil
	}
	if rec[2] == 6 {
		return &MoEFusedCapacityError{Rank: int(rec[1]), Rows: int(rec[4]), Cap: int(rec[5])}
	}
	e := &MoEFusedTimeoutError{Rank: int(rec[1]), Tile: int(rec[3]), Seen: int(rec[4]), Want: int(rec[5])}
	switch rec[2] {
	case 1:
		e.Role, e.WaitedFor = "compute (gemm1)", "dispatch"
	case 2:
		e.Role, e.WaitedFor = "compute (gemm2)", "gemm1"
	case 3:
		e.Role, e.WaitedFor = "combine", "gemm2"
	case 4:
		e.Role, e.WaitedFor = "plan", "routing"
	case 5:
		e.Role, e.WaitedFor = "dispatch or combine", "peer plan"
	case 7:
		e.Role, e.WaitedFor = "compute (wgmma CTA)", "its own stage or task ring"
	default:
		e.Role, e.WaitedFor = fmt.Sprintf("role %d", rec[2]), "?"
	}
	return e
}
