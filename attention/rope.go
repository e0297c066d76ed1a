package attention

// RoPEStyle says which pairs of dimensions a rotation mixes.
type RoPEStyle int

const (
	// NeoX rotates dimension i with i+Dim/2 (Llama, Mixtral, Qwen, OLMoE, gpt-oss).
	NeoX RoPEStyle = iota
	// Interleaved rotates dimension 2i with 2i+1 (GPT-J; DeepSeek-V3 with
	// rope_interleave). Hugging Face's DeepSeek-V3 instead permutes the rotary
	// dims of q and k into [evens | odds] and applies a NeoX rotation, leaving
	// q and k in that permuted order; since q and k get the same permutation,
	// every q·k (and so the attention output) equals the one obtained with this
	// in-place pairwise rotation. Only the raw rotated q/k vectors differ (by
	// that permutation), so compare those to Hugging Face after permuting.
	Interleaved
)

// RoPEScaling is the rope_scaling / rope_parameters block of a config.
// Zero values mean "unset" and take Hugging Face's defaults.
type RoPEScaling struct {
	Type string // "" or "default", "linear", "llama3", "yarn"
	// Factor is the context extension factor (linear, llama3, yarn; > 0).
	// Where a yarn config leaves it out, transformers uses
	// max_position_embeddings / original_max_position_embeddings; the config
	// loader must fill it in the same way.
	Factor          float64
	OriginalMaxPos  int     // original_max_position_embeddings (llama3, yarn)
	BetaFast        float64 // yarn (default 32)
	BetaSlow        float64 // yarn (default 1)
	MScale          float64 // yarn mscale (DeepSeek); 0 = unset
	MScaleAllDim    float64 // yarn mscale_all_dim (DeepSeek); 0 = unset
	AttentionFactor float64 // explicit attention_factor; 0 = derive
	Truncate        *bool   // yarn truncate (nil = true)
	LowFreqFactor   float64 // llama3
	HighFreqFactor  float64 // llama3
}

// RoPE is one layer's rotary embedding: the first Dim dimensions of each
// head are rotated. A RoPE is read-only once built and safe for concurrent
// use; Apply shares cos/sin tables between all RoPE values with equal
// parameters.
type RoPE struct {
	Dim     int     // rotary dimensions per head (even, ≤ head dim)
	Theta   float64 // rope_theta
	Style   RoPEStyle
	Scaling RoPEScaling
}
