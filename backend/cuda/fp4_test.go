package cuda

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/models/safetensors"
	"github.com/mkserve/mkserve/tensor"
)

// fp4Config is a small gpt-oss with MXFP4 experts (hidden and intermediate
// multiples of 64: FP4's blocks), sliding and full layers, sinks, biases
// and the clamped SwiGLU.
const fp4Config = `{
  "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
  "hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 2,
  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
  "num_local_experts": 16, "num_experts_per_tok": 4, "experts_per_token": 4,
  "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8,
  "attention_bias": true, "hidden_act": "silu", "swiglu_limit": 7.0,
  "rms_norm_eps": 1e-05, "rope_theta": 150000, "max_position_embeddings": 256,
  "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
    "original_max_position_embeddings": 64, "truncate": false},
  "vocab_size": 256, "tie_word_embeddings": false, "eos_token_id": 2, "pad_token_id": 0,
  "quantization_config": {"quant_method": "mxfp4",
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
}`

// TestFP4Weights loads a random MXFP4 gpt-oss on the CUDA backend with its
// experts held as FP4 and as bf16 (WeightsFP4 against WeightsAuto, which
// keeps so small a model in bf16, and WeightsStored), in the fast and the
// exact profile, and compares the logits of a prompt of 6 tokens (the FP4
// GEMV kernels) and of 40 (the FP4 grouped GEMMs). Fast profile: FP4
// against bf16, relative L2 ≤ 1e-2 and argmax at ≥ 95 % of positions (the
// two may agree to the bit: their MoE outputs differ below bf16's
// resolution, where every activation is rounded); against the CPU logged
// only (this random model amplifies x's rounding to bf16: ~0.1). Exact
// profile: the FP4 experts run the host path an expert at a time,
// dequantized, with x's split halves — FP4 against bf16 ≤ 1e-5 (2.2e-6 on
// the H200: the GEMMs see other buffers) and both against the CPU ≤ 1e-4
// (4.1e-6 each; 0.118 before, when exact FP4 read x in bf16).
func TestFP4Weights(t *testing.T) {
	gpuBackend(t) // skips without a GPU
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(fp4Config), 0o644); err != nil {
		t.Fatal(err)
	}
	load := func(be backend.Backend) *models.Loaded {
		l, err := models.LoadRandom(dir, be, 3)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	type run struct {
		be backend.Backend
		l  *models.Loaded
	}
	mk := func(split bool, weights string, wantFP4 int) run {
		be, err := New(Options{SplitActivations: &split, Weights: weights})
		if err != nil {
			t.Fatal(err)
		}
		l := load(be)
		if n := be.FP4Weights(); n != wantFP4 {
			t.Fatalf("split %v, weights %s: %d weights uploaded as FP4, want %d", split, weights, n, wantFP4)
		}
		return run{be, l}
	}
	// Two layers' gate_up and down each; auto keeps this small model's
	// experts in bf16 (PlanExperts: far below 60 % of the GPU).
	fastFP4, fastBF16 := mk(false, WeightsFP4, 4), mk(false, WeightsAuto, 0)
	exactFP4, exactBF16 := mk(true, WeightsFP4, 4), mk(true, WeightsStored, 0)
	// Two layers of 16 experts, gate/up [2·192, 128] and down [128, 192],
	// at 17/32 of a byte a value; the bf16 backend holds none.
	fb, sb := fastFP4.be.(*Backend).WeightBytes(), fastBF16.be.(*Backend).WeightBytes()
	if want := int64(2*16*(2*192*128+128*192)) * 17 / 32; fb.FP4 != want || sb.FP4 != 0 || fb.BF16+want*32/17*2 != sb.BF16 {
		t.Errorf("weights held: FP4 backend %+v, bf16 backend %+v; want %d FP4 bytes in place of their bf16", fb, sb, want)
	}
	cbe := cpu.New(cpu.Options{Weights: cpu.WeightsStored})
	cl := load(cbe)
	flat := func(r [][]float32) (v []float32) {
		for _, x := range r {
			v = append(v, x...)
		}
		return v
	}
	for _, n := range []int{6, 40} {
		ids := make([]int32, n)
		for i := range ids {
			ids[i] = int32((i*37 + 11) % 256)
		}
		logits := func(l *models.Loaded, be backend.Backend) [][]float32 {
			rows, err := engine.Logits(l.Model, be, ids)
			if err != nil {
				t.Fatal(err)
			}
			return rows
		}
		calls := moeFP4Calls.Load()
		ff, fb := logits(fastFP4.l, fastFP4.be), logits(fastBF16.l, fastBF16.be)
		ef, eb := logits(exactFP4.l, exactFP4.be), logits(exactBF16.l, exactBF16.be)
		if d := moeFP4Calls.Load() - calls; d != 4 {
			t.Fatalf("%d tokens: %d MoE layers ran on FP4 experts, want 4", n, d)
		}
		c := logits(cl, cbe)
		for _, k := range []struct {
			name     string
			got, ref [][]float32
			tol      float64
		}{{"fast: FP4 against bf16 experts", ff, fb, 1e-2}, {"exact: FP4 against bf16 experts", ef, eb, 1e-5},
			{"fast FP4 against the CPU", ff, c, -1}, {"exact FP4 against the CPU", ef, c, 1e-4}, {"exact bf16 against the CPU", eb, c, 1e-4}} {
			e := relL2(flat(k.got), flat(k.ref))
			same := 0
			for i := range k.got {
				if argmax(k.got[i]) == argmax(k.ref[i]) {
					same++
				}
			}
			if k.tol > 0 && (!(e <= k.tol) || same*100 < 95*n) {
				t.Errorf("%d tokens, %s: relative L2 %.3g (bound %g), argmax %d of %d", n, k.name, e, k.tol, same, n)
			} else {
				t.Logf("%d tokens, %s: relative L2 %.3g, argmax %d of %d", n, k.name, e, same, n)
			}
		}
	}
}

func argmax(v []float32) int {
	b := 0
	for i, x := range v {
		if x > v[b] {
			b = i
		}
	}
	return b
}

// TestPlanExperts: WeightsAuto holds an MXFP4 checkpoint's experts as FP4
// when their bf16 bytes pass 60 % of the GPU's memory, never another
// checkpoint's; the plan of a gpt-oss-120b-shaped config says so.
func TestPlanExperts(t *testing.T) {
	be := gpuBackend(t)
	mem := int64(be.Info().TotalMem)
	for _, c := range []struct {
		p    backend.ExpertPlan
		want bool
	}{
		{backend.ExpertPlan{Quant: "mxfp4", BF16Bytes: mem, E: 128}, true},
		{backend.ExpertPlan{Quant: "mxfp4", BF16Bytes: mem / 2, E: 128}, false},
		{backend.ExpertPlan{Quant: "", BF16Bytes: 2 * mem, E: 128}, false},
		{backend.ExpertPlan{Quant: "fp8", BF16Bytes: 2 * mem, E: 128}, false},
	} {
		be.PlanExperts(c.p)
		if got := be.fp4Auto.Load(); got != c.want {
			t.Errorf("%+v: FP4 %v, want %v", c.p, got, c.want)
		}
	}
	be.PlanExperts(backend.ExpertPlan{})
}

// TestFP4FromMXFP4Checkpoint writes the random MXFP4 gpt-oss of
// TestFP4Weights as an MXFP4 checkpoint (experts as blocks and E8M0
// scales, [E, out, in/32, 16]) and loads it with the experts held as FP4
// — handed over as stored (backend.FP4Loader, kernels.RepackMXFP4) — and
// as bf16: the same logits as the bf16 checkpoint of the same values
// loaded with FP4 experts by PackFP4 (bit for bit: the same FP4 values),
// within 1e-2 of the bf16 experts.
func TestFP4FromMXFP4Checkpoint(t *testing.T) {
	gpuBackend(t)
	cfgDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(cfgDir, "config.json"), []byte(fp4Config), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := models.LoadConfig(cfgDir)
	if err != nil {
		t.Fatal(err)
	}
	// Every tensor the model binds, made by a load on the CPU.
	src := &models.RandomSource{Config: cfg, Seed: 3}
	if _, err := models.Build(cfg, models.NewWeights(src, cpu.New(cpu.Options{})), cpu.New(cpu.Options{})); err != nil {
		t.Fatal(err)
	}
	var plain, quant []*tensor.Host
	for name, shape := range src.Shapes() {
		h, err := src.TensorOfShape(name, shape)
		if err != nil {
			t.Fatal(err)
		}
		plain = append(plain, h)
		if !strings.HasSuffix(name, "experts.gate_up_proj") && !strings.HasSuffix(name, "experts.down_proj") {
			quant = append(quant, h)
			continue
		}
		quant = append(quant, mxfp4Of(t, h)...)
	}
	write := func(ts []*tensor.Host, q bool) string {
		dir := t.TempDir()
		raw := fp4Config
		if !q {
			raw = strings.Replace(fp4Config, `"quantization_config"`, `"unused_quantization_config"`, 1)
		}
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(raw), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	qdir, pdir := write(quant, true), write(plain, false)
	off := false
	ids := []int32{11, 48, 85, 122, 159, 196, 233, 14, 51}
	logits := func(dir, weights string) ([]float32, int) {
		be, err := New(Options{SplitActivations: &off, Weights: weights})
		if err != nil {
			t.Fatal(err)
		}
		l, err := models.Load(dir, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		rows, err := engine.Logits(l.Model, be, ids)
		if err != nil {
			t.Fatal(err)
		}
		var v []float32
		for _, r := range rows {
			v = append(v, r...)
		}
		return v, be.FP4Weights()
	}
	direct, n1 := logits(qdir, WeightsFP4)
	packed, n2 := logits(pdir, WeightsFP4)
	bf, n3 := logits(qdir, WeightsStored)
	if n1 != 4 || n2 != 4 || n3 != 0 {
		t.Fatalf("FP4 uploads: %d from the blocks, %d packed from bf16, %d stored; want 4, 4, 0", n1, n2, n3)
	}
	if !slices.Equal(direct, packed) {
		t.Errorf("FP4 from the blocks against FP4 packed from bf16: relative L2 %.3g, want equal", relL2(direct, packed))
	}
	if e := relL2(direct, bf); !(e <= 1e-2) {
		t.Errorf("FP4 from the blocks against bf16 experts: relative L2 %.3g", e)
	}
}

// mxfp4Of is the MXFP4 blocks and scales of an expert tensor h [E, in,
// out] holding MXFP4's values (RandomSource's): [E, out, in/32, 16] and
// [E, out, in/32], as gpt-oss checkpoints store them.
func mxfp4Of(t *testing.T, h *tensor.Host) []*tensor.Host {
	v, err := h.Float32()
	if err != nil {
		t.Fatal(err)
	}
	E, in, out := h.Shape[0], h.Shape[1], h.Shape[2]
	G := in / 32
	rows := make([]float32, len(v)) // [E, out, in]: each output's inputs in groups of 32
	for e := range E {
		for k := range in {
			for o := range out {
				rows[(e*out+o)*in+k] = v[(e*in+k)*out+o]
			}
		}
	}
	blocks, scales := kernels.QuantizeMXFP4(rows, E*out, in)
	for i, b := range kernels.DecodeMXFP4(blocks, scales, E*out, in) {
		if tensor.BF16ToF32(b) != rows[i] {
			t.Fatalf("%s: %v is not an MXFP4 value", h.Name, rows[i])
		}
	}
	return []*tensor.Host{
		{Name: h.Name + "_blocks", DType: tensor.U8, Shape: []int{E, out, G, 16}, Data: blocks},
		{Name: h.Name + "_scales", DType: tensor.U8, Shape: []int{E, out, G}, Data: scales},
	}
}
