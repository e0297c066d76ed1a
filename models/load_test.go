package models_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/models/safetensors"
	"github.com/mkserve/mkserve/tensor"
)

// tinyMixtral is a random Mixtral checkpoint built in Go: its config and
// every tensor by name.
func tinyMixtral(rng *rand.Rand, perExpert bool) (map[string]any, []*tensor.Host) {
	const V, H, L, NH, KVH, D, E, I = 40, 16, 2, 4, 2, 4, 4, 24
	cfg := map[string]any{
		"architectures": []string{"MixtralForCausalLM"}, "model_type": "mixtral",
		"vocab_size": V, "hidden_size": H, "num_hidden_layers": L, "num_attention_heads": NH,
		"num_key_value_heads": KVH, "intermediate_size": I, "num_local_experts": E,
		"num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "eos_token_id": 2,
	}
	var ts []*tensor.Host
	add := func(name string, shape ...int) {
		v := make([]float32, tensor.NumElements(shape))
		for i := range v {
			v[i] = float32(rng.NormFloat64() * 0.3)
		}
		ts = append(ts, tensor.FromFloat32(name, shape, v))
	}
	add("model.embed_tokens.weight", V, H)
	add("model.norm.weight", H)
	add("lm_head.weight", V, H)
	for l := 0; l < L; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		add(p+"input_layernorm.weight", H)
		add(p+"post_attention_layernorm.weight", H)
		add(p+"self_attn.q_proj.weight", NH*D, H)
		add(p+"self_attn.k_proj.weight", KVH*D, H)
		add(p+"self_attn.v_proj.weight", KVH*D, H)
		add(p+"self_attn.o_proj.weight", H, NH*D)
		if perExpert {
			add(p+"block_sparse_moe.gate.weight", E, H)
			for e := 0; e < E; e++ {
				add(fmt.Sprintf("%sblock_sparse_moe.experts.%d.w1.weight", p, e), I, H)
				add(fmt.Sprintf("%sblock_sparse_moe.experts.%d.w3.weight", p, e), I, H)
				add(fmt.Sprintf("%sblock_sparse_moe.experts.%d.w2.weight", p, e), H, I)
			}
		} else {
			add(p+"mlp.gate.weight", E, H)
			add(p+"mlp.experts.gate_up_proj", E, 2*I, H)
			add(p+"mlp.experts.down_proj", E, H, I)
		}
	}
	return cfg, ts
}

func writeCheckpoint(t *testing.T, cfg map[string]any, ts []*tensor.Host) string {
	t.Helper()
	dir := t.TempDir()
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestExpertLayoutsAgree: the per-expert (w1/w3/w2) and fused
// (gate_up_proj/down_proj) layouts of the same weights give the same logits.
func TestExpertLayoutsAgree(t *testing.T) {
	cfg, per := tinyMixtral(rand.New(rand.NewPCG(1, 2)), true)
	// Build the fused layout from the same numbers.
	byName := map[string]*tensor.Host{}
	for _, h := range per {
		byName[h.Name] = h
	}
	var fused []*tensor.Host
	for _, h := range per {
		if !strings.Contains(h.Name, "block_sparse_moe") {
			fused = append(fused, h)
		}
	}
	for l := 0; l < 2; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		g := byName[p+"block_sparse_moe.gate.weight"]
		fused = append(fused, &tensor.Host{Name: p + "mlp.gate.weight", DType: g.DType, Shape: g.Shape, Data: g.Data})
		var gu, dn []byte
		for e := 0; e < 4; e++ {
			q := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", p, e)
			gu = append(gu, byName[q+"w1.weight"].Data...)
			gu = append(gu, byName[q+"w3.weight"].Data...)
			dn = append(dn, byName[q+"w2.weight"].Data...)
		}
		fused = append(fused, &tensor.Host{Name: p + "mlp.experts.gate_up_proj", DType: tensor.F32, Shape: []int{4, 48, 16}, Data: gu})
		fused = append(fused, &tensor.Host{Name: p + "mlp.experts.down_proj", DType: tensor.F32, Shape: []int{4, 16, 24}, Data: dn})
	}
	ids := []int32{1, 5, 9, 33, 7, 2, 0, 39}
	var results [2][]float32
	for i, ts := range [][]*tensor.Host{per, fused} {
		be := cpu.New(cpu.Options{})
		l, err := models.Load(writeCheckpoint(t, cfg, ts), be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := engine.Logits(l.Model, be, ids)
		if err != nil {
			t.Fatal(err)
		}
		results[i] = flatten(rows)
		l.Close()
	}
	if e := relL2(results[1], results[0]); e > 1e-6 {
		t.Errorf("fused layout differs from per-expert layout: rel L2 %.3g", e)
	}
}

// TestLoadErrorsNameTheProblem: bad checkpoints fail with an error that
// names the file and tensor or field.
func TestLoadErrorsNameTheProblem(t *testing.T) {
	mutate := func(f func(cfg map[string]any, ts []*tensor.Host) []*tensor.Host) string {
		cfg, ts := tinyMixtral(rand.New(rand.NewPCG(3, 4)), true)
		ts = f(cfg, ts)
		return writeCheckpoint(t, cfg, ts)
	}
	drop := func(name string) func(map[string]any, []*tensor.Host) []*tensor.Host {
		return func(_ map[string]any, ts []*tensor.Host) []*tensor.Host {
			var out []*tensor.Host
			for _, h := range ts {
				if h.Name != name {
					out = append(out, h)
				}
			}
			return out
		}
	}
	for _, tc := range []struct {
		name string
		dir  string
		want []string
	}{
		{"unknown architecture", mutate(func(cfg map[string]any, ts []*tensor.Host) []*tensor.Host {
			cfg["architectures"] = []string{"LlamaForCausalLM"}
			return ts
		}), []string{"LlamaForCausalLM", "MixtralForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM"}},
		{"missing tensor", mutate(drop("model.layers.1.self_attn.k_proj.weight")), []string{"model.layers.1.self_attn.k_proj.weight"}},
		{"missing expert", mutate(drop("model.layers.0.block_sparse_moe.experts.3.w2.weight")), []string{"experts.3.w2.weight"}},
		{"extra tensor", mutate(func(_ map[string]any, ts []*tensor.Host) []*tensor.Host {
			return append(ts, tensor.FromFloat32("model.layers.0.mystery.weight", []int{2}, []float32{1, 2}))
		}), []string{"model.layers.0.mystery.weight", "model.safetensors"}},
		{"wrong shape", mutate(func(_ map[string]any, ts []*tensor.Host) []*tensor.Host {
			for i, h := range ts {
				if h.Name == "model.norm.weight" {
					ts[i] = tensor.FromFloat32(h.Name, []int{15}, make([]float32, 15))
				}
			}
			return ts
		}), []string{"model.norm.weight", "[15]", "[16]", "model.safetensors"}},
		{"bad config field", mutate(func(cfg map[string]any, ts []*tensor.Host) []*tensor.Host {
			cfg["hidden_size"] = "sixteen"
			return ts
		}), []string{"config.json", "hidden_size"}},
		{"fp8 weights", mutate(func(_ map[string]any, ts []*tensor.Host) []*tensor.Host {
			return append(ts, &tensor.Host{Name: "model.layers.0.self_attn.q_proj.weight_scale_inv", DType: tensor.F32, Shape: []int{1}, Data: make([]byte, 4)},
				&tensor.Host{Name: "model.layers.0.fp8.weight", DType: tensor.F8E4M3, Shape: []int{4}, Data: make([]byte, 4)})
		}), []string{"FP8", "model.layers.0.fp8.weight"}},
		{"no directory", filepath.Join(t.TempDir(), "absent"), []string{"absent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := models.Load(tc.dir, cpu.New(cpu.Options{}), models.LoadOptions{})
			if err == nil {
				t.Fatal("loaded a bad checkpoint")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestLoadProgress: with a progress writer the loader reports the bytes it
// uploads.
func TestLoadProgress(t *testing.T) {
	cfg, ts := tinyMixtral(rand.New(rand.NewPCG(5, 6)), true)
	var buf strings.Builder
	l, err := models.Load(writeCheckpoint(t, cfg, ts), cpu.New(cpu.Options{}), models.LoadOptions{Progress: &buf})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if !strings.Contains(buf.String(), "loading") {
		t.Errorf("no progress bar written: %q", buf.String())
	}
}
