package attention

// RoPEStyle says which pairs of dimensions a rotation mixes.
type RoPEStyle int

const (
	// NeoX rotates dimension i with i+Dim/2 (Llama, Mixtral, Qwen, OLMoE, gpt-oss).
	NeoX RoPEStyle = iota
	// Interleaved rotates dimension 2i with 2i+1 (GPT-J; DeepSeek-V3 with rope_interleave).
	Interleaved
)

// RoPEScaling is the rope_scaling / rope_parameters block of a config.
type RoPEScaling struct {
	Type            string  // "" or "default", "linear", "llama3", "yarn"
	Factor          float64 // context extension factor
	OriginalMaxPos  int     // original_max_position_embeddings
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
// head are rotated.
type RoPE struct {
	Dim     int     // rotary dimensions per head (even, ≤ head dim)
	Theta   float64 // rope_theta
	Style   RoPEStyle
	Scaling RoPEScaling
}
