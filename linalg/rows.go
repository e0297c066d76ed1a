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
	if N < 0 || K < 0 || ldb < K || len(dst) < N || len(a) < K || (N > 0 && len(b) < (N-1)*ldb+K) {
		panic(fmt.Sprintf("linalg.DotRow: N=%d K=%d ldb=%d with len(dst)=%d len(a)=%d len(b)=%d", N, K, ldb,
			len(dst), len(a), len(b)))
	}
	if N == 0 {
		return
	}
	clear(dst[:N])
	K8 := 0
	if useAsm && K >= 8 {
		K8 = K &^ 7
		ks := &avx2Kernels.dotSet
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
		dst[j] += Dot(ar, b[j*ldb+K8:j*ldb+K])
	}
}

// AccumRows adds Σ_{j<M} p[j]·x[j·ldx+c] to y[c] for c < n: the rows of x,
// ldx apart, weighted by p. Each column is summed in row order (on AVX2
// with one FMA a row, the columns in 8-lane registers for all M rows). It
// panics if a slice is shorter than its shape.
func AccumRows(y, p, x []float32, ldx, M, n int) {
	if M < 0 || n < 0 || ldx < n || len(y) < n || len(p) < M || (M > 0 && len(x) < (M-1)*ldx+n) {
		panic(fmt.Sprintf("linalg.AccumRows: M=%d n=%d ldx=%d with len(y)=%d len(p)=%d len(x)=%d", M, n, ldx,
			len(y), len(p), len(x)))
	}
	if M == 0 || n == 0 {
		return
	}
	c := 0
	if useAsm {
		for _, k := range avx2Accum {
			for ; c+k.n <= n; c += k.n {
				k.f(&y[c], &p[0], &x[c], ldx, M)
			}
		}
	}
	for ; c < n; c++ {
		s := y[c]
		for j := range M {
			s += p[j] * x[j*ldx+c]
		}
		y[c] = s
	}
}

// DotRowBF16 is DotRow with b in bf16 (the upper halves of float32s): the
// same sums as DotRow on the widened rows, bit for bit, reading half the
// bytes (MatMulTBF16's 1-row dot kernels).
func DotRowBF16(dst, a []float32, b []uint16, ldb, N, K int) {
	if N < 0 || K < 0 || ldb < K || len(dst) < N || len(a) < K || (N > 0 && len(b) < (N-1)*ldb+K) {
		panic(fmt.Sprintf("linalg.DotRowBF16: N=%d K=%d ldb=%d with len(dst)=%d len(a)=%d len(b)=%d", N, K, ldb,
			len(dst), len(a), len(b)))
	}
	if N == 0 {
		return
	}
	clear(dst[:N])
	K8 := 0
	if useAsm && avx2DotBF != nil && K >= 8 {
		K8 = K &^ 7
		ks := avx2DotBF
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
	row := make([]float32, K-K8) // (the Go path: every column is the tail)
	ar := a[K8:K]
	for j := range N {
		WidenBF16(row, b[j*ldb+K8:j*ldb+K])
		dst[j] += Dot(ar, row)
	}
}

// AccumRowsBF16 is AccumRows with x in bf16: the same sums as AccumRows on
// the widened rows, bit for bit, reading half the bytes.
func AccumRowsBF16(y, p []float32, x []uint16, ldx, M, n int) {
	if M < 0 || n < 0 || ldx < n || len(y) < n || len(p) < M || (M > 0 && len(x) < (M-1)*ldx+n) {
		panic(fmt.Sprintf("linalg.AccumRowsBF16: M=%d n=%d ldx=%d with len(y)=%d len(p)=%d len(x)=%d", M, n, ldx,
			len(y), len(p), len(x)))
	}
	if M == 0 || n == 0 {
		return
	}
	c := 0
	if useAsm {
		for _, k := range avx2AccumBF {
			for ; c+k.n <= n; c += k.n {
				k.f(&y[c], &p[0], &x[c], ldx, M)
			}
		}
	}
	for ; c < n; c++ {
		s := y[c]
		for j := range M {
			s += p[j] * tensor.BF16ToF32(x[j*ldx+c])
		}
		y[c] = s
	}
}
