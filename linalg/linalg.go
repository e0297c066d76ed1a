// Package linalg is the pure-Go float32 linear algebra used by the CPU
// backend and the reference implementations: a parallel, cache-blocked
// GEMM in the layout that Hugging Face Linear weights use.
//
// MatMulT runs AVX2/FMA assembly micro-kernels (kernels_amd64.s, generated
// by gen_kernels.go) when the CPU has them, and portable Go kernels
// otherwise; both share one blocking and threading driver.
package linalg

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// kernel adds to c (row stride ldc) the mr×(nr·nt) dot products of mr rows
// of a (row stride lda) with nr·nt rows of b (row stride ldb) over their
// first n elements: nt tiles of nr rows of b, side by side in c. mr and nr
// are fixed per kernel; n is a positive multiple of 8 and nt ≥ 1.
type kernel func(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

// tileKernels holds one kernel per tile shape, indexed [mr-1][nr-1]; the
// full tile is tileM×tileN and the others cover the edges.
type tileKernels [tileM][tileN]kernel

const (
	tileM = 4 // rows of a per micro-tile
	tileN = 3 // rows of b per micro-tile
	gemvN = 4 // rows of b per GEMV kernel call (M = 1)
)

// Blocking parameters, in elements: a block of kc columns of a tile's rows
// of a stays in L1 while nc rows of b (kc columns each) stream from L2.
var (
	blockK = 1024
	blockN = 48
	// parallelMin is the smallest M·N·K worth splitting over goroutines.
	parallelMin = 1 << 16
)

// useAsm selects the assembly kernels; tests switch it off to check the Go path.
var useAsm = hasAVX2

// MatMulT computes dst = a·bᵀ: a [M, K], b [N, K], dst [M, N] (row-major).
// dst is overwritten. It panics if a slice is shorter than its shape.
func MatMulT(dst, a, b []float32, M, N, K int) {
	if M < 0 || N < 0 || K < 0 || len(a) < M*K || len(b) < N*K || len(dst) < M*N {
		panic(fmt.Sprintf("linalg.MatMulT: M=%d N=%d K=%d with len(a)=%d len(b)=%d len(dst)=%d", M, N, K, len(a), len(b), len(dst)))
	}
	if M == 0 || N == 0 {
		return
	}
	clear(dst[:M*N])
	if K == 0 {
		return
	}
	ks, gemv := &goKernels, kernel(goGEMV)
	if useAsm {
		ks, gemv = &avx2Kernels, avx2GEMV
	}
	g := gemm{dst: dst, a: a, b: b, M: M, N: N, K: K, ks: ks, gemv: gemv}
	w := runtime.GOMAXPROCS(0)
	if M*N*K < parallelMin {
		w = 1
	}
	switch {
	case w <= 1:
		g.run(0, M, 0, N)
	case N >= 24*w || M < 2*tileM*w:
		// Split the output columns; chunks are whole micro-tiles.
		parallelFor(N, 12, w, func(n0, n1 int) { g.run(0, M, n0, n1) })
	default:
		parallelFor(M, tileM, w, func(m0, m1 int) { g.run(m0, m1, 0, N) })
	}
}

// gemm is one MatMulT call.
type gemm struct {
	dst, a, b []float32
	M, N, K   int
	ks        *tileKernels
	gemv      kernel
}

// run computes the block dst[m0:m1, n0:n1].
func (g *gemm) run(m0, m1, n0, n1 int) {
	N, K := g.N, g.K
	K8 := K &^ 7 // the kernels take multiples of 8; the rest is summed below
	kc := blockK
	if m1-m0 <= tileM {
		kc = K8 // b is read once: no reuse to block for
	}
	for k0 := 0; k0 < K8; k0 += kc {
		kk := min(kc, K8-k0)
		if m1-m0 == 1 {
			g.gemvRow(m0, n0, n1, k0, kk)
			continue
		}
		for nb := n0; nb < n1; nb += blockN {
			ne := min(nb+blockN, n1)
			for m := m0; m < m1; m += tileM {
				mr := min(tileM, m1-m)
				ap := &g.a[m*K+k0]
				cp := g.dst[m*N:]
				row := g.ks[mr-1]
				n := nb
				if nt := (ne - nb) / tileN; nt > 0 {
					row[tileN-1](ap, K, &g.b[n*K+k0], K, kk, &cp[n], N, nt)
					n += nt * tileN
				}
				if n < ne {
					row[ne-n-1](ap, K, &g.b[n*K+k0], K, kk, &cp[n], N, 1)
				}
			}
		}
	}
	if K8 < K {
		for m := m0; m < m1; m++ {
			ar := g.a[m*K+K8 : m*K+K]
			for n := n0; n < n1; n++ {
				br := g.b[n*K+K8 : n*K+K]
				s := float32(0)
				for k, x := range ar {
					s += x * br[k]
				}
				g.dst[m*N+n] += s
			}
		}
	}
}

// gemvRow computes row m of dst over columns [n0, n1) and k in [k0, k0+kk).
func (g *gemm) gemvRow(m, n0, n1, k0, kk int) {
	K, N := g.K, g.N
	ap := &g.a[m*K+k0]
	n := n0
	if nt := (n1 - n0) / gemvN; nt > 0 {
		g.gemv(ap, K, &g.b[n*K+k0], K, kk, &g.dst[m*N+n], N, nt)
		n += nt * gemvN
	}
	for ; n < n1; n += tileN {
		nr := min(tileN, n1-n)
		g.ks[0][nr-1](ap, K, &g.b[n*K+k0], K, kk, &g.dst[m*N+n], N, 1)
	}
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

// parallelFor splits [0, n) into at most w contiguous chunks whose
// boundaries are multiples of align, and runs f on each in its own goroutine.
func parallelFor(n, align, w int, f func(lo, hi int)) {
	chunk := (n + w - 1) / w
	chunk = (chunk + align - 1) / align * align
	if chunk >= n {
		f(0, n)
		return
	}
	var wg sync.WaitGroup
	for lo := chunk; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() { defer wg.Done(); f(lo, hi) }()
	}
	f(0, min(chunk, n))
	wg.Wait()
}

// Portable kernels.

// goKernels is the tile table of the pure-Go path.
var goKernels = func() (t tileKernels) {
	for i := range t {
		for j := range t[i] {
			mr, nr := i+1, j+1
			t[i][j] = func(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int) {
				goDot(mr, nr*nt, a, lda, b, ldb, n, c, ldc)
			}
		}
	}
	return t
}()

// goGEMV is the pure-Go M=1 kernel.
func goGEMV(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int) {
	goDot(1, gemvN*nt, a, lda, b, ldb, n, c, ldc)
}

// rowAt is the n-element row starting i rows of stride ld after p.
func rowAt(p *float32, i, ld, n int) []float32 {
	return unsafe.Slice((*float32)(unsafe.Add(unsafe.Pointer(p), 4*i*ld)), n)
}

// goDot is the portable kernel for an mr×nr tile of any size: rows of a in
// pairs against rows of b in triples, scalar accumulators.
func goDot(mr, nr int, a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int) {
	for i := 0; i < mr; i += 2 {
		for j := 0; j < nr; j += 3 {
			if i+2 <= mr && j+3 <= nr {
				cj := rowAt(c, i, ldc, j+3)
				cj1 := rowAt(c, i+1, ldc, j+3)
				goDot2x3(rowAt(a, i, lda, n), rowAt(a, i+1, lda, n),
					rowAt(b, j, ldb, n), rowAt(b, j+1, ldb, n), rowAt(b, j+2, ldb, n),
					cj[j:], cj1[j:])
				continue
			}
			for ii := i; ii < min(i+2, mr); ii++ {
				ar := rowAt(a, ii, lda, n)
				cr := rowAt(c, ii, ldc, nr)
				for jj := j; jj < min(j+3, nr); jj++ {
					cr[jj] += Dot(ar, rowAt(b, jj, ldb, n))
				}
			}
		}
	}
}

// goDot2x3 adds the six dot products of a0, a1 with b0, b1, b2 to c0[:3], c1[:3].
func goDot2x3(a0, a1, b0, b1, b2, c0, c1 []float32) {
	n := len(a0)
	a1, b0, b1, b2 = a1[:n], b0[:n], b1[:n], b2[:n]
	var s00, s01, s02, s10, s11, s12 float32
	for k := 0; k < n; k++ {
		x0, x1 := a0[k], a1[k]
		y0, y1, y2 := b0[k], b1[k], b2[k]
		s00 += x0 * y0
		s01 += x0 * y1
		s02 += x0 * y2
		s10 += x1 * y0
		s11 += x1 * y1
		s12 += x1 * y2
	}
	c0[0] += s00
	c0[1] += s01
	c0[2] += s02
	c1[0] += s10
	c1[1] += s11
	c1[2] += s12
}
