package cuda

import (
	"os"
	"sync"
	"sync/atomic"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
)

// The persistent decode layer (kernels.LayerDecode): at one decode token a
// whole layer of grouped-query attention and routed experts in one launch
// (backend.LayerDecoder), instead of the ~10 kernels of its ops.

// LayerEnv names the environment variable that, set to 1, runs batch-1
// decode layers through the persistent layer kernel instead of op by op.
// It is off by default: on the H200 it is still slower than the ops
// (docs/PERF.md, "GPU, thirty-eighth pass").
const LayerEnv = "MKSERVE_LAYER_KERNEL"

var layerEnvOn = sync.OnceValue(func() bool { return os.Getenv(LayerEnv) == "1" })

// layerOn reports whether be decodes layers through the layer kernel.
func (be *Backend) layerOn() bool {
	if be.layerMode != 0 {
		return be.layerMode > 0
	}
	return layerEnvOn()
}

var _ backend.LayerDecoder = (*Backend)(nil)

// layerCalls counts layers run by the layer kernel (for tests).
var layerCalls atomic.Int64

// layerState is the layer kernel's device state: its counter buffer
// (zeroed once, left zeroed by every launch) and which shapes it takes.
type layerState struct {
	mu   sync.Mutex
	sync *kernels.Buffer
	fits map[[7]int]int64 // workspace bytes by shape; -1: not taken
}

// DecodesLayers implements backend.LayerDecoder: a fast-profile step of one
// decode token with a block table, on the bf16 cache, one process, no
// emulated expert-parallel ranks.
func (be *Backend) DecodesLayers(b *backend.Batch) bool {
	if !be.layerOn() || be.split || be.kvF32 || be.world != nil || be.epRanks != 1 || b == nil || len(b.Tokens) != 1 ||
		len(b.Seqs) != 1 {
		return false
	}
	s := b.Seqs[0]
	return s.Len == 1 && s.Blocks != nil && len(b.Positions) == 1
}

// layerShape is l's shape key and the kernel's form of it.
func layerShape(l *backend.DecodeLayer) ([7]int, kernels.Layer) {
	p, m := l.Attn, l.MoE
	H := 0
	if sh := m.Gate.Shape(); len(sh) == 2 {
		H = sh[1]
	}
	I := 0
	if sh := m.Down.Shape(); len(sh) == 2 && sh[1] > 0 {
		I = sh[1]
	}
	k := kernels.Layer{Hidden: H, Heads: p.NumHeads, KVHeads: p.NumKVHeads, HeadDim: p.HeadDim,
		Experts: m.Router.NumExperts, TopK: m.Router.TopK, Inter: I}
	return [7]int{H, p.NumHeads, p.NumKVHeads, p.HeadDim, k.Experts, k.TopK, I}, k
}

// layerFits reports (and remembers) whether the kernel takes l's shapes,
// with the workspace bytes it needs.
func (be *Backend) layerFits(l *backend.DecodeLayer) (int64, bool) {
	key, k := layerShape(l)
	ls := &be.layer
	ls.mu.Lock()
	n, ok := ls.fits[key]
	ls.mu.Unlock()
	if !ok {
		n = -1
		k.BlockSize, k.RotDim = 1, 0
		_ = be.g.Do(func(d *kernels.Device) error {
			if w, err := d.LayerWorkspace(&k); err == nil {
				n = w
			}
			return nil
		})
		ls.mu.Lock()
		if ls.fits == nil {
			ls.fits = map[[7]int]int64{}
		}
		ls.fits[key] = n
		ls.mu.Unlock()
	}
	return n, n >= 0
}

// bf16Weight is t's bf16 memory when t is a bf16 weight (not float32, not
// FP4), else nil.
func bf16Weight(t backend.Tensor) *kernels.Buffer {
	w, ok := t.(*Tensor)
	if !ok || w == nil || isFP4(w) {
		return nil
	}
	b, isF32 := weightMem(w)
	if isF32 {
		return nil
	}
	return b
}

// DecodeLayer implements backend.LayerDecoder through kernels.LayerDecode.
// It takes the layer when DecodesLayers(b) holds, its weights are bf16, its
// router a softmax one without groups and its shapes fit the kernel; else
// ok is false and nothing was done.
func (be *Backend) DecodeLayer(x backend.Tensor, l *backend.DecodeLayer, b *backend.Batch) (backend.Tensor, bool) {
	if !be.DecodesLayers(b) || l == nil || l.Attn == nil || l.MoE == nil || l.RoPE == nil || l.RoPE.Validate() != nil ||
		l.RoPE.Dim > l.Attn.HeadDim {
		return nil, false
	}
	p, m := l.Attn, l.MoE
	if m.Shared != nil || m.GateBias != nil || m.ScoreBias != nil || m.GateUpBias != nil || m.DownBias != nil ||
		m.Act.Kind != moe.SwiGLU || m.Router.Scoring != moe.Softmax || m.Router.NumGroups > 0 || m.LocalExperts > 0 ||
		p.Sinks != nil || p.Window > 0 || p.ValuesInKeys || p.HeadDim != p.VHeadDim {
		return nil, false
	}
	ws := []backend.Tensor{l.Q, l.K, l.V, l.O, m.Gate, m.GateUp, m.Down}
	wb := make([]*kernels.Buffer, len(ws))
	for i, w := range ws {
		if wb[i] = bf16Weight(w); wb[i] == nil {
			return nil, false
		}
	}
	qw, ok1 := headNormWeight("DecodeLayer", l.QNorm, p.HeadDim)
	kw, ok2 := headNormWeight("DecodeLayer", l.KNorm, p.HeadDim)
	if !ok1 || !ok2 {
		return nil, false
	}
	work, ok := be.layerFits(l)
	if !ok {
		return nil, false
	}
	_, k := layerShape(l)
	xt, _ := matrix("DecodeLayer", "x", x, k.Hidden)
	inN := vector("DecodeLayer", "InNorm", l.InNorm, k.Hidden)
	postN := vector("DecodeLayer", "PostNorm", l.PostNorm, k.Hidden)
	if inN == nil || postN == nil {
		panicf("DecodeLayer", "nil InNorm or PostNorm")
	}
	_, _, style := ropeInput("DecodeLayer", xt, k.Hidden, l.RoPE, b.Positions)
	c := be.counter(m.Layer, m.Router.NumExperts)

	// The attention's paged metadata comes from the attention op's own
	// path (groups, metadata uploads, graph inputs); q, k and v are
	// placeholders there, the kernel makes its own.
	var q, kk, v *Tensor
	be.do("DecodeLayer", func(d *kernels.Device) error {
		q = be.newF32(d, 1, p.NumHeads*p.HeadDim)
		kk = be.newF32(d, 1, p.NumKVHeads*p.HeadDim)
		v = be.newF32(d, 1, p.NumKVHeads*p.HeadDim)
		return nil
	})
	var sum *Tensor
	nr := &normRoPEArgs{qw: qw, kw: kw, eps: l.Eps, rope: l.RoPE, style: style}
	nr.whole = func(d *kernels.Device, pl *kvLayer, meta attnMeta, blockSize int, ropePos *kernels.Buffer,
		f *ropeFreqs) error {
		sum = be.newF32(d, 1, k.Hidden)
		wk := be.alloc.get(d, work)
		defer be.alloc.put(wk)
		k.BlockSize, k.RotDim, k.Style = blockSize, l.RoPE.Dim, style
		k.SoftmaxTopK, k.NormTopK = m.Router.SoftmaxTopK, m.Router.NormTopK
		k.Eps, k.Scale, k.AttnFactor, k.Scaling = l.Eps, p.Scale, f.attn, float32(m.Router.ScalingFactor)
		k.X, k.Out, k.InNorm, k.PostNorm = be.f32(d, xt), sum.st.f32, be.f32(d, inN), be.f32(d, postN)
		k.WQ, k.WK, k.WV, k.WO, k.Gate, k.GateUp, k.Down = wb[0], wb[1], wb[2], wb[3], wb[4], wb[5], wb[6]
		if qw != nil {
			k.QNorm = be.f32(d, qw)
		}
		if kw != nil {
			k.KNorm = be.f32(d, kw)
		}
		k.InvFreq = f.inv
		k.PoolK, k.PoolV, k.Blocks = pl.k, pl.v, meta.blocks
		k.Pos, k.Table, k.Slot, k.RoPEPos = meta.pos, meta.table, meta.slots, ropePos
		k.Counts = be.counterBuffer(d, c)
		k.Work, k.Sync = wk, be.layerSync(d)
		return d.LayerDecode(nil, &k)
	}
	out, ok := be.attention(q, kk, v, b, p, false, nr)
	be.Release(q, kk, v, out)
	if !ok || sum == nil {
		if ok {
			panicf("DecodeLayer", "the attention path did not run the layer")
		}
		return nil, false
	}
	layerCalls.Add(1)
	return sum, true
}

// layerSync is the layer kernel's counter buffer, made (zeroed) once.
func (be *Backend) layerSync(d *kernels.Device) *kernels.Buffer {
	ls := &be.layer
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.sync == nil {
		be.graphGuard("the layer kernel's counters")
		b, err := d.Malloc(kernels.LayerSyncBytes)
		must("layer counters", err)
		must("layer counters", kernels.Upload(d, b, make([]int32, kernels.LayerSyncBytes/4)))
		ls.sync = b
	}
	return ls.sync
}
