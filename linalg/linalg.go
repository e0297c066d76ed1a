// Package linalg is the pure-Go float32 linear algebra used by the CPU
// backend and the reference implementations: a parallel, cache-blocked
// GEMM in the layout that Hugging Face Linear weights use.
package linalg

import (
	"runtime"
	"sync"
)

// MatMulT computes dst = a·bᵀ: a [M, K], b [N, K], dst [M, N] (row-major).
// dst is overwritten.
func MatMulT(dst, a, b []float32, M, N, K int) {
	if len(a) < M*K || len(b) < N*K || len(dst) < M*N {
		panic("linalg.MatMulT: slice shorter than shape")
	}
	parallelFor(N, func(n0, n1 int) {
		for m := 0; m < M; m++ {
			ar := a[m*K : m*K+K]
			for n := n0; n < n1; n++ {
				dst[m*N+n] = Dot(ar, b[n*K:n*K+K])
			}
		}
	})
}

// Dot is Σ a[i]*b[i] over len(a) elements.
func Dot(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// parallelFor splits [0, n) into contiguous chunks run on all cores.
func parallelFor(n int, f func(lo, hi int)) {
	w := runtime.GOMAXPROCS(0)
	if w > n {
		w = n
	}
	if w <= 1 {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	chunk := (n + w - 1) / w
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() { defer wg.Done(); f(lo, hi) }()
	}
	wg.Wait()
}
