// Package defaultmodel holds tests of the default checkpoint in this folder:
// the small Qwen3-MoE model trained on the King James Bible by
// scripts/train_default.py, which `make run` serves.
package defaultmodel

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/tokenizer"
)

const dir = "."

// maxBytes is the budget for everything the checkpoint commits.
const maxBytes = 30 << 20

func TestCheckpointFiles(t *testing.T) {
	var total int64
	for _, f := range []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatalf("checkpoint file missing: %v", err)
		}
		total += st.Size()
	}
	if total > maxBytes {
		t.Errorf("checkpoint is %d bytes, over the %d-byte budget", total, maxBytes)
	}
}

func TestConfig(t *testing.T) {
	c, err := models.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name      string
		got, want any
	}{
		{"model_type", c.ModelType, "qwen3_moe"},
		{"architecture", c.Architecture, "Qwen3MoeForCausalLM"},
		{"vocab_size", c.VocabSize, 4096},
		{"num_local_experts", c.NumExperts, 8},
		{"num_experts_per_tok", c.NumExpertsPerTok, 2},
		{"tie_word_embeddings", c.TieWordEmbeddings, true},
	}
	for _, w := range want {
		if w.got != w.want {
			t.Errorf("%s = %v, want %v", w.name, w.got, w.want)
		}
	}
	g, err := models.LoadGenerationConfig(dir)
	if err != nil || g == nil {
		t.Fatalf("generation_config.json: %v (nil: %v)", err, g == nil)
	}
	if len(g.EOSTokenIDs) != 2 || g.EOSTokenIDs[0] != 2 || g.EOSTokenIDs[1] != 0 {
		t.Errorf("generation eos_token_id = %v, want [2 0] (<|im_end|>, <|endoftext|>)", g.EOSTokenIDs)
	}
	if !g.DoSample || g.Temperature == nil || *g.Temperature != 0.8 || g.TopP == nil || *g.TopP != 0.95 {
		t.Errorf("generation defaults = do_sample %v temperature %v top_p %v, want true 0.8 0.95", g.DoSample, g.Temperature, g.TopP)
	}
}

func TestTokenizer(t *testing.T) {
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg := tok.Config()
	if cfg.EOSToken != "<|im_end|>" || !strings.Contains(cfg.ChatTemplate, "<|im_start|>") {
		t.Errorf("tokenizer_config: eos %q, chat template %q", cfg.EOSToken, cfg.ChatTemplate)
	}
	for i, s := range []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"} {
		ids, err := tok.Encode(s, false)
		if err != nil || len(ids) != 1 || ids[0] != int32(i) {
			t.Errorf("Encode(%q) = %v, %v; want [%d]", s, ids, err, i)
		}
	}
	const text = "And God said, Let there be light: and there was light.\n"
	ids, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	back, err := tok.Decode(ids, false)
	if err != nil || back != text {
		t.Errorf("round trip = %q, %v; want %q", back, err, text)
	}
}

// TestGreedyMatchesTransformers decodes greedily on the CPU backend and checks
// the text against what transformers produced from the same checkpoint on the
// GPU (testdata/hf_greedy.json). HF ran in bf16, this backend in float32, so
// only the first tokens are compared: far along, a near-tie can flip.
func TestGreedyMatchesTransformers(t *testing.T) {
	const newTokens = 24
	data, err := os.ReadFile(filepath.Join(dir, "testdata", "hf_greedy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Greedy []struct{ Prompt, Continuation string }
	}
	if err := json.Unmarshal(data, &ref); err != nil || len(ref.Greedy) == 0 {
		t.Fatalf("testdata/hf_greedy.json: %v (%d cases)", err, len(ref.Greedy))
	}
	be := cpu.New(cpu.Options{})
	l, err := models.Load(dir, be, models.LoadOptions{Progress: nil})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ref.Greedy {
		t.Run(firstWords(c.Prompt), func(t *testing.T) {
			ids, err := tok.Encode(c.Prompt, false)
			if err != nil {
				t.Fatal(err)
			}
			out, err := engine.Greedy(context.Background(), l.Model, be, ids, engine.GreedyOptions{
				MaxTokens: newTokens, StopIDs: []int32{2, 0},
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != newTokens {
				t.Fatalf("got %d new tokens, want %d (stopped early?)", len(out), newTokens)
			}
			text, err := tok.Decode(out, false)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(c.Continuation, text) {
				t.Errorf("greedy text differs from transformers\n got: %q\nwant prefix of: %q", text, c.Continuation)
			}
		})
	}
}

func firstWords(s string) string {
	f := strings.Fields(strings.NewReplacer("<|", " ", "|>", " ").Replace(s))
	if len(f) > 4 {
		f = f[:4]
	}
	return strings.Join(f, "_")
}

// TestBF16WeightsSameLogits: the CPU backend keeps this BF16 checkpoint's
// matrices in bf16 (half the memory; linalg.MatMulTBF16) and computes the
// same logits, bit for bit, as with them widened to float32
// (cpu.Options.F32Weights), for a prompt and then a decode step of two
// sequences.
func TestBF16WeightsSameLogits(t *testing.T) {
	run := func(opts cpu.Options) [][]float32 {
		be := cpu.New(opts)
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		prompt := []int32{1, 17, 345, 9, 2048, 77, 5, 1200, 33, 4095, 8, 61}
		var out [][]float32
		for s := range 2 {
			x, err := l.Model.Forward(backend.SingleSequence(uint64(s+1), prompt[s:], 0, false))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, be.ToHost(x))
		}
		step := &backend.Batch{Tokens: []int32{40, 41}, Positions: []int32{int32(len(prompt)), int32(len(prompt) - 1)},
			Seqs: []backend.SeqSpan{{ID: 1, Offset: 0, Len: 1, Past: len(prompt)}, {ID: 2, Offset: 1, Len: 1, Past: len(prompt) - 1}}}
		x, err := l.Model.Forward(step)
		if err != nil {
			t.Fatal(err)
		}
		return append(out, be.ToHost(x))
	}
	want, got := run(cpu.Options{F32Weights: true}), run(cpu.Options{})
	for i := range want {
		if len(got[i]) != len(want[i]) || len(want[i]) == 0 {
			t.Fatalf("forward %d: %d logits, want %d", i, len(got[i]), len(want[i]))
		}
		for j := range want[i] {
			if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
				t.Fatalf("forward %d: logit %d = %g with bf16 weights, %g with float32", i, j, got[i][j], want[i][j])
			}
		}
	}
}

// refTexts is each case of testdata/hf_greedy.json as one token sequence,
// [prompt ‖ transformers' continuation]: text to score a model on.
func refTexts(t *testing.T) [][]int32 {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "testdata", "hf_greedy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Greedy []struct{ Prompt, Continuation string }
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var texts [][]int32
	for _, c := range ref.Greedy {
		ids, err := tok.Encode(c.Prompt+c.Continuation, false)
		if err != nil {
			t.Fatal(err)
		}
		texts = append(texts, ids)
	}
	return texts
}

// TestQ8Quality: held as Q8 (cpu.WeightsQ8: every matrix but the routers
// in int8 groups of 32), this trained checkpoint's perplexity on
// transformers' own continuations stays within 2 % of the stored bf16
// weights', and its greedy choices agree at ≥ 95 % of positions.
func TestQ8Quality(t *testing.T) {
	texts := refTexts(t)
	score := func(w cpu.WeightFormat) (nll float64, n int, picks []int, held cpu.WeightBytes) {
		be := cpu.New(cpu.Options{Weights: w})
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for _, ids := range texts {
			rows, err := engine.Logits(l.Model, be, ids)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i+1 < len(ids); i++ {
				row := rows[i]
				m := float64(row[engine.Argmax(row)])
				var z float64
				for _, x := range row {
					z += math.Exp(float64(x) - m)
				}
				nll += m + math.Log(z) - float64(row[ids[i+1]])
				n++
				picks = append(picks, engine.Argmax(row))
			}
		}
		return nll, n, picks, be.WeightBytes()
	}
	nllS, n, pickS, heldS := score(cpu.WeightsStored)
	nllQ, _, pickQ, heldQ := score(cpu.WeightsQ8)
	pplS, pplQ := math.Exp(nllS/float64(n)), math.Exp(nllQ/float64(n))
	same := 0
	for i := range pickS {
		if pickS[i] == pickQ[i] {
			same++
		}
	}
	t.Logf("%d tokens: perplexity %.4f stored, %.4f Q8 (×%.4f); greedy choices agree at %d of %d; weights %d → %d bytes",
		n, pplS, pplQ, pplQ/pplS, same, len(pickS), heldS.Total(), heldQ.Total())
	if pplQ > 1.02*pplS || pplQ == pplS {
		t.Errorf("perplexity %.4f with Q8 weights against %.4f stored: want a change within 2 %%", pplQ, pplS)
	}
	if float64(same) < 0.95*float64(len(pickS)) {
		t.Errorf("greedy choices agree at %d of %d positions", same, len(pickS))
	}
	if heldQ.Total()*3 > heldS.Total()*2 {
		t.Errorf("Q8 holds %d bytes against %d stored: want at most 2/3", heldQ.Total(), heldS.Total())
	}
}

// TestKVBF16Quality: with the paged KV cache in bf16 (cpu.Options.KVBF16)
// this trained checkpoint's perplexity on transformers' own continuations,
// each text prefilled through the paged cache and then decoded a token a
// step from it, stays within 1 % of the float32 cache's, its greedy
// choices agree at ≥ 95 % of positions, and an engine given the same
// kv_cache_bytes holds twice the blocks.
func TestKVBF16Quality(t *testing.T) {
	texts := refTexts(t)
	const bs = 16
	score := func(bf bool) (nll float64, n int, picks []int) {
		be := cpu.New(cpu.Options{KVBF16: bf})
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := be.InitKV(bs, 64); err != nil {
			t.Fatal(err)
		}
		for i, ids := range texts {
			blocks := make([]int32, (len(ids)+bs-1)/bs)
			for b := range blocks {
				blocks[b] = int32(b)
			}
			half := len(ids) / 2 // the first half prefilled, the rest one step each, reading the cache
			var rows [][]float32
			for past := 0; past < len(ids); {
				n := 1
				if past == 0 {
					n = half
				}
				b := backend.SingleSequence(uint64(i+1), ids[past:past+n], past, true)
				b.Seqs[0].Blocks = blocks
				out, err := l.Model.Forward(b)
				if err != nil {
					t.Fatal(err)
				}
				v := be.ToHost(out)
				V := len(v) / n
				for r := range n {
					rows = append(rows, v[r*V:(r+1)*V])
				}
				past += n
			}
			be.FreeSequence(uint64(i + 1))
			for j := 0; j+1 < len(ids); j++ {
				row := rows[j]
				a := engine.Argmax(row)
				m := float64(row[a])
				var z float64
				for _, x := range row {
					z += math.Exp(float64(x) - m)
				}
				nll += m + math.Log(z) - float64(row[ids[j+1]])
				n++
				picks = append(picks, a)
			}
		}
		return nll, n, picks
	}
	nllF, n, pickF := score(false)
	nllB, _, pickB := score(true)
	pplF, pplB := math.Exp(nllF/float64(n)), math.Exp(nllB/float64(n))
	same := 0
	for i := range pickF {
		if pickF[i] == pickB[i] {
			same++
		}
	}
	t.Logf("%d tokens: perplexity %.4f with a float32 cache, %.4f bf16 (×%.5f); greedy choices agree at %d of %d",
		n, pplF, pplB, pplB/pplF, same, len(pickF))
	if math.Abs(pplB/pplF-1) > 0.01 || pplB == pplF {
		t.Errorf("perplexity %.4f with a bf16 cache against %.4f: want a change within 1 %%", pplB, pplF)
	}
	if float64(same) < 0.95*float64(len(pickF)) {
		t.Errorf("greedy choices agree at %d of %d positions", same, len(pickF))
	}
	blocks := func(bf bool) int {
		be := cpu.New(cpu.Options{KVBF16: bf})
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		e, err := engine.New(l.Model, be, nil, engine.Config{KVCacheBytes: 32 << 20, BlockSize: bs}, engine.Options{Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		return e.Stats().BlocksFree
	}
	if f, b := blocks(false), blocks(true); b != 2*f && b != 2*f+1 { // (both rounded down)
		t.Errorf("32 MiB of KV cache: %d blocks in bf16, %d in float32; want twice", b, f)
	}
}
