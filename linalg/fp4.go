package linalg

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/mkserve/mkserve/tensor"
)

// FP4 matrices: a row-major [N, K] matrix of E2M1 values (MXFP4's
// elements: 0, ½, 1, 1½, 2, 3, 4, 6 and their negatives) in groups of
// Q8Group along each row, every group scaled by a float32. A row is
// FP4RowBytes(K) bytes: its K/Q8Group groups, each 16 bytes of 4-bit codes
// (element 2i in the low nibble of byte i, 2i+1 in the high one) followed
// by the group's scale (little-endian float32, 20 bytes a group: 5 bits a
// value). Code c stands for fp4Codes[c] (the E2M1 value doubled, an
// integer), and element (n, k) is float32(fp4Codes[code]) ·
// scale[n][k/Q8Group], the product rounded to float32 (exact for the
// power-of-two scales FP4 is built with).
//
// FP4 holds only values it holds exactly: MXFP4 checkpoints (gpt-oss's
// experts, dequantized to bf16 as they load) convert back without loss, at
// 5/16 of bf16's bytes.

// fp4Codes are the values of the 16 codes: E2M1 doubled (sign in bit 3),
// as the kernels' codebook holds them.
var fp4Codes = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// fp4GroupBytes is the size of an FP4 group: its codes and its scale.
const fp4GroupBytes = Q8Group/2 + 4

// FP4RowBytes is the size of an FP4 row of k values (k a multiple of
// Q8Group).
func FP4RowBytes(k int) int { return k / Q8Group * fp4GroupBytes }

// fp4Scale reports whether every value of group g is an E2M1 value times
// one power of two, and that power halved (the scale of the doubled
// codes): writing each nonzero value as m·2^p with m odd, s is the
// smallest p, and each value must be 1, 2, 4 or 8 (m = 1) or 3, 6 or 12
// (m = 3) times 2^s.
func fp4Scale(g []float32) (s int, ok bool) {
	s, ok = exactScale(g) // the smallest p, with every value within 7 bits of it
	if !ok {
		return 0, false
	}
	for _, v := range g {
		if v == 0 {
			continue
		}
		c := math.Abs(float64(v)) / math.Ldexp(1, s)
		switch c {
		case 1, 2, 3, 4, 6, 8, 12:
		default:
			return 0, false
		}
	}
	return s, true
}

// fp4Code is the code of the doubled E2M1 value c (an integer, |c| ≤ 12,
// one of the codebook's).
func fp4Code(c int) byte {
	var code byte
	if c < 0 {
		code, c = 8, -c
	}
	switch c {
	case 0, 1, 2, 3, 4:
		return code | byte(c)
	case 6:
		return code | 5
	case 8:
		return code | 6
	}
	return code | 7 // 12
}

// QuantizeFP4BF16 fills dst (N·FP4RowBytes(K) bytes) with the FP4 form of
// the bf16 matrix src [N, K] (the upper halves of float32s) and reports
// true, or reports false at the first group FP4 cannot hold exactly (dst
// is then partly written). It panics if K is not a multiple of Q8Group or a
// slice is short.
func QuantizeFP4BF16(dst []byte, src []uint16, N, K int) bool {
	if N < 0 || K < 0 || K%Q8Group != 0 || len(dst) < N*FP4RowBytes(K) || len(src) < N*K {
		panic(fmt.Sprintf("linalg.QuantizeFP4BF16: N=%d K=%d (a multiple of %d) with %d FP4 bytes and %d values", N, K, Q8Group, len(dst), len(src)))
	}
	var v [Q8Group]float32
	for g := 0; g < N*K/Q8Group; g++ {
		for i, b := range src[g*Q8Group : (g+1)*Q8Group] {
			v[i] = tensor.BF16ToF32(b)
		}
		s, ok := fp4Scale(v[:])
		if !ok {
			return false
		}
		q := dst[g*fp4GroupBytes : (g+1)*fp4GroupBytes]
		scale := math.Ldexp(1, s)
		for i := 0; i < Q8Group; i += 2 {
			q[i/2] = fp4Code(int(float64(v[i])/scale)) | fp4Code(int(float64(v[i+1])/scale))<<4
		}
		binary.LittleEndian.PutUint32(q[Q8Group/2:], math.Float32bits(float32(scale)))
	}
	return true
}

// FP4ExactBF16 reports whether QuantizeFP4BF16 would take the bf16 matrix
// src [N, K]; it stops at the first group it would not (a plain bf16
// weight fails at once).
func FP4ExactBF16(src []uint16, N, K int) bool {
	if K%Q8Group != 0 || len(src) < N*K {
		return false
	}
	var v [Q8Group]float32
	for g := 0; g < N*K; g += Q8Group {
		for i, b := range src[g : g+Q8Group] {
			v[i] = tensor.BF16ToF32(b)
		}
		if _, ok := fp4Scale(v[:]); !ok {
			return false
		}
	}
	return true
}

// DequantFP4 writes the float32 values of the FP4 matrix b [N, K] to dst.
func DequantFP4(dst []float32, b []byte, N, K int) {
	if N < 0 || K < 0 || K%Q8Group != 0 || len(b) < N*FP4RowBytes(K) || len(dst) < N*K {
		panic(fmt.Sprintf("linalg.DequantFP4: N=%d K=%d with %d FP4 bytes and %d values", N, K, len(b), len(dst)))
	}
	if N*K == 0 {
		return
	}
	if useAsm && avx2DotFP4 != nil {
		widenfp4(&dst[0], &b[0], N*K)
		return
	}
	for g := 0; g < N*K/Q8Group; g++ {
		q := b[g*fp4GroupBytes : (g+1)*fp4GroupBytes]
		s := math.Float32frombits(binary.LittleEndian.Uint32(q[Q8Group/2:]))
		for i, c := range q[:Q8Group/2] {
			dst[g*Q8Group+2*i] = float32(fp4Codes[c&15]) * s
			dst[g*Q8Group+2*i+1] = float32(fp4Codes[c>>4]) * s
		}
	}
}

// MatMulTFP4 computes dst = a·bᵀ like MatMulT, with b [N, K] an FP4
// matrix (K a multiple of Q8Group): the result is MatMulT's on the
// dequantized b to float32 rounding (the FP4 kernels' tiles are smaller
// than MatMulT's, so their sums pair up differently), while b's bytes read
// are 5/16 of bf16's. Below panelMinM rows of a the AVX2 dot kernels
// decode b as they stream it; from there on each goroutine dequantizes
// bfBlock rows of b at a time for the packed kernels.
func MatMulTFP4(dst, a []float32, b []byte, M, N, K int) {
	matMulGrouped("MatMulTFP4", dst, a, b, M, N, K, fp4GroupBytes, avx2DotFP4, DequantFP4)
}
