package models_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/internal/golden"
)

// poisonReleaser is the cpu backend with a Release that overwrites each
// released tensor with NaN, so that a model using a tensor after it
// released it (or releasing one it still needs) produces NaN or different
// logits. It counts what it poisoned.
type poisonReleaser struct {
	*cpu.Backend
	released int
}

func (p *poisonReleaser) Release(ts ...backend.Tensor) {
	for _, t := range ts {
		if c, ok := t.(*cpu.Tensor); ok {
			d := c.Data()
			for i := range d {
				d[i] = float32(math.NaN())
			}
			p.released++
		}
	}
}

// TestReleaseNeverUsedAgain: every family's forward passes release only
// tensors they no longer read — logits and greedy generations with
// released tensors poisoned equal those without, bit for bit, prefilled in
// one step and in chunks.
func TestReleaseNeverUsedAgain(t *testing.T) {
	for _, fam := range golden.Families {
		t.Run(fam, func(t *testing.T) {
			t.Parallel()
			checkReleases(t, fam)
		})
	}
}

// TestReleaseNeverUsedAgainDecompressedMLA: the same for DeepSeek-V3 with
// the decompressed MLA cache (backend.LatentMLAEnv 0), whose attention
// branch releases other tensors than the latent one's.
func TestReleaseNeverUsedAgainDecompressedMLA(t *testing.T) {
	t.Setenv(backend.LatentMLAEnv, "0")
	checkReleases(t, "deepseek_v3")
}

// checkReleases compares a family's logits and greedy generations on the
// NaN-poisoning releaser with the plain cpu backend's.
func checkReleases(t *testing.T, fam string) {
	g := readGolden(t, fam)
	plain := cpu.New(cpu.Options{})
	pr := &poisonReleaser{Backend: cpu.New(cpu.Options{})}
	lp, lr := loadGoldenOn(t, fam, plain), loadGoldenOn(t, fam, pr)
	want, err := engine.Logits(lp.Model, plain, g.IDs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := engine.Logits(lr.Model, pr, g.IDs)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(flatten(got), flatten(want)) {
		t.Errorf("logits with released tensors poisoned differ from the plain backend's")
	}
	if pr.released == 0 {
		t.Fatalf("the forward pass released nothing")
	}
	for _, chunk := range []int{0, 3} {
		opt := engine.GreedyOptions{MaxTokens: 6, ChunkSize: chunk}
		a, err := engine.Greedy(context.Background(), lp.Model, plain, g.GenPrompt, opt)
		if err != nil {
			t.Fatal(err)
		}
		b, err := engine.Greedy(context.Background(), lr.Model, pr, g.GenPrompt, opt)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) {
			t.Errorf("chunk %d: greedy %v with poisoned releases, %v without", chunk, b, a)
		}
	}
}
