package kernels

import (
	"fmt"
	"math"
)

// The float32-activation ops of the CUDA model backend (f32ops.cu). Every
// tensor is float32 unless a doc says otherwise; shapes follow mkernel.h.
// Buffers are checked for size; the device pointers of views are used as is.

// positive checks that every named dimension is in [1, MaxInt32].
func positive(op string, kv ...any) error { return dims(op, kv...) }

// AddRMSNormF32 writes sum [rows, cols] = x + r and out = RMSNorm(sum) · w
// [cols] (one group per row) in one launch, with the values of AddF32 then
// RMSNormF32; outb, when not nil, also gets out rounded to bf16 (RN).
func (d *Device) AddRMSNormF32(s *Stream, sum, out, x, r, w, outb *Buffer, rows, cols int, eps float32) error {
	const op = "AddRMSNormF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "cols", cols); err != nil {
		return err
	}
	n := int64(rows) * int64(cols)
	if err := needAll(op, 4, "sum", sum, n, "out", out, n, "x", x, n, "r", r, n, "w", w, int64(cols)); err != nil {
		return err
	}
	var ob uint64
	if outb != nil {
		if err := need(op, "outb", outb, n, 2); err != nil {
			return err
		}
		ob = outb.ptr
	}
	return d.lib.check("mk_add_rmsnorm_f32", d.lib.addRMSNormF32(s.handle(), sum.ptr, out.ptr, x.ptr, r.ptr, w.ptr,
		int64(rows), int64(cols), math.Float32bits(eps), ob))
}

// RMSNormF32 writes out [rows, cols] = x / rms(each group of `group` columns)
// * w [group], all float32; the sum of squares accumulates in float64.
func (d *Device) RMSNormF32(s *Stream, out, x, w *Buffer, rows, cols, group int, eps float32) error {
	const op = "RMSNormF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "cols", cols, "group", group); err != nil {
		return err
	}
	if cols%group != 0 {
		return fmt.Errorf("kernels: %s: cols=%d is not a multiple of group=%d", op, cols, group)
	}
	n := int64(rows) * int64(cols)
	if err := needAll(op, 4, "out", out, n, "x", x, n, "w", w, int64(group)); err != nil {
		return err
	}
	return d.lib.check("mk_rmsnorm_f32", d.lib.rmsnormF32(s.handle(), out.ptr, x.ptr, w.ptr,
		int64(rows), int64(cols), int64(group), math.Float32bits(eps)))
}

// needAll checks (name, buffer, elements) triples of one element size.
func needAll(op string, size int64, kv ...any) error {
	if len(kv)%3 != 0 {
		return fmt.Errorf("kernels: %s: %d arguments to needAll (want name, buffer, count triples)", op, len(kv))
	}
	for i := 0; i < len(kv); i += 3 {
		name, ok1 := kv[i].(string)
		b, ok2 := kv[i+1].(*Buffer)
		var n int64
		switch v := kv[i+2].(type) {
		case int64:
			n = v
		case int:
			n = int64(v)
		default:
			ok2 = false
		}
		if !ok1 || !ok2 {
			return fmt.Errorf("kernels: %s: needAll argument %d: %T, %T, %T (want string, *Buffer, int or int64)", op,
				i/3, kv[i], kv[i+1], kv[i+2])
		}
		if err := need(op, name, b, n, size); err != nil {
			return err
		}
	}
	return nil
}

// SplitBF16 splits n float32 values of x into hi = bf16(x) and lo =
// bf16(x − hi) (nearest even), so that hi + lo keeps about 16 bits of x's
// mantissa: a·bᵀ ≈ Gemm(hi, b) then GemmAdd(lo, b).
func (d *Device) SplitBF16(s *Stream, hi, lo, x *Buffer, n int) error {
	const op = "SplitBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n); err != nil {
		return err
	}
	N := int64(n)
	if err := needAll(op, 2, "hi", hi, N, "lo", lo, N); err != nil {
		return err
	}
	if err := need(op, "x", x, N, 4); err != nil {
		return err
	}
	return d.lib.check("mk_split_bf16", d.lib.splitBF16(s.handle(), hi.ptr, lo.ptr, x.ptr, N))
}

// FillF32 writes out [n] = v.
func (d *Device) FillF32(s *Stream, out *Buffer, n int, v float32) error {
	const op = "FillF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n); err != nil {
		return err
	}
	if err := needAll(op, 4, "out", out, int64(n)); err != nil {
		return err
	}
	return d.lib.check("mk_fill_f32", d.lib.fillF32(s.handle(), out.ptr, int64(n), math.Float32bits(v)))
}

// AddF32 writes out [n] = a + b.
func (d *Device) AddF32(s *Stream, out, a, b *Buffer, n int) error {
	const op = "AddF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n); err != nil {
		return err
	}
	N := int64(n)
	if err := needAll(op, 4, "out", out, N, "a", a, N, "b", b, N); err != nil {
		return err
	}
	return d.lib.check("mk_add_f32", d.lib.addF32(s.handle(), out.ptr, a.ptr, b.ptr, N))
}

// ClampF32 writes out [n] = clamp(x, -limit, limit).
func (d *Device) ClampF32(s *Stream, out, x *Buffer, n int, limit float32) error {
	const op = "ClampF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n); err != nil {
		return err
	}
	N := int64(n)
	if err := needAll(op, 4, "out", out, N, "x", x, N); err != nil {
		return err
	}
	return d.lib.check("mk_clamp_f32", d.lib.clampF32(s.handle(), out.ptr, x.ptr, N, math.Float32bits(limit)))
}

// BiasAddF32 adds bias [cols] to every row of x [rows, cols] in place.
func (d *Device) BiasAddF32(s *Stream, x, bias *Buffer, rows, cols int) error {
	const op = "BiasAddF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "cols", cols); err != nil {
		return err
	}
	if err := needAll(op, 4, "x", x, int64(rows)*int64(cols), "bias", bias, int64(cols)); err != nil {
		return err
	}
	return d.lib.check("mk_bias_add_f32", d.lib.biasAddF32(s.handle(), x.ptr, bias.ptr, int64(rows), int64(cols)))
}

// SwiGLUF32 writes out [t, inter] from in [t, 2*inter] = [gate | up]:
// silu(gate)*up, or with clamped the gpt-oss form (see SwiGLUClamped).
func (d *Device) SwiGLUF32(s *Stream, out, in *Buffer, t, inter int, clamped bool, alpha, limit float32) error {
	const op = "SwiGLUF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "T", t, "I", inter); err != nil {
		return err
	}
	n := int64(t) * int64(inter)
	if err := needAll(op, 4, "out", out, n, "in", in, 2*n); err != nil {
		return err
	}
	kind := int32(0)
	if clamped {
		kind = 1
	}
	return d.lib.check("mk_swiglu_f32", d.lib.swigluF32(s.handle(), out.ptr, in.ptr, int64(t), int64(inter),
		kind, math.Float32bits(alpha), math.Float32bits(limit)))
}

// RoPEF32 rotates x [t, heads*headDim] in place (see RoPE): angle
// float32(invFreq[j]·float32(pos)), cos/sin from float64 rounded to float32
// and scaled by attnFactor, products rounded separately.
func (d *Device) RoPEF32(s *Stream, x, pos *Buffer, t, heads, headDim, rotDim int, style RoPEStyle,
	invFreq *Buffer, attnFactor float32) error {
	const op = "RoPEF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "T", t, "heads", heads, "headDim", headDim, "rotDim", rotDim); err != nil {
		return err
	}
	if rotDim%2 != 0 || rotDim > headDim {
		return fmt.Errorf("kernels: %s: rotDim=%d must be even and at most headDim=%d", op, rotDim, headDim)
	}
	if err := needAll(op, 4, "x", x, int64(t)*int64(heads)*int64(headDim), "pos", pos, int64(t),
		"invFreq", invFreq, int64(rotDim/2)); err != nil {
		return err
	}
	return d.lib.check("mk_rope_f32", d.lib.ropeF32(s.handle(), x.ptr, pos.ptr, int64(t), int64(heads),
		int64(headDim), int64(rotDim), int32(style), invFreq.ptr, math.Float32bits(attnFactor)))
}

// NormRoPEMaxHeadDim is the largest head dimension NormRoPEF32 takes.
const NormRoPEMaxHeadDim = 256

// NormRoPEPart is one tensor of a NormRoPEF32 launch: Out and X [t,
// Heads*headDim], and the norm weight W [headDim] (nil: no norm). OutBF16
// (the first part only; nil: none) [t, Heads*headDim] bf16 gets Out rounded
// to bf16 as well.
type NormRoPEPart struct {
	Out, X, W *Buffer
	Heads     int
	OutBF16   *Buffer
}

// NormRoPEF32 is Out = RoPEF32 of RMSNormF32(X, W) with W applied to each
// head (eps) for one or two parts (q and k) in one launch, out of place.
// Exact (fast false): the arithmetic of the two calls per element (the
// float64 sum of squares in another order). fast: float32 sums, rsqrtf and
// sincosf, a few ulp from the exact values. headDim ≤ NormRoPEMaxHeadDim.
func (d *Device) NormRoPEF32(s *Stream, parts []NormRoPEPart, pos *Buffer, t, headDim, rotDim int, style RoPEStyle,
	invFreq *Buffer, attnFactor, eps float32, fast bool) error {
	const op = "NormRoPEF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if len(parts) < 1 || len(parts) > 2 {
		return fmt.Errorf("kernels: %s: %d parts (want 1 or 2)", op, len(parts))
	}
	if err := positive(op, "T", t, "headDim", headDim, "rotDim", rotDim); err != nil {
		return err
	}
	if rotDim%2 != 0 || rotDim > headDim || headDim > NormRoPEMaxHeadDim {
		return fmt.Errorf("kernels: %s: rotDim=%d must be even and at most headDim=%d (at most %d)", op, rotDim,
			headDim, NormRoPEMaxHeadDim)
	}
	if err := needAll(op, 4, "pos", pos, int64(t), "invFreq", invFreq, int64(rotDim/2)); err != nil {
		return err
	}
	var ptr [2][3]uint64
	var heads [2]int64
	var outb uint64
	for i, p := range parts {
		name := fmt.Sprintf("part %d", i)
		if err := positive(op, name+" heads", p.Heads); err != nil {
			return err
		}
		n := int64(t) * int64(p.Heads) * int64(headDim)
		if err := needAll(op, 4, name+" out", p.Out, n, name+" x", p.X, n); err != nil {
			return err
		}
		if p.W != nil {
			if err := need(op, name+" w", p.W, int64(headDim), 4); err != nil {
				return err
			}
			ptr[i][2] = p.W.ptr
		}
		if p.OutBF16 != nil {
			if i > 0 {
				return fmt.Errorf("kernels: %s: only the first part takes OutBF16", op)
			}
			if err := need(op, name+" outBF16", p.OutBF16, n, 2); err != nil {
				return err
			}
			outb = p.OutBF16.ptr
		}
		ptr[i][0], ptr[i][1], heads[i] = p.Out.ptr, p.X.ptr, int64(p.Heads)
	}
	var flags int32
	if fast {
		flags = 1 // MK_NORM_ROPE_FAST
	}
	return d.lib.check("mk_norm_rope_f32", d.lib.normRopeF32(s.handle(), ptr[0][0], ptr[0][1], ptr[0][2], heads[0],
		ptr[1][0], ptr[1][1], ptr[1][2], heads[1], pos.ptr, int64(t), int64(headDim), int64(rotDim), int32(style),
		invFreq.ptr, math.Float32bits(attnFactor), math.Float32bits(eps), flags, outb))
}

// ColCopy describes one strided column copy: dst[r*DstLd + h*DstHead +
// DstOff + c] = src[r*SrcLd + h*SrcHead + SrcOff + c] for r < Rows,
// h < Heads, c < Width. SrcHead 0 broadcasts one source head to all.
type ColCopy struct {
	DstLd, DstOff, DstHead int
	SrcLd, SrcOff, SrcHead int
	Rows, Heads, Width     int
}

// CopyColsF32 runs one ColCopy from src to dst (float32). The caller
// guarantees the index ranges fit the buffers (they are checked by the
// largest index touched).
func (d *Device) CopyColsF32(s *Stream, dst, src *Buffer, c ColCopy) error {
	return d.copyCols("CopyColsF32", s, dst, 4, src, c)
}

// CopyColsBF16 is CopyColsF32 into a bf16 dst, each value rounded to
// nearest even (ABI 24): a concatenation built in bf16 for the tensor
// cores without a float32 copy first.
func (d *Device) CopyColsBF16(s *Stream, dst, src *Buffer, c ColCopy) error {
	if int64(c.Heads)*int64(c.Width) >= 1<<31 {
		return fmt.Errorf("kernels: CopyColsBF16: heads %d × width %d is 2^31 or more", c.Heads, c.Width)
	}
	return d.copyCols("CopyColsBF16", s, dst, 2, src, c)
}

// copyCols checks a ColCopy into dst of dsize-byte elements and runs it.
func (d *Device) copyCols(op string, s *Stream, dst *Buffer, dsize int64, src *Buffer, c ColCopy) error {
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", c.Rows, "heads", c.Heads, "width", c.Width); err != nil {
		return err
	}
	last := func(ld, off, hs int) int64 {
		return int64(c.Rows-1)*int64(ld) + int64(c.Heads-1)*int64(hs) + int64(off) + int64(c.Width)
	}
	if err := need(op, "dst", dst, last(c.DstLd, c.DstOff, c.DstHead), dsize); err != nil {
		return err
	}
	if err := need(op, "src", src, last(c.SrcLd, c.SrcOff, c.SrcHead), 4); err != nil {
		return err
	}
	args := []int64{int64(c.DstLd), int64(c.DstOff), int64(c.DstHead), int64(c.SrcLd), int64(c.SrcOff),
		int64(c.SrcHead), int64(c.Rows), int64(c.Heads), int64(c.Width)}
	if dsize == 2 {
		return d.lib.check("mk_copy_cols_bf16", d.lib.copyColsBF16(s.handle(), dst.ptr, args[0], args[1], args[2],
			src.ptr, args[3], args[4], args[5], args[6], args[7], args[8]))
	}
	return d.lib.check("mk_copy_cols_f32", d.lib.copyColsF32(s.handle(), dst.ptr, args[0], args[1], args[2],
		src.ptr, args[3], args[4], args[5], args[6], args[7], args[8]))
}

// GatherRowsF32 writes dst [n, cols] (float32) = rows idx [n] (int32) of
// src [srcRows, cols] of type st (F32 or BF16); an index outside
// [0, srcRows) gives a row of NaN.
func (d *Device) GatherRowsF32(s *Stream, dst, src *Buffer, st DType, idx *Buffer, n, cols, srcRows int) error {
	const op = "GatherRowsF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n, "cols", cols, "srcRows", srcRows); err != nil {
		return err
	}
	if st != F32 && st != BF16 {
		return fmt.Errorf("kernels: %s: source type %d", op, st)
	}
	if err := need(op, "src", src, int64(srcRows)*int64(cols), st.size()); err != nil {
		return err
	}
	if err := needAll(op, 4, "dst", dst, int64(n)*int64(cols), "idx", idx, int64(n)); err != nil {
		return err
	}
	return d.lib.check("mk_gather_rows_f32", d.lib.gatherRowsF32(s.handle(), dst.ptr, src.ptr, int32(st), idx.ptr,
		int64(n), int64(cols), int64(srcRows)))
}

// GatherRowsFeedF32 is GatherRowsF32 with fed rows: idx holds 2n ids, the
// host's [0, n) then feed rows [n, 2n). Row i gathers row idx[i] of src, or,
// when feed row f = idx[n+i] ≥ 0, the token the previous step sampled for
// its row f: word 0 of row f of picks [pickRows, SampleResultWords] (what
// SampleF32 wrote). An id outside [0, srcRows) or f ≥ pickRows gives a row
// of NaN.
func (d *Device) GatherRowsFeedF32(s *Stream, dst, src *Buffer, st DType, idx, picks *Buffer, pickRows, n, cols, srcRows int) error {
	const op = "GatherRowsFeedF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n, "cols", cols, "srcRows", srcRows, "pickRows", pickRows); err != nil {
		return err
	}
	if st != F32 && st != BF16 {
		return fmt.Errorf("kernels: %s: source type %d", op, st)
	}
	if err := need(op, "src", src, int64(srcRows)*int64(cols), st.size()); err != nil {
		return err
	}
	if err := needAll(op, 4, "dst", dst, int64(n)*int64(cols), "idx", idx, 2*int64(n),
		"picks", picks, int64(pickRows)*SampleResultWords); err != nil {
		return err
	}
	return d.lib.check("mk_gather_rows_feed_f32", d.lib.gatherFeedF32(s.handle(), dst.ptr, src.ptr, int32(st), idx.ptr,
		picks.ptr, SampleResultWords, int64(pickRows), int64(n), int64(cols), int64(srcRows)))
}

// ScatterAddRowsF32 adds w[i]·src[i, :] to out[idx[i], :] for i < n (atomic
// float32 adds: the order of the additions is not fixed). idx must lie in
// out's rows (outRows).
func (d *Device) ScatterAddRowsF32(s *Stream, out, src, idx, w *Buffer, n, cols, outRows int) error {
	const op = "ScatterAddRowsF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n, "cols", cols, "outRows", outRows); err != nil {
		return err
	}
	N := int64(n)
	if err := needAll(op, 4, "out", out, int64(outRows)*int64(cols), "src", src, N*int64(cols), "idx", idx, N,
		"w", w, N); err != nil {
		return err
	}
	return d.lib.check("mk_scatter_add_rows_f32", d.lib.scatterAddF32(s.handle(), out.ptr, src.ptr, idx.ptr, w.ptr,
		N, int64(cols)))
}

// GatedAddF32 adds sigmoid(gate[r])·x[r, :] to out [rows, cols]; a nil gate
// adds x.
func (d *Device) GatedAddF32(s *Stream, out, x, gate *Buffer, rows, cols int) error {
	const op = "GatedAddF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "rows", rows, "cols", cols); err != nil {
		return err
	}
	n := int64(rows) * int64(cols)
	if err := needAll(op, 4, "out", out, n, "x", x, n); err != nil {
		return err
	}
	var g uint64
	if gate != nil {
		if err := need(op, "gate", gate, int64(rows), 4); err != nil {
			return err
		}
		g = gate.ptr
	}
	return d.lib.check("mk_gated_add_f32", d.lib.gatedAddF32(s.handle(), out.ptr, x.ptr, g, int64(rows), int64(cols)))
}

// KVWriteF32 stores k [n, kw] and v [n, vw] at pool rows slots [n] (int32)
// of poolK [poolRows, kw] and poolV [poolRows, vw]. Slots are trusted to lie
// in the pool (the caller computes them from its block tables).
func (d *Device) KVWriteF32(s *Stream, poolK, poolV, k, v, slots *Buffer, n, kw, vw int) error {
	const op = "KVWriteF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n, "kw", kw, "vw", vw); err != nil {
		return err
	}
	N := int64(n)
	if err := needAll(op, 4, "poolK", poolK, int64(kw), "poolV", poolV, int64(vw), "k", k, N*int64(kw),
		"v", v, N*int64(vw), "slots", slots, N); err != nil {
		return err
	}
	return d.lib.check("mk_kv_write_f32", d.lib.kvWriteF32(s.handle(), poolK.ptr, poolV.ptr, k.ptr, v.ptr, slots.ptr,
		N, int64(kw), int64(vw)))
}

// AttnArgs are the shapes of AttentionF32.
type AttnArgs struct {
	Heads, KVHeads, HeadDim, VHeadDim int
	BlockSize                         int
	Scale                             float32
	Window                            int // 0: full causal
}

// AttentionF32 runs paged causal attention for n query rows: row b is q/out
// row rows[b] at position pos[b], reading its keys through
// blocks[table[b] + j/BlockSize] (all int32 buffers). sinks [Heads] may be
// nil. Block ids and positions are trusted (the caller builds them).
func (d *Device) AttentionF32(s *Stream, out, q, poolK, poolV, rows, pos, table, blocks, sinks *Buffer,
	n int, a AttnArgs) error {
	const op = "AttentionF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := positive(op, "n", n, "heads", a.Heads, "kvHeads", a.KVHeads, "headDim", a.HeadDim,
		"vHeadDim", a.VHeadDim, "blockSize", a.BlockSize); err != nil {
		return err
	}
	if a.Heads%a.KVHeads != 0 || a.Window < 0 {
		return fmt.Errorf("kernels: %s: heads %d / kv heads %d, window %d", op, a.Heads, a.KVHeads, a.Window)
	}
	N := int64(n)
	if err := needAll(op, 4, "q", q, int64(a.Heads*a.HeadDim), "out", out, int64(a.Heads*a.VHeadDim),
		"poolK", poolK, int64(a.KVHeads*a.HeadDim), "poolV", poolV, int64(a.KVHeads*a.VHeadDim),
		"rows", rows, N, "pos", pos, N, "table", table, N, "blocks", blocks, int64(1)); err != nil {
		return err
	}
	var sk uint64
	if sinks != nil {
		if err := need(op, "sinks", sinks, int64(a.Heads), 4); err != nil {
			return err
		}
		sk = sinks.ptr
	}
	return d.lib.check("mk_attention_f32", d.lib.attentionF32(s.handle(), out.ptr, q.ptr, poolK.ptr, poolV.ptr,
		rows.ptr, pos.ptr, table.ptr, blocks.ptr, N, int32(a.Heads), int32(a.KVHeads), int32(a.HeadDim),
		int32(a.VHeadDim), int32(a.BlockSize), math.Float32bits(a.Scale), int32(a.Window), sk))
}
