// Package linalg is the pure-Go float32 linear algebra used by the CPU
// backend and the reference implementations: a parallel, cache-blocked
// GEMM in the layout that Hugging Face Linear weights use.
//
// MatMulT runs AVX2/FMA assembly micro-kernels (kernels_amd64.s, generated
// by gen_kernels.go) when the CPU has them, and portable Go kernels
// otherwise; both share one blocking and threading driver. Two kernel
// families cover the shapes of inference:
//
//   - dot-product tiles (4 rows of a × 3 rows of b, 8-lane accumulators
//     reduced at the end) read a and b in place; they serve small M (decode,
//     few-token experts) and M = 1 (GEMV, memory-bound, split over N);
//   - for M ≥ 16, a is packed into k-major panels of 16 rows and a
//     broadcast kernel (16 rows × 6 rows of b, no horizontal reductions)
//     runs over long k blocks: the prefill path.
//
// Work is split over all cores by columns of the output (rows of b), or by
// rows when the output is narrow.
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
type kernel = kernelOf[float32]

// kernelOf is kernel for b of element type E: float32, uint16 holding
// bf16 values (MatMulTBF16), or byte holding Q8 or FP4 rows (MatMulTQ8,
// MatMulTFP4: ldb in bytes, b at a group boundary, n a multiple of 32).
type kernelOf[E float32 | uint16 | byte] func(a *float32, lda int, b *E, ldb int, n int, c *float32, ldc int, nt int)

// dotSet is the dot path's kernels for b of element type E: the full mr×nr
// tile and its edges, and the M = 1 kernel.
type dotSet[E float32 | uint16 | byte] struct {
	mr, nr int             // full tile: rows of a, rows of b
	k      [][]kernelOf[E] // [i-1][j-1] is the i×j kernel, i ≤ mr, j ≤ nr
	gemv   kernelOf[E]     // 1×gemvN kernel for M = 1
	gemvN  int
}

// tileKernels is a kernel set: the dot kernels and the packed path's.
type tileKernels struct {
	dotSet[float32]
	// panel[j-1] is the broadcast kernel for a packed panel of panelM rows
	// of a against j rows of b (j ≤ len(panel)); nil: no packed path.
	panel []panelKernel
}

// panelKernel adds to c (row stride ldc), for i < panelM and j < nr·nt,
// Σ_{k<n} p[k*panelM+i]·b[j*ldb+k]: p is a panel of panelM rows of a packed
// k-major, b holds nt tiles of nr rows (nr fixed per kernel) and n is a
// positive multiple of 4.
type panelKernel func(p *float32, b *float32, ldb int, n int, c *float32, ldc int, nt int)

// panelM is the number of rows of a in a packed panel.
const panelM = 16

// Blocking parameters, in elements, tuned on a Zen 3 core (32 KB L1d, 512 KB
// L2). Dot path: kc columns of a tile's rows of a stay in L1 while nc rows of
// b (kc columns each) stream from L2. Packed path: a panel of panelM rows ×
// kcP columns (at most 256 KB) stays in L2 while the tiles of ncP rows of b
// pass over it; long k blocks keep the transposed stores of results rare.
var (
	blockK  = 1024
	blockN  = 48
	blockKP = 4096
	blockNP = 24
	// panelMinM is the smallest M that takes the packed path.
	panelMinM = 16
	// parallelMin is the smallest M·N·K worth splitting over goroutines.
	parallelMin = 1 << 18
)

// useAsm selects the assembly kernels; tests switch it off to check the Go path.
var useAsm = hasAVX2

// MatMulT computes dst = a·bᵀ: a [M, K], b [N, K], dst [M, N] (row-major).
// dst is overwritten. It panics if a slice is shorter than its shape.
func MatMulT(dst, a, b []float32, M, N, K int) {
	g, w, mAlign, ok := begin("MatMulT", dst, a, len(b), M, N, K)
	if !ok {
		return
	}
	defer g.done()
	g.b = b
	switch {
	case w <= 1:
		g.run(0, M, 0, N)
	case N >= 24*w || M < 2*mAlign*w:
		// Split the output columns; chunks are whole micro-tiles.
		parallelFor(N, 12, w, func(n0, n1 int) { g.run(0, M, n0, n1) })
	default:
		parallelFor(M, mAlign, w, func(m0, m1 int) { g.run(m0, m1, 0, N) })
	}
}

// begin checks a call's shapes (bLen: b's elements), zeroes dst and sets
// up its gemm (a packed when the packed path runs), the goroutines w and the
// row granularity mAlign of a split over rows; ok is false when nothing is
// left to compute. The caller sets b and calls done.
func begin(op string, dst, a []float32, bLen, M, N, K int) (g *gemm, w, mAlign int, ok bool) {
	if M < 0 || N < 0 || K < 0 || len(a) < M*K || bLen < N*K || len(dst) < M*N {
		panic(fmt.Sprintf("linalg.%s: M=%d N=%d K=%d with len(a)=%d len(b)=%d len(dst)=%d", op, M, N, K, len(a), bLen, len(dst)))
	}
	if M == 0 || N == 0 {
		return nil, 0, 0, false
	}
	clear(dst[:M*N])
	if K == 0 {
		return nil, 0, 0, false
	}
	ks := goKernels
	if useAsm {
		ks = avx2Kernels
	}
	g = &gemm{dst: dst, a: a, M: M, N: N, K: K, ks: ks}
	w = runtime.GOMAXPROCS(0)
	if M*N*K < parallelMin {
		w = 1
	}
	mAlign = ks.mr
	if ks.panel != nil && M >= panelMinM && K >= 8 {
		g.mf = M / panelM * panelM
		g.pack(w)
		mAlign = panelM
	}
	return g, w, mAlign, true
}

// done returns the call's packing buffer.
func (g *gemm) done() {
	if g.packed != nil {
		putBuf(g.packed)
	}
}

// gemm is one MatMulT call.
type gemm struct {
	dst, a, b []float32
	M, N, K   int
	ks        *tileKernels
	// Packed path: rows [0, mf) of a as panels, k-block by k-block: the
	// block at column k0 (width kk) starts at packed[k0*mf], panel i of it
	// at packed[k0*mf+i*panelM*kk], element (row r, column k) at k*panelM+r.
	mf     int
	packed []float32
	// bOff is the first row of b that b holds (MatMulTBF16 points b at a
	// widened block of rows): row n of b is b[(n-bOff)*K:].
	bOff int
}

// pack fills g.packed from a, on up to w goroutines.
func (g *gemm) pack(w int) {
	K, K8, mf := g.K, g.K&^7, g.mf
	g.packed = getBuf(mf * K8)
	panels := mf / panelM
	if mf*K8 < parallelMin {
		w = 1
	}
	parallelFor(panels, 1, w, func(p0, p1 int) {
		for k0 := 0; k0 < K8; k0 += blockKP {
			kk := min(blockKP, K8-k0)
			for pi := p0; pi < p1; pi++ {
				dst := g.packed[k0*mf+pi*panelM*kk : k0*mf+(pi+1)*panelM*kk]
				for r := 0; r < panelM; r++ {
					src := g.a[(pi*panelM+r)*K+k0 : (pi*panelM+r)*K+k0+kk]
					for k, v := range src {
						dst[k*panelM+r] = v
					}
				}
			}
		}
	})
}

// run computes the block dst[m0:m1, n0:n1]; m0 is a multiple of panelM when
// the packed path is in use.
func (g *gemm) run(m0, m1, n0, n1 int) {
	if p1 := min(m1, g.mf); m0 < p1 {
		g.runPanels(m0, p1, n0, n1)
	}
	g.runDot(max(m0, g.mf), m1, n0, n1)
	g.tailK(m0, m1, n0, n1)
}

// runPanels computes rows [m0, m1) (whole panels) of dst[:, n0:n1] over
// the first K&^7 columns with the packed kernels.
func (g *gemm) runPanels(m0, m1, n0, n1 int) {
	N, K, K8, mf := g.N, g.K, g.K&^7, g.mf
	nr := len(g.ks.panel)
	for k0 := 0; k0 < K8; k0 += blockKP {
		kk := min(blockKP, K8-k0)
		for nb := n0; nb < n1; nb += blockNP {
			ne := min(nb+blockNP, n1)
			for m := m0; m < m1; m += panelM {
				p := &g.packed[k0*mf+m*kk]
				cp := g.dst[m*N:]
				n := nb
				if nt := (ne - nb) / nr; nt > 0 {
					g.ks.panel[nr-1](p, &g.b[(n-g.bOff)*K+k0], K, kk, &cp[n], N, nt)
					n += nt * nr
				}
				if n < ne {
					g.ks.panel[ne-n-1](p, &g.b[(n-g.bOff)*K+k0], K, kk, &cp[n], N, 1)
				}
			}
		}
	}
}

// runDot computes dst[m0:m1, n0:n1] over the first K&^7 columns with the
// dot-product kernels.
func (g *gemm) runDot(m0, m1, n0, n1 int) { runDotOf(g, g.b, &g.ks.dotSet, m0, m1, n0, n1) }

// runDotOf is runDot with b's rows [g.bOff, ...) in b and the kernels ks for
// its element type.
func runDotOf[E float32 | uint16](g *gemm, b []E, ks *dotSet[E], m0, m1, n0, n1 int) {
	if m0 >= m1 {
		return
	}
	N, K := g.N, g.K
	K8 := K &^ 7 // the kernels take multiples of 8; the rest is summed by tailK
	kc := blockK
	mr, nr := ks.mr, ks.nr
	if m1-m0 <= mr {
		kc = K8 // b is read once: no reuse to block for
	}
	for k0 := 0; k0 < K8; k0 += kc {
		kk := min(kc, K8-k0)
		if m1-m0 == 1 {
			gemvRowOf(g, b, ks, m0, n0, n1, k0, kk)
			continue
		}
		for nb := n0; nb < n1; nb += blockN {
			ne := min(nb+blockN, n1)
			for m := m0; m < m1; m += mr {
				row := ks.k[min(mr, m1-m)-1]
				ap := &g.a[m*K+k0]
				cp := g.dst[m*N:]
				n := nb
				if nt := (ne - nb) / nr; nt > 0 {
					row[nr-1](ap, K, &b[(n-g.bOff)*K+k0], K, kk, &cp[n], N, nt)
					n += nt * nr
				}
				if n < ne {
					row[ne-n-1](ap, K, &b[(n-g.bOff)*K+k0], K, kk, &cp[n], N, 1)
				}
			}
		}
	}
}

// tailK adds the columns past K&^7 to dst[m0:m1, n0:n1].
func (g *gemm) tailK(m0, m1, n0, n1 int) {
	tailKOf(g, g.b, func(x float32) float32 { return x }, m0, m1, n0, n1)
}

// tailKOf is tailK with b's rows [g.bOff, ...) in b, widened by f.
func tailKOf[E float32 | uint16](g *gemm, b []E, f func(E) float32, m0, m1, n0, n1 int) {
	N, K, K8 := g.N, g.K, g.K&^7
	if K8 < K {
		for m := m0; m < m1; m++ {
			ar := g.a[m*K+K8 : m*K+K]
			for n := n0; n < n1; n++ {
				br := b[(n-g.bOff)*K+K8 : (n-g.bOff)*K+K]
				s := float32(0)
				for k, x := range ar {
					s += x * f(br[k])
				}
				g.dst[m*N+n] += s
			}
		}
	}
}

// gemvRowOf computes row m of dst over columns [n0, n1) and k in [k0, k0+kk).
func gemvRowOf[E float32 | uint16](g *gemm, b []E, ks *dotSet[E], m, n0, n1, k0, kk int) {
	K, N := g.K, g.N
	ap := &g.a[m*K+k0]
	n := n0
	if nt := (n1 - n0) / ks.gemvN; nt > 0 {
		ks.gemv(ap, K, &b[(n-g.bOff)*K+k0], K, kk, &g.dst[m*N+n], N, nt)
		n += nt * ks.gemvN
	}
	for ; n < n1; n += ks.nr {
		nr := min(ks.nr, n1-n)
		ks.k[0][nr-1](ap, K, &b[(n-g.bOff)*K+k0], K, kk, &g.dst[m*N+n], N, 1)
	}
}

// bufPool recycles packing buffers (*[]float32) between calls.
var bufPool sync.Pool

// getBuf returns a slice of n float32s with unspecified contents.
func getBuf(n int) []float32 {
	if p, ok := bufPool.Get().(*[]float32); ok && cap(*p) >= n {
		return (*p)[:n]
	}
	return make([]float32, n)
}

// putBuf hands b back to the pool.
func putBuf(b []float32) { bufPool.Put(&b) }

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

// goKernels is the kernel set of the pure-Go path: 4×3 tiles.
var goKernels = func() *tileKernels {
	t := &tileKernels{dotSet: dotSet[float32]{mr: 4, nr: 3, gemvN: 4}}
	t.k = make([][]kernel, t.mr)
	for i := range t.k {
		t.k[i] = make([]kernel, t.nr)
		for j := range t.k[i] {
			mr, nr := i+1, j+1
			t.k[i][j] = func(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int) {
				goDot(mr, nr*nt, a, lda, b, ldb, n, c, ldc)
			}
		}
	}
	t.gemv = func(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int) {
		goDot(1, t.gemvN*nt, a, lda, b, ldb, n, c, ldc)
	}
	return t
}()

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
