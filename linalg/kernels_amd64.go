//go:build amd64 && !purego

package linalg

import "golang.org/x/sys/cpu"

//go:generate sh -c "go run gen_kernels.go > kernels_amd64.s"

// The AVX2/FMA micro-kernels of kernels_amd64.s, with the contract of
// kernel: dotMxN adds to c the M×(N·nt) dot products of M rows of a with
// N·nt rows of b over their first n elements.

//go:noescape
func dot1x1(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x2(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x3(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x1(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x2(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x3(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x1(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x2(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x3(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x1(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x2(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x3(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x4(a *float32, lda int, b *float32, ldb int, n int, c *float32, ldc int, nt int)

// panel16xN are the broadcast kernels of the packed path; see genPanel in
// gen_kernels.go for the contract.

//go:noescape
func panel16x1(p *float32, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func panel16x2(p *float32, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func panel16x3(p *float32, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func panel16x4(p *float32, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func panel16x5(p *float32, b *float32, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func panel16x6(p *float32, b *float32, ldb int, n int, c *float32, ldc int, nt int)

// dotMxNbf are dotMxN with b in bf16 (gen_kernels.go: bit for bit the
// float32 kernel on the widened b).

//go:noescape
func dot1x1bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x2bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x3bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x1bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x2bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x3bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x1bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x2bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x3bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x1bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x2bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x3bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x4bf(a *float32, lda int, b *uint16, ldb int, n int, c *float32, ldc int, nt int)

// The q8 dot kernels: b's rows are linalg.Q8 rows (ldb bytes apart), n
// is their whole length in values, a multiple of 32.

//go:noescape
func dot1x1q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x2q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x3q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x1q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x2q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x3q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x1q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x2q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x3q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x1q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x2q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x3q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x4q8(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

// The FP4 dot kernels: b's rows are linalg.FP4 rows (ldb bytes apart), n
// a multiple of 32 values from a group boundary.

//go:noescape
func dot1x1fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x2fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x1fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot2x2fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x1fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot3x2fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x1fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot4x2fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

//go:noescape
func dot1x4fp4(a *float32, lda int, b *byte, ldb int, n int, c *float32, ldc int, nt int)

// widenfp4 sets dst[i] to the value of element i of the FP4 row src of n
// values (n a positive multiple of 32).
//
//go:noescape
func widenfp4(dst *float32, src *byte, n int)

// widenq8 sets dst[i] to the value of element i of the Q8 row src of n
// values (n a positive multiple of 32).
//
//go:noescape
func widenq8(dst *float32, src *byte, n int)

// widenbf16 sets dst[i] to the float32 of bf16 src[i] for i < n, n a
// positive multiple of 32.
//
//go:noescape
func widenbf16(dst *float32, src *uint16, n int)

// accumN adds Σ_{j<m} p[j]·x[j·ldx : j·ldx+N] to y[0:N] (AccumRows), m ≥ 1.
//
//go:noescape
func accum8(y *float32, p *float32, x *float32, ldx int, m int)

//go:noescape
func accum16(y *float32, p *float32, x *float32, ldx int, m int)

//go:noescape
func accum32(y *float32, p *float32, x *float32, ldx int, m int)

//go:noescape
func accum64(y *float32, p *float32, x *float32, ldx int, m int)

// accumNbf are accumN with x in bf16.
//
//go:noescape
func accum8bf(y *float32, p *float32, x *uint16, ldx int, m int)

//go:noescape
func accum16bf(y *float32, p *float32, x *uint16, ldx int, m int)

//go:noescape
func accum32bf(y *float32, p *float32, x *uint16, ldx int, m int)

//go:noescape
func accum64bf(y *float32, p *float32, x *uint16, ldx int, m int)

// avx2AccumBF are the accumNbf kernels, widest first, with their widths.
var avx2AccumBF = []struct {
	n int
	f func(y *float32, p *float32, x *uint16, ldx int, m int)
}{{64, accum64bf}, {32, accum32bf}, {16, accum16bf}, {8, accum8bf}}

// avx2Accum are the accumN kernels, widest first, with their widths.
var avx2Accum = []struct {
	n int
	f func(y *float32, p *float32, x *float32, ldx int, m int)
}{{64, accum64}, {32, accum32}, {16, accum16}, {8, accum8}}

// avx2DotBF is avx2Kernels' dot set for bf16 b.
var avx2DotBF = &dotSet[uint16]{
	mr: 4, nr: 3,
	k: [][]kernelOf[uint16]{
		{dot1x1bf, dot1x2bf, dot1x3bf},
		{dot2x1bf, dot2x2bf, dot2x3bf},
		{dot3x1bf, dot3x2bf, dot3x3bf},
		{dot4x1bf, dot4x2bf, dot4x3bf},
	},
	gemv: dot1x4bf, gemvN: 4,
}

// avx2DotQ8 is avx2Kernels' dot set for Q8 b.
var avx2DotQ8 = &dotSet[byte]{
	mr: 4, nr: 3,
	k: [][]kernelOf[byte]{
		{dot1x1q8, dot1x2q8, dot1x3q8},
		{dot2x1q8, dot2x2q8, dot2x3q8},
		{dot3x1q8, dot3x2q8, dot3x3q8},
		{dot4x1q8, dot4x2q8, dot4x3q8},
	},
	gemv: dot1x4q8, gemvN: 4,
}

// avx2DotFP4 is avx2Kernels' dot set for FP4 b: 4×2 tiles (the decoding
// leaves registers for no more accumulators).
var avx2DotFP4 = &dotSet[byte]{
	mr: 4, nr: 2,
	k: [][]kernelOf[byte]{
		{dot1x1fp4, dot1x2fp4},
		{dot2x1fp4, dot2x2fp4},
		{dot3x1fp4, dot3x2fp4},
		{dot4x1fp4, dot4x2fp4},
	},
	gemv: dot1x4fp4, gemvN: 4,
}

// hasAVX2 reports whether the assembly kernels can run on this CPU.
var hasAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasFMA

// avx2Kernels is the kernel set of the assembly path.
var avx2Kernels = &tileKernels{
	dotSet: dotSet[float32]{
		mr: 4, nr: 3,
		k: [][]kernel{
			{dot1x1, dot1x2, dot1x3},
			{dot2x1, dot2x2, dot2x3},
			{dot3x1, dot3x2, dot3x3},
			{dot4x1, dot4x2, dot4x3},
		},
		gemv: dot1x4, gemvN: 4,
	},
	panel: []panelKernel{panel16x1, panel16x2, panel16x3, panel16x4, panel16x5, panel16x6},
}
