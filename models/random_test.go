package models_test

import (
	"math"
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
