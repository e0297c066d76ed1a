package models

import (
	"path/filepath"
	"testing"
)

// TestExpertPlan: the routed experts' bf16 bytes and quantization that
// Build hands a backend.ExpertPlanner, for the shapes in configs/shapes.
func TestExpertPlan(t *testing.T) {
	for _, c := range []struct {
		dir   string
		quant string
		bytes int64
		e     int
	}{
		{"gpt-oss-120b", "mxfp4", 36 * 128 * 3 * 2880 * 2880 * 2, 128},
		{"gpt-oss-20b", "mxfp4", 24 * 32 * 3 * 2880 * 2880 * 2, 32},
		{"qwen3-30b-a3b", "", 48 * 128 * 3 * 2048 * 768 * 2, 128},
		{"mixtral-8x7b", "", 32 * 8 * 3 * 4096 * 14336 * 2, 8},
		{"deepseek-v3-4l", "", 3 * 256 * 3 * 7168 * 2048 * 2, 256}, // one dense layer (first_k_dense_replace 1), then three MoE layers
	} {
		cfg, err := LoadConfig(filepath.Join("..", "configs", "shapes", c.dir))
		if err != nil {
			t.Fatal(err)
		}
		p := expertPlan(cfg)
		if p.Quant != c.quant || p.BF16Bytes != c.bytes || p.E != c.e {
			t.Errorf("%s: plan %+v, want quant %q, %d bytes, %d experts", c.dir, p, c.quant, c.bytes, c.e)
		}
	}
}
