package kernels

import (
	"fmt"
	"math"
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
)

func init() {
	registerSymbols(
		symbol{"mk_kv_write_bf16", &kvWriteBF16},
		symbol{"mk_paged_attn_variant", &pagedAttnVariant},
		symbol{"mk_paged_attn_stages", &pagedAttnStages},
		symbol{"mk_paged_attn_workspace", &pagedAttnWorkspace},
		symbol{"mk_paged_attn_bf16", &pagedAttnBF16},
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
	if err := checkPaged(op, n, a); err != nil {
		return err
	}
	N := int64(n)
	if err := needAll(op, 4, "q", q, int64(a.Heads*a.HeadDim), "out", out, int64(a.Heads*a.VHeadDim),
		"rows", rows, N, "pos", pos, N, "table", table, N, "blocks", blocks, int64(1)); err != nil {
		return err
	}
	if err := needAll(op, 2, "poolK", poolK, int64(a.KVHeads*a.HeadDim)); err != nil {
		return err
	}
	var pv uint64
	if poolV != nil {
		if err := needAll(op, 2, "poolV", poolV, int64(a.KVHeads*a.VHeadDim)); err != nil {
			return err
		}
		pv = poolV.ptr
	} else if a.VHeadDim > a.HeadDim {
		return fmt.Errorf("kernels: %s: values inside keys need VHeadDim %d ≤ HeadDim %d", op, a.VHeadDim, a.HeadDim)
	}
	if poolK.ptr%16 != 0 || pv%16 != 0 {
		return fmt.Errorf("kernels: %s: poolK and poolV must be 16-byte aligned", op)
	}
	var sk, wp, wn, ob uint64
	if sinks != nil {
		if err := need(op, "sinks", sinks, int64(a.Heads), 4); err != nil {
			return err
		}
		sk = sinks.ptr
	}
	if outBF16 != nil {
		if err := need(op, "outBF16", outBF16, int64(a.Heads*a.VHeadDim), 2); err != nil {
			return err
		}
		ob = outBF16.ptr
	}
	if work != nil {
		if err := work.fits("PagedAttnBF16 workspace", 0); err != nil {
			return err
		}
		wp, wn = work.ptr, uint64(work.bytes)
	}
	return d.lib.check("mk_paged_attn_bf16", pagedAttnBF16(s.handle(), out.ptr, ob, q.ptr, poolK.ptr, pv,
		rows.ptr, pos.ptr, table.ptr, blocks.ptr, N, int32(a.Heads), int32(a.KVHeads), int32(a.HeadDim),
		int32(a.VHeadDim), int32(a.BlockSize), math.Float32bits(a.Scale), int32(a.Window), sk,
		int32(max(0, min(maxKeys, math.MaxInt32))), wp, wn))
}
