package models

import (
	"strings"
	"testing"
)

// Minimal configs in the two layouts transformers writes.
const (
	deepseekV4x = `{"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3","torch_dtype":"bfloat16",
	 "vocab_size":512,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,
	 "rope_theta":10000,"rope_scaling":{"type":"yarn","factor":40,"original_max_position_embeddings":4096,
	 "beta_fast":32,"beta_slow":1,"mscale":1.0,"mscale_all_dim":1.0},"max_position_embeddings":163840,
	 "n_routed_experts":16,"num_experts_per_tok":4,"eos_token_id":1,"bos_token_id":0}`
	deepseekV5x = `{"architectures":["DeepseekV3ForCausalLM"],"model_type":"deepseek_v3","dtype":"bfloat16",
	 "vocab_size":512,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":4,
	 "rope_parameters":{"rope_type":"yarn","rope_theta":10000,"factor":40,"original_max_position_embeddings":4096,
	 "beta_fast":32,"beta_slow":1,"mscale":1.0,"mscale_all_dim":1.0},"max_position_embeddings":163840,
	 "n_routed_experts":16,"num_experts_per_tok":4,"eos_token_id":[1,2],"bos_token_id":0}`
)

func TestParseConfigLayouts(t *testing.T) {
	for _, tc := range []struct {
		name, json string
		eos        []int
	}{
		{"transformers-4", deepseekV4x, []int{1}},
		{"transformers-5", deepseekV5x, []int{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if c.DType != "bfloat16" || c.RopeTheta != 10000 || c.RopeScaling.Type != "yarn" ||
				c.RopeScaling.Factor != 40 || c.RopeScaling.OriginalMaxPos != 4096 || c.RopeScaling.MScaleAllDim != 1 {
				t.Errorf("rope/dtype parsed wrong: dtype %q theta %v scaling %+v", c.DType, c.RopeTheta, c.RopeScaling)
			}
			if c.NumExperts != 16 || c.NumExpertsPerTok != 4 || c.HeadDim != 16 {
				t.Errorf("experts %d/%d head_dim %d", c.NumExperts, c.NumExpertsPerTok, c.HeadDim)
			}
			if len(c.EOSTokenID) != len(tc.eos) || c.EOSTokenID[0] != tc.eos[0] {
				t.Errorf("eos %v, want %v", c.EOSTokenID, tc.eos)
			}
		})
	}
}

func TestParseConfigDefaultsAndWindows(t *testing.T) {
	c, err := ParseConfig([]byte(`{"architectures":["Qwen2MoeForCausalLM"],"vocab_size":10,"hidden_size":8,
	 "num_hidden_layers":2,"num_attention_heads":2,"sliding_window":4096,"use_sliding_window":false,
	 "rope_theta":1000000.0,"num_experts":4,"num_experts_per_tok":2,"mlp_only_layers":[1],"decoder_sparse_step":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.NumKVHeads != 2 || c.HeadDim != 4 || c.SlidingWindow != 0 || c.RopeTheta != 1e6 || c.RopeScaling.Type != "" {
		t.Errorf("defaults wrong: %+v", c)
	}
	if !qwenSparse(c, 0) || qwenSparse(c, 1) {
		t.Errorf("mlp_only_layers [1] not honoured")
	}
	g, err := ParseConfig([]byte(`{"architectures":["GptOssForCausalLM"],"vocab_size":10,"hidden_size":8,
	 "num_hidden_layers":3,"num_attention_heads":2,"sliding_window":6,
	 "layer_types":["sliding_attention","full_attention","sliding_attention"]}`))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []int{6, 0, 6} {
		if got := windowFor(g, i); got != want {
			t.Errorf("layer %d window %d, want %d", i, got, want)
		}
	}
}

func TestParseConfigErrorsNameTheField(t *testing.T) {
	base := `"architectures":["MixtralForCausalLM"],"vocab_size":10,"hidden_size":8,"num_hidden_layers":1`
	for _, tc := range []struct{ json, field string }{
		{`[]`, "JSON object"},
		{`{` + base + `,"num_attention_heads":"four"}`, `"num_attention_heads"`},
		{`{` + base + `,"num_attention_heads":2.5}`, `"num_attention_heads"`},
		{`{` + base + `,"num_attention_heads":4,"num_key_value_heads":3}`, `"num_key_value_heads"`},
		{`{` + base + `}`, `"num_attention_heads"`},
		{`{"vocab_size":10,"hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2}`, `"architectures"`},
		{`{` + base + `,"num_attention_heads":2,"rope_scaling":{"rope_type":"dynamic","factor":2}}`, "dynamic"},
		{`{` + base + `,"num_attention_heads":2,"rope_parameters":[1]}`, `"rope_parameters"`},
		{`{` + base + `,"num_attention_heads":2,"eos_token_id":"x"}`, `"eos_token_id"`},
		{`{` + base + `,"num_attention_heads":2,"layer_types":["full_attention","full_attention"]}`, `"layer_types"`},
		{`{` + base + `,"num_attention_heads":2,"num_local_experts":2,"num_experts_per_tok":3}`, `"num_experts_per_tok"`},
	} {
		_, err := ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("ParseConfig(%s) = %v, want an error naming %s", tc.json, err, tc.field)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(deepseekV4x))
	f.Add([]byte(deepseekV5x))
	f.Add([]byte(`{"rope_parameters":{"full_attention":{"rope_type":"yarn"}}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err == nil && (c.NumHeads <= 0 || c.NumKVHeads <= 0 || c.NumHeads%c.NumKVHeads != 0) {
			t.Fatalf("accepted inconsistent heads %d/%d", c.NumHeads, c.NumKVHeads)
		}
	})
}
