package linalg

import (
	"fmt"

	"github.com/mkserve/mkserve/tensor"
)

// The two halves of attention over a cache of rows (attention.Causal): the
// scores of one query row against many key rows (DotRow), and the weighted
// sum of many value rows (AccumRows). Both read rows ld elements apart (a
// KV head's rows in a [tokens, heads·D] cache) and compute every output
// element the same way whatever N or M is, so a row's results do not
// depend on how many rows come with it.

// DotRow sets dst[j] = Σ_{k<K} a[k]·b[j·ldb+k] for j < N: the dot products
// of one row a with N rows of b, ldb apart. On AVX2 the 1-row dot kernels of
// MatMulT's dot path run (8-lane accumulators, two copies), then the K&^7
// tail; elsewhere a Go loop. It panics if a slice is shorter than its shape.
func DotRow(dst, a, b []float32, ldb, N, K int) {
	var ks *dotSet[float32]
	if avx2Kernels != nil {
		ks = &avx2Kernels.dotSet
	}
	dotRowOf("DotRow", dst, a, b, ldb, N, K, ks, func(row []float32) []float32 { return row })
}

// dotRowOf is DotRow for b of element type E: ks its 1-row dot kernels
// (nil: none here), widen a tail of a row of b as float32.
func dotRowOf[E float32 | uint16](op string, dst, a []float32, b []E, ldb, N, K int, ks *dotSet[E], widen func(row []E) []float32) {
	if N < 0 || K < 0 || ldb < K || len(dst) < N || len(a) < K || (N > 0 && len(b) < (N-1)*ldb+K) {
		panic(fmt.Sprintf("linalg.%s: N=%d K=%d ldb=%d with len(dst)=%d len(a)=%d len(b)=%d", op, N, K, ldb,
			len(dst), len(a), len(b)))
	}
	if N == 0 {
		return
	}
	clear(dst[:N])
	K8 := 0
	if useAsm && ks != nil && K >= 8 {
		K8 = K &^ 7
		j := 0
		if nt := N / ks.gemvN; nt > 0 {
			ks.gemv(&a[0], K, &b[0], ldb, K8, &dst[0], N, nt)
			j = nt * ks.gemvN
		}
		for j < N {
			r := min(ks.nr, N-j)
			ks.k[0][r-1](&a[0], K, &b[j*ldb], ldb, K8, &dst[j], N, 1)
			j += r
		}
	}
	if K8 == K {
		return
	}
	ar := a[K8:K]
	for j := range N {
		dst[j] += Dot(ar, widen(b[j*ldb+K8:j*ldb+K]))
	}
}

// AccumRows adds Σ_{j<M} p[j]·x[j·ldx+c] to y[c] for c < n: the rows of x,
// ldx apart, weighted by p. Each column is summed in row order (on AVX2
// with one FMA a row, the columns in 8-lane registers for all M rows). It
// panics if a slice is shorter than its shape.
func AccumRows(y, p, x []float32, ldx, M, n int) {
	accumRowsOf("AccumRows", y, p, x, ldx, M, n, avx2Accum, func(x float32) float32 { return x })
}

// accumRowsOf is AccumRows for x of element type E: ks its kernels by
// width, widest first (empty: none here), f an element's float32 value.
func accumRowsOf[E float32 | uint16](op string, y, p []float32, x []E, ldx, M, n int, ks []struct {
	n int
	f func(y *float32, p *float32, x *E, ldx int, m int)
}, f func(E) float32) {
	if M < 0 || n < 0 || ldx < n || len(y) < n || len(p) < M || (M > 0 && len(x) < (M-1)*ldx+n) {
		panic(fmt.Sprintf("linalg.%s: M=%d n=%d ldx=%d with len(y)=%d len(p)=%d len(x)=%d", op, M, n, ldx,
			len(y), len(p), len(x)))
	}
	if M == 0 || n == 0 {
		return
	}
	c := 0
	if useAsm {
		for _, k := range ks {
			for ; c+k.n <= n; c += k.n {
				k.f(&y[c], &p[0], &x[c], ldx, M)
			}
		}
	}
	for ; c < n; c++ {
		s := y[c]
		for j := range M {
			s += p[j] * f(x[j*ldx+c])
		}
		y[c] = s
	}
}

// DotRowBF16 is DotRow with b in bf16 (the upper halves of float32s): the
// same sums as DotRow on the widened rows, bit for bit, reading half the
// bytes (MatMulTBF16's 1-row dot kernels).
func DotRowBF16(dst, a []float32, b []uint16, ldb, N, K int) {
	var row []float32 // (the Go path: every column is the tail)
	dotRowOf("DotRowBF16", dst, a, b, ldb, N, K, avx2DotBF, func(r []uint16) []float32 {
		if cap(row) < len(r) {
			row = make([]float32, len(r))
		}
		row = row[:len(r)]
		WidenBF16(row, r)
		return row
	})
}

// AccumRowsBF16 is AccumRows with x in bf16: the same sums as AccumRows on
// the widened rows, bit for bit, reading half the bytes.
func AccumRowsBF16(y, p []float32, x []uint16, ldx, M, n int) {
	accumRowsOf("AccumRowsBF16", y, p, x, ldx, M, n, avx2AccumBF, tensor.BF16ToF32)
}
