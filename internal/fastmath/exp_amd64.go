//go:build amd64 && !purego

package fastmath

import (
	"math"

	"golang.org/x/sys/cpu"
)

// hasAVX2 reports whether expSub4 can run here.
var hasAVX2 = cpu.X86.HasAVX2

// expTable holds expSub4's constants, each replicated across a vector so
// that the kernel reads them as memory operands: Exp32's float64
// constants, bit for bit, and its float32 range limits.
type expTable struct {
	log2e, magic, ln2, one [4]float64
	c7, c6, c5, c4, c3, c2 [4]float64 // 1/5040 … 1/2
	bias                   [4]int64   // 1023
	hi, lo, inf            [4]float32 // 88.72283, -87.33654, +Inf
}

func splat(v float64) [4]float64 { return [4]float64{v, v, v, v} }

func splat32(v float32) [4]float32 { return [4]float32{v, v, v, v} }

var expTab = expTable{
	log2e: splat(math.Log2E), magic: splat(roundMagic), ln2: splat(math.Ln2), one: splat(1),
	c7: splat(1.0 / 5040), c6: splat(1.0 / 720), c5: splat(1.0 / 120), c4: splat(1.0 / 24), c3: splat(1.0 / 6),
	c2:   splat(1.0 / 2),
	bias: [4]int64{1023, 1023, 1023, 1023},
	hi:   splat32(88.72283), lo: splat32(-87.33654), inf: splat32(float32(math.Inf(1))),
}

// expSub4 sets dst[i] = Exp32(src[i] - sub) for i < n, n a positive
// multiple of 4: Exp32's operations in the same order on four float64
// lanes (no fused multiply-add), so the same bits.
//
//go:noescape
func expSub4(dst *float32, src *float32, n int, sub float32, tab *expTable)

// ExpSub sets dst[i] = Exp32(src[i] - sub) for i < len(src), bit for bit;
// dst may be src. It panics if dst is shorter than src.
func ExpSub(dst, src []float32, sub float32) {
	dst = dst[:len(src)]
	i := 0
	if n := len(src) &^ 3; hasAVX2 && n > 0 {
		expSub4(&dst[0], &src[0], n, sub, &expTab)
		i = n
	}
	for ; i < len(src); i++ {
		dst[i] = Exp32(src[i] - sub)
	}
}
