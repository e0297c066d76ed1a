package kernels

import (
	"fmt"
	"math"
	"runtime"
)

// The persistent decode layer (layer.cu, mk_layer.h): a whole pre-norm
// decoder layer of one decode token — norms, q/k/v, q/k norms, RoPE, the KV
// write, paged attention, o, router, top-k, experts and combine — in one
// launch of one CTA per SM, streaming every weight through one ring of
// shared memory.

var (
	layerWorkspace func(l *mkLayer, bytes *uint64) int32
	layerDecode    func(stream uint64, l *mkLayer) int32
)

func init() {
	registerSymbols(
		symbol{"mk_layer_workspace", &layerWorkspace},
		symbol{"mk_layer_decode", &layerDecode},
	)
}

// mkLayer mirrors mk_layer (mk_layer.h) field for field.
type mkLayer struct {
	hidden, heads, kvHeads, headDim, experts, topK, inter, blockSize int32
	rotDim, style, softmaxTopK, normTopK                             int32
	epsBits, scaleBits, attnBits, scalingBits                        uint32
	x, out, inNorm, postNorm                                         uint64
	wq, wk, wv, wo, qNorm, kNorm, invFreq                            uint64
	poolK, poolV, blocks, pos, table, slot, ropePos                  uint64
	gate, gateUp, down, counts                                       uint64
	work, sync                                                       uint64
}

// LayerSyncBytes is the size of a LayerDecode counter buffer (zeroed once
// by its owner; every launch leaves it zeroed).
const LayerSyncBytes = 256 * 4

// Layer is one decoder layer of one decode token for LayerDecode.
//
// Shapes: Hidden H, Heads HQ, KVHeads KV (HQ/KV ≤ 16), HeadDim 128,
// Experts E (≤ 1024), TopK K (≤ 16), Inter I; H ≤ 2048, HQ·128 ≤ 4096 and
// I ≤ 4096 (every weight row fits the kernel's 8 KB copies), H and I
// multiples of 8. X and Out [H] float32 (the residual in and out: x + attn
// + moe), InNorm and PostNorm [H] float32; bf16 weights WQ [HQ·D, H], WK
// and WV [KV·D, H], WO [H, HQ·D], Gate [E, H], GateUp [E, 2I, H] (gate rows
// then up rows), Down [E, H, I]; QNorm and KNorm [D] float32 or nil;
// InvFreq [RotDim/2] float32 (RotDim 0: no rotation). The router scores by
// softmax (SoftmaxTopK: top k of the logits, then softmax over them;
// NormTopK; Scaling, 0 or 1 for none); Counts [E] int64 or nil gets one
// added per chosen expert. The bf16 paged cache PoolK and PoolV [rows,
// KV·D] (mk_decode.h's layout) with Blocks, and the token's device int32
// scalars Pos, Table, Slot and RoPEPos (read by the kernel: a captured
// graph replays with new values). Work holds LayerWorkspace bytes; Sync is
// a zeroed LayerSyncBytes buffer that one launch at a time uses.
type Layer struct {
	Hidden, Heads, KVHeads, HeadDim, Experts, TopK, Inter, BlockSize int
	RotDim                                                           int
	Style                                                            RoPEStyle
	SoftmaxTopK, NormTopK                                            bool
	Eps, Scale, AttnFactor, Scaling                                  float32
	X, Out, InNorm, PostNorm                                         *Buffer
	WQ, WK, WV, WO, QNorm, KNorm, InvFreq                            *Buffer
	PoolK, PoolV, Blocks, Pos, Table, Slot, RoPEPos                  *Buffer
	Gate, GateUp, Down, Counts                                       *Buffer
	Work, Sync                                                       *Buffer
}

// abi converts l to mk_layer, checking the buffers' sizes (work only when
// withWork).
func (l *Layer) abi(op string, withWork bool) (mkLayer, error) {
	m := mkLayer{hidden: int32(l.Hidden), heads: int32(l.Heads), kvHeads: int32(l.KVHeads),
		headDim: int32(l.HeadDim), experts: int32(l.Experts), topK: int32(l.TopK), inter: int32(l.Inter),
		blockSize: int32(l.BlockSize), rotDim: int32(l.RotDim), style: int32(l.Style),
		softmaxTopK: b2i(l.SoftmaxTopK), normTopK: b2i(l.NormTopK), epsBits: math.Float32bits(l.Eps),
		scaleBits: math.Float32bits(l.Scale), attnBits: math.Float32bits(l.AttnFactor),
		scalingBits: math.Float32bits(l.Scaling)}
	if !withWork {
		return m, nil
	}
	if l.Hidden <= 0 || l.Heads <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 || l.Experts <= 0 || l.Inter <= 0 ||
		l.TopK <= 0 || l.BlockSize <= 0 {
		return m, fmt.Errorf("kernels: %s: shapes %+v", op, *l)
	}
	H, HD, KD, E, I := int64(l.Hidden), int64(l.Heads*l.HeadDim), int64(l.KVHeads*l.HeadDim), int64(l.Experts),
		int64(l.Inter)
	type arg struct {
		b     *Buffer
		dst   *uint64
		n     int64
		size  int64
		name  string
		maybe bool
	}
	args := []arg{
		{l.X, &m.x, H, 4, "X", false}, {l.Out, &m.out, H, 4, "Out", false},
		{l.InNorm, &m.inNorm, H, 4, "InNorm", false}, {l.PostNorm, &m.postNorm, H, 4, "PostNorm", false},
		{l.WQ, &m.wq, HD * H, 2, "WQ", false}, {l.WK, &m.wk, KD * H, 2, "WK", false},
		{l.WV, &m.wv, KD * H, 2, "WV", false}, {l.WO, &m.wo, H * HD, 2, "WO", false},
		{l.QNorm, &m.qNorm, int64(l.HeadDim), 4, "QNorm", true}, {l.KNorm, &m.kNorm, int64(l.HeadDim), 4, "KNorm", true},
		{l.InvFreq, &m.invFreq, int64(l.RotDim / 2), 4, "InvFreq", l.RotDim == 0},
		{l.PoolK, &m.poolK, KD, 2, "PoolK", false}, {l.PoolV, &m.poolV, KD, 2, "PoolV", false},
		{l.Blocks, &m.blocks, 1, 4, "Blocks", false}, {l.Pos, &m.pos, 1, 4, "Pos", false},
		{l.Table, &m.table, 1, 4, "Table", false}, {l.Slot, &m.slot, 1, 4, "Slot", false},
		{l.RoPEPos, &m.ropePos, 1, 4, "RoPEPos", false},
		{l.Gate, &m.gate, E * H, 2, "Gate", false}, {l.GateUp, &m.gateUp, E * 2 * I * H, 2, "GateUp", false},
		{l.Down, &m.down, E * H * I, 2, "Down", false}, {l.Counts, &m.counts, E, 8, "Counts", true},
		{l.Work, &m.work, 1, 1, "Work", false}, {l.Sync, &m.sync, LayerSyncBytes / 4, 4, "Sync", false},
	}
	for _, a := range args {
		if a.b == nil && a.maybe {
			continue
		}
		if err := need(op, a.name, a.b, a.n, a.size); err != nil {
			return m, err
		}
		*a.dst = a.b.ptr
	}
	return m, nil
}

// LayerWorkspace is the Work bytes LayerDecode needs for l's shapes on
// this GPU; an error when the kernel does not take them.
func (d *Device) LayerWorkspace(l *Layer) (int64, error) {
	const op = "LayerWorkspace"
	if err := d.ready(op); err != nil {
		return 0, err
	}
	m, _ := l.abi(op, false)
	var n uint64
	rc := layerWorkspace(&m, &n)
	runtime.KeepAlive(&m)
	if err := d.lib.check("mk_layer_workspace", rc); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// LayerDecode runs the layer (see Layer) on s.
func (d *Device) LayerDecode(s *Stream, l *Layer) error {
	const op = "LayerDecode"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	m, err := l.abi(op, true)
	if err != nil {
		return err
	}
	need, err := d.LayerWorkspace(l)
	if err != nil {
		return err
	}
	if l.Work.bytes < need {
		return fmt.Errorf("kernels: %s: Work holds %d bytes, the layer needs %d", op, l.Work.bytes, need)
	}
	rc := layerDecode(s.handle(), &m)
	runtime.KeepAlive(&m)
	return d.lib.check("mk_layer_decode", rc)
}
