package moe

// Scoring turns router logits into expert scores.
type Scoring int

const (
	// Softmax over all experts (Mixtral, Qwen, OLMoE).
	Softmax Scoring = iota
	// Sigmoid per expert (DeepSeek-V3).
	Sigmoid
)

// RouterConfig describes how a layer picks experts for a token.
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
