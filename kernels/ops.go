package kernels

import (
	"fmt"
	"math"
)

// DType is the element type of an op's output where it has a choice.
type DType int32

// Output element types (MK_DTYPE_*).
const (
	BF16 DType = 0
	F32  DType = 1
)

func (t DType) size() int64 {
	if t == F32 {
		return 4
	}
	return 2
}

// RoPEStyle says which dimensions a rotation pairs (MK_ROPE_*).
type RoPEStyle int32

const (
	// RoPENeoX pairs dimension i with i+rotDim/2.
	RoPENeoX RoPEStyle = 0
	// RoPEInterleaved pairs dimension 2i with 2i+1.
	RoPEInterleaved RoPEStyle = 1
)

// dims checks that every named dimension is in [1, MaxInt32].
func dims(op string, kv ...any) error {
	for i := 0; i+1 < len(kv); i += 2 {
		v := kv[i+1].(int)
		if v <= 0 || v > math.MaxInt32 {
			return fmt.Errorf("kernels: %s: %s=%d must be in [1, 2^31)", op, kv[i], v)
		}
	}
	return nil
}

// need checks that buffer `name` of op holds elems elements of size bytes.
func need(op, name string, b *Buffer, elems, size int64) error {
	if b == nil || b.ptr == 0 {
		return fmt.Errorf("kernels: %s: %s is a nil or freed buffer", op, name)
	}
	if elems > b.bytes/size {
		return fmt.Errorf("kernels: %s: %s holds %d bytes, %d elements of %d bytes needed", op, name, b.bytes, elems, size)
	}
	return nil
}

// Gemm computes c [m,n] = a [m,k] · b [n,k]ᵀ on stream s: bf16 operands,
// float32 accumulation, c of type ct (BF16 or F32).
func (d *Device) Gemm(s *Stream, c *Buffer, ct DType, a, b *Buffer, m, n, k int) error {
	return d.gemm("Gemm", s, c, ct, BF16, a, b, m, n, k, false)
}

// GemmAdd is Gemm accumulating into c: c [m,n] += a [m,k] · b [n,k]ᵀ (bf16
// operands, float32 accumulation, c of type ct).
func (d *Device) GemmAdd(s *Stream, c *Buffer, ct DType, a, b *Buffer, m, n, k int) error {
	return d.gemm("GemmAdd", s, c, ct, BF16, a, b, m, n, k, true)
}

// GemmF32 computes c [m,n] = a [m,k] · b [n,k]ᵀ with float32 a, b and c in
// full FP32 (cuBLAS compute type 32F, never TF32).
func (d *Device) GemmF32(s *Stream, c, a, b *Buffer, m, n, k int) error {
	return d.gemm("GemmF32", s, c, F32, F32, a, b, m, n, k, false)
}

var gemmHeads func(stream, a, b, c uint64, abDtype int32, m, n, k, heads int64, accumulate int32) int32

func init() { registerSymbols(symbol{"mk_gemm_heads", &gemmHeads}) }

// GemmHeads is a Linear per head: for h < heads, c's columns h*n..h*n+n-1
// [m, n] (+)= a's columns h*k..h*k+k-1 [m, k] · (b's rows h*n..h*n+n-1
// [n, k])ᵀ, with a [m, heads*k] and b [heads*n, k] both of type abt (BF16
// with float32 accumulation, or F32 in full FP32) and c [m, heads*n]
// float32; acc adds to c. MLA's absorbed projections (q_nope·W_UK and the
// latent outputs through W_UV, per head).
func (d *Device) GemmHeads(s *Stream, c *Buffer, abt DType, a, b *Buffer, m, n, k, heads int, acc bool) error {
	const op = "GemmHeads"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "M", m, "N", n, "K", k, "heads", heads); err != nil {
		return err
	}
	if abt != BF16 && abt != F32 {
		return fmt.Errorf("kernels: %s: operand type %d is neither BF16 nor F32", op, abt)
	}
	M, N, K, H := int64(m), int64(n), int64(k), int64(heads)
	if err := need(op, "A", a, M*H*K, abt.size()); err != nil {
		return err
	}
	if err := need(op, "B", b, H*N*K, abt.size()); err != nil {
		return err
	}
	if err := need(op, "C", c, M*H*N, 4); err != nil {
		return err
	}
	accumulate := int32(0)
	if acc {
		accumulate = 1
	}
	return d.lib.check("mk_gemm_heads", gemmHeads(s.handle(), a.ptr, b.ptr, c.ptr, int32(abt), M, N, K, H, accumulate))
}

// GemvMaxRows is the most rows of A that GemvBF16 (and MoERouterF32) take.
const GemvMaxRows = 8

// GemvBF16 is the skinny GEMM of decode batches: c [m,n] f32 = a [m,k] bf16
// · b [n,k]ᵀ bf16 for 1 ≤ m ≤ GemvMaxRows, one warp per row of b streaming
// it (gemv.cu), float32 products and sums. k must be a multiple of 8 and a
// and b 16-byte aligned; c is overwritten. Where cuBLASLt's kernels for
// these shapes take several times the time of b's bytes, this one reads b
// at close to the memory's rate.
func (d *Device) GemvBF16(s *Stream, c, a, b *Buffer, m, n, k int) error {
	const op = "GemvBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "M", m, "N", n, "K", k); err != nil {
		return err
	}
	if m > GemvMaxRows || k%8 != 0 {
		return fmt.Errorf("kernels: %s: M=%d K=%d (want M ≤ %d, K a multiple of 8)", op, m, k, GemvMaxRows)
	}
	M, N, K := int64(m), int64(n), int64(k)
	if err := needAll(op, 2, "A", a, M*K, "B", b, N*K); err != nil {
		return err
	}
	if err := need(op, "C", c, M*N, 4); err != nil {
		return err
	}
	return d.lib.check("mk_gemv_bf16", gemvBF16(s.handle(), c.ptr, a.ptr, b.ptr, M, N, K))
}

// SkinnyMaxRows is the most rows of A that GemmSkinnyBF16 takes.
const SkinnyMaxRows = 64

// GemmSkinnyBF16 is the dense GEMM of decode batches of a few to 64 rows:
// c [m,n] f32 = a [m,k] bf16 · b [n,k]ᵀ bf16 (+ bias [n] f32 when not nil)
// on the expert GEMM's weight-streaming tensor-core tiles (moe.cu: 16 or 32
// rows × 64 columns, a 6-stage cp.async ring), which read b once per launch
// where cuBLASLt's kernels for these shapes read it at 1–1.5 TB/s (ncu,
// ninth pass). Each output is the same float32 sum in the same order
// whatever m is. n and k must be multiples of 8, a and b 16-byte aligned;
// c is overwritten; work holds SkinnyWorkspace bytes (nil when that is 0):
// a launch's 64-column tiles are split over k into enough CTAs for two
// waves, and a second launch sums the splits. Without the split (one
// "expert", N/64 CTAs) it lost to cuBLASLt in whole decode steps; with it,
// it is as fast or faster at 4–32 rows (docs/PERF.md, ninth pass).
func (d *Device) GemmSkinnyBF16(s *Stream, c, a, b, bias, work *Buffer, m, n, k int) error {
	const op = "GemmSkinnyBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "M", m, "N", n, "K", k); err != nil {
		return err
	}
	if m > SkinnyMaxRows || n%8 != 0 || k%8 != 0 {
		return fmt.Errorf("kernels: %s: M=%d N=%d K=%d (want M ≤ %d, N and K multiples of 8)", op, m, n, k, SkinnyMaxRows)
	}
	M, N, K := int64(m), int64(n), int64(k)
	if err := needAll(op, 2, "A", a, M*K, "B", b, N*K); err != nil {
		return err
	}
	if err := need(op, "C", c, M*N, 4); err != nil {
		return err
	}
	var bp uint64
	if bias != nil {
		if err := need(op, "bias", bias, N, 4); err != nil {
			return err
		}
		bp = bias.ptr
	}
	if a.ptr%16 != 0 || b.ptr%16 != 0 {
		return fmt.Errorf("kernels: %s: A and B must be 16-byte aligned", op)
	}
	var wp, wn uint64
	if work != nil {
		if err := work.fits("GemmSkinnyBF16 workspace", 0); err != nil {
			return err
		}
		wp, wn = work.ptr, uint64(work.bytes)
	}
	return d.lib.check("mk_gemm_skinny_bf16", gemmSkinny(s.handle(), c.ptr, a.ptr, b.ptr, bp, M, N, K, wp, wn))
}

// SkinnyWorkspace is the workspace (bytes) GemmSkinnyBF16 needs for (m, n,
// k): 0 when it runs as one launch, else the partial sums of its split over
// k (m·n float32s a split).
func (d *Device) SkinnyWorkspace(m, n, k int) (int64, error) {
	const op = "SkinnyWorkspace"
	if err := d.ready(op); err != nil {
		return 0, err
	}
	if err := dims(op, "M", m, "N", n, "K", k); err != nil {
		return 0, err
	}
	type key struct{ m, n, k int }
	return query(d, op, key{m, n, k}, func() (int64, error) {
		var b uint64
		err := d.lib.check("mk_gemm_skinny_workspace", gemmSkinnyWS(int64(m), int64(n), int64(k), &b))
		return int64(b), err
	})
}

// GemvMaxOuts is the most projections one GemvBF16Multi launch takes.
const GemvMaxOuts = 3

// GemvOut is one projection of GemvBF16Multi: C [m, N] f32 = a · B [N, k]ᵀ
// bf16, plus Bias [N] f32 when not nil.
type GemvOut struct {
	C, B, Bias *Buffer
	N          int
}

// GemvBF16Multi runs GemvBF16 for up to GemvMaxOuts projections of the same
// a [m, k] bf16 in one launch (q, k and v of a decode step), each with an
// optional float32 bias. Every B must be 16-byte aligned.
func (d *Device) GemvBF16Multi(s *Stream, a *Buffer, m, k int, outs []GemvOut) error {
	const op = "GemvBF16Multi"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "M", m, "K", k); err != nil {
		return err
	}
	if m > GemvMaxRows || k%8 != 0 || len(outs) == 0 || len(outs) > GemvMaxOuts {
		return fmt.Errorf("kernels: %s: M=%d K=%d, %d projections (want M ≤ %d, K a multiple of 8, 1 to %d projections)",
			op, m, k, len(outs), GemvMaxRows, GemvMaxOuts)
	}
	M, K := int64(m), int64(k)
	if err := need(op, "A", a, M*K, 2); err != nil {
		return err
	}
	var c, b, bias [GemvMaxOuts]uint64
	var n [GemvMaxOuts]int64
	for i, o := range outs {
		name := fmt.Sprintf("projection %d", i)
		if err := dims(op, name+" N", o.N); err != nil {
			return err
		}
		N := int64(o.N)
		if err := needAll(op, 2, name+" B", o.B, N*K); err != nil {
			return err
		}
		if err := need(op, name+" C", o.C, M*N, 4); err != nil {
			return err
		}
		if o.Bias != nil {
			if err := need(op, name+" bias", o.Bias, N, 4); err != nil {
				return err
			}
			bias[i] = o.Bias.ptr
		}
		c[i], b[i], n[i] = o.C.ptr, o.B.ptr, N
	}
	return d.lib.check("mk_gemv_bf16_multi", gemvMulti(s.handle(), a.ptr, M, K, c[0], b[0], bias[0], n[0],
		c[1], b[1], bias[1], n[1], c[2], b[2], bias[2], n[2]))
}

// gemm checks and runs one GEMM: operands of type abt, c of type ct.
func (d *Device) gemm(op string, s *Stream, c *Buffer, ct, abt DType, a, b *Buffer, m, n, k int, acc bool) error {
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "M", m, "N", n, "K", k); err != nil {
		return err
	}
	if ct != BF16 && ct != F32 {
		return fmt.Errorf("kernels: %s: output type %d is neither BF16 nor F32", op, ct)
	}
	M, N, K := int64(m), int64(n), int64(k)
	if err := need(op, "A", a, M*K, abt.size()); err != nil {
		return err
	}
	if err := need(op, "B", b, N*K, abt.size()); err != nil {
		return err
	}
	if err := need(op, "C", c, M*N, ct.size()); err != nil {
		return err
	}
	accumulate := int32(0)
	if acc {
		accumulate = 1
	}
	if abt == F32 {
		return d.lib.check("mk_gemm_f32", d.lib.gemmF32(s.handle(), a.ptr, b.ptr, c.ptr, M, N, K, accumulate))
	}
	return d.lib.check("mk_gemm_bf16", d.lib.gemm(s.handle(), a.ptr, b.ptr, c.ptr, int32(ct), M, N, K, accumulate))
}

// RMSNorm writes out [rows, cols] = x / rms(x over each group of `group`
// columns) * w [group]; cols must be a multiple of group, and out may be x.
func (d *Device) RMSNorm(s *Stream, out, x, w *Buffer, rows, cols, group int, eps float32) error {
	const op = "RMSNorm"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "rows", rows, "cols", cols, "group", group); err != nil {
		return err
	}
	if cols%group != 0 {
		return fmt.Errorf("kernels: RMSNorm: cols=%d is not a multiple of group=%d", cols, group)
	}
	if !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return fmt.Errorf("kernels: RMSNorm: eps=%g must be finite and non-negative", eps)
	}
	n := int64(rows) * int64(cols)
	if err := need(op, "x", x, n, 2); err != nil {
		return err
	}
	if err := need(op, "out", out, n, 2); err != nil {
		return err
	}
	if err := need(op, "w", w, int64(group), 2); err != nil {
		return err
	}
	return d.lib.check("mk_rmsnorm_bf16", d.lib.rmsnorm(s.handle(), out.ptr, x.ptr, w.ptr,
		int64(rows), int64(cols), int64(group), math.Float32bits(eps)))
}

// AddRMSNorm adds x into resid [rows, cols] (rounded to bf16), then writes
// out = rmsnorm(resid) * w [cols].
func (d *Device) AddRMSNorm(s *Stream, resid, x, w, out *Buffer, rows, cols int, eps float32) error {
	const op = "AddRMSNorm"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "rows", rows, "cols", cols); err != nil {
		return err
	}
	if !(eps >= 0) || math.IsInf(float64(eps), 0) {
		return fmt.Errorf("kernels: AddRMSNorm: eps=%g must be finite and non-negative", eps)
	}
	n := int64(rows) * int64(cols)
	for _, b := range []struct {
		name string
		b    *Buffer
		n    int64
	}{{"resid", resid, n}, {"x", x, n}, {"out", out, n}, {"w", w, int64(cols)}} {
		if err := need(op, b.name, b.b, b.n, 2); err != nil {
			return err
		}
	}
	return d.lib.check("mk_add_rmsnorm_bf16", d.lib.addRMSNorm(s.handle(), resid.ptr, x.ptr, w.ptr, out.ptr,
		int64(rows), int64(cols), math.Float32bits(eps)))
}

// Embedding writes out [n, hidden] = rows ids [n] (int32) of table
// [vocab, hidden]. An id outside [0, vocab) gives a row of NaN.
func (d *Device) Embedding(s *Stream, out, table, ids *Buffer, n, hidden, vocab int) error {
	const op = "Embedding"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "n", n, "hidden", hidden, "vocab", vocab); err != nil {
		return err
	}
	if err := need(op, "out", out, int64(n)*int64(hidden), 2); err != nil {
		return err
	}
	if err := need(op, "table", table, int64(vocab)*int64(hidden), 2); err != nil {
		return err
	}
	if err := need(op, "ids", ids, int64(n), 4); err != nil {
		return err
	}
	return d.lib.check("mk_embedding_bf16", d.lib.embedding(s.handle(), out.ptr, table.ptr, ids.ptr,
		int64(n), int64(hidden), int64(vocab)))
}

// SwiGLU writes out [t, inter] = silu(gate) * up from in [t, 2*inter] laid
// out as [gate | up].
func (d *Device) SwiGLU(s *Stream, out, in *Buffer, t, inter int) error {
	const op = "SwiGLU"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "T", t, "I", inter); err != nil {
		return err
	}
	if err := need(op, "in", in, 2*int64(t)*int64(inter), 2); err != nil {
		return err
	}
	if err := need(op, "out", out, int64(t)*int64(inter), 2); err != nil {
		return err
	}
	return d.lib.check("mk_swiglu_bf16", d.lib.swiglu(s.handle(), out.ptr, in.ptr, int64(t), int64(inter)))
}

// SwiGLUClamped is gpt-oss's activation: g = min(gate, limit),
// u = clamp(up, -limit, limit), out = (u+1) * g * sigmoid(alpha*g).
// interleaved: gate and up alternate in in's columns (gate first), as in the
// gpt-oss checkpoints; otherwise in is [gate | up].
func (d *Device) SwiGLUClamped(s *Stream, out, in *Buffer, t, inter int, alpha, limit float32, interleaved bool) error {
	const op = "SwiGLUClamped"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "T", t, "I", inter); err != nil {
		return err
	}
	if math.IsNaN(float64(alpha)) || math.IsInf(float64(alpha), 0) || !(limit > 0) {
		return fmt.Errorf("kernels: SwiGLUClamped: alpha=%g must be finite and limit=%g positive", alpha, limit)
	}
	if err := need(op, "in", in, 2*int64(t)*int64(inter), 2); err != nil {
		return err
	}
	if err := need(op, "out", out, int64(t)*int64(inter), 2); err != nil {
		return err
	}
	il := int32(0)
	if interleaved {
		il = 1
	}
	return d.lib.check("mk_swiglu_oss_bf16", d.lib.swigluOSS(s.handle(), out.ptr, in.ptr, int64(t), int64(inter),
		math.Float32bits(alpha), math.Float32bits(limit), il))
}

// RoPE rotates, in place, the first rotDim dims of every head of
// x [t, heads*headDim], row r at position pos[r] (int32 [t]): the angle is
// float32(pos)·invFreq[j] (float32 [rotDim/2] on the device) and cos/sin
// are scaled by attnFactor.
func (d *Device) RoPE(s *Stream, x, pos *Buffer, t, heads, headDim, rotDim int, style RoPEStyle,
	invFreq *Buffer, attnFactor float32) error {
	const op = "RoPE"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := dims(op, "T", t, "heads", heads, "headDim", headDim, "rotDim", rotDim); err != nil {
		return err
	}
	if rotDim%2 != 0 || rotDim > headDim {
		return fmt.Errorf("kernels: RoPE: rotDim=%d must be even and at most headDim=%d", rotDim, headDim)
	}
	if style != RoPENeoX && style != RoPEInterleaved {
		return fmt.Errorf("kernels: RoPE: unknown style %d", style)
	}
	if math.IsNaN(float64(attnFactor)) || math.IsInf(float64(attnFactor), 0) {
		return fmt.Errorf("kernels: RoPE: attnFactor=%g is not finite", attnFactor)
	}
	if err := need(op, "x", x, int64(t)*int64(heads)*int64(headDim), 2); err != nil {
		return err
	}
	if err := need(op, "pos", pos, int64(t), 4); err != nil {
		return err
	}
	if err := need(op, "invFreq", invFreq, int64(rotDim/2), 4); err != nil {
		return err
	}
	return d.lib.check("mk_rope_bf16", d.lib.rope(s.handle(), x.ptr, pos.ptr, int64(t), int64(heads),
		int64(headDim), int64(rotDim), int32(style), invFreq.ptr, math.Float32bits(attnFactor)))
}

// ConvertF32ToBF16 rounds n float32 values of src to bf16 in dst (nearest even).
func (d *Device) ConvertF32ToBF16(s *Stream, dst, src *Buffer, n int) error {
	const op = "ConvertF32ToBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("kernels: %s: n=%d", op, n)
	}
	if err := need(op, "src", src, int64(n), 4); err != nil {
		return err
	}
	if err := need(op, "dst", dst, int64(n), 2); err != nil {
		return err
	}
	return d.lib.check("mk_convert_f32_to_bf16", d.lib.f32ToBF16(s.handle(), dst.ptr, src.ptr, int64(n)))
}

// ConvertBF16ToF32 widens n bf16 values of src to float32 in dst.
func (d *Device) ConvertBF16ToF32(s *Stream, dst, src *Buffer, n int) error {
	const op = "ConvertBF16ToF32"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("kernels: %s: n=%d", op, n)
	}
	if err := need(op, "src", src, int64(n), 2); err != nil {
		return err
	}
	if err := need(op, "dst", dst, int64(n), 4); err != nil {
		return err
	}
	return d.lib.check("mk_convert_bf16_to_f32", d.lib.bf16ToF32(s.handle(), dst.ptr, src.ptr, int64(n)))
}
