//go:build !amd64 || purego

package linalg

// No assembly kernels on this platform: MatMulT runs the pure-Go path.
var (
	hasAVX2     = false
	avx2Kernels *tileKernels
	avx2DotBF   *dotSet[uint16]
	avx2DotQ8   *dotSet[byte]
	avx2DotFP4  *dotSet[byte]
	avx2Accum   []struct {
		n int
		f func(y *float32, p *float32, x *float32, ldx int, m int)
	}
	avx2AccumBF []struct {
		n int
		f func(y *float32, p *float32, x *uint16, ldx int, m int)
	}
)

// widenbf16 is never called here (avx2DotBF is nil).
func widenbf16(dst *float32, src *uint16, n int) {
	panic("linalg: no widenbf16 kernel on this platform")
}

// widenq8 is never called here (avx2DotQ8 is nil).
func widenq8(dst *float32, src *byte, n int) {
	panic("linalg: no widenq8 kernel on this platform")
}

// widenfp4 is never called here (avx2DotFP4 is nil).
func widenfp4(dst *float32, src *byte, n int) {
	panic("linalg: no widenfp4 kernel on this platform")
}
