package cuda

import (
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
)

// MoE routes every row of x [T, H] to its experts and returns the combined
// output [T, H], shared experts included, as the CPU backend does:
//
//	logits = x·Gateᵀ + GateBias                       [T, E] (GPU)
//	ids, w = moe.Route(Router, logits, ScoreBias)     [T, K] each
//	out    = Σ_k w[t,k]·expert_{ids[t,k]}(x[t])
//	out   += sigmoid(x·SharedGateᵀ)·MLP(x, Shared)    when Shared != nil
//
// Two paths for the routed experts:
//   - grouped (bf16 expert weights, split mode off, H and I multiples of 8):
//     routing on the GPU (kernels.MoERoute, moe.Route's exact semantics),
//     then align, one grouped tensor-core GEMM per projection with the
//     activation fused, and a combine by token (kernels.MoEExpertsRun); no
//     host synchronisation, expert counters stay on the device until
//     TakeExpertLoad. x is rounded to bf16 once, the activation once.
//   - host (moeHost: float32 weights, split mode, other shapes): logits copied
//     to the host, moe.Route, per expert a gather, two (split) GEMMs and a
//     scatter-add. FP4 experts (split mode) are dequantized an expert at a
//     time into a bf16 scratch for its GEMMs.
//
// E and I come from the shapes: Gate is [E, H], GateUp [E*2I, H], Down [E*H, I].
func (be *Backend) MoE(x backend.Tensor, l *backend.MoELayer) backend.Tensor {
	return be.moeChecked(be.moeOperands(x, l), l)
}

// moeChecked is MoE of checked operands.
func (be *Backend) moeChecked(m moeOperands, l *backend.MoELayer) *Tensor {
	xt, gate, gateBias, gu, gub, down, db, sg := m.xt, m.gate, m.gateBias, m.gu, m.gub, m.down, m.db, m.sg
	T, H, E, I, base, Ew := m.T, m.H, m.E, m.I, m.base, m.Ew
	var out *Tensor
	if isFP4(gu) != isFP4(down) || ((isFP4(gu) || isFP4(down)) && (H%8 != 0 || I%8 != 0 || E > 2048)) {
		// One projection in FP4 but not the other: both as bf16.
		be.do("MoE", func(d *kernels.Device) error {
			be.fp4Values(d, gu)
			be.fp4Values(d, down)
			return nil
		}, gu, down)
	}
	if (isFP4(gu) && !be.split) || be.grouped(gu, down, H, I, E) {
		out = be.moeGrouped(xt, l, gate, gateBias, vector("MoE", "ScoreBias", l.ScoreBias, E), gu, gub, down, db, T, H, E, I, base, Ew, nil)
	} else {
		var scoreBias []float32
		if sb := vector("MoE", "ScoreBias", l.ScoreBias, E); sb != nil {
			scoreBias = be.ToHost(sb)
		}
		out = be.moeHost(xt, l, gate, gateBias, scoreBias, gu, gub, down, db, T, H, E, I, base)
	}

	if w := be.world; w != nil && T > 0 {
		// The ranks' partial outputs (each its own experts) summed: every
		// rank makes this call for every MoE layer, with the same T.
		be.do("MoE all-reduce", func(d *kernels.Device) error {
			w.allReduce(be, d, out.st.f32, int64(T)*int64(H), int64(H))
			return nil
		}, out)
	}

	if l.Shared != nil {
		sh := be.MLP(xt, l.Shared).(*Tensor)
		var g *Tensor
		if sg != nil {
			g = be.Linear(xt, sg, nil).(*Tensor)
		}
		be.do("MoE", func(d *kernels.Device) error {
			if T == 0 || H == 0 {
				return nil
			}
			var gb *kernels.Buffer
			if g != nil {
				gb = g.st.f32
			}
			return d.GatedAddF32(nil, out.st.f32, sh.st.f32, gb, T, H)
		}, sh, g, out)
	}
	return out
}

// moeOperands are a MoE call's checked operands and shapes.
type moeOperands struct {
	xt, gate, gateBias, gu, gub, down, db, sg *Tensor
	T, H, E, I, base, Ew                      int
}

// moeOperands checks MoE's arguments (panicking on bad ones).
func (be *Backend) moeOperands(x backend.Tensor, l *backend.MoELayer) moeOperands {
	if l == nil {
		panicf("MoE", "nil layer")
	}
	gate, E := matrix("MoE", "Gate", l.Gate, -1)
	_, H := gate.dims()
	xt, T := matrix("MoE", "x", x, H)
	if E != l.Router.NumExperts {
		panicf("MoE", "Gate %v has %d experts, Router.NumExperts = %d", gate.shape, E, l.Router.NumExperts)
	}
	if err := l.Router.Validate(); err != nil {
		panicf("MoE", "%v", err)
	}
	if err := l.Act.Validate(); err != nil {
		panicf("MoE", "%v", err)
	}
	// The weights hold experts [base, base+Ew): all E, or one rank's block.
	base, Ew := 0, E
	if l.LocalExperts > 0 {
		base, Ew = l.ExpertLo, l.LocalExperts
		if lo, hi := be.ExpertShard(E); lo != base || hi != base+Ew {
			panicf("MoE", "layer %d holds experts [%d, %d), this backend's block is [%d, %d)", l.Layer, base, base+Ew, lo, hi)
		}
	}
	gu, rows := matrix("MoE", "GateUp", l.GateUp, H)
	if rows%(2*Ew) != 0 || rows == 0 {
		panicf("MoE", "GateUp %v is not [E*2I, H] for E = %d", gu.shape, Ew)
	}
	I := rows / (2 * Ew)
	down, drows := matrix("MoE", "Down", l.Down, I)
	if drows != Ew*H {
		panicf("MoE", "Down %v is not [E*H, I] = [%d, %d]", down.shape, Ew*H, I)
	}
	gub := flat("MoE", "GateUpBias", l.GateUpBias, Ew*2*I)
	db := flat("MoE", "DownBias", l.DownBias, Ew*H)
	gateBias := vector("MoE", "GateBias", l.GateBias, E)
	var sg *Tensor
	if l.SharedGate != nil {
		sg = tensorOf("MoE", "SharedGate", l.SharedGate)
		if sg.st.n != H {
			panicf("MoE", "SharedGate has shape %v, want [1, %d]", sg.shape, H)
		}
	}
	return moeOperands{xt: xt, gate: gate, gateBias: gateBias, gu: gu, gub: gub, down: down, db: db, sg: sg,
		T: T, H: H, E: E, I: I, base: base, Ew: Ew}
}

// moeHost is the routed experts with routing on the host (moe.Route) and two
// GEMMs per expert: the exact path, used for float32 expert weights and in
// split mode (hi/lo bf16 halves), and for shapes the grouped kernels refuse.
//
// The weights hold experts from base on (0, or a world rank's block).
func (be *Backend) moeHost(xt *Tensor, l *backend.MoELayer, gate, gateBias *Tensor, scoreBias []float32,
	gu, gub, down, db *Tensor, T, H, E, I, base int) *Tensor {
	K := l.Router.TopK

	logits := be.ToHost(be.routerLinear(xt, gate, gateBias))
	ids, w := moe.Route(&l.Router, logits, scoreBias, T)
	be.load.AddIDs(l.Layer, E, ids)

	// Assignments to this rank's experts [lo, hi) (all of them without a
	// world) sorted by expert: tok[a] is the token row, wt[a] its weight.
	lo, hi := 0, E
	if be.world != nil {
		lo, hi = be.world.experts(E)
	}
	count := make([]int, E+1)
	for _, e := range ids {
		if int(e) >= lo && int(e) < hi {
			count[e+1]++
		}
	}
	for e := 1; e <= E; e++ {
		count[e] += count[e-1]
	}
	N := count[E]
	tok, wt := make([]int32, N), make([]float32, N)
	next := append([]int(nil), count[:E]...)
	for a, e := range ids {
		if int(e) < lo || int(e) >= hi {
			continue
		}
		i := next[e]
		next[e]++
		tok[i], wt[i] = int32(a/K), w[a]
	}

	var out *Tensor
	be.do("MoE", func(d *kernels.Device) error {
		out = be.newF32(d, T, H)
		if T == 0 || H == 0 {
			return nil
		}
		must("zero", kernels.Upload(d, out.st.f32, make([]float32, T*H)))
		if N == 0 || I == 0 {
			return nil
		}
		a := be.alloc
		tb, wb := upload(be, d, tok), upload(be, d, wt)
		xg := a.get(d, int64(N*H)*4)
		must("gather", d.GatherRowsF32(nil, xg, be.f32(d, xt), kernels.F32, tb, N, H, T))
		guw, guF32 := weightMem(gu)
		dw, dF32 := weightMem(down)
		// expert is expert we's rows of w (rows of n values each): a view of
		// w's memory, or of FP4 rows dequantized into scratch.
		var scratch *kernels.Buffer
		if isFP4(gu) || isFP4(down) {
			moeFP4Calls.Add(1)
			scratch = a.get(d, int64(2*I*H)*2) // an expert's gate/up, or its down

			defer a.put(scratch)
		}
		expert := func(w *Tensor, mem *kernels.Buffer, size int64, we, rows, n int) *kernels.Buffer {
			if !isFP4(w) {
				return view(mem, int64(we*rows*n)*size, int64(rows*n)*size)
			}
			m, err := w.st.fp4.Rows(we*rows, (we+1)*rows)
			must("FP4 expert", err)
			sv := view(scratch, 0, int64(rows*n)*2)
			must("FP4 expert", d.FP4DequantBF16(nil, sv, m))
			return sv
		}
		xin := be.prepare(d, xg, N*H, guF32)
		h := a.get(d, int64(N*2*I)*4)
		var gubb, dbb *kernels.Buffer
		if gub != nil {
			gubb = be.f32(d, gub)
		}
		if db != nil {
			dbb = be.f32(d, db)
		}
		wsize := func(isF32 bool) int64 {
			if isF32 {
				return 4
			}
			return 2
		}
		gs, ds := wsize(guF32), wsize(dF32)
		for e := range E {
			r0, n := count[e], count[e+1]-count[e]
			if n == 0 {
				continue
			}
			hv := view(h, int64(r0*2*I)*4, int64(n*2*I)*4)
			we := e - base // its place in the weights
			be.gemm(d, hv, xin.rows(r0, n, H), expert(gu, guw, gs, we, 2*I, H), n, 2*I, H)
			if gubb != nil {
				must("bias", d.BiasAddF32(nil, hv, view(gubb, int64(we*2*I)*4, int64(2*I)*4), n, 2*I))
			}
		}
		be.release(xin)
		act := a.get(d, int64(N*I)*4)
		clamped := l.Act.Kind == moe.ClampedSwiGLU
		must("activation", d.SwiGLUF32(nil, act, h, N, I, clamped, l.Act.Alpha, l.Act.Limit))
		ain := be.prepare(d, act, N*I, dF32)
		y := a.get(d, int64(N*H)*4)
		for e := range E {
			r0, n := count[e], count[e+1]-count[e]
			if n == 0 {
				continue
			}
			yv := view(y, int64(r0*H)*4, int64(n*H)*4)
			we := e - base
			be.gemm(d, yv, ain.rows(r0, n, I), expert(down, dw, ds, we, H, I), n, H, I)
			if dbb != nil {
				must("bias", d.BiasAddF32(nil, yv, view(dbb, int64(we*H)*4, int64(H)*4), n, H))
			}
		}
		be.release(ain)
		must("scatter", d.ScatterAddRowsF32(nil, out.st.f32, y, tb, wb, N, H, T))
		for _, b := range []*kernels.Buffer{tb, wb, xg, h, act, y} {
			a.put(b)
		}
		return nil
	}, xt, gu, down, gub, db)
	return out
}

// TakeExpertLoad implements backend.ExpertCounter: tokens per expert per
// MoE layer since the previous call, from both paths (the grouped and fused
// paths' device counters are read and zeroed here, not per layer; a placed
// layer's per-slot counters are summed per expert).
func (be *Backend) TakeExpertLoad() map[int][]int64 {
	for layer, c := range be.takeDeviceLoad() {
		be.load.AddCounts(layer, c)
	}
	return be.load.Take()
}
