package linalg

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
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

// fp4Group writes the FP4 group of the 32 bf16 values src (the upper
// halves of float32s) to q (fp4GroupBytes) and reports true, or reports
// false if FP4 cannot hold them exactly. Writing each nonzero value as
// m·2^p with m odd, the scale is 2^s for the smallest p, s, and every
// value must be 1, 2, 4 or 8 (m = 1) or 3, 6 or 12 (m = 3) times it: a
// doubled E2M1 value.
func fp4Group(q []byte, src []uint16) bool {
	var m [Q8Group]uint32
	var p [Q8Group]int
	s := math.MaxInt
	for i, b := range src {
		e, f := int(b>>7&0xFF), uint32(b&0x7F)
		switch {
		case e == 0xFF: // an infinity or a NaN
			return false
		case e == 0 && f == 0: // ±0
			continue
		case e == 0: // subnormal: f·2^-133
			e = 1
		default:
			f |= 0x80
		}
		tz := bits.TrailingZeros32(f)
		m[i], p[i] = f>>tz, e-134+tz
		s = min(s, p[i])
	}
	if s == math.MaxInt { // all zero
		s = 0
	}
	var codes [Q8Group]byte
	for i, mi := range m {
		if mi == 0 {
			continue
		}
		sh := p[i] - s
		if mi > 3 || mi == 2 || sh > 3 || (mi == 3 && sh > 2) {
			return false
		}
		codes[i] = fp4Code(int(mi << sh))
		if src[i]&0x8000 != 0 {
			codes[i] |= 8
		}
	}
	for i := 0; i < Q8Group; i += 2 {
		q[i/2] = codes[i] | codes[i+1]<<4
	}
	binary.LittleEndian.PutUint32(q[Q8Group/2:], math.Float32bits(float32(math.Ldexp(1, s))))
	return true
}

// fp4Code is the code of the doubled E2M1 magnitude c (1, 2, 3, 4, 6, 8
// or 12), its sign bit clear.
func fp4Code(c int) byte {
	switch c {
	case 6:
		return 5
	case 8:
		return 6
	case 12:
		return 7
	}
	return byte(c)
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
	for g := 0; g < N*K/Q8Group; g++ {
		if !fp4Group(dst[g*fp4GroupBytes:(g+1)*fp4GroupBytes], src[g*Q8Group:(g+1)*Q8Group]) {
			return false
		}
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
	var q [fp4GroupBytes]byte
	for g := 0; g < N*K; g += Q8Group {
		if !fp4Group(q[:], src[g:g+Q8Group]) {
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
