package linalg

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/mkserve/mkserve/tensor"
)

// Q8 matrices: a row-major [N, K] matrix of int8 values in groups of
// Q8Group along each row, every group scaled by a float32. A row is
// Q8RowBytes(K) bytes: its K/Q8Group groups, each Q8Group int8 values
// followed by their scale (little-endian float32, 36 bytes a group), so a
// row is one contiguous stream for the dot kernels and any whole number of
// groups can be cut from it. Element (n, k) is float32(q[n][k]) ·
// scale[n][k/Q8Group], the product rounded to float32; K must be a
// multiple of Q8Group.
//
// A group is quantized exactly where it can be: when every value is an
// integer multiple of one power of two 2^s with |value| ≤ 127·2^s, the
// scale is 2^s and the values are kept bit for bit. MXFP4 checkpoints
// (gpt-oss's experts: E2M1 values, which are multiples of ½, times a
// power-of-two scale per 32) are exact throughout, at half the bytes of
// bf16. Other groups are scaled by absmax/127 and rounded to nearest: an
// element's error is at most absmax/254 of its group (plus the rounding of
// the scale itself, where it is a subnormal float32).

// Q8Group is the number of consecutive values of a row that share a scale.
const Q8Group = 32

// Q8RowBytes is the size of a Q8 row of k values (k a multiple of Q8Group).
func Q8RowBytes(k int) int { return k / Q8Group * q8GroupBytes }

// q8GroupBytes is the size of a group: its values and its scale.
const q8GroupBytes = Q8Group + 4

// exactScale reports whether the group g can be held exactly, and the
// power of two 2^s it would be scaled by. Writing each nonzero value as
// m·2^p with m odd, s is the smallest p, and the group is exact when every
// |value|/2^s = m·2^(p−s) is at most 127: when the highest bit of any
// value lies at most 7 above s. An all-zero group is exact; one holding an
// infinity or a NaN is not.
func exactScale(g []float32) (s int, ok bool) {
	lo, hi := math.MaxInt, math.MinInt
	for _, v := range g {
		b := math.Float32bits(v)
		e, m := int(b>>23&0xFF), b&(1<<23-1)
		switch {
		case e == 0xFF:
			return 0, false
		case e == 0 && m == 0: // ±0
			continue
		case e == 0: // subnormal: m·2^-149
			e = 1
		default:
			m |= 1 << 23
		}
		p := e - 150
		lo = min(lo, p+bits.TrailingZeros32(m))
		hi = max(hi, p+bits.Len32(m)) // one above the highest bit
		if hi-lo > 7 {
			return 0, false
		}
	}
	if lo == math.MaxInt {
		return 0, true
	}
	return lo, true
}

// quantizeGroup writes group g's int8 values to q and returns its scale,
// and whether the group is exact.
func quantizeGroup(q []byte, g []float32) (scale float32, exact bool) {
	if s, ok := exactScale(g); ok {
		scale = float32(math.Ldexp(1, s))
		if s < -126 { // 1/scale is past float32's range
			for i, v := range g {
				q[i] = byte(int8(v / scale))
			}
			return scale, true
		}
		inv := float32(math.Ldexp(1, -s)) // v·inv is exact: a small integer
		for i, v := range g {
			q[i] = byte(int8(v * inv))
		}
		return scale, true
	}
	var bmax uint32 // the largest |value|'s bits (bit order is magnitude order; a NaN's are above all)
	for _, v := range g {
		bmax = max(bmax, math.Float32bits(v)&^(1<<31))
	}
	amax := math.Float32frombits(bmax)
	if bmax >= 0x7F800000 { // an infinity or a NaN: no int8 holds the group
		clear(q[:len(g)])
		return amax, false
	}
	scale, inv := amax/127, 127/amax
	if math.IsInf(float64(inv), 0) { // a group of tiny values (amax below 127/MaxFloat32): in float64
		inv64 := 127 / float64(amax)
		for i, v := range g {
			q[i] = byte(int8(math.Round(float64(v) * inv64)))
		}
		return scale, false
	}
	for i, v := range g {
		r := v * inv
		half := math.Float32frombits(0x3F000000 | math.Float32bits(r)&(1<<31)) // ±½ with r's sign: to nearest, halves away from zero (no branch on the sign)
		q[i] = byte(int8(min(127, max(-127, int32(r+half)))))
	}
	return scale, false
}

// QuantizeQ8 fills dst (N·Q8RowBytes(K) bytes) with the Q8 form of src
// [N, K] and reports whether every group was exact. It panics if K is not
// a multiple of Q8Group or a slice is short.
func QuantizeQ8(dst []byte, src []float32, N, K int) (exact bool) {
	checkQ8("QuantizeQ8", len(dst), len(src), N, K)
	exact = true
	for g := 0; g < N*K/Q8Group; g++ {
		q := dst[g*q8GroupBytes : (g+1)*q8GroupBytes]
		s, ok := quantizeGroup(q, src[g*Q8Group:(g+1)*Q8Group])
		binary.LittleEndian.PutUint32(q[Q8Group:], math.Float32bits(s))
		exact = exact && ok
	}
	return exact
}

// QuantizeQ8BF16 is QuantizeQ8 for bf16 src (the upper halves of float32s).
func QuantizeQ8BF16(dst []byte, src []uint16, N, K int) (exact bool) {
	checkQ8("QuantizeQ8BF16", len(dst), len(src), N, K)
	var v [Q8Group]float32
	exact = true
	for g := 0; g < N*K/Q8Group; g++ {
		for i, b := range src[g*Q8Group : (g+1)*Q8Group] {
			v[i] = tensor.BF16ToF32(b)
		}
		q := dst[g*q8GroupBytes : (g+1)*q8GroupBytes]
		s, ok := quantizeGroup(q, v[:])
		binary.LittleEndian.PutUint32(q[Q8Group:], math.Float32bits(s))
		exact = exact && ok
	}
	return exact
}

// Q8ExactBF16 reports whether QuantizeQ8BF16 would hold every value of
// the bf16 matrix src [N, K] exactly; it stops at the first group that it
// would not (a plain bf16 weight fails at once). K must be a multiple of
// Q8Group.
func Q8ExactBF16(src []uint16, N, K int) bool {
	if K%Q8Group != 0 || len(src) < N*K {
		return false
	}
	var g [Q8Group]float32
	for k := 0; k < N*K; k += Q8Group {
		for i, b := range src[k : k+Q8Group] {
			g[i] = tensor.BF16ToF32(b)
		}
		if _, ok := exactScale(g[:]); !ok {
			return false
		}
	}
	return true
}

// checkQ8 panics unless a Q8 matrix of dstLen bytes and srcLen values can
// hold [N, K].
func checkQ8(op string, qLen, vLen, N, K int) {
	if N < 0 || K < 0 || K%Q8Group != 0 || qLen < N*Q8RowBytes(K) || vLen < N*K {
		panic(fmt.Sprintf("linalg.%s: N=%d K=%d (a multiple of %d) with %d Q8 bytes and %d values", op, N, K, Q8Group, qLen, vLen))
	}
}

// DequantQ8 writes the float32 values of the Q8 matrix q [N, K] to dst.
func DequantQ8(dst []float32, q []byte, N, K int) {
	checkQ8("DequantQ8", len(q), len(dst), N, K)
	ld := Q8RowBytes(K)
	for n := range N {
		dequantRow(dst[n*K:(n+1)*K], q[n*ld:(n+1)*ld], K)
	}
}

// dequantRow writes the K values of the Q8 row q to dst.
func dequantRow(dst []float32, q []byte, K int) {
	if K == 0 {
		return
	}
	if useAsm && avx2DotQ8 != nil {
		widenq8(&dst[0], &q[0], K)
		return
	}
	for g := 0; g < K/Q8Group; g++ {
		grp := q[g*q8GroupBytes : (g+1)*q8GroupBytes]
		s := math.Float32frombits(binary.LittleEndian.Uint32(grp[Q8Group:]))
		for i, b := range grp[:Q8Group] {
			dst[g*Q8Group+i] = float32(int8(b)) * s
		}
	}
}

// MatMulTQ8 computes dst = a·bᵀ like MatMulT, with b [N, K] a Q8 matrix
// (K a multiple of Q8Group): the result is MatMulT's on the dequantized b,
// bit for bit, while b's bytes read are 9/32 of float32's (9/16 of
// bf16's). Below panelMinM rows of a (decode) the AVX2 dot kernels
// dequantize b as they stream it; from there on (prefill) each goroutine
// dequantizes bfBlock rows of b at a time into a float32 buffer that the
// packed kernels read.
func MatMulTQ8(dst, a []float32, b []byte, M, N, K int) {
	matMulGrouped("MatMulTQ8", dst, a, b, M, N, K, q8GroupBytes, avx2DotQ8, DequantQ8)
}

// matMulGrouped is MatMulTQ8 and MatMulTFP4: b [N, K] in groups of
// Q8Group values of groupBytes bytes each, ks its dot kernels (nil: none
// on this machine), dequant its rows' float32 values.
func matMulGrouped(op string, dst, a []float32, b []byte, M, N, K, groupBytes int, ks *dotSet[byte],
	dequant func(dst []float32, b []byte, N, K int)) {
	if K%Q8Group != 0 {
		panic(fmt.Sprintf("linalg.%s: K=%d is not a multiple of %d", op, K, Q8Group))
	}
	ld := K / Q8Group * groupBytes
	bRows := N
	if ld > 0 {
		bRows = len(b) / ld
	}
	g, w, mAlign, ok := begin(op, dst, a, bRows*K, M, N, K)
	if !ok {
		return
	}
	defer g.done()
	var dot func(m0, m1, n0, n1 int)
	if useAsm && ks != nil {
		dot = func(m0, m1, n0, n1 int) { runDotGrouped(g, b, groupBytes, ks, m0, m1, n0, n1) }
	}
	g.runWidened(w, mAlign, dot, func(dst []float32, n0, n1 int) { dequant(dst, b[n0*ld:n1*ld], n1-n0, K) })
}

// runDotGrouped computes dst[m0:m1, n0:n1] with the dot kernels ks of a
// grouped format (groups of Q8Group values in groupBytes bytes), blocked as
// runDotOf blocks the float32 kernels (so that the Q8 sums are theirs).
func runDotGrouped(g *gemm, b []byte, groupBytes int, ks *dotSet[byte], m0, m1, n0, n1 int) {
	if m0 >= m1 || n0 >= n1 {
		return
	}
	N, K := g.N, g.K
	ld := K / Q8Group * groupBytes
	mr, nr := ks.mr, ks.nr
	kc := blockK // a multiple of Q8Group
	if m1-m0 <= mr {
		kc = K // b is read once: no reuse to block for
	}
	// at is row n of b from column k (a group boundary).
	at := func(n, k int) *byte { return &b[n*ld+k/Q8Group*groupBytes] }
	for k0 := 0; k0 < K; k0 += kc {
		kk := min(kc, K-k0)
		if m1-m0 == 1 {
			ap, c := &g.a[m0*K+k0], g.dst[m0*N:]
			n := n0
			if nt := (n1 - n0) / ks.gemvN; nt > 0 {
				ks.gemv(ap, K, at(n, k0), ld, kk, &c[n], N, nt)
				n += nt * ks.gemvN
			}
			for ; n < n1; n += nr {
				ks.k[0][min(nr, n1-n)-1](ap, K, at(n, k0), ld, kk, &c[n], N, 1)
			}
			continue
		}
		for nb := n0; nb < n1; nb += blockN {
			ne := min(nb+blockN, n1)
			for m := m0; m < m1; m += mr {
				row := ks.k[min(mr, m1-m)-1]
				ap, c := &g.a[m*K+k0], g.dst[m*N:]
				n := nb
				if nt := (ne - nb) / nr; nt > 0 {
					row[nr-1](ap, K, at(n, k0), ld, kk, &c[n], N, nt)
					n += nt * nr
				}
				if n < ne {
					row[ne-n-1](ap, K, at(n, k0), ld, kk, &c[n], N, 1)
				}
			}
		}
	}
}
