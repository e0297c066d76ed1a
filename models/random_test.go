package models_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/models/safetensors"
	"github.com/mkserve/mkserve/tensor"
)

// TestRandomSourceMatchesCheckpoints builds every golden family from its
// config with random weights and checks that it binds exactly as many
// parameters as the real checkpoint holds, that two loads with one seed
// agree and another seed differs, and that a forward pass is finite.
func TestRandomSourceMatchesCheckpoints(t *testing.T) {
	for _, fam := range []string{"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"} {
		t.Run(fam, func(t *testing.T) {
			dir := filepath.Join(goldenDir, fam)
			ck, err := safetensors.OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			want := 0
			for _, n := range ck.Names() {
				h, err := ck.Tensor(n)
				if err != nil {
					t.Fatal(err)
				}
				want += tensor.NumElements(h.Shape)
			}
			cfg, err := models.LoadConfig(dir)
			if err != nil {
				t.Fatal(err)
			}
			src := &models.RandomSource{Config: cfg, Seed: 1}
			if _, err := models.Build(cfg, models.NewWeights(src, cpu.New(cpu.Options{})), cpu.New(cpu.Options{})); err != nil {
				t.Fatal(err)
			}
			if len(src.Names()) == 0 {
				t.Fatal("Build made no tensors")
			}
			// Count the elements of what Build asks for.
			cs := &countingSource{RandomSource: models.RandomSource{Config: cfg, Seed: 1}}
			if _, err := models.Build(cfg, models.NewWeights(cs, cpu.New(cpu.Options{})), cpu.New(cpu.Options{})); err != nil {
				t.Fatal(err)
			}
			if got := cs.elements; got != want {
				t.Errorf("random %s binds %d parameters, the checkpoint holds %d", fam, got, want)
			}

			logits := func(seed uint64) []float32 {
				be := cpu.New(cpu.Options{})
				l, err := models.LoadRandom(dir, be, seed)
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				out, err := l.Model.Forward(backend.SingleSequence(1, []int32{1, 5, 9, 2}, 0, true))
				if err != nil {
					t.Fatal(err)
				}
				return be.ToHost(out)
			}
			a, b, c := logits(7), logits(7), logits(8)
			if len(a) != 4*cfg.VocabSize {
				t.Fatalf("logits has %d values, want %d", len(a), 4*cfg.VocabSize)
			}
			same := true
			for i := range a {
				if math.IsNaN(float64(a[i])) || math.IsInf(float64(a[i]), 0) {
					t.Fatalf("logit %d is %v", i, a[i])
				}
				if a[i] != b[i] {
					t.Fatalf("seed 7 twice: logit %d is %v then %v", i, a[i], b[i])
				}
				same = same && a[i] == c[i]
			}
			if same {
				t.Error("seeds 7 and 8 give the same logits")
			}
		})
	}
}

// countingSource counts the elements of every tensor Build makes.
type countingSource struct {
	models.RandomSource
	elements int
}

func (c *countingSource) TensorOfShape(name string, shape []int) (*tensor.Host, error) {
	c.elements += tensor.NumElements(shape)
	return c.RandomSource.TensorOfShape(name, shape)
}

func TestRandomSourceErrors(t *testing.T) {
	cfg, err := models.LoadConfig(filepath.Join(goldenDir, "mixtral"))
	if err != nil {
		t.Fatal(err)
	}
	src := &models.RandomSource{Config: cfg}
	if _, err := src.Tensor("x"); err == nil {
		t.Error("Tensor without a shape: no error")
	}
	if _, err := src.TensorOfShape("x", []int{3, 0}); err == nil {
		t.Error("shape with a zero: no error")
	}
	if _, err := models.LoadRandom(t.TempDir(), cpu.New(cpu.Options{}), 1); err == nil {
		t.Error("LoadRandom on a directory without config.json: no error")
	}
}

// TestRandomSourceMXFP4: with an MXFP4 quantization_config, random gpt-oss
// experts hold values an MXFP4 checkpoint holds — the CPU backend takes
// every expert matrix as FP4 (5/16 of bf16's bytes) — with about the
// configured spread; without it they are plain bf16.
func TestRandomSourceMXFP4(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "gpt_oss", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, quant := range []bool{false, true} {
		if quant {
			cfg["quantization_config"] = map[string]any{"quant_method": "mxfp4"}
		}
		dir := t.TempDir()
		b, _ := json.Marshal(cfg)
		if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		be := cpu.New(cpu.Options{})
		l, err := models.LoadRandom(dir, be, 7)
		if err != nil {
			t.Fatal(err)
		}
		wb := be.WeightBytes()
		E, H, I, L := l.Config.NumExperts, l.Config.HiddenSize, l.Config.IntermediateSize, l.Config.NumLayers
		experts := int64(L * E * 3 * H * I) // values of every expert matrix
		t.Logf("mxfp4 %v: weights held %+v", quant, wb)
		if quant && wb.FP4 != experts*5/8 || !quant && wb.FP4 != 0 {
			t.Errorf("mxfp4 %v: %d bytes held as FP4, want %d", quant, wb.FP4, map[bool]int64{true: experts * 5 / 8}[quant])
		}
		out, err := l.Model.Forward(backend.SingleSequence(1, []int32{1, 2, 3}, 0, true))
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range be.ToHost(out) {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("mxfp4 %v: logit %g", quant, v)
			}
		}
	}
	// The values' spread: RMS within a factor 2 of the default 0.02.
	src := &models.RandomSource{Config: mustConfig(t, cfg), Seed: 1}
	h, err := src.TensorOfShape("model.layers.0.mlp.experts.down_proj", []int{2, 64, 64})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := h.Float32()
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	if rms := math.Sqrt(ss / float64(len(v))); rms < 0.01 || rms > 0.04 {
		t.Errorf("MXFP4 random experts: RMS %.4f, want about 0.02", rms)
	}
}

// mustConfig parses a config.json object.
func mustConfig(t *testing.T, raw map[string]any) *models.Config {
	t.Helper()
	dir := t.TempDir()
	b, _ := json.Marshal(raw)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := models.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
