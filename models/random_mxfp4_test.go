package models

import (
	"bytes"
	"path/filepath"
	"testing"
)

// TestRandomMXFP4Raw: RandomSource's MXFP4 experts as blocks and scales
// dequantize to exactly the bf16 tensor TensorOfShape makes, so a model
// loads the same whichever way a backend takes them; other tensors and
// shapes are not MXFP4.
func TestRandomMXFP4Raw(t *testing.T) {
	cfg, err := LoadConfig(filepath.Join("..", "configs", "shapes", "gpt-oss-20b-4l"))
	if err != nil {
		t.Fatal(err)
	}
	src := &RandomSource{Config: cfg, Seed: 9}
	const E, H, I = 3, 128, 64
	for _, c := range []struct {
		name    string
		in, out int
	}{{"model.layers.1.mlp.experts.gate_up_proj", H, 2 * I}, {"model.layers.1.mlp.experts.down_proj", I, H}} {
		b, s, ok, err := src.mxfp4Raw(c.name, E, c.out, c.in/32)
		if err != nil || !ok {
			t.Fatalf("%s: ok %v, %v", c.name, ok, err)
		}
		want, err := src.TensorOfShape(c.name, []int{E, c.in, c.out})
		if err != nil {
			t.Fatal(err)
		}
		if got := dequantMXFP4(c.name, b, s); !bytes.Equal(got.Data, want.Data) {
			t.Errorf("%s: the blocks' values differ from TensorOfShape's", c.name)
		}
	}
	if _, _, ok, _ := src.mxfp4Raw("model.layers.1.self_attn.q_proj.weight", 1, 64, 2); ok {
		t.Error("an attention weight came as MXFP4")
	}
	plain := &RandomSource{Config: mustLoad(t, "qwen3-30b-a3b"), Seed: 9}
	if _, _, ok, _ := plain.mxfp4Raw("model.layers.1.mlp.experts.gate_up_proj", E, 2*I, H/32); ok {
		t.Error("a checkpoint without MXFP4 gave MXFP4 experts")
	}
}

func mustLoad(t *testing.T, shape string) *Config {
	cfg, err := LoadConfig(filepath.Join("..", "configs", "shapes", shape))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}
