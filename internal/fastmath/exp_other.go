//go:build !amd64 || purego

package fastmath

// ExpSub sets dst[i] = Exp32(src[i] - sub) for i < len(src); dst may be
// src. It panics if dst is shorter than src.
func ExpSub(dst, src []float32, sub float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = Exp32(x - sub)
	}
}
