package moe

import (
	"fmt"
	"math"
)

// Scoring turns router logits into expert scores.
type Scoring int

const (
	// Softmax over all experts (Mixtral, Qwen, OLMoE).
	Softmax Scoring = iota
	// Sigmoid per expert (DeepSeek-V3).
	Sigmoid
)

// RouterConfig describes how a layer picks experts for a token. Route
// applies it in this order (the order of the Hugging Face modeling code):
//
//  1. scores s: softmax over all experts (Softmax), sigmoid per expert
//     (Sigmoid), or the raw logits (SoftmaxTopK);
//  2. choice scores c = s + scoreBias (when a bias is given; selection only);
//  3. group limiting (NumGroups > 0): groups outside the best TopKGroups get
//     c = −inf, as transformers 5.17, vLLM and DeepSeek's own code mask it;
//  4. top-k on c;
//  5. weights w = s at the chosen experts; softmax over them (SoftmaxTopK);
//     divided by their sum (NormTopK; + 1e-20 under Sigmoid scoring);
//     times ScalingFactor.
//
// The HF families map onto it as: Mixtral {Softmax, NormTopK}; Qwen2-MoE,
// Qwen3-MoE, OLMoE {Softmax, NormTopK: norm_topk_prob}; gpt-oss
// {Softmax, SoftmaxTopK} with the router bias added to the logits by the
// caller; DeepSeek-V3 {Sigmoid, NumGroups: n_group, TopKGroups: topk_group,
// NormTopK: norm_topk_prob, ScalingFactor: routed_scaling_factor} with
// e_score_correction_bias as scoreBias.
type RouterConfig struct {
	NumExperts int
	TopK       int
	Scoring    Scoring
	// SoftmaxTopK: take the top-k logits, then softmax over those k (gpt-oss).
	// With Softmax scoring and NormTopK this gives the same weights (Mixtral).
	SoftmaxTopK bool
	// NormTopK renormalises the chosen weights to sum to one.
	NormTopK bool
	// NumGroups, TopKGroups: group-limited routing (DeepSeek-V3): experts are
	// split into NumGroups groups, each group scored by the sum of its two best
	// (bias-corrected) scores, and only the best TopKGroups groups are eligible.
	// Zero disables it.
	NumGroups  int
	TopKGroups int
	// ScalingFactor multiplies the final weights (routed_scaling_factor); 0 means 1.
	ScalingFactor float32
}

// ActKind is the expert activation.
type ActKind int

const (
	// SwiGLU is silu(gate) * up.
	SwiGLU ActKind = iota
	// ClampedSwiGLU is gpt-oss's: gate clamped above at Limit, up clamped to
	// [-Limit, Limit], out = (up + 1) * gate * sigmoid(Alpha * gate).
	ClampedSwiGLU
)

// Activation of the experts' first projection.
type Activation struct {
	Kind  ActKind
	Alpha float32
	Limit float32
}

// Validate reports the first field of c that Route cannot work with. Loaders
// call it once per layer so that Route itself never sees a bad config.
func (c *RouterConfig) Validate() error {
	if c == nil {
		return fmt.Errorf("moe: router config is nil")
	}
	if c.NumExperts <= 0 {
		return fmt.Errorf("moe: router config: NumExperts = %d, want > 0", c.NumExperts)
	}
	if c.TopK <= 0 || c.TopK > c.NumExperts {
		return fmt.Errorf("moe: router config: TopK = %d, want 1..NumExperts (%d)", c.TopK, c.NumExperts)
	}
	if c.Scoring != Softmax && c.Scoring != Sigmoid {
		return fmt.Errorf("moe: router config: unknown Scoring %d", c.Scoring)
	}
	if c.SoftmaxTopK && c.Scoring != Softmax {
		return fmt.Errorf("moe: router config: SoftmaxTopK needs Softmax scoring")
	}
	if c.NumGroups < 0 || c.TopKGroups < 0 {
		return fmt.Errorf("moe: router config: NumGroups = %d, TopKGroups = %d, want >= 0", c.NumGroups, c.TopKGroups)
	}
	if c.NumGroups > 0 {
		if c.NumExperts%c.NumGroups != 0 {
			return fmt.Errorf("moe: router config: NumExperts (%d) not divisible by NumGroups (%d)", c.NumExperts, c.NumGroups)
		}
		if c.NumExperts/c.NumGroups < 2 {
			return fmt.Errorf("moe: router config: %d experts per group, group scoring needs >= 2", c.NumExperts/c.NumGroups)
		}
		if c.TopKGroups < 1 || c.TopKGroups > c.NumGroups {
			return fmt.Errorf("moe: router config: TopKGroups = %d, want 1..NumGroups (%d)", c.TopKGroups, c.NumGroups)
		}
	} else if c.TopKGroups != 0 {
		return fmt.Errorf("moe: router config: TopKGroups = %d without NumGroups", c.TopKGroups)
	}
	if math.IsNaN(float64(c.ScalingFactor)) || math.IsInf(float64(c.ScalingFactor), 0) {
		return fmt.Errorf("moe: router config: ScalingFactor = %v", c.ScalingFactor)
	}
	return nil
}

// Validate reports an activation that the experts cannot apply.
func (a Activation) Validate() error {
	switch a.Kind {
	case SwiGLU:
		return nil
	case ClampedSwiGLU:
		if !(a.Limit > 0) || math.IsInf(float64(a.Limit), 0) {
			return fmt.Errorf("moe: activation: ClampedSwiGLU Limit = %v, want finite > 0", a.Limit)
		}
		if math.IsNaN(float64(a.Alpha)) || math.IsInf(float64(a.Alpha), 0) {
			return fmt.Errorf("moe: activation: ClampedSwiGLU Alpha = %v", a.Alpha)
		}
		return nil
	}
	return fmt.Errorf("moe: activation: unknown kind %d", a.Kind)
}
