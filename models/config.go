package models

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/mkserve/mkserve/attention"
)

// Config is the union of the config.json fields that the supported families
// use, read from the files that transformers 4.x and 5.x write. Field names
// in comments are the JSON keys.
type Config struct {
	Architecture string // architectures[0]
	ModelType    string // model_type
	DType        string // dtype (5.x) or torch_dtype (4.x)

	VocabSize         int     // vocab_size
	HiddenSize        int     // hidden_size
	NumLayers         int     // num_hidden_layers
	NumHeads          int     // num_attention_heads
	NumKVHeads        int     // num_key_value_heads (default NumHeads)
	HeadDim           int     // head_dim (default HiddenSize/NumHeads)
	IntermediateSize  int     // intermediate_size (dense MLP)
	RMSNormEps        float64 // rms_norm_eps
	TieWordEmbeddings bool    // tie_word_embeddings
	AttentionBias     bool    // attention_bias (Qwen2-MoE: q/k/v bias always)
	MaxPositions      int     // max_position_embeddings

	// Rotary embedding: rope_theta + rope_scaling (4.x) or rope_parameters (5.x).
	RopeTheta      float64
	RopeScaling    attention.RoPEScaling
	PartialRotary  float64 // partial_rotary_factor (default 1)
	RopeInterleave bool    // rope_interleave (DeepSeek-V3, default true)

	// Sliding-window attention.
	SlidingWindow int      // sliding_window (0: none)
	LayerTypes    []string // layer_types: "sliding_attention" / "full_attention"
	ClipQKV       float64  // clip_qkv (OLMoE; 0: none)

	// Mixture of experts.
	NumExperts          int     // num_local_experts | num_experts | n_routed_experts
	NumExpertsPerTok    int     // num_experts_per_tok
	MoEIntermediateSize int     // moe_intermediate_size (default IntermediateSize)
	NormTopKProb        bool    // norm_topk_prob
	DecoderSparseStep   int     // decoder_sparse_step (Qwen; default 1)
	MLPOnlyLayers       []int   // mlp_only_layers (Qwen)
	SharedExpertSize    int     // shared_expert_intermediate_size (Qwen2-MoE)
	NumSharedExperts    int     // n_shared_experts (DeepSeek-V3)
	NumGroups           int     // n_group
	TopKGroups          int     // topk_group
	RoutedScaling       float64 // routed_scaling_factor
	FirstKDense         int     // first_k_dense_replace
	MoELayerFreq        int     // moe_layer_freq (DeepSeek; default 1)
	ScoringFunc         string  // scoring_func (DeepSeek: "sigmoid")
	SwigluLimit         float64 // swiglu_limit (gpt-oss)

	// Multi-head latent attention (DeepSeek-V3).
	QLoraRank     int // q_lora_rank (0: plain q_proj)
	KVLoraRank    int // kv_lora_rank
	QKNopeHeadDim int // qk_nope_head_dim
	QKRopeHeadDim int // qk_rope_head_dim
	VHeadDim      int // v_head_dim

	BOSTokenID []int // bos_token_id
	EOSTokenID []int // eos_token_id (int or list)

	// Raw keeps every key for family-specific lookups.
	Raw map[string]any
}

// LoadConfig reads dir/config.json.
func LoadConfig(dir string) (*Config, error) {
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model config: %w", err)
	}
	c, err := ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes a config.json document. Errors name the field.
func ParseConfig(data []byte) (*Config, error) {
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("not a JSON object: %w", err)
	}
	if raw == nil {
		return nil, fmt.Errorf("not a JSON object")
	}
	r := reader{raw: raw}
	c := &Config{Raw: raw}
	if archs := r.strings("architectures"); len(archs) > 0 {
		c.Architecture = archs[0]
	}
	c.ModelType = r.str("model_type", "")
	c.DType = r.str("dtype", r.str("torch_dtype", ""))
	c.VocabSize = r.int("vocab_size", 0)
	c.HiddenSize = r.int("hidden_size", 0)
	c.NumLayers = r.int("num_hidden_layers", 0)
	c.NumHeads = r.int("num_attention_heads", 0)
	c.NumKVHeads = r.int("num_key_value_heads", c.NumHeads)
	if c.NumHeads > 0 {
		c.HeadDim = r.int("head_dim", c.HiddenSize/c.NumHeads)
	} else {
		c.HeadDim = r.int("head_dim", 0)
	}
	c.IntermediateSize = r.int("intermediate_size", 0)
	c.RMSNormEps = r.float("rms_norm_eps", 1e-6)
	c.TieWordEmbeddings = r.bool("tie_word_embeddings", false)
	c.AttentionBias = r.bool("attention_bias", false)
	c.MaxPositions = r.int("max_position_embeddings", 0)
	c.PartialRotary = r.float("partial_rotary_factor", 1)
	c.RopeInterleave = r.bool("rope_interleave", true)

	c.SlidingWindow = r.int("sliding_window", 0)
	if v, ok := raw["use_sliding_window"]; ok && v == false {
		c.SlidingWindow = 0 // Qwen configs carry a window they do not use
	}
	c.LayerTypes = r.strings("layer_types")
	c.ClipQKV = r.float("clip_qkv", 0)

	c.NumExperts = r.int("num_local_experts", r.int("num_experts", r.int("n_routed_experts", 0)))
	c.NumExpertsPerTok = r.int("num_experts_per_tok", 0)
	c.MoEIntermediateSize = r.int("moe_intermediate_size", c.IntermediateSize)
	c.NormTopKProb = r.bool("norm_topk_prob", false)
	c.DecoderSparseStep = r.int("decoder_sparse_step", 1)
	c.MLPOnlyLayers = r.ints("mlp_only_layers")
	c.SharedExpertSize = r.int("shared_expert_intermediate_size", 0)
	c.NumSharedExperts = r.int("n_shared_experts", 0)
	c.NumGroups = r.int("n_group", 0)
	c.TopKGroups = r.int("topk_group", 0)
	c.RoutedScaling = r.float("routed_scaling_factor", 1)
	c.FirstKDense = r.int("first_k_dense_replace", 0)
	c.MoELayerFreq = r.int("moe_layer_freq", 1)
	c.ScoringFunc = r.str("scoring_func", "")
	c.SwigluLimit = r.float("swiglu_limit", 0)

	c.QLoraRank = r.int("q_lora_rank", 0)
	c.KVLoraRank = r.int("kv_lora_rank", 0)
	c.QKNopeHeadDim = r.int("qk_nope_head_dim", 0)
	c.QKRopeHeadDim = r.int("qk_rope_head_dim", 0)
	c.VHeadDim = r.int("v_head_dim", 0)

	c.BOSTokenID = r.ints("bos_token_id")
	c.EOSTokenID = r.ints("eos_token_id")

	c.RopeTheta, c.RopeScaling = r.rope()
	if s := &c.RopeScaling; s.Type == "yarn" {
		// transformers' fallbacks: the original length defaults to
		// max_position_embeddings, and a missing factor is the ratio of the two.
		if s.OriginalMaxPos == 0 {
			s.OriginalMaxPos = c.MaxPositions
		}
		if s.Factor == 0 && s.OriginalMaxPos > 0 {
			s.Factor = float64(c.MaxPositions) / float64(s.OriginalMaxPos)
		}
	}
	if c.RopeScaling.Factor == 0 {
		c.RopeScaling.Factor = 1
	}
	if r.err != nil {
		return nil, r.err
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	need := []struct {
		name string
		v    int
	}{
		{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize},
		{"num_hidden_layers", c.NumLayers}, {"num_attention_heads", c.NumHeads},
		{"num_key_value_heads", c.NumKVHeads},
	}
	for _, n := range need {
		if n.v <= 0 {
			return fmt.Errorf("field %q: must be a positive integer, got %d", n.name, n.v)
		}
	}
	if c.NumHeads%c.NumKVHeads != 0 {
		return fmt.Errorf("field %q: %d query heads are not a multiple of %d key/value heads", "num_key_value_heads", c.NumHeads, c.NumKVHeads)
	}
	if c.Architecture == "" {
		return fmt.Errorf("field %q: missing or empty", "architectures")
	}
	if c.NumExpertsPerTok < 0 || (c.NumExperts > 0 && c.NumExpertsPerTok > c.NumExperts) {
		return fmt.Errorf("field %q: %d experts per token with %d experts", "num_experts_per_tok", c.NumExpertsPerTok, c.NumExperts)
	}
	if len(c.LayerTypes) > 0 && len(c.LayerTypes) != c.NumLayers {
		return fmt.Errorf("field %q: %d entries for %d layers", "layer_types", len(c.LayerTypes), c.NumLayers)
	}
	return nil
}

// reader pulls typed fields out of a decoded JSON object, remembering the
// first type error with the field's name.
type reader struct {
	raw map[string]any
	err error
}

func (r *reader) fail(key string, want string, v any) {
	if r.err == nil {
		r.err = fmt.Errorf("field %q: want %s, got %s", key, want, describe(v))
	}
}

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("string %q", v)
	case float64:
		return fmt.Sprintf("number %v", v)
	case bool:
		return fmt.Sprintf("bool %v", v)
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func (r *reader) get(key string) (any, bool) {
	v, ok := r.raw[key]
	if !ok || v == nil {
		return nil, false
	}
	return v, true
}

func (r *reader) int(key string, def int) int {
	v, ok := r.get(key)
	if !ok {
		return def
	}
	f, isNum := v.(float64)
	if !isNum || f != math.Trunc(f) || math.Abs(f) > 1<<40 {
		r.fail(key, "an integer", v)
		return def
	}
	return int(f)
}

func (r *reader) float(key string, def float64) float64 {
	v, ok := r.get(key)
	if !ok {
		return def
	}
	f, isNum := v.(float64)
	if !isNum {
		r.fail(key, "a number", v)
		return def
	}
	return f
}

func (r *reader) bool(key string, def bool) bool {
	v, ok := r.get(key)
	if !ok {
		return def
	}
	b, isBool := v.(bool)
	if !isBool {
		r.fail(key, "true or false", v)
		return def
	}
	return b
}

func (r *reader) str(key, def string) string {
	v, ok := r.get(key)
	if !ok {
		return def
	}
	s, isStr := v.(string)
	if !isStr {
		r.fail(key, "a string", v)
		return def
	}
	return s
}

func (r *reader) strings(key string) []string {
	v, ok := r.get(key)
	if !ok {
		return nil
	}
	list, isList := v.([]any)
	if !isList {
		r.fail(key, "a list of strings", v)
		return nil
	}
	out := make([]string, len(list))
	for i, e := range list {
		s, isStr := e.(string)
		if !isStr {
			r.fail(key, "a list of strings", e)
			return nil
		}
		out[i] = s
	}
	return out
}

// ints reads an integer or a list of integers.
func (r *reader) ints(key string) []int {
	v, ok := r.get(key)
	if !ok {
		return nil
	}
	if f, isNum := v.(float64); isNum {
		if f != math.Trunc(f) {
			r.fail(key, "an integer or a list of integers", v)
			return nil
		}
		return []int{int(f)}
	}
	list, isList := v.([]any)
	if !isList {
		r.fail(key, "an integer or a list of integers", v)
		return nil
	}
	out := make([]int, len(list))
	for i, e := range list {
		f, isNum := e.(float64)
		if !isNum || f != math.Trunc(f) {
			r.fail(key, "a list of integers", e)
			return nil
		}
		out[i] = int(f)
	}
	return out
}

// rope reads rope_theta and the scaling block from either layout:
// transformers 4.x writes rope_theta and rope_scaling {"type"|"rope_type", ...};
// 5.x writes rope_parameters {"rope_type", "rope_theta", ...}, possibly one
// block per layer type, of which the full-attention one is used.
func (r *reader) rope() (float64, attention.RoPEScaling) {
	theta := r.float("rope_theta", 10000)
	var block map[string]any
	key := ""
	for _, k := range []string{"rope_parameters", "rope_scaling"} {
		v, ok := r.get(k)
		if !ok {
			continue
		}
		m, isObj := v.(map[string]any)
		if !isObj {
			r.fail(k, "an object", v)
			return theta, attention.RoPEScaling{}
		}
		block, key = m, k
		break
	}
	if block == nil {
		return theta, attention.RoPEScaling{}
	}
	if inner, ok := block["full_attention"].(map[string]any); ok {
		block = inner
	}
	sub := reader{raw: block}
	theta = sub.float("rope_theta", theta)
	s := attention.RoPEScaling{
		Type:            sub.str("rope_type", sub.str("type", "default")),
		Factor:          sub.float("factor", 0),
		OriginalMaxPos:  sub.int("original_max_position_embeddings", 0),
		BetaFast:        sub.float("beta_fast", 32),
		BetaSlow:        sub.float("beta_slow", 1),
		MScale:          sub.float("mscale", 0),
		MScaleAllDim:    sub.float("mscale_all_dim", 0),
		AttentionFactor: sub.float("attention_factor", 0),
		LowFreqFactor:   sub.float("low_freq_factor", 1),
		HighFreqFactor:  sub.float("high_freq_factor", 4),
	}
	if v, ok := block["truncate"]; ok && v != nil {
		b, isBool := v.(bool)
		if !isBool {
			sub.fail("truncate", "true or false", v)
		}
		s.Truncate = &b
	}
	if sub.err != nil && r.err == nil {
		r.err = fmt.Errorf("%s: %w", key, sub.err)
	}
	switch s.Type {
	case "default", "linear", "llama3", "yarn":
	default:
		if r.err == nil {
			r.err = fmt.Errorf("field %q: rope type %q is not supported (supported: default, linear, llama3, yarn)", key, s.Type)
		}
	}
	return theta, s
}
