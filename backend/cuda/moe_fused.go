package cuda

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/tuning"
)

// The fused MoE path (kernels.MoEFused): each layer's routed experts as one
// persistent launch over R expert-parallel ranks emulated on this GPU
// (Options.EPRanks; 1 when unset). Rank r holds experts [r·E/R, (r+1)·E/R)
// (views of the layer's stacked weights, a block placement) unless
// PlaceExperts gave the layer another placement (moe_place.go: copies of the
// experts per rank, replicas of hot experts), and serves tokens
// [r·T/R, (r+1)·T/R) of the step as their source rank; the kernel
// dispatches each (token, k) to the expert's rank, runs the GEMMs tile by
// tile as rows arrive, and combines the results back at the source rank.
// Selected with Options.MoEPath = "fused" (or MKSERVE_MOE_PATH=fused);
// layers with expert biases (gpt-oss) keep the grouped path at one rank.
//
// Watchdog: the kernel's waits are bounded; a timeout leaves an error
// record in the backend's one control buffer, which ToHost and Sample (the
// step's sync points) read: the step then fails with the report instead of
// returning the garbage the ended kernel left.

// MoEPathEnv names the environment variable that selects the MoE path of
// every CUDA backend of the process: "grouped" or "fused".
const MoEPathEnv = "MKSERVE_MOE_PATH"

// moeFusedCalls counts MoE layers that ran the fused kernel (for tests).
var moeFusedCalls atomic.Int64

// fusedState is a backend's fused-path state.
type fusedState struct {
	mu     sync.Mutex
	ctl    *kernels.Buffer            // the control workspace every launch shares (stream order)
	tables map[[2]int]*kernels.Buffer // (E, R) → placement table on the device
	used   bool                       // a fused launch ran since the last check

	layers  map[int]*fusedLayer    // by layer index: what the fused path last saw (PlaceExperts copies from it)
	placed  map[int]*placedExperts // by layer index: installed non-block placements
	pending map[int]*placedExperts // by layer index: prepared by PlaceExperts, installed at the layer's next eager step (nil: back to the block placement)
}

// moePath resolves Options.MoEPath and the environment.
func moePath(opt string) (string, error) {
	p := opt
	if p == "" {
		p = os.Getenv(MoEPathEnv)
	}
	switch p {
	case "", "grouped":
		return "grouped", nil
	case "fused":
		return "fused", nil
	}
	return "", fmt.Errorf("cuda: MoE path %q: want grouped or fused", p)
}

// fusedFits reports whether a layer can take the fused path.
func (be *Backend) fusedFits(E int, gub, db *Tensor) bool {
	return be.moePath == "fused" && gub == nil && db == nil && E%be.epRanks == 0 && E/be.epRanks <= kernels.MoEFusedMaxSlots
}

// fusedRoute is the routing a fused call does itself: the router's logits
// [T, E] f32, its score bias [E] f32 or nil, and its configuration.
type fusedRoute struct {
	logits, scoreBias *kernels.Buffer
	router            kernels.MoERouter
}

// moeFusedRun is the routed experts of one layer through kernels.MoEFused
// (on the GPU goroutine): out [T, H] f32 from xb [T, H] bf16; ids/w [T, K]
// are written by the call from rt's logits (MoEFusedArgs.Router) when rt is
// not nil, else read; gu and dn are the layer's stacked weights (ex.GateUp,
// ex.Down), counts its per-expert counters [E] (used by the block placement).
func (be *Backend) moeFusedRun(d *kernels.Device, out, xb, ids, w *kernels.Buffer, rt *fusedRoute, T, K int,
	ex *kernels.MoEExperts, counts *kernels.Buffer, layer int, gu, dn *Tensor) error {
	R, E, H, I := be.epRanks, ex.E, ex.H, ex.I
	S := E / R
	fs := &be.fused
	fs.mu.Lock()
	defer fs.mu.Unlock()
	pl := be.notePlaced(d, layer, gu, dn, E, H, I)
	if fs.ctl == nil {
		be.graphGuard("the fused MoE control buffer")
		ctl, _, _, err := d.MoEFusedWorkspace(kernels.MoEFusedArgs{Tokens: []int{1}, Slots: []int{E}, Experts: E, TopK: K, H: H, I: I}, false)
		if err != nil {
			return err
		}
		if fs.ctl, err = d.NewMoEFusedControl(ctl); err != nil {
			return err
		}
	}
	tk := [2]int{E, R}
	table := fs.tables[tk]
	if pl != nil {
		table = pl.table
	} else if table == nil {
		be.graphGuard("a fused MoE placement table")
		v, err := kernels.MoEBlockPlacement(E, R).Table()
		if err != nil {
			return err
		}
		table = be.alloc.get(d, int64(len(v))*4)
		if err := kernels.Upload(d, table, v); err != nil {
			return err
		}
		if fs.tables == nil {
			fs.tables = map[[2]int]*kernels.Buffer{}
		}
		fs.tables[tk] = table
	}
	tokens, slots := make([]int, R), make([]int, R)
	for r := range R {
		tokens[r] = (r+1)*T/R - r*T/R
		slots[r] = S
		if pl != nil {
			slots[r] = pl.slots[r]
		}
	}
	args := kernels.MoEFusedArgs{Tokens: tokens, Slots: slots, Table: table, Experts: E, TopK: K, H: H, I: I,
		Clamped: ex.Clamped, Alpha: ex.Alpha, Limit: ex.Limit}
	if rt != nil {
		args.Router, args.ScoreBias = &rt.router, rt.scoreBias
	}
	tk2 := tuning.MoEKey{Device: be.g.Info().Name, Hidden: H, Intermediate: I, Experts: E, TopK: K, Ranks: R}
	if c, ok := be.moeTuning.Lookup(tk2, (T+R-1)/R); ok {
		args.CTAs, args.DispatchCTAs, args.Tile = c.CTAs, c.DispatchCTAs, c.Tile
	}
	// Memoised by kernels: a replay device answers it as the capture did.
	ctl, sz, _, err := d.MoEFusedWorkspace(args, false)
	if err != nil {
		return err
	}
	if ctl > fs.ctl.Bytes() {
		return fmt.Errorf("cuda: fused MoE control workspace of %d bytes, %d allocated", ctl, fs.ctl.Bytes())
	}
	rows := func(b *kernels.Buffer, t0, n int, rowBytes int64) *kernels.Buffer {
		return view(b, int64(t0)*rowBytes, max(int64(n), 1)*rowBytes)
	}
	ranks := make([]kernels.MoEFusedRank, R)
	var slotCounts *kernels.Buffer // [Σ Slots_r] int64: the placement's per-slot counters
	slot0 := 0
	if pl != nil {
		slotCounts = be.counterBuffer(d, &moeCounter{E: pl.counter.n, off: pl.counter.off})
	}
	var ws []*kernels.Buffer
	defer func() {
		for _, b := range ws {
			be.alloc.put(b)
		}
	}()
	for r := range R {
		t0 := r * T / R
		n := tokens[r]
		rk := &ranks[r]
		rk.X = rows(xb, t0, n, int64(H)*2)
		rk.IDs = rows(ids, t0, n, int64(K)*4)
		rk.Weights = rows(w, t0, n, int64(K)*4)
		rk.Out = rows(out, t0, n, int64(H)*4)
		if rt != nil {
			rk.Logits = rows(rt.logits, t0, n, int64(E)*4)
		}
		switch {
		case pl != nil:
			rk.GateUp, rk.Down = pl.gateUp[r], pl.down[r]
			if n := slots[r]; n > 0 {
				rk.Counts = view(slotCounts, int64(slot0)*8, int64(n)*8)
			}
			slot0 += slots[r]
		default:
			rk.GateUp = view(ex.GateUp, int64(r*S)*int64(2*I*H)*2, int64(S)*int64(2*I*H)*2)
			rk.Down = view(ex.Down, int64(r*S)*int64(H*I)*2, int64(S)*int64(H*I)*2)
			if counts != nil {
				rk.Counts = view(counts, int64(r*S)*8, int64(S)*8)
			}
		}
		b := be.alloc.get(d, max(sz[r], 1))
		ws = append(ws, b)
		rk.WS = b
	}
	fs.used = true
	moeFusedCalls.Add(1)
	return d.MoEFused(nil, ranks, fs.ctl, args)
}

// checkWatchdogs returns the step's kernel watchdog reports, if any: the
// fused MoE kernel's and, while MK_MOE_GEMV=2 puts decode-sized MoE
// layers on the one-launch GEMV kernel, its grid barrier's (checked every
// step then: fast graph replays run no Go code to say whether a layer used
// it). On the GPU goroutine, after the step's work.
func (be *Backend) checkWatchdogs(d *kernels.Device) error {
	if err := be.checkFused(d); err != nil {
		return err
	}
	if kernels.MoEGemvOneLaunchOn() {
		if err := d.MoEDecodeCheck(); err != nil {
			return fmt.Errorf("cuda: the step's one-launch MoE kernel stopped: %w", err)
		}
	}
	return nil
}

// checkFused returns the fused kernel's watchdog report since the last
// check, if any (on the GPU goroutine, after the step's work).
func (be *Backend) checkFused(d *kernels.Device) error {
	fs := &be.fused
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.ctl == nil || !fs.used {
		return nil
	}
	fs.used = false
	if err := d.MoEFusedCheck(fs.ctl); err != nil {
		return fmt.Errorf("cuda: the step's fused MoE kernel stopped: %w", err)
	}
	return nil
}
