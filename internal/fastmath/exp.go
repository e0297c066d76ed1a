// Package fastmath has float32 elementary functions for the CPU hot loops
// (softmax, SiLU), faster than widening to float64 for math.Exp.
package fastmath

import "math"

// roundMagic is 1.5·2^52: adding and subtracting it rounds a float64 of
// magnitude below 2^51 to the nearest integer (ties to even).
const roundMagic = 6755399441055744.0

// Exp32 is e^x in float32 to within 2 ulp (about 2.4e-7 relative) over the
// whole float32 range: +Inf above 88.72, 0 below −87.34 (no subnormal
// results), NaN for NaN. It reduces x·log2(e) = n + f with |f| ≤ 1/2 (n by the round-to-nearest
// trick of adding 1.5·2^52) and
// evaluates 2^f = e^(f·ln2) with a degree-7 Taylor polynomial in float64,
// then scales by 2^n through the exponent bits. It is deterministic: the
// same x gives the same bits on every call.
func Exp32(x float32) float32 {
	switch {
	case x != x:
		return x
	case x > 88.72283:
		return float32(math.Inf(1))
	case x < -87.33654:
		return 0
	}
	t := float64(x) * math.Log2E
	n := (t + roundMagic) - roundMagic // t rounded to the nearest integer (|t| < 2^51)
	f := (t - n) * math.Ln2            // [-ln2/2, ln2/2]
	p := 1 + f*(1+f*(1.0/2+f*(1.0/6+f*(1.0/24+f*(1.0/120+f*(1.0/720+f*(1.0/5040)))))))
	return float32(p * math.Float64frombits(uint64(int64(n)+1023)<<52))
}
