package cuda

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/internal/golden"
	"github.com/mkserve/mkserve/models"
)

// goldenDir holds the tiny checkpoints and transformers' float32 outputs
// (scripts/gen_golden.py).
const goldenDir = "../../models/testdata/golden"

// readGolden loads a family's transformers reference outputs.
func readGolden(t testing.TB, family string) *golden.Data {
	t.Helper()
	g, err := golden.Read(goldenDir, family)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func loadModel(t testing.TB, family string, be backend.Backend) *models.Loaded {
	t.Helper()
	l, err := models.Load(filepath.Join(goldenDir, family), be, models.LoadOptions{})
	if err != nil {
		t.Fatalf("load %s: %v", family, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestGolden: every family loaded on the GPU reproduces transformers'
// float32 logits and its greedy generation (mismatches are reported with the
// position), in both precision profiles:
//   - exact (the default: float32 activations split into two bf16 GEMMs,
//     float32 KV cache): relative L2 ≤ 2e-2, argmax equal at ≥ 95% of
//     positions (the CUDA-backend issue's bound);
//   - fast (bf16 activations into the GEMMs and the grouped expert kernels,
//     bf16 KV cache with the paged and flash kernels, as vLLM serves bf16
//     checkpoints): relative L2 ≤ 5e-2, argmax ≥ 90%. The tiny random
//     golden models amplify bf16 rounding, so this profile gets its own,
//     stated bound; its BF16 families must run the grouped MoE path. When
//     rounding flips a near-tie of the router (expert loads differ from the
//     CPU backend's), tokens run other experts and only argmax ≥ 90% and a
//     sanity bound of 0.25 apply; the exact profile must route exactly as
//     float32 does;
//   - fast-f32kv: the fast profile with a float32 KV cache, same bounds
//     (it separates the KV cache's share of the fast profile's error).
func TestGolden(t *testing.T) {
	gpuBackend(t)
	for _, fam := range golden.Families {
		t.Run(fam, func(t *testing.T) {
			for _, mode := range []struct {
				name        string
				split, kv32 bool
			}{{"split", true, true}, {"fast", false, false}, {"fast-f32kv", false, true}} {
				t.Run(mode.name, func(t *testing.T) { goldenFamily(t, fam, mode.name, mode.split, mode.kv32) })
			}
		})
	}
}

// TestGoldenLatentMLA is TestGolden's deepseek_v3 with the latent MLA cache,
// this backend's default (LatentAttention, GemmHeads and the paged kernels
// over [latent ‖ rope key]), in every precision profile; TestGoldenDecompressedMLA
// the same with backend.LatentMLAEnv=0 (every head's keys and values cached).
func TestGoldenLatentMLA(t *testing.T) { goldenMLA(t, "", true) }

// TestGoldenDecompressedMLA: see TestGoldenLatentMLA.
func TestGoldenDecompressedMLA(t *testing.T) { goldenMLA(t, "0", false) }

func goldenMLA(t *testing.T, env string, latent bool) {
	be := gpuBackend(t)
	t.Setenv(backend.LatentMLAEnv, env)
	l := loadModel(t, "deepseek_v3", be)
	c := l.Config
	wantV := c.KVLoraRank // the latent again as values, or 0 inside the keys
	if backend.ValuesInKeysOn(be) {
		wantV = 0
	}
	for i, w := range l.Model.KVWidths() {
		isLatent := w.K == c.KVLoraRank+c.QKRopeHeadDim && w.V == wantV
		if isLatent != latent {
			t.Fatalf("layer %d caches %d/%d values a token: latent %v, want %v", i, w.K, w.V, isLatent, latent)
		}
	}
	for _, mode := range []struct {
		name        string
		split, kv32 bool
	}{{"split", true, true}, {"fast", false, false}, {"fast-f32kv", false, true}} {
		t.Run(mode.name, func(t *testing.T) { goldenFamily(t, "deepseek_v3", mode.name, mode.split, mode.kv32) })
	}
}

// bf16Golden are the golden families whose experts load as bf16 (the
// others are F32 checkpoints).
var bf16Golden = map[string]bool{"mixtral": true, "qwen3_moe": true, "deepseek_v3": true, "gpt_oss": true}

// goldenFamily is TestGolden for one family in one precision profile.
func goldenFamily(t *testing.T, fam, mode string, split, kv32 bool) {
	be, err := New(Options{SplitActivations: &split, KVCacheF32: &kv32})
	if err != nil {
		t.Fatal(err)
	}
	g := readGolden(t, fam)
	l := loadModel(t, fam, be)
	cb := cpu.New(cpu.Options{})
	cl := loadModel(t, fam, cb)
	cb.TakeExpertLoad()
	ref, err := engine.Logits(cl.Model, cb, g.IDs)
	if err != nil {
		t.Fatal(err)
	}
	refLoad := cb.TakeExpertLoad()
	be.TakeExpertLoad()
	before := moeGroupedCalls.Load()
	rows, err := engine.Logits(l.Model, be, g.IDs)
	if err != nil {
		t.Fatal(err)
	}
	// Routing choices that differ from the float32 CPU backend's: a
	// near-tie among router scores flips with any rounding upstream, and
	// then a token runs other experts, which no logit bound survives.
	gpuLoad := be.TakeExpertLoad()
	var moved int64
	for layer, want := range refLoad {
		gl := gpuLoad[layer]
		if len(gl) != len(want) {
			t.Fatalf("layer %d: %d expert counters on the GPU, %d on the CPU", layer, len(gl), len(want))
		}
		for e := range want {
			d := gl[e] - want[e]
			moved += max(d, -d)
		}
	}
	moved /= 2 // each moved choice leaves one expert and joins another
	t.Logf("GOLDEN %s %s: %d token-expert choices differ from the CPU backend's", fam, mode, moved)
	grouped := moeGroupedCalls.Load() - before
	t.Logf("GOLDEN %s %s: grouped MoE calls %d", fam, mode, grouped)
	if !split && grouped == 0 && bf16Golden[fam] {
		t.Errorf("fast mode on a BF16 checkpoint did not take the grouped MoE path")
	}
	var got []float32
	for _, r := range rows {
		got = append(got, r...)
	}
	e := relL2(got, g.Logits)
	var cpuFlat []float32
	for _, r := range ref {
		cpuFlat = append(cpuFlat, r...)
	}
	t.Logf("GOLDEN %s %s: logits relative L2 to the CPU backend %.3g", fam, mode, relL2(got, cpuFlat))
	V := l.Config.VocabSize
	same, n := 0, len(got)/V
	for i := 0; i < n; i++ {
		if engine.Argmax(got[i*V:(i+1)*V]) == engine.Argmax(g.Logits[i*V:(i+1)*V]) {
			same++
		}
	}
	frac := float64(same) / float64(max(n, 1))
	t.Logf("GOLDEN %s %s: logits relative L2 %.3g, argmax equal at %d/%d positions (%.1f%%)", fam, mode, e, same, n, 100*frac)
	maxErr, minFrac := 2e-2, 0.95
	switch {
	case split && moved != 0:
		t.Errorf("the exact profile routed %d token-expert choices differently from float32", moved)
	case !split && moved != 0:
		// Rerouted tokens: only the argmax and a sanity bound apply.
		maxErr, minFrac = 0.25, 0.90
		t.Logf("GOLDEN %s %s: routing differs, logit bound relaxed to %g", fam, mode, maxErr)
	case !split:
		maxErr, minFrac = 5e-2, 0.90
	}
	if !(e <= maxErr) || math.IsNaN(e) {
		t.Errorf("relative L2 %.3g > %g", e, maxErr)
	}
	if frac < minFrac {
		t.Errorf("argmax equal at %.1f%% < %.0f%% of positions", 100*frac, 100*minFrac)
	}
	want := g.GenOutput[len(g.GenPrompt):]
	for _, chunk := range []int{0, 5} {
		gen, err := engine.Greedy(context.Background(), l.Model, be, g.GenPrompt,
			engine.GreedyOptions{MaxTokens: len(want), ChunkSize: chunk})
		if err != nil {
			t.Fatal(err)
		}
		first := -1
		for i := range want {
			if i >= len(gen) || gen[i] != want[i] {
				first = i
				break
			}
		}
		if first < 0 {
			t.Logf("GREEDY %s %s chunk %d: all %d tokens match transformers", fam, mode, chunk, len(want))
		} else {
			// Divergence after a near-tie is possible with bf16 GEMMs: report it.
			t.Logf("GREEDY %s %s chunk %d: first %d of %d tokens match transformers (got %v, want %v)",
				fam, mode, chunk, first, len(want), gen, want)
			if first < len(want)/2 {
				t.Errorf("greedy generation diverges at token %d of %d", first, len(want))
			}
		}
	}
}

type idText struct{}

func (idText) Decode(ids []int32, _ bool) (string, error) { return fmt.Sprint(ids), nil }

// engineMatchesGreedy runs concurrent greedy requests through the serving
// engine (paged KV, continuous batching) on be and compares each with
// engine.Greedy on the same backend.
// stopEngine shuts e down, waiting up to 10 s for its requests.
func stopEngine(e *engine.Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e.Shutdown(ctx)
}

// generate runs one greedy request of maxTok tokens (EOS ignored) on e and
// returns its tokens; an error fails the test.
func generate(t *testing.T, e *engine.Engine, id string, prompt []int32, maxTok int) []int32 {
	t.Helper()
	ch, err := e.Generate(context.Background(), &engine.Request{ID: id, Prompt: prompt,
		Sampling: engine.SamplingParams{N: 1, MaxTokens: maxTok, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}})
	if err != nil {
		t.Fatal(err)
	}
	var got []int32
	for ev := range ch {
		if ev.Err != nil {
			t.Fatal(ev.Err)
		}
		got = append(got, ev.TokenIDs...)
	}
	return got
}

// engineMatchesGreedy serves concurrent greedy requests on be and checks
// their tokens against engine.Greedy; it returns the engine's stats.
func engineMatchesGreedy(t *testing.T, be backend.Backend, opts ...func(*engine.Config)) engine.Stats {
	l := loadModel(t, "qwen3_moe", be)
	prompts := [][]int32{{1, 5, 9, 13, 17, 21, 25}, {3, 4}, {100, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 42}, {1, 5, 9, 13, 2}}
	const maxTok = 8
	want := make([][]int32, len(prompts))
	for i, p := range prompts {
		g, err := engine.Greedy(context.Background(), l.Model, be, p, engine.GreedyOptions{MaxTokens: maxTok})
		if err != nil {
			t.Fatal(err)
		}
		want[i] = g
	}
	cfg := engine.Config{BlockSize: 4, MaxNumSeqs: 8, KVCacheBytes: 16 << 20}
	for _, o := range opts {
		o(&cfg)
	}
	e, err := engine.New(l.Model, be, idText{}, cfg, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer stopEngine(e)
	got := make([][]int32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ch, err := e.Generate(context.Background(), &engine.Request{ID: fmt.Sprint(i), Prompt: p,
				Sampling: engine.SamplingParams{N: 1, MaxTokens: maxTok, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}})
			if err != nil {
				t.Error(err)
				return
			}
			for ev := range ch {
				if ev.Err != nil {
					t.Error(ev.Err)
				}
				got[i] = append(got[i], ev.TokenIDs...)
			}
		}()
	}
	wg.Wait()
	for i := range prompts {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: engine %v, Greedy %v", i, got[i], want[i])
		}
	}
	t.Logf("ENGINE %s: %d concurrent requests equal engine.Greedy: %v", be.Name(), len(prompts), want)
	return e.Stats()
}

// TestEngineMatchesGreedy: the serving engine on the CUDA backend.
func TestEngineMatchesGreedy(t *testing.T) {
	engineMatchesGreedy(t, gpuBackend(t))
}
