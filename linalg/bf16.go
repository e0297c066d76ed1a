package linalg

import "github.com/mkserve/mkserve/tensor"

// bfBlock is the rows of b one goroutine widens to float32 at a time for
// the packed path (MatMulTBF16 from panelMinM rows of a): a multiple of
// the dot path's blockN and the packed path's blockNP, so the blocks split
// the columns exactly where MatMulT's own blocking does.
const bfBlock = 48

// MatMulTBF16 computes dst = a·bᵀ like MatMulT, with b [N, K] in bf16: each
// element the upper 16 bits of a float32 (safetensors' BF16). The result is
// MatMulT's on the widened b, bit for bit, while b's bytes read are half.
// Below panelMinM rows of a (decode) the AVX2 dot kernels widen b as they
// stream it; from there on (prefill), each goroutine widens bfBlock rows of
// b at a time into a float32 buffer that the packed kernels read, once for
// all of a's panels.
func MatMulTBF16(dst, a []float32, b []uint16, M, N, K int) {
	g, w, mAlign, ok := begin("MatMulTBF16", dst, a, len(b), M, N, K)
	if !ok {
		return
	}
	defer g.done()
	var dot func(m0, m1, n0, n1 int)
	if useAsm && avx2DotBF != nil {
		dot = func(m0, m1, n0, n1 int) {
			runDotOf(g, b, avx2DotBF, m0, m1, n0, n1)
			tailKOf(g, b, tensor.BF16ToF32, m0, m1, n0, n1)
		}
	}
	g.runWidened(w, mAlign, dot, func(dst []float32, n0, n1 int) { WidenBF16(dst, b[n0*K:n1*K]) })
}

// runWidened computes g (begun by begin, on w goroutines) for a b held in
// another form than float32: dot (nil: none here) computes dst[m0:m1,
// n0:n1] straight from that form on the dot path; widen writes rows [n0,
// n1) of b as float32 to dst. Below panelMinM rows of a the dot path runs;
// from there on each goroutine widens bfBlock rows of b at a time into a
// float32 buffer that the packed kernels read, once for all of a's panels
// (or, when the rows of a are split over the goroutines, all of b at once).
func (g *gemm) runWidened(w, mAlign int, dot func(m0, m1, n0, n1 int), widen func(dst []float32, n0, n1 int)) {
	M, N, K := g.M, g.N, g.K
	packed := g.mf > 0
	// run computes dst[m0:m1, n0:n1] (MatMulT's gemm.run).
	run := func(m0, m1, n0, n1 int) {
		if !packed && dot != nil {
			dot(m0, m1, n0, n1)
			return
		}
		buf := getBuf(min(bfBlock, n1-n0) * K)
		defer putBuf(buf)
		for nb := n0; nb < n1; nb += bfBlock {
			ne := min(nb+bfBlock, n1)
			widen(buf[:(ne-nb)*K], nb, ne)
			h := *g
			h.b, h.bOff = buf, nb
			h.run(m0, m1, nb, ne)
		}
	}
	switch {
	case w <= 1:
		run(0, M, 0, N)
	case N >= 24*w || M < 2*mAlign*w:
		parallelFor(N, 12, w, func(n0, n1 int) { run(0, M, n0, n1) })
	default: // rows split over the goroutines: each reads all of b, so widen it once
		buf := getBuf(N * K)
		defer putBuf(buf)
		parallelFor(N, 1, w, func(n0, n1 int) { widen(buf[n0*K:n1*K], n0, n1) })
		g.b = buf
		parallelFor(M, mAlign, w, func(m0, m1 int) { g.run(m0, m1, 0, N) })
	}
}

// WidenBF16 writes the float32 values of src's bf16 elements to dst
// (len(dst) ≥ len(src)), with the AVX2 kernel where there is one.
func WidenBF16(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	i := 0
	if n := len(src) &^ 31; n > 0 && useAsm && avx2DotBF != nil {
		widenbf16(&dst[0], &src[0], n)
		i = n
	}
	for ; i < len(src); i++ {
		dst[i] = tensor.BF16ToF32(src[i])
	}
}

// Weights is a row-major matrix held as float32 values (F32), as bf16
// values (BF16, the upper halves of float32s, as BF16 checkpoints store
// them), as a Q8 matrix (Q8) or as an FP4 matrix (FP4): exactly one is
// set.
type Weights struct {
	F32  []float32
	BF16 []uint16
	Q8   []byte
	FP4  []byte
}

// Len is the number of values.
func (w Weights) Len() int {
	switch {
	case w.BF16 != nil:
		return len(w.BF16)
	case w.Q8 != nil:
		return len(w.Q8) / q8GroupBytes * Q8Group
	case w.FP4 != nil:
		return len(w.FP4) / fp4GroupBytes * Q8Group
	}
	return len(w.F32)
}

// Forms is the number of forms set (1 for a valid matrix).
func (w Weights) Forms() int {
	n := 0
	for _, set := range []bool{w.F32 != nil, w.BF16 != nil, w.Q8 != nil, w.FP4 != nil} {
		if set {
			n++
		}
	}
	return n
}

// Grouped reports whether w is held in groups of Q8Group values along its
// rows (Q8 or FP4), whose rows must be whole groups.
func (w Weights) Grouped() bool { return w.Q8 != nil || w.FP4 != nil }

// Block is values [i·n, i·n+n), capped so it cannot reach the next block
// (for Q8 and FP4, n is a whole number of rows).
func (w Weights) Block(i, n int) Weights {
	switch {
	case w.BF16 != nil:
		return Weights{BF16: w.BF16[i*n : i*n+n : i*n+n]}
	case w.Q8 != nil:
		nb := n / Q8Group * q8GroupBytes
		return Weights{Q8: w.Q8[i*nb : i*nb+nb : i*nb+nb]}
	case w.FP4 != nil:
		nb := n / Q8Group * fp4GroupBytes
		return Weights{FP4: w.FP4[i*nb : i*nb+nb : i*nb+nb]}
	}
	return Weights{F32: w.F32[i*n : i*n+n : i*n+n]}
}

// MulT sets dst = a·wᵀ for a [M, K] and w [N, K]: MatMulT, MatMulTBF16
// (the same values, bit for bit, reading half the bytes), MatMulTQ8 or
// MatMulTFP4.
func (w Weights) MulT(dst, a []float32, M, N, K int) {
	switch {
	case w.BF16 != nil:
		MatMulTBF16(dst, a, w.BF16, M, N, K)
	case w.Q8 != nil:
		MatMulTQ8(dst, a, w.Q8, M, N, K)
	case w.FP4 != nil:
		MatMulTFP4(dst, a, w.FP4, M, N, K)
	default:
		MatMulT(dst, a, w.F32, M, N, K)
	}
}
