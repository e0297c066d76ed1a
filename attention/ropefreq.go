package attention

import (
	"errors"
	"fmt"
	"math"
)

// Freqs returns the inverse frequencies [Dim/2] of r and the factor by which
// cos and sin are multiplied (Hugging Face's attention_scaling), following
// transformers' modeling_rope_utils for the types "default" (or ""),
// "linear", "llama3" and "yarn".
//
// Hugging Face computes inv_freq as float32 tensors; Freqs repeats each of
// those float32 steps (every value it returns is exactly a float32), so the
// result agrees with transformers to float32 rounding (pow may differ by one
// ulp). r must be valid (see Validate); Freqs panics otherwise.
func (r *RoPE) Freqs() (invFreq []float64, attnFactor float64) {
	if err := r.Validate(); err != nil {
		panic("attention: RoPE.Freqs: " + err.Error())
	}
	s := &r.Scaling
	half := r.Dim / 2
	dim := float64(r.Dim)
	base := f32(r.Theta)
	// posFreq[i] = base ** (arange(0, dim, 2).float() / dim), all in float32.
	posFreq := make([]float64, half)
	for i := range posFreq {
		e := f32(float64(2*i) / dim)
		posFreq[i] = f32(math.Pow(base, e))
	}
	inv := make([]float64, half)
	for i, p := range posFreq {
		inv[i] = f32(1 / p)
	}
	switch s.Type {
	case "", "default":
		return inv, 1
	case "linear":
		fac := f32(s.Factor)
		for i := range inv {
			inv[i] = f32(inv[i] / fac)
		}
		return inv, 1
	case "llama3":
		return llama3Freqs(inv, s), 1
	case "yarn":
		return yarnFreqs(posFreq, r.Dim, r.Theta, s)
	}
	panic("unreachable: Validate accepted rope type " + s.Type)
}

// llama3Freqs applies Llama 3.1's piecewise scaling to the default
// frequencies: long wavelengths are divided by Factor, short ones kept, and
// the band in between interpolated smoothly.
func llama3Freqs(inv []float64, s *RoPEScaling) []float64 {
	old := float64(s.OriginalMaxPos)
	lowWave := f32(old / s.LowFreqFactor)
	highWave := f32(old / s.HighFreqFactor)
	fac := f32(s.Factor)
	lowF := f32(s.LowFreqFactor)
	band := f32(s.HighFreqFactor - s.LowFreqFactor)
	twoPi := f32(2 * math.Pi)
	out := make([]float64, len(inv))
	for i, f := range inv {
		wave := f32(twoPi / f)
		scaled := f
		if wave > lowWave {
			scaled = f32(f / fac)
		}
		out[i] = scaled
		if !(wave < highWave) && !(wave > lowWave) {
			smooth := f32(f32(f32(f32(old)/wave)-lowF) / band)
			a := f32(f32(f32(1-smooth)*scaled) / fac)
			b := f32(smooth * scaled)
			out[i] = f32(a + b)
		}
	}
	return out
}

// yarnFreqs blends interpolated (divided by Factor) and extrapolated
// (unchanged) frequencies with a linear ramp between the correction dims of
// BetaFast and BetaSlow rotations over OriginalMaxPos tokens.
func yarnFreqs(posFreq []float64, dimI int, theta float64, s *RoPEScaling) ([]float64, float64) {
	factor := s.Factor
	attn := s.AttentionFactor
	if attn == 0 {
		if s.MScale != 0 && s.MScaleAllDim != 0 {
			attn = YaRNMScale(factor, s.MScale) / YaRNMScale(factor, s.MScaleAllDim)
		} else {
			attn = YaRNMScale(factor, 1)
		}
	}
	betaFast, betaSlow := s.BetaFast, s.BetaSlow
	if betaFast == 0 {
		betaFast = 32
	}
	if betaSlow == 0 {
		betaSlow = 1
	}
	dim := float64(dimI)
	orig := float64(s.OriginalMaxPos)
	corrDim := func(rotations float64) float64 {
		return dim * math.Log(orig/(rotations*2*math.Pi)) / (2 * math.Log(theta))
	}
	low, high := corrDim(betaFast), corrDim(betaSlow)
	if s.Truncate == nil || *s.Truncate {
		low, high = math.Floor(low), math.Ceil(high)
	}
	low, high = math.Max(low, 0), math.Min(high, dim-1)
	if low == high {
		high += 0.001 // as transformers: avoid a zero-width ramp
	}
	lowF, width := f32(low), f32(high-low)
	fac := f32(factor)
	inv := make([]float64, len(posFreq))
	for i, p := range posFreq {
		extra := f32(1 / p)
		inter := f32(1 / f32(fac*p))
		ramp := f32(f32(float64(i)-lowF) / width)
		ramp = math.Min(math.Max(ramp, 0), 1)
		keep := f32(1 - ramp) // weight of the extrapolated frequency
		inv[i] = f32(f32(inter*f32(1-keep)) + f32(extra*keep))
	}
	return inv, attn
}

// YaRNMScale is YaRN's magnitude correction 0.1·mscale·ln(scale) + 1 for
// scale > 1, and 1 otherwise (transformers' get_mscale). DeepSeek-V3
// multiplies its softmax scale by YaRNMScale(factor, mscale_all_dim)².
func YaRNMScale(scale, mscale float64) float64 {
	if scale <= 1 {
		return 1
	}
	return 0.1*mscale*math.Log(scale) + 1
}

// Validate reports the first field of r that Freqs and Apply cannot use.
// Model loaders call it so that a bad config becomes an error, not a panic.
func (r *RoPE) Validate() error {
	if r == nil {
		return errors.New("rope: nil")
	}
	if r.Dim <= 0 || r.Dim%2 != 0 {
		return fmt.Errorf("rope: Dim %d must be positive and even", r.Dim)
	}
	if !(r.Theta > 0) || math.IsInf(r.Theta, 0) {
		return fmt.Errorf("rope: rope_theta %v must be positive and finite", r.Theta)
	}
	if r.Style != NeoX && r.Style != Interleaved {
		return fmt.Errorf("rope: unknown style %d", r.Style)
	}
	s := &r.Scaling
	needFactor := func() error {
		if !(s.Factor > 0) || math.IsInf(s.Factor, 0) {
			return fmt.Errorf("rope: %s scaling: factor %v must be positive and finite", s.Type, s.Factor)
		}
		return nil
	}
	switch s.Type {
	case "", "default":
		return nil
	case "linear":
		return needFactor()
	case "llama3":
		if err := needFactor(); err != nil {
			return err
		}
		if s.OriginalMaxPos <= 0 {
			return fmt.Errorf("rope: llama3 scaling: original_max_position_embeddings %d must be positive", s.OriginalMaxPos)
		}
		if !(s.LowFreqFactor > 0) || !(s.HighFreqFactor > s.LowFreqFactor) {
			return fmt.Errorf("rope: llama3 scaling: need 0 < low_freq_factor (%v) < high_freq_factor (%v)",
				s.LowFreqFactor, s.HighFreqFactor)
		}
		return nil
	case "yarn":
		if err := needFactor(); err != nil {
			return err
		}
		if s.OriginalMaxPos <= 0 {
			return fmt.Errorf("rope: yarn scaling: original_max_position_embeddings %d must be positive", s.OriginalMaxPos)
		}
		if s.BetaFast < 0 || s.BetaSlow < 0 {
			return fmt.Errorf("rope: yarn scaling: beta_fast %v and beta_slow %v must not be negative", s.BetaFast, s.BetaSlow)
		}
		if s.AttentionFactor < 0 {
			return fmt.Errorf("rope: yarn scaling: attention_factor %v must not be negative", s.AttentionFactor)
		}
		return nil
	}
	return fmt.Errorf("rope: unsupported rope_type %q (want default, linear, llama3 or yarn)", s.Type)
}

// f32 rounds x to float32 precision. Rounding a float64 result of +, −, ×, ÷
// on float32 operands gives exactly the float32 result (53 ≥ 2·24+2), which
// lets Freqs replay transformers' float32 arithmetic.
func f32(x float64) float64 { return float64(float32(x)) }
