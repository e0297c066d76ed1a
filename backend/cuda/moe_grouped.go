package cuda

import (
	"sync"
	"sync/atomic"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
)

// The grouped MoE path: routing, expert GEMMs and combine on the GPU with
// no host synchronisation (kernels.MoERoute, kernels.MoEExpertsRun).

// moeDevState is a Backend's device-side MoE state: per layer, the expert
// counters the grouped path accumulates into. Kept beside the Backend (not
// in it) so that this file owns it.
type moeDevState struct {
	mu       sync.Mutex
	counters map[int]*moeCounter
}

// moeCounter is one layer's tokens-per-expert counters on the device.
type moeCounter struct {
	E   int
	buf *kernels.Buffer // [E] int64; allocated and zeroed on the GPU goroutine
}

// moeGroupedCalls counts MoE calls that took the grouped path (for tests).
var moeGroupedCalls atomic.Int64

var (
	moeStatesMu sync.Mutex
	moeStates   = map[*Backend]*moeDevState{}
)

func (be *Backend) moeDev() *moeDevState {
	moeStatesMu.Lock()
	defer moeStatesMu.Unlock()
	s := moeStates[be]
	if s == nil {
		s = &moeDevState{counters: map[int]*moeCounter{}}
		moeStates[be] = s
	}
	return s
}

// counter returns layer's counter record for E experts (a layer whose
// expert count changed starts a new one).
func (be *Backend) counter(layer, E int) *moeCounter {
	s := be.moeDev()
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.counters[layer]
	if c == nil || c.E != E {
		c = &moeCounter{E: E}
		s.counters[layer] = c
	}
	return c
}

// buffer returns the counters' device memory, allocating zeroed memory on
// first use; on the GPU goroutine.
func (c *moeCounter) buffer(d *kernels.Device) *kernels.Buffer {
	if c.buf == nil {
		b, err := d.Malloc(int64(c.E) * 8)
		must("expert counters", err)
		must("expert counters", kernels.Upload(d, b, make([]int64, c.E)))
		c.buf = b
	}
	return c.buf
}

// takeDeviceLoad reads and zeroes every layer's device counters; layers
// with no tokens since the last call are left out.
func (be *Backend) takeDeviceLoad() map[int][]int64 {
	s := be.moeDev()
	s.mu.Lock()
	layers := make(map[int]*moeCounter, len(s.counters))
	for l, c := range s.counters {
		layers[l] = c
	}
	s.mu.Unlock()
	if len(layers) == 0 {
		return nil
	}
	out := map[int][]int64{}
	be.do("TakeExpertLoad", func(d *kernels.Device) error {
		for l, c := range layers {
			if c.buf == nil {
				continue
			}
			v := make([]int64, c.E)
			if err := kernels.Download(d, v, c.buf); err != nil {
				return err
			}
			var sum int64
			for _, n := range v {
				sum += n
			}
			if sum == 0 {
				continue
			}
			if err := kernels.Upload(d, c.buf, make([]int64, c.E)); err != nil {
				return err
			}
			out[l] = v
		}
		return nil
	})
	return out
}

// grouped reports whether the routed experts can take the grouped path:
// bf16 expert weights, split mode off, shapes the kernels accept.
func (be *Backend) grouped(gu, down *Tensor, H, I, E int) bool {
	_, guF32 := weightMem(gu)
	_, dF32 := weightMem(down)
	return !be.split && !guF32 && !dF32 && H%8 == 0 && I%8 == 0 && H > 0 && I > 0 && E <= 2048
}

// moeRouterOf converts the layer's router to the kernels' form.
func moeRouterOf(r *moe.RouterConfig) kernels.MoERouter {
	return kernels.MoERouter{Experts: r.NumExperts, TopK: r.TopK, Sigmoid: r.Scoring == moe.Sigmoid,
		SoftmaxTopK: r.SoftmaxTopK, NormTopK: r.NormTopK, Groups: r.NumGroups, TopKGroups: r.TopKGroups,
		Scaling: r.ScalingFactor}
}

// moeGrouped is the routed experts on the GPU: router GEMM (Linear), device
// routing, x rounded to bf16, kernels.MoEExpertsRun → out [T, H] f32.
func (be *Backend) moeGrouped(xt *Tensor, l *backend.MoELayer, gate, gateBias, scoreBias *Tensor,
	gu, gub, down, db *Tensor, T, H, E, I int) *Tensor {
	K := l.Router.TopK
	var logits *Tensor
	if T > 0 {
		logits = be.routerLinear(xt, gate, gateBias)
	}
	c := be.counter(l.Layer, E)
	moeGroupedCalls.Add(1)
	var out *Tensor
	be.do("MoE", func(d *kernels.Device) error {
		out = be.newF32(d, T, H)
		if T == 0 {
			return nil
		}
		a := be.alloc
		ids, w := a.get(d, int64(T*K)*4), a.get(d, int64(T*K)*4)
		defer a.put(ids)
		defer a.put(w)
		var sb *kernels.Buffer
		if scoreBias != nil {
			sb = be.f32(d, scoreBias)
		}
		must("route", d.MoERoute(nil, ids, w, logits.st.f32, sb, T, moeRouterOf(&l.Router)))
		xb := a.get(d, int64(T*H)*2)
		defer a.put(xb)
		must("convert", d.ConvertF32ToBF16(nil, xb, be.f32(d, xt), T*H))
		ex := &kernels.MoEExperts{E: E, H: H, I: I, GateUp: gu.st.bf16, Down: down.st.bf16,
			Clamped: l.Act.Kind == moe.ClampedSwiGLU, Alpha: l.Act.Alpha, Limit: l.Act.Limit}
		if gub != nil {
			ex.GateUpBias = be.f32(d, gub)
		}
		if db != nil {
			ex.DownBias = be.f32(d, db)
		}
		wsBytes, _, err := d.MoEWorkspace(T, K, ex)
		must("workspace", err)
		ws := a.get(d, wsBytes)
		defer a.put(ws)
		must("experts", d.MoEExpertsRun(nil, out.st.f32, xb, ids, w, T, K, ex, c.buffer(d), ws))
		return nil
	}, xt, logits, gu, down, gub, db, scoreBias)
	return out
}
