package models_test

import (
	"path/filepath"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
)

// plainBackend hides every optional interface of the backend it wraps
// (backend.LatentAttender among them), so a model loads as it would on a
// backend without them.
type plainBackend struct{ backend.Backend }

// TestMLALatentCache: on a backend.LatentAttender (the CPU backend) a
// DeepSeek-V3 layer caches [latent ‖ rope key] per token, one KV head
// (kv_lora_rank + qk_rope_head_dim keys, the values inside them: the CPU
// backend is a backend.ValuesInKeysCache), and its
// logits over a prompt match the decompressed form's (every head's keys and
// values cached) to float32 rounding. (KV-cached decoding on the latent
// cache against transformers: TestGoldenGreedy.)
func TestMLALatentCache(t *testing.T) {
	g := readGolden(t, "deepseek_v3")
	lat, latBe := loadGolden(t, "deepseek_v3", 1)
	plainBe := plainBackend{cpu.New(cpu.Options{})}
	dec, err := models.Load(filepath.Join(goldenDir, "deepseek_v3"), plainBe, models.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()

	c := lat.Config
	H, lora, rope := c.NumHeads, c.KVLoraRank, c.QKRopeHeadDim
	for i, w := range lat.Model.KVWidths() {
		if w.K != lora+rope || w.V != 0 {
			t.Fatalf("latent layer %d caches %d/%d floats a token, want %d/0", i, w.K, w.V, lora+rope)
		}
	}
	for i, w := range dec.Model.KVWidths() {
		if w.K != H*(c.QKNopeHeadDim+rope) || w.V != H*c.VHeadDim {
			t.Fatalf("decompressed layer %d caches %d/%d floats a token, want %d/%d", i, w.K, w.V,
				H*(c.QKNopeHeadDim+rope), H*c.VHeadDim)
		}
	}
	if a, b := lat.Model.KVFloatsPerToken(), dec.Model.KVFloatsPerToken(); a >= b {
		t.Fatalf("latent cache %d floats a token, decompressed %d: want fewer", a, b)
	}

	got, err := engine.Logits(lat.Model, latBe, g.IDs)
	if err != nil {
		t.Fatal(err)
	}
	want, err := engine.Logits(dec.Model, plainBe, g.IDs)
	if err != nil {
		t.Fatal(err)
	}
	if e := relL2(flatten(got), flatten(want)); !(e <= 1e-5) {
		t.Errorf("latent against decompressed logits: relative L2 %.3g > 1e-5", e)
	}
}
