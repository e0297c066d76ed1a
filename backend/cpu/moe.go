package cpu

import (
	"context"
	"fmt"
	"time"

	"math"
	"unsafe"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/linalg"
	"github.com/mkserve/mkserve/moe"
)

// MoE routes every row of x [T, H] to its experts and returns the combined
// output [T, H], shared experts included:
//
//	logits = x·Gateᵀ + GateBias                       [T, E]
//	ids, w = moe.Route(Router, logits, ScoreBias)     [T, K] each
//	out    = Σ_k w[t,k]·expert_{ids[t,k]}(x[t])       moe.Experts or moe.EP
//	out   += sigmoid(x·SharedGateᵀ)·MLP(x, Shared)    when Shared != nil
//
// E and I come from the shapes: Gate is [E, H], GateUp [E*2I, H], Down
// [E*H, I]. With Options.EPRanks > 1 the experts run on that many emulated
// ranks (one moe.EP per layer, built on first use); an EP failure panics,
// as the interface has no error result.
func (be *Backend) MoE(x backend.Tensor, l *backend.MoELayer) backend.Tensor {
	if l == nil {
		panicf("MoE", "nil layer")
	}
	gate, E := weightMatrix("MoE", "Gate", l.Gate, -1)
	_, H := gate.dims()
	xt, T := matrix("MoE", "x", x, H)
	if E != l.Router.NumExperts {
		panicf("MoE", "Gate %v has %d experts, Router.NumExperts = %d", gate.shape, E, l.Router.NumExperts)
	}
	ex := be.experts(l, E, H)

	logits := linear(xt.data, gate.weights(), vector("MoE", "GateBias", l.GateBias, E), T, E, H)
	ids, w := moe.Route(&l.Router, logits.data, vector("MoE", "ScoreBias", l.ScoreBias, E), T)
	K := l.Router.TopK
	be.load.AddIDs(l.Layer, E, ids)
	out := newTensor(T, H)
	switch {
	case be.opts.EPComm != nil:
		ctx, cancel := context.WithTimeout(context.Background(), epRankTimeout)
		err := be.epRank(l, ex).Forward(ctx, out.data, xt.data, T, K, ids, w)
		cancel()
		if err != nil {
			panicf("MoE", "expert parallel forward (rank %d of %d): %v", be.opts.EPComm.Rank(), be.opts.EPComm.Size(), err)
		}
	case be.opts.EPRanks > 1:
		if err := be.ep(l, ex).Forward(out.data, xt.data, T, K, ids, w); err != nil {
			panicf("MoE", "expert parallel forward: %v", err)
		}
	default:
		ex.Forward(out.data, xt.data, T, K, ids, w)
	}

	if l.Shared != nil {
		sh := be.MLP(xt, l.Shared).(*Tensor)
		var sg []float32
		if l.SharedGate != nil {
			g := weightOf("MoE", "SharedGate", l.SharedGate)
			if g.weights().Len() != H {
				panicf("MoE", "SharedGate has shape %v, want [1, %d]", g.shape, H)
			}
			sg = linear(xt.data, g.weights(), nil, T, 1, H).data
		}
		parallelRows(T, H, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				s := float32(1)
				if sg != nil {
					s = float32(1 / (1 + math.Exp(-float64(sg[t]))))
				}
				dst, src := out.data[t*H:(t+1)*H], sh.data[t*H:(t+1)*H]
				for i, v := range src {
					dst[i] += s * v
				}
			}
		})
	}
	return out
}

// experts views l's stacked expert weights as moe.Experts (no copy).
func (be *Backend) experts(l *backend.MoELayer, E, H int) *moe.Experts {
	gu, rows := weightMatrix("MoE", "GateUp", l.GateUp, H)
	if rows%(2*E) != 0 || rows == 0 {
		panicf("MoE", "GateUp %v is not [E*2I, H] for E = %d", gu.shape, E)
	}
	I := rows / (2 * E)
	down, drows := weightMatrix("MoE", "Down", l.Down, I)
	if drows != E*H {
		panicf("MoE", "Down %v is not [E*H, I] = [%d, %d]", down.shape, E*H, I)
	}
	ex := &moe.Experts{
		E: E, H: H, I: I,
		GateUp:     gu.data,
		GateUpW:    gu.form(),
		GateUpBias: flat("MoE", "GateUpBias", l.GateUpBias, E*2*I),
		Down:       down.data,
		DownW:      down.form(),
		DownBias:   flat("MoE", "DownBias", l.DownBias, E*H),
		Act:        l.Act,
	}
	if err := ex.Validate(); err != nil {
		panicf("MoE", "%v", err)
	}
	return ex
}

// flat unwraps an optional tensor of n values in any 1-D or 2-D shape.
func flat(op, name string, x backend.Tensor, n int) []float32 {
	t := optional(op, name, x)
	if t == nil {
		return nil
	}
	if len(t.data) != n {
		panicf(op, "%s has shape %v, want %d values", name, t.shape, n)
	}
	return t.data
}

// epWorld is a layer's cached expert-parallel world and the weights it was
// built on.
type epWorld struct {
	ep        *moe.EP
	weights   [4]unsafe.Pointer // first elements of GateUp, GateUpBias, Down, DownBias (float32, bf16 or Q8)
	placement *moe.Placement    // nil: the contiguous table
}

// firstOf is the address of w's first element in whichever form it is
// held (nil: none).
func firstOf(w linalg.Weights) unsafe.Pointer {
	switch {
	case len(w.F32) > 0:
		return unsafe.Pointer(&w.F32[0])
	case len(w.BF16) > 0:
		return unsafe.Pointer(&w.BF16[0])
	case len(w.Q8) > 0:
		return unsafe.Pointer(&w.Q8[0])
	case len(w.FP4) > 0:
		return unsafe.Pointer(&w.FP4[0])
	}
	return nil
}

// weightKey identifies the weight slices of ex.
func weightKey(ex *moe.Experts) (k [4]unsafe.Pointer) {
	for i, s := range [][]float32{ex.GateUp, ex.GateUpBias, ex.Down, ex.DownBias} {
		if len(s) > 0 {
			k[i] = unsafe.Pointer(&s[0])
		}
	}
	for i, w := range []linalg.Weights{ex.GateUpW, ex.DownW} {
		if p := firstOf(w); p != nil {
			k[2*i] = p
		}
	}
	return k
}

// ep returns the layer's expert-parallel world, building it on first use
// (and again if the layer's weight tensors or its placement changed): the
// contiguous table, or the placement PlaceExperts installed.
func (be *Backend) ep(l *backend.MoELayer, ex *moe.Experts) *moe.EP {
	be.epMu.Lock()
	defer be.epMu.Unlock()
	key := weightKey(ex)
	pl := be.placements[l.Layer]
	if w := be.eps[l]; w != nil && w.weights == key && w.placement == pl {
		return w.ep
	}
	table := moe.NewTable(ex.E, be.opts.EPRanks)
	if pl != nil {
		if pl.Experts != ex.E {
			panicf("MoE", "layer %d: placement of %d experts for a layer of %d", l.Layer, pl.Experts, ex.E)
		}
		table = pl.Table()
	}
	p, err := moe.NewEP(table, ex)
	if err != nil {
		panicf("MoE", "expert parallel world of %d ranks: %v", be.opts.EPRanks, err)
	}
	be.eps[l] = &epWorld{ep: p, weights: key, placement: pl}
	return p
}

// epRankTimeout bounds one MoE layer's exchange with the other processes:
// a rank that stops answering fails the step (and aborts the world)
// instead of hanging it.
var epRankTimeout = 60 * time.Second

// epRankWorld is a layer's rank of the process world and the weights it
// was built on.
type epRankWorld struct {
	ep      *moe.EPRank
	weights [4]unsafe.Pointer
}

// epRank returns the layer's rank of the process world (Options.EPComm),
// building it on first use: the contiguous table over the world's ranks.
func (be *Backend) epRank(l *backend.MoELayer, ex *moe.Experts) *moe.EPRank {
	be.epMu.Lock()
	defer be.epMu.Unlock()
	key := weightKey(ex)
	if w := be.epRanks[l]; w != nil && w.weights == key {
		return w.ep
	}
	c := be.opts.EPComm
	p, err := moe.NewEPRank(moe.NewTable(ex.E, c.Size()), ex, c)
	if err != nil {
		panicf("MoE", "expert parallel rank %d of %d: %v", c.Rank(), c.Size(), err)
	}
	if be.epRanks == nil {
		be.epRanks = map[*backend.MoELayer]*epRankWorld{}
	}
	be.epRanks[l] = &epRankWorld{ep: p, weights: key}
	return p
}

// ExpertRanks implements backend.ExpertPlacer: Options.EPRanks (1 without
// expert parallelism).
func (be *Backend) ExpertRanks() int { return max(1, be.opts.EPRanks) }

// PlaceExperts implements backend.ExpertPlacer. On the emulated ranks a new
// placement costs nothing to move to (every rank's weights are views of the
// same memory): the layer's world is rebuilt on its next step.
func (be *Backend) PlaceExperts(layer int, p *moe.Placement) error {
	if be.opts.EPRanks <= 1 {
		return fmt.Errorf("cpu: PlaceExperts: no in-process expert parallelism (EPRanks %d; placements across processes are not supported)", be.opts.EPRanks)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("cpu: PlaceExperts layer %d: %w", layer, err)
	}
	if p.Ranks() != be.opts.EPRanks {
		return fmt.Errorf("cpu: PlaceExperts layer %d: placement on %d ranks, the backend has %d", layer, p.Ranks(), be.opts.EPRanks)
	}
	be.epMu.Lock()
	defer be.epMu.Unlock()
	if be.placements == nil {
		be.placements = map[int]*moe.Placement{}
	}
	be.placements[layer] = p
	return nil
}

// TakeExpertLoad implements backend.ExpertCounter.
func (be *Backend) TakeExpertLoad() map[int][]int64 { return be.load.Take() }
