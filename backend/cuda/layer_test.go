package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models"
)

// layerTestConfig is a Qwen3-MoE config in the persistent layer kernel's
// shapes (head dim 128, hidden ≤ 2048) with a dense layer in the middle,
// so that a step mixes layers run whole and layers run op by op.
const layerTestConfig = `{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 2048, "hidden_size": 1024, "intermediate_size": 1536,
  "moe_intermediate_size": 384, "num_hidden_layers": 3, "num_attention_heads": 16,
  "num_key_value_heads": 2, "head_dim": 128, "num_experts": 64, "num_experts_per_tok": 8,
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [1],
  "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
  "tie_word_embeddings": false, "attention_bias": false
}`

// TestDecodeLayerMatchesOps: decode steps whose MoE layers run as one
// persistent kernel (kernels.LayerDecode) give the logits of the same steps
// run op by op on a second backend with the same random weights (the ops
// are tested against the CPU backend elsewhere), eagerly and from CUDA
// graphs, at a short context that crosses block boundaries and a long one
// whose attention units take several key tiles. Both runs are fed the same
// tokens (the layer run's argmax), so every step compares the same work;
// the KV cache the kernel writes is read by the steps after it. The
// layer kernel must have run every MoE layer of every decode step, and the
// expert counters must hold top_k counts per token and layer.
func TestDecodeLayerMatchesOps(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(layerTestConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		graphs bool
		prompt int
	}{{false, 37}, {true, 37}, {false, 5000}, {true, 5000}} {
		t.Run(fmt.Sprintf("graphs=%v/prompt=%d", c.graphs, c.prompt), func(t *testing.T) {
			const bs, steps = 16, 12
			perSeq := (c.prompt+steps)/bs + 1
			runs := make([]*graphRun, 2) // the layer kernel, op by op
			for i := range runs {
				be := fastBackend(t, c.graphs)
				be.layerMode = 1
				if i == 1 {
					be.layerMode = -1
				}
				if err := be.InitKV(bs, perSeq); err != nil {
					t.Fatal(err)
				}
				m, err := models.LoadRandom(dir, be, 11)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { m.Close() })
				runs[i] = &graphRun{be: be, m: m, bs: bs, perSeq: perSeq}
			}
			V := runs[0].m.Config.VocabSize
			prompt := make([]int32, c.prompt)
			for i := range prompt {
				prompt[i] = int32((i*131 + 7) % V)
			}
			var next int32
			for i, r := range runs {
				b := backend.SingleSequence(1, prompt, 0, false)
				b.Seqs[0].Blocks = r.blocks(0, len(prompt))
				b.LogitRows = []int{len(prompt) - 1}
				v := r.step(t, b)
				if i == 0 {
					next = argmaxRows(v, 1)[0]
				}
			}
			_ = runs[0].be.TakeExpertLoad()
			calls0 := layerCalls.Load()
			past, worst, flips, chosen := len(prompt), 0.0, 0, int64(0)
			_ = runs[1].be.TakeExpertLoad()
			for st := range steps {
				var got [2][]float32
				for i, r := range runs {
					b := &backend.Batch{Tokens: []int32{next}, Positions: []int32{int32(past)},
						Seqs: []backend.SeqSpan{{ID: 1, Len: 1, Past: past, Blocks: r.blocks(0, past+1)}}}
					got[i] = r.step(t, b)
				}
				// The same experts chosen in every layer: the bound of the
				// fast profile's ops; a router near-tie that rounding flipped
				// (the kernel keeps the normed rows in float32, the ops round
				// them to bf16) sends the token to another expert: then only
				// a sanity bound.
				l0, l1 := runs[0].be.TakeExpertLoad(), runs[1].be.TakeExpertLoad()
				same := len(l0) == len(l1)
				for l, v := range l0 {
					same = same && slices.Equal(v, l1[l])
					for _, n := range v {
						chosen += n
					}
				}
				e := relL2(got[0], got[1])
				bound := 1e-2
				if !same {
					bound, flips = 0.25, flips+1
				} else {
					worst = max(worst, e)
				}
				if !(e <= bound) {
					t.Errorf("step %d (context %d, same experts %v): logits relative L2 %.3g between the layer kernel and the ops",
						st, past, same, e)
				}
				if !same {
					t.Logf("step %d (context %d): routing differs (a near-tie), relative L2 %.3g", st, past, e)
				}
				next = argmaxRows(got[0], 1)[0]
				past++
			}
			// Fast graph replays launch the captured kernel without running
			// the op's Go code; eager steps, captures and slow replays count.
			calls := layerCalls.Load() - calls0
			gs := runs[0].be.Graphs()
			want := 2 * (steps - gs.FastReplays)
			if calls != want {
				t.Errorf("the layer kernel ran %d layers (graph stats %+v), want %d", calls, gs, want)
			}
			if chosen != 2*steps*8 { // two MoE layers
				t.Errorf("the MoE layers' expert counters hold %d choices, want %d (2 layers × steps × top_k)", chosen, 2*steps*8)
			}
			if flips > steps/2 {
				t.Errorf("routing differed at %d of %d steps", flips, steps)
			}
			t.Logf("LAYER graphs=%v prompt=%d: %d steps, worst logits relative L2 %.3g where routing agreed, %d steps with a flipped near-tie; graphs %+v",
				c.graphs, c.prompt, steps, worst, flips, gs)
		})
	}
}
