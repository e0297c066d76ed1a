//go:build !amd64 || purego

package linalg

// No assembly kernels on this platform: MatMulT runs the pure-Go path.
var (
	hasAVX2     = false
	avx2Kernels *tileKernels
)
