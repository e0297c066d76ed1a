package kernels

import (
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
)

// The bf16 paged KV cache and paged decode attention (decode.cu, mk_decode.h).
// A pool is two bf16 buffers, keys [poolRows, KVHeads*HeadDim] and values
// [poolRows, KVHeads*VHeadDim], row-major; token j of a sequence lives at pool
// row blocks[table + j/BlockSize]*BlockSize + j%BlockSize.

var (
	kvWriteBF16        func(stream, poolK, poolV, k, v, slots uint64, n, kw, vw int64) int32
	pagedAttnVariant   func(variant int32) int32
	pagedAttnStages    func(stages int32) int32
	pagedAttnWorkspace func(n int64, heads, kvHeads, headDim, vHeadDim, maxKeys int32, bytes *uint64) int32
	pagedAttnBF16      func(stream, out, outBF16, q, poolK, poolV, rows, pos, table, blocks uint64, n int64,
		heads, kvHeads, headDim, vHeadDim, blockSize int32, scaleBits uint32, window int32, sinks uint64,
		maxKeys int32, work, workSize uint64) int32
	pagedDecodeFits func(heads, kvHeads, headDim, vHeadDim, rotDim int32) int32
	pagedDecodeBF16 func(stream, out, outBF16, q, poolK, poolV, rows, pos, table, blocks uint64, n int64,
		heads, kvHeads, headDim, vHeadDim, blockSize int32, scaleBits uint32, window int32, sinks uint64,
		maxKeys int32, work, workSize uint64, nw *decodeNew) int32
)

func init() {
	registerSymbols(
		symbol{"mk_kv_write_bf16", &kvWriteBF16},
		symbol{"mk_paged_attn_variant", &pagedAttnVariant},
		symbol{"mk_paged_attn_stages", &pagedAttnStages},
		symbol{"mk_paged_attn_workspace", &pagedAttnWorkspace},
		symbol{"mk_paged_attn_bf16", &pagedAttnBF16},
		symbol{"mk_paged_decode_fits", &pagedDecodeFits},
		symbol{"mk_paged_decode_bf16", &pagedDecodeBF16},
	)
}

// KVWriteBF16 stores float32 k [n, kw] and v [n, vw], rounded to bf16, at
// pool rows slots [n] (int32) of the bf16 pools poolK [poolRows, kw] and
// poolV [poolRows, vw]; rows with a negative slot are skipped. vw 0 stores
// keys only (v and poolV may be nil: a cache whose values live inside its
// keys). Slots are trusted to lie in the pool (the caller computes them
// from its block tables).
func (d *Device) KVWriteBF16(s *Stream, poolK, poolV, k, v, slots *Buffer, n, kw, vw int) error {
	const op = "KVWriteBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n, "kw", kw); err != nil {
		return err
	}
	if vw < 0 {
		return fmt.Errorf("kernels: %s: vw %d is negative", op, vw)
	}
	N := int64(n)
	if err := needAll(op, 2, "poolK", poolK, int64(kw)); err != nil {
		return err
	}
	if err := needAll(op, 4, "k", k, N*int64(kw), "slots", slots, N); err != nil {
		return err
	}
	var pv, vp uint64
	if vw > 0 {
		if err := needAll(op, 2, "poolV", poolV, int64(vw)); err != nil {
			return err
		}
		if err := needAll(op, 4, "v", v, N*int64(vw)); err != nil {
			return err
		}
		pv, vp = poolV.ptr, v.ptr
	}
	return d.lib.check("mk_kv_write_bf16", kvWriteBF16(s.handle(), poolK.ptr, pv, k.ptr, vp, slots.ptr,
		N, int64(kw), int64(vw)))
}

// PagedVariant selects PagedAttnBF16's kernel.
type PagedVariant int32

// The kernels of PagedAttnBF16.
const (
	// PagedAuto (the default) runs PagedWarp where it has the head dims,
	// else PagedMMA for groups of more than 4 query heads per kv head with
	// VHeadDim ≤ 128, else PagedSIMT. Past head dim 256 it runs MLA's
	// absorbed form (HeadDim 576, VHeadDim 512) on the tensor cores (64
	// query heads a CTA, bf16 q and softmax weights) and other dims on
	// the CUDA cores.
	PagedAuto PagedVariant = 0
	// PagedSIMT computes on the CUDA cores in float32 (past head dim 256
	// too, MLA's dims included).
	PagedSIMT PagedVariant = 1
	// PagedMMA computes on the tensor cores (bf16 MMA, float32 accumulation)
	// with q and the softmax weights split into bf16 hi + lo halves, so only
	// K and V are bf16-rounded; VHeadDim ≤ 128. Its K/V tiles come through a
	// ring of 2-4 stages (SetPagedStages).
	PagedMMA PagedVariant = 2
	// PagedWarp splits each CTA's keys over its warps, which load K and V
	// from the pool straight into tensor-core fragments (no shared-memory
	// tiles: more warps per SM, more loads in flight); q and the softmax
	// weights enter the MMAs as bf16. Head dims 64/64, 128/128 and 192/128;
	// other shapes run what PagedAuto would pick without it.
	PagedWarp PagedVariant = 3
)

// SetPagedStages sets the depth of PagedMMA's ring of 64-key K/V tiles for
// later PagedAttnBF16 and PagedAttnWorkspace calls (for tests and
// comparisons): 0 (the default) picks it per head dims, 2-4 force it (the
// deepest below that fits in shared memory).
func (d *Device) SetPagedStages(n int) error {
	if err := d.ready("SetPagedStages"); err != nil {
		return err
	}
	if n < 0 || n > 4 {
		return fmt.Errorf("kernels: SetPagedStages: %d stages is not 0 or 2..4", n)
	}
	if err := d.lib.check("mk_paged_attn_stages", pagedAttnStages(int32(n))); err != nil {
		return err
	}
	pagedStagesNow.Store(int32(n))
	return nil
}

// SetPagedVariant selects the kernel of later PagedAttnBF16 and
// PagedAttnWorkspace calls (for tests and comparisons).
func (d *Device) SetPagedVariant(v PagedVariant) error {
	if err := d.ready("SetPagedVariant"); err != nil {
		return err
	}
	if err := d.lib.check("mk_paged_attn_variant", pagedAttnVariant(int32(v))); err != nil {
		return err
	}
	pagedVariantNow.Store(int32(v))
	return nil
}

// pagedVariantNow and pagedStagesNow mirror the library's (process-wide)
// kernel choice, so that PagedAttnWorkspace's memo keys on it: the plan, and
// with it the workspace, depends on the kernel.
var pagedVariantNow, pagedStagesNow atomic.Int32

// PagedMaxHeadDim and PagedMaxVHeadDim are the largest key and value head
// dims PagedAttnBF16 takes (DeepSeek-V3's absorbed MLA: 576 and 512).
const (
	PagedMaxHeadDim  = 768
	PagedMaxVHeadDim = 512
)

// checkPaged validates the shapes of a paged attention call.
func checkPaged(op string, n int, a AttnArgs) error {
	if err := positive(op, "n", n, "heads", a.Heads, "kvHeads", a.KVHeads, "headDim", a.HeadDim,
		"vHeadDim", a.VHeadDim, "blockSize", a.BlockSize); err != nil {
		return err
	}
	if a.Heads%a.KVHeads != 0 || a.Window < 0 {
		return fmt.Errorf("kernels: %s: heads %d / kv heads %d, window %d", op, a.Heads, a.KVHeads, a.Window)
	}
	if a.HeadDim%8 != 0 || a.HeadDim > PagedMaxHeadDim || a.VHeadDim%8 != 0 || a.VHeadDim > PagedMaxVHeadDim {
		return fmt.Errorf("kernels: %s: head dims %d/%d must be multiples of 8 up to %d/%d", op, a.HeadDim, a.VHeadDim,
			PagedMaxHeadDim, PagedMaxVHeadDim)
	}
	return nil
}

// PagedAttnWorkspace is the workspace (bytes) PagedAttnBF16 uses to split
// the keys of n rows, of which the longest attends maxKeys keys, across
// thread blocks (0 when it would not split).
func (d *Device) PagedAttnWorkspace(n, maxKeys int, a AttnArgs) (int64, error) {
	const op = "PagedAttnWorkspace"
	if err := d.ready(op); err != nil {
		return 0, err
	}
	if err := checkPaged(op, n, a); err != nil {
		return 0, err
	}
	type key struct {
		n, maxKeys, heads, kvHeads, headDim, vHeadDim int
		variant, stages                               int32
	}
	k := key{n, maxKeys, a.Heads, a.KVHeads, a.HeadDim, a.VHeadDim, pagedVariantNow.Load(), pagedStagesNow.Load()}
	return query(d, op, k, func() (int64, error) {
		var bytes uint64
		err := d.lib.check("mk_paged_attn_workspace", pagedAttnWorkspace(int64(n), int32(a.Heads), int32(a.KVHeads),
			int32(a.HeadDim), int32(a.VHeadDim), int32(min(maxKeys, math.MaxInt32)), &bytes))
		return int64(bytes), err
	})
}

// PagedAttnBF16 runs paged causal attention for n query rows over the bf16
// pools poolK / poolV, with the semantics of AttentionF32: row b is q/out row
// rows[b] at position pos[b], reading its keys through blocks[table[b] +
// j/BlockSize] (int32 buffers). q [*, Heads*HeadDim] and out
// [*, Heads*VHeadDim] are float32; outBF16 (may be nil) gets every value
// written to out rounded to bf16 as well (the input of a bf16 projection,
// without a conversion launch); sinks [Heads] may be nil. maxKeys is the
// most keys any row attends (min(pos+1, Window) at most), a hint for
// splitting long rows across thread blocks; work (may be nil) is the
// workspace of PagedAttnWorkspace bytes: a smaller one means fewer splits.
// Head dims must be multiples of 8 up to PagedMaxHeadDim / PagedMaxVHeadDim
// (past 256: MLA's tensor-core kernel at 576/512 unless SetPagedVariant
// chose PagedSIMT, else a CUDA-core kernel). poolV nil: each kv head's
// values are the first VHeadDim columns of its keys in poolK (VHeadDim ≤
// HeadDim; MLA's latent cache). Block ids and positions are
// trusted (the caller builds them).
func (d *Device) PagedAttnBF16(s *Stream, out, outBF16, q, poolK, poolV, rows, pos, table, blocks, sinks, work *Buffer,
	n, maxKeys int, a AttnArgs) error {
	const op = "PagedAttnBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	c, err := pagedCall(op, out, outBF16, q, poolK, poolV, rows, pos, table, blocks, sinks, work, n, maxKeys, a)
	if err != nil {
		return err
	}
	return d.lib.check("mk_paged_attn_bf16", pagedAttnBF16(s.handle(), c.out, c.ob, c.q, c.pk, c.pv,
		c.rows, c.pos, c.table, c.blocks, c.n, c.heads, c.kvHeads, c.headDim, c.vHeadDim, c.bs, c.scale, c.window,
		c.sinks, c.maxKeys, c.work, c.workN))
}

// pagedArgs are the flattened arguments of mk_paged_attn_bf16 (and of
// mk_paged_decode_bf16, which takes the same and the new tokens).
type pagedArgs struct {
	out, ob, q, pk, pv, rows, pos, table, blocks, sinks, work, workN uint64
	n                                                                int64
	heads, kvHeads, headDim, vHeadDim, bs, window, maxKeys           int32
	scale                                                            uint32
}

// pagedCall checks PagedAttnBF16's buffers against the shapes and
// flattens them.
func pagedCall(op string, out, outBF16, q, poolK, poolV, rows, pos, table, blocks, sinks, work *Buffer,
	n, maxKeys int, a AttnArgs) (pagedArgs, error) {
	var c pagedArgs
	if err := checkPaged(op, n, a); err != nil {
		return c, err
	}
	N := int64(n)
	if err := needAll(op, 4, "q", q, int64(a.Heads*a.HeadDim), "out", out, int64(a.Heads*a.VHeadDim),
		"rows", rows, N, "pos", pos, N, "table", table, N, "blocks", blocks, int64(1)); err != nil {
		return c, err
	}
	if err := needAll(op, 2, "poolK", poolK, int64(a.KVHeads*a.HeadDim)); err != nil {
		return c, err
	}
	if poolV != nil {
		if err := needAll(op, 2, "poolV", poolV, int64(a.KVHeads*a.VHeadDim)); err != nil {
			return c, err
		}
		c.pv = poolV.ptr
	} else if a.VHeadDim > a.HeadDim {
		return c, fmt.Errorf("kernels: %s: values inside keys need VHeadDim %d ≤ HeadDim %d", op, a.VHeadDim, a.HeadDim)
	}
	if poolK.ptr%16 != 0 || c.pv%16 != 0 {
		return c, fmt.Errorf("kernels: %s: poolK and poolV must be 16-byte aligned", op)
	}
	if sinks != nil {
		if err := need(op, "sinks", sinks, int64(a.Heads), 4); err != nil {
			return c, err
		}
		c.sinks = sinks.ptr
	}
	if outBF16 != nil {
		if err := need(op, "outBF16", outBF16, int64(a.Heads*a.VHeadDim), 2); err != nil {
			return c, err
		}
		c.ob = outBF16.ptr
	}
	if work != nil {
		if err := work.fits(op+" workspace", 0); err != nil {
			return c, err
		}
		c.work, c.workN = work.ptr, uint64(work.bytes)
	}
	c.out, c.q, c.pk, c.rows, c.pos, c.table, c.blocks = out.ptr, q.ptr, poolK.ptr, rows.ptr, pos.ptr, table.ptr, blocks.ptr
	c.n = N
	c.heads, c.kvHeads, c.headDim, c.vHeadDim = int32(a.Heads), int32(a.KVHeads), int32(a.HeadDim), int32(a.VHeadDim)
	c.bs, c.window, c.maxKeys = int32(a.BlockSize), int32(a.Window), int32(max(0, min(maxKeys, math.MaxInt32)))
	c.scale = math.Float32bits(a.Scale)
	return c, nil
}

// decodeNew mirrors mk_decode_new (mk_decode.h).
type decodeNew struct {
	k, v, slots, qNorm, kNorm, ropePos, invFreq uint64
	rotDim, style                               int32
	attnBits, epsBits                           uint32
}

// DecodeNew says where PagedDecodeBF16's new tokens are and how their q
// and k are normalised and rotated: K [T, KVHeads*HeadDim] and V
// [T, KVHeads*VHeadDim] float32 as projected, Slots [T] int32 their pool
// rows (negative: not stored), QNorm / KNorm [HeadDim] float32 the per-head
// RMSNorm weights (nil: no norm), RoPEPos [T] int32 the rotation's
// positions, InvFreq [RotDim/2] float32 its frequencies (RotDim 0: none),
// Style its pairing, AttnFactor its scale (1 for none).
type DecodeNew struct {
	K, V, Slots, QNorm, KNorm, RoPEPos, InvFreq *Buffer
	Tokens, RotDim                              int
	Style                                       RoPEStyle
	AttnFactor, Eps                             float32
}

// PagedDecodeFits reports whether PagedDecodeBF16 takes these shapes with
// the kernel SetPagedVariant chose (the warp-split kernel's head dims 64/64,
// 128/128 and 192/128; rotDim even, at most HeadDim).
func (d *Device) PagedDecodeFits(a AttnArgs, rotDim int) bool {
	if d.ready("PagedDecodeFits") != nil {
		return false
	}
	return pagedDecodeFits(int32(a.Heads), int32(a.KVHeads), int32(a.HeadDim), int32(a.VHeadDim), int32(rotDim)) == 1
}

// PagedDecodeBF16 is a decode step's attention with its new tokens in one
// kernel: the per-head RMSNorm and RoPE of q (NormRoPEF32, fast) and of the
// new keys, KVWriteBF16 of the new keys and values, then PagedAttnBF16 —
// with PagedAttnBF16's arguments, except that q is the raw projection. Every
// row b must be a decode row: its token is row rows[b] of q and of nw's
// buffers, and pos[b] is that token's position, the last key the row sees
// (written by this call, not read from the pool). poolV must not be nil;
// q, K and V must be 16-byte aligned; PagedDecodeFits must hold. The keys
// before each row's new one and rows, pos, table and blocks may be read
// before the stream's previous kernel has completed: it must not write them.
func (d *Device) PagedDecodeBF16(s *Stream, out, outBF16, q, poolK, poolV, rows, pos, table, blocks, sinks, work *Buffer,
	n, maxKeys int, a AttnArgs, nw DecodeNew) error {
	const op = "PagedDecodeBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	c, err := pagedCall(op, out, outBF16, q, poolK, poolV, rows, pos, table, blocks, sinks, work, n, maxKeys, a)
	if err != nil {
		return err
	}
	if poolV == nil {
		return fmt.Errorf("kernels: %s: the values need their own pool (poolV is nil)", op)
	}
	if nw.Tokens < n || nw.RotDim < 0 || nw.RotDim%2 != 0 || nw.RotDim > a.HeadDim {
		return fmt.Errorf("kernels: %s: %d tokens for %d rows, rotDim %d (head dim %d)", op, nw.Tokens, n, nw.RotDim,
			a.HeadDim)
	}
	T := int64(nw.Tokens)
	if err := needAll(op, 4, "K", nw.K, T*int64(a.KVHeads*a.HeadDim), "V", nw.V, T*int64(a.KVHeads*a.VHeadDim),
		"Slots", nw.Slots, T, "RoPEPos", nw.RoPEPos, T); err != nil {
		return err
	}
	if err := needAll(op, 4, "q", q, T*int64(a.Heads*a.HeadDim)); err != nil {
		return err
	}
	dn := decodeNew{k: nw.K.ptr, v: nw.V.ptr, slots: nw.Slots.ptr, ropePos: nw.RoPEPos.ptr, rotDim: int32(nw.RotDim),
		style: int32(nw.Style), attnBits: math.Float32bits(nw.AttnFactor), epsBits: math.Float32bits(nw.Eps)}
	for _, x := range []struct {
		b   *Buffer
		dst *uint64
		n   int64
		nm  string
	}{{nw.QNorm, &dn.qNorm, int64(a.HeadDim), "QNorm"}, {nw.KNorm, &dn.kNorm, int64(a.HeadDim), "KNorm"},
		{nw.InvFreq, &dn.invFreq, int64(nw.RotDim / 2), "InvFreq"}} {
		if x.b == nil {
			continue
		}
		if err := need(op, x.nm, x.b, x.n, 4); err != nil {
			return err
		}
		*x.dst = x.b.ptr
	}
	if nw.RotDim > 0 && dn.invFreq == 0 {
		return fmt.Errorf("kernels: %s: rotDim %d without InvFreq", op, nw.RotDim)
	}
	rc := pagedDecodeBF16(s.handle(), c.out, c.ob, c.q, c.pk, c.pv, c.rows, c.pos, c.table, c.blocks, c.n, c.heads,
		c.kvHeads, c.headDim, c.vHeadDim, c.bs, c.scale, c.window, c.sinks, c.maxKeys, c.work, c.workN, &dn)
	runtime.KeepAlive(&dn)
	return d.lib.check("mk_paged_decode_bf16", rc)
}
