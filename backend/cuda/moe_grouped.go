package cuda

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
)

// The grouped MoE path: routing, expert GEMMs and combine on the GPU with
// no host synchronisation (kernels.MoERoute, kernels.MoEExpertsRun).

// moeDevState is a Backend's device-side MoE state: the tokens-per-expert
// counters the grouped path accumulates into, every layer's in one device
// buffer, so that reading them (TakeExpertLoad, every engine step) costs one
// download and one zeroing upload, not two per layer.
type moeDevState struct {
	mu     sync.Mutex
	layers map[int]*moeCounter  // by layer index
	slots  map[int]*slotCounter // by layer index: per-slot counters of placed layers (moe_place.go)
	used   int                  // int64 counters assigned
	buf    *kernels.Buffer      // [capacity] int64 on the device
	cap    int
}

// moeCounter is one layer's slice of the counters: [off, off+E).
type moeCounter struct{ E, off int }

// moeGroupedCalls counts MoE calls that took the grouped path (for tests).
var moeGroupedCalls atomic.Int64

// counter returns layer's counters for E experts (a layer whose expert
// count changed gets a new slice).
func (be *Backend) counter(layer, E int) *moeCounter {
	s := &be.moe
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.layers == nil {
		s.layers = map[int]*moeCounter{}
	}
	c := s.layers[layer]
	if c == nil || c.E != E {
		c = &moeCounter{E: E, off: s.used}
		s.used += E
		s.layers[layer] = c
	}
	return c
}

// counterBuffer returns c's counters in device memory, growing the shared
// buffer (zeroed, old counts kept) when c lies beyond it; on the GPU
// goroutine.
func (be *Backend) counterBuffer(d *kernels.Device, c *moeCounter) *kernels.Buffer {
	s := &be.moe
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used > s.cap {
		be.graphGuard("growing the expert counters")
		be.gr.stale.Store(true) // graphs hold the old buffer's address
		n := max(s.used, 2*s.cap, 1024)
		b, err := d.Malloc(int64(n) * 8)
		must("expert counters", err)
		must("expert counters", kernels.Upload(d, b, make([]int64, n)))
		if s.buf != nil {
			// Ordered after the kernels that added to the old buffer.
			must("expert counters", d.Copy(b, s.buf, int64(s.cap)*8))
			must("expert counters", s.buf.Free())
		}
		s.buf, s.cap = b, n
	}
	return view(s.buf, int64(c.off)*8, int64(c.E)*8)
}

// takeDeviceLoad reads and zeroes every layer's device counters; layers
// with no tokens since the last call are left out.
func (be *Backend) takeDeviceLoad() map[int][]int64 {
	s := &be.moe
	s.mu.Lock()
	layers := make(map[int]*moeCounter, len(s.layers))
	for l, c := range s.layers {
		layers[l] = c
	}
	s.mu.Unlock()
	if len(layers) == 0 {
		return nil
	}
	out := map[int][]int64{}
	be.do("TakeExpertLoad", func(d *kernels.Device) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.buf == nil {
			return nil
		}
		all := make([]int64, s.cap)
		if err := kernels.Download(d, all, s.buf); err != nil {
			return err
		}
		nonzero := false
		for l, c := range layers {
			if c.off+c.E > s.cap {
				continue // assigned, not run yet
			}
			v := all[c.off : c.off+c.E]
			var sum int64
			for _, n := range v {
				sum += n
			}
			if sum != 0 {
				out[l] = slices.Clone(v)
				nonzero = true
			}
		}
		// Placed layers: each slot's count goes to the expert it holds.
		for l, c := range s.slots {
			if c.expert == nil || c.off+len(c.expert) > s.cap {
				continue
			}
			v := all[c.off : c.off+len(c.expert)]
			if !slices.ContainsFunc(v, func(n int64) bool { return n != 0 }) {
				continue
			}
			o := out[l]
			if len(o) != c.E {
				o = make([]int64, c.E)
				out[l] = o
			}
			for i, e := range c.expert {
				o[e] += v[i]
			}
			nonzero = true
		}
		if !nonzero {
			return nil
		}
		return kernels.Upload(d, s.buf, make([]int64, s.cap))
	})
	return out
}

// grouped reports whether the routed experts can take the grouped path
// with bf16 weights: bf16 expert weights (not float32, not FP4), split mode
// off, shapes the kernels accept.
func (be *Backend) grouped(gu, down *Tensor, H, I, E int) bool {
	_, guF32 := weightMem(gu)
	_, dF32 := weightMem(down)
	return !be.split && !guF32 && !dF32 && !isFP4(gu) && !isFP4(down) && H%8 == 0 && I%8 == 0 && H > 0 && I > 0 && E <= 2048
}

// moeRouterOf converts the layer's router to the kernels' form.
func moeRouterOf(r *moe.RouterConfig) kernels.MoERouter {
	return kernels.MoERouter{Experts: r.NumExperts, TopK: r.TopK, Sigmoid: r.Scoring == moe.Sigmoid,
		SoftmaxTopK: r.SoftmaxTopK, NormTopK: r.NormTopK, Groups: r.NumGroups, TopKGroups: r.TopKGroups,
		Scaling: r.ScalingFactor}
}

// moeGrouped is the routed experts on the GPU: router GEMM (Linear), device
// routing, x rounded to bf16, kernels.MoEExpertsRun → out [T, H] f32.
//
// With fold (MoEAddRMSNorm; one process, the grouped GEMMs, T > 0) the
// layer's combine runs inside the residual add and RMSNorm after it: fold's
// sum and out are made and filled, and the result is nil.
func (be *Backend) moeGrouped(xt *Tensor, l *backend.MoELayer, gate, gateBias, scoreBias *Tensor,
	gu, gub, down, db *Tensor, T, H, E, I, base, Ew int, fold *moeFold) *Tensor {
	K := l.Router.TopK
	var logits *Tensor
	if T > 0 {
		logits = be.routerLinear(xt, gate, gateBias)
	}
	c := be.counter(l.Layer, E)
	moeGroupedCalls.Add(1)
	var out *Tensor
	var fx, fw *Tensor
	if fold != nil {
		fx, fw = fold.x, fold.w
	}
	be.do("MoE", func(d *kernels.Device) error {
		a := be.alloc
		var ob *kernels.Buffer
		if fold != nil {
			fold.sum, fold.out = be.newF32(d, T, H), be.newF32(d, T, H)
			ob = a.get(d, int64(T*H)*2) // the fast profile's GEMMs read the normed rows in bf16
			be.attach(fold.out, &fold.out.st.bf16, ob)
		} else {
			out = be.newF32(d, T, H)
		}
		if T == 0 {
			return nil
		}
		ids, w := a.get(d, int64(T*K)*4), a.get(d, int64(T*K)*4)
		defer a.put(ids)
		defer a.put(w)
		var sb *kernels.Buffer
		if scoreBias != nil {
			sb = be.f32(d, scoreBias)
		}
		router := moeRouterOf(&l.Router)
		route := func() { must("route", d.MoERoute(nil, ids, w, logits.st.f32, sb, T, router)) }
		be.f32(d, xt)
		xb, temp := be.bf16Of(d, xt) // the router's split left it with xt
		if temp {
			defer a.put(xb)
		}
		ex := &kernels.MoEExperts{E: Ew, H: H, I: I, Clamped: l.Act.Kind == moe.ClampedSwiGLU, Alpha: l.Act.Alpha,
			Limit: l.Act.Limit}
		if isFP4(gu) { // the FP4 path (fp4.go); never folded or fused
			ex.GateUpFP4, ex.DownFP4 = gu.st.fp4, down.st.fp4
			moeFP4Calls.Add(1)
		} else {
			ex.GateUp, ex.Down = gu.st.bf16, down.st.bf16
		}
		if gub != nil {
			ex.GateUpBias = be.f32(d, gub)
		}
		if db != nil {
			ex.DownBias = be.f32(d, db)
		}
		counts := be.counterBuffer(d, c)
		if wd := be.world; wd != nil {
			// This rank's experts only: the others' ids become −1 (no work).
			route()
			lo, hi := wd.experts(E)
			if hi == lo {
				panicf("MoE", "rank %d of %d holds none of the %d experts (more ranks than experts)", wd.me, wd.R, E)
			}
			// Every rank routes every token: the counters take all the
			// world's experts here (the leader's are /metrics'), before
			// the ids become local, and the local run counts nothing more.
			must("localize", d.MoELocalize(nil, ids, T*K, lo, hi, counts, E))
			if Ew == E { // every expert uploaded: this rank's are a view
				l, err := ex.Block(lo, hi)
				must("experts", err)
				ex = l
			}
			counts = nil
		} else if !be.moeGemv(T, K, I) && be.fusedFits(E, gub, db) && !ex.IsFP4() {
			// The fused call routes (MoERoute's launch, inside the call).
			rt := &fusedRoute{logits: logits.st.f32, scoreBias: sb, router: router}
			return be.moeFusedRun(d, out.st.f32, xb, ids, w, rt, T, K, ex, counts, l.Layer, gu, down)
		}
		wsBytes, _, err := d.MoEWorkspace(T, K, ex)
		must("workspace", err)
		ws := a.get(d, wsBytes)
		defer a.put(ws)
		if be.world != nil {
			must("experts", d.MoEExpertsRun(nil, out.st.f32, xb, ids, w, T, K, ex, counts, ws))
			return nil
		}
		// Routing and experts in one call (with or without the combine).
		if fold == nil {
			must("experts", d.MoERouteExpertsRun(nil, out.st.f32, xb, ids, w, logits.st.f32, sb, T, router, ex, counts, ws))
			return nil
		}
		must("experts", d.MoERouteExpertsRun(nil, nil, xb, ids, w, logits.st.f32, sb, T, router, ex, counts, ws))
		must("combine, add and norm", d.MoECombineAddRMSNormF32(nil, fold.sum.st.f32, fold.out.st.f32, ob,
			be.f32(d, fold.x), w, ws, T, K, ex, be.f32(d, fold.w), fold.eps))
		return nil
	}, xt, logits, gu, down, gub, db, scoreBias, fx, fw)
	return out
}

// moeFold is the residual add and RMSNorm a MoE layer's combine is folded
// into (MoEAddRMSNorm): sum = x + the layer's output, out = RMSNorm(sum)·w.
type moeFold struct {
	x, w     *Tensor
	eps      float32
	sum, out *Tensor // made by moeGrouped
}

// MoEAddRMSNorm implements backend.MoEAddNormer: a layer of routed experts
// only (no shared experts) on the grouped path of one process has its
// combine folded into the add and norm (kernels.MoECombineAddRMSNormF32:
// the bits of the combine then AddRMSNorm, one launch fewer); any other
// layer runs as AddRMSNorm(x, MoE(h, l), w, eps).
func (be *Backend) MoEAddRMSNorm(x, h backend.Tensor, l *backend.MoELayer, w backend.Tensor,
	eps float32) (backend.Tensor, backend.Tensor) {
	m := be.moeOperands(h, l)
	if be.world != nil || l.Shared != nil || m.T == 0 || m.Ew != m.E || m.H%4 != 0 || m.H > 8192 ||
		!be.grouped(m.gu, m.down, m.H, m.I, m.E) || be.moeGemv(m.T, l.Router.TopK, m.I) || be.fusedFits(m.E, m.gub, m.db) {
		return be.AddRMSNorm(x, be.moeChecked(m, l), w, eps)
	}
	xt := tensorOf("MoEAddRMSNorm", "x", x)
	if r, c := xt.dims(); len(xt.shape) != 2 || r != m.T || c != m.H {
		panicf("MoEAddRMSNorm", "x %v for h [%d, %d]", xt.shape, m.T, m.H)
	}
	wt := vector("MoEAddRMSNorm", "w", w, m.H)
	if wt == nil {
		panicf("MoEAddRMSNorm", "nil w")
	}
	f := &moeFold{x: xt, w: wt, eps: eps}
	be.moeGrouped(m.xt, l, m.gate, m.gateBias, vector("MoE", "ScoreBias", l.ScoreBias, m.E), m.gu, m.gub, m.down,
		m.db, m.T, m.H, m.E, m.I, m.base, m.Ew, f)
	return f.sum, f.out
}

// moeGemv reports whether a call of T tokens of top-K over experts of
// intermediate size I takes MoEExpertsRun's decode-sized GEMV kernels
// instead of the fused kernel: on one rank (the emulated expert-parallel
// ranks need the fused kernel) where kernels.MoEGemv says so (by default
// one token over experts of intermediate size ≥ kernels.MoEGemvAutoInter,
// Mixtral-8x7B's; MK_MOE_GEMV=0 turns them off, 1–3 on for up to four
// tokens; docs/PERF.md, forty-first pass).
func (be *Backend) moeGemv(T, K, I int) bool { return be.epRanks == 1 && kernels.MoEGemv(T, K, I) }
