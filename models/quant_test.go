package models

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/models/safetensors"
	"github.com/mkserve/mkserve/tensor"
)

// TestFP8E4M3: the OCP E4M3 constants (1.0 = 0x38, the largest normal 448
// = 0x7E, the smallest normal 2^-6 = 0x08, the smallest subnormal 2^-9 =
// 0x01, NaN = 0x7F/0xFF, no infinities), sign symmetry, and monotonic
// positive codes.
func TestFP8E4M3(t *testing.T) {
	for _, tc := range []struct {
		b    byte
		want float64
	}{{0x00, 0}, {0x38, 1}, {0x7E, 448}, {0x08, 1.0 / 64}, {0x01, 1.0 / 512}, {0x07, 7.0 / 512},
		{0x3F, 1.875}, {0x40, 2}, {0xB8, -1}, {0xFE, -448}} {
		if got := fp8E4M3(tc.b); float64(got) != tc.want {
			t.Errorf("fp8E4M3(%#02x) = %v, want %v", tc.b, got, tc.want)
		}
	}
	for _, b := range []byte{0x7F, 0xFF} {
		if v := fp8E4M3(b); v == v {
			t.Errorf("fp8E4M3(%#02x) = %v, want NaN", b, v)
		}
	}
	for b := 1; b <= 0x7E; b++ {
		if !(fp8E4M3(byte(b)) > fp8E4M3(byte(b-1))) {
			t.Fatalf("codes %#02x, %#02x not increasing", b-1, b)
		}
		if fp8E4M3(byte(b)|0x80) != -fp8E4M3(byte(b)) {
			t.Fatalf("code %#02x: sign not symmetric", b)
		}
	}
}

// TestDequantFP8Blocks: each element is scaled by its own block's scale,
// with partial blocks at the edges.
func TestDequantFP8Blocks(t *testing.T) {
	codes := []byte{0x38, 0x40, 0xB8, 0x30, 0x38, 0x38, 0x44, 0x01, 0x00, 0x38, 0x3C, 0x48, 0x38, 0x38, 0x38} // [5, 3]
	scale := []float32{0.5, 4, 2, 8, 0.25, 1}                                                                 // [3, 2] for blocks of 2×2
	h := dequantFP8("w", &tensor.Host{DType: tensor.F8E4M3, Shape: []int{5, 3}, Data: codes}, scale, [2]int{2, 2})
	if !slices.Equal(h.Shape, []int{5, 3}) || h.DType != tensor.BF16 {
		t.Fatalf("shape %v dtype %s", h.Shape, h.DType)
	}
	got, _ := h.Float32()
	for r := range 5 {
		for c := range 3 {
			want := fp8E4M3(codes[r*3+c]) * scale[(r/2)*2+c/2]
			if got[r*3+c] != want {
				t.Errorf("[%d,%d] = %v, want %v", r, c, got[r*3+c], want)
			}
		}
	}
}

// TestDequantMXFP4Layout: low nibble first, a group's scale 2^(s−127), and
// the last two dims swapped, on a hand-built block.
func TestDequantMXFP4Layout(t *testing.T) {
	blocks := make([]byte, 2*16) // [1 expert, 2 rows, 1 group, 16 bytes]
	blocks[0] = 0x21             // row 0: 0.5 (lo), 1.0 (hi)
	blocks[16] = 0x9F            // row 1: −6 (lo), −0.5 (hi)
	blocks[16+15] = 0x7E         // row 1, last byte: −4 (lo, nibble 0xE), 6 (hi)
	scales := []byte{128, 126}   // row 0 ×2, row 1 ×0.5
	h := dequantMXFP4("w", &tensor.Host{DType: tensor.U8, Shape: []int{1, 2, 1, 16}, Data: blocks},
		&tensor.Host{DType: tensor.U8, Shape: []int{1, 2, 1}, Data: scales})
	if !slices.Equal(h.Shape, []int{1, 32, 2}) {
		t.Fatalf("shape %v, want [1 32 2]", h.Shape)
	}
	v, _ := h.Float32()
	at := func(c, r int) float32 { return v[c*2+r] }
	for _, tc := range []struct {
		c, r int
		want float32
	}{{0, 0, 1}, {1, 0, 2}, {2, 0, 0}, {0, 1, -3}, {1, 1, -0.25}, {30, 1, -2}, {31, 1, 3}} {
		if got := at(tc.c, tc.r); got != tc.want {
			t.Errorf("[%d, %d] = %v, want %v", tc.c, tc.r, got, tc.want)
		}
	}
}

// goldenTensors reads a golden checkpoint's config and tensors.
func goldenTensors(t *testing.T, family string) (map[string]any, []*tensor.Host) {
	t.Helper()
	dir := filepath.Join("testdata/golden", family)
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var ts []*tensor.Host
	for _, n := range ck.Names() {
		h, err := ck.Tensor(n)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, &tensor.Host{Name: n, DType: h.DType, Shape: slices.Clone(h.Shape), Data: slices.Clone(h.Data)})
	}
	return cfg, ts
}

func writeDir(t *testing.T, cfg map[string]any, ts []*tensor.Host) string {
	t.Helper()
	dir := t.TempDir()
	data, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

func bf16Host(name string, shape []int, v []float32) *tensor.Host {
	b := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(b[2*i:], tensor.F32ToBF16(x))
	}
	return &tensor.Host{Name: name, DType: tensor.BF16, Shape: shape, Data: b}
}

func logitsOf(t *testing.T, dir string) []float32 {
	t.Helper()
	return logitsOn(t, dir, cpu.New(cpu.Options{}))
}

// logitsOn is logitsOf on be.
func logitsOn(t *testing.T, dir string, be backend.Backend) []float32 {
	t.Helper()
	l, err := Load(dir, be, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	out, err := l.Model.Forward(backend.SingleSequence(1, []int32{1, 7, 30, 2, 99}, 0, true))
	if err != nil {
		t.Fatal(err)
	}
	return be.ToHost(out)
}

// TestLoadMXFP4: gpt-oss's experts quantized to MXFP4 by this test
// (blocks [E, out, in/32, 16], scales [E, out, in/32]) load to exactly the
// logits of a bf16 checkpoint holding the values the test's own quantizer
// chose, in gpt-oss's bf16 layout ([E, in, out]).
func TestLoadMXFP4(t *testing.T) {
	cfg, ts := goldenTensors(t, "gpt_oss")
	var quant, plain []*tensor.Host
	quantized := 0
	for _, h := range ts {
		if !strings.HasSuffix(h.Name, "experts.gate_up_proj") && !strings.HasSuffix(h.Name, "experts.down_proj") {
			quant, plain = append(quant, h), append(plain, h)
			continue
		}
		v, _ := h.Float32()
		E, in, out := h.Shape[0], h.Shape[1], h.Shape[2] // bf16 layout [E, in, out]
		G := in / 32
		// MXFP4 stores [E, out, in]: each output's inputs in groups of 32.
		rows := make([]float32, len(v))
		for e := range E {
			for k := range in {
				for o := range out {
					rows[(e*out+o)*in+k] = v[(e*in+k)*out+o]
				}
			}
		}
		blocks, scales := kernels.QuantizeMXFP4(rows, E*out, in)
		// The values the blocks stand for, by the spec's table.
		deq := make([]float32, len(v))
		for e := range E {
			for o := range out {
				for k := range in {
					q := (e*out+o)*G + k/32
					nib := blocks[q*16+k%32/2] >> (4 * (k % 2)) & 0xF
					deq[(e*in+k)*out+o] = float32(fp4Spec[nib] * math.Ldexp(1, int(scales[q])-127))
				}
			}
		}
		quant = append(quant,
			&tensor.Host{Name: h.Name + "_blocks", DType: tensor.U8, Shape: []int{E, out, G, 16}, Data: blocks},
			&tensor.Host{Name: h.Name + "_scales", DType: tensor.U8, Shape: []int{E, out, G}, Data: scales})
		plain = append(plain, bf16Host(h.Name, h.Shape, deq))
		quantized++
	}
	if quantized == 0 {
		t.Fatal("no expert tensors found to quantize")
	}
	qcfg := maps(cfg)
	qcfg["quantization_config"] = map[string]any{"quant_method": "mxfp4", "modules_to_not_convert": []any{}}
	qdir := writeDir(t, qcfg, quant)
	got, want := logitsOf(t, qdir), logitsOf(t, writeDir(t, cfg, plain))
	if !slices.Equal(got, want) {
		t.Errorf("MXFP4 checkpoint's logits differ from the dequantized bf16 checkpoint's (relative L2 %.3g)", relL2(got, want))
	}
	// The CPU backend holds the experts as FP4 by default (MXFP4's values,
	// exactly): the logits of holding them in bf16 to float32 rounding, in
	// 5/16 of the bytes.
	auto, stored := cpu.New(cpu.Options{}), cpu.New(cpu.Options{Weights: cpu.WeightsStored})
	if a, s := logitsOn(t, qdir, auto), logitsOn(t, qdir, stored); relL2(a, s) > 1e-5 {
		t.Errorf("experts held as FP4: logits differ from bf16's by relative L2 %.3g", relL2(a, s))
	}
	// auto takes the experts as stored (backend.FP4Loader: the blocks
	// handed over, no bf16 on the way), to the same logits as from their
	// bf16 values (FP4 again, by exactFP4).
	direct := &countFP4{Backend: cpu.New(cpu.Options{})}
	viaBF16 := cpu.New(cpu.Options{})
	if d, v := logitsOn(t, qdir, direct), logitsOn(t, writeDir(t, cfg, plain), viaBF16); !slices.Equal(d, v) || direct.n != quantized {
		t.Errorf("MXFP4 handed over as stored: %d matrices of %d, logits at relative L2 %.3g from those of the bf16 values", direct.n, quantized, relL2(d, v))
	}
	if d, v := direct.WeightBytes(), viaBF16.WeightBytes(); d != v {
		t.Errorf("weights held from the blocks %+v, from bf16 %+v", d, v)
	}
	ab, sb := auto.WeightBytes(), stored.WeightBytes()
	t.Logf("weights held: auto %+v, stored %+v", ab, sb)
	if ab.FP4 == 0 || sb.FP4 != 0 || ab.Q8 != 0 || ab.BF16+ab.FP4*16/5 != sb.BF16 {
		t.Errorf("weights held: auto %+v, stored %+v; want the experts' bf16 bytes as FP4 (5/16 of them)", ab, sb)
	}
	// Without the quantization_config the blocks are refused, naming them.
	if _, err := Load(writeDir(t, cfg, quant), cpu.New(cpu.Options{}), LoadOptions{}); err == nil || !strings.Contains(err.Error(), "MXFP4") {
		t.Errorf("MXFP4 blocks without quantization_config: %v", err)
	}
}

// fp4Spec is the E2M1 value of each nibble, from the OCP MX spec (sign in
// bit 3), written out independently of fp4Values.
var fp4Spec = []float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6}

// TestLoadFP8: DeepSeek-V3's projection weights quantized to FP8 E4M3 with
// 128×128 block scales by this test load to exactly the logits of a bf16
// checkpoint holding the values the test's quantizer chose; a scale of the
// wrong shape is an error naming the tensor.
func TestLoadFP8(t *testing.T) {
	cfg, ts := goldenTensors(t, "deepseek_v3")
	const B = 128
	var quant, plain []*tensor.Host
	n := 0
	for _, h := range ts {
		if !strings.HasSuffix(h.Name, "_proj.weight") || len(h.Shape) != 2 {
			quant, plain = append(quant, h), append(plain, h)
			continue
		}
		v, _ := h.Float32()
		rows, cols := h.Shape[0], h.Shape[1]
		sr, sc := (rows+B-1)/B, (cols+B-1)/B
		scale := make([]float32, sr*sc)
		codes := make([]byte, rows*cols)
		deq := make([]float32, rows*cols)
		for br := range sr {
			for bc := range sc {
				amax := float32(0)
				for r := br * B; r < min(rows, (br+1)*B); r++ {
					for c := bc * B; c < min(cols, (bc+1)*B); c++ {
						amax = max(amax, float32(math.Abs(float64(v[r*cols+c]))))
					}
				}
				s := amax / 448
				if s == 0 {
					s = 1
				}
				scale[br*sc+bc] = s
				for r := br * B; r < min(rows, (br+1)*B); r++ {
					for c := bc * B; c < min(cols, (bc+1)*B); c++ {
						x := v[r*cols+c] / s
						best := byte(0)
						for code := 0; code < 256; code++ {
							if f := e4m3Spec(byte(code)); f == f && math.Abs(float64(x-f)) < math.Abs(float64(x-e4m3Spec(best))) {
								best = byte(code)
							}
						}
						codes[r*cols+c] = best
						deq[r*cols+c] = e4m3Spec(best) * s
					}
				}
			}
		}
		quant = append(quant, &tensor.Host{Name: h.Name, DType: tensor.F8E4M3, Shape: h.Shape, Data: codes},
			tensor.FromFloat32(h.Name+"_scale_inv", []int{sr, sc}, scale))
		plain = append(plain, bf16Host(h.Name, h.Shape, deq))
		n++
	}
	if n == 0 {
		t.Fatal("no projection weights found to quantize")
	}
	qcfg := maps(cfg)
	qcfg["quantization_config"] = map[string]any{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
		"weight_block_size": []any{float64(B), float64(B)}}
	got, want := logitsOf(t, writeDir(t, qcfg, quant)), logitsOf(t, writeDir(t, cfg, plain))
	if !slices.Equal(got, want) {
		t.Errorf("FP8 checkpoint's logits differ from the dequantized bf16 checkpoint's (relative L2 %.3g)", relL2(got, want))
	}
	// A block size the scales do not fit: the error names the tensor.
	qcfg["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []any{float64(2), float64(2)}}
	if _, err := Load(writeDir(t, qcfg, quant), cpu.New(cpu.Options{}), LoadOptions{}); err == nil || !strings.Contains(err.Error(), "_scale_inv") {
		t.Errorf("mismatched block size: %v", err)
	}
	qcfg["quantization_config"] = map[string]any{"quant_method": "gptq"}
	if _, err := Load(writeDir(t, qcfg, quant), cpu.New(cpu.Options{}), LoadOptions{}); err == nil || !strings.Contains(err.Error(), "gptq") {
		t.Errorf("unsupported method: %v", err)
	}
}

// e4m3Spec decodes E4M3 from the spec's definition: (−1)^s · 2^(e−7) ·
// (1 + m/8) for e > 0, (−1)^s · 2^−6 · m/8 for e = 0, NaN for e = 15, m = 7.
func e4m3Spec(b byte) float32 {
	s, e, m := float64(1-2*int(b>>7)), int(b>>3)&15, float64(b&7)
	if e == 15 && m == 7 {
		return float32(math.NaN())
	}
	if e == 0 {
		return float32(s * math.Ldexp(m/8, -6))
	}
	return float32(s * math.Ldexp(1+m/8, e-7))
}

func maps(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func relL2(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / den)
}

// TestCheckpointShapesQuantized: the shapes the model binds, for a
// quantized checkpoint, are the dequantized ones under plain names.
func TestCheckpointShapesQuantized(t *testing.T) {
	blocks := &tensor.Host{Name: "m.experts.down_proj_blocks", DType: tensor.U8, Shape: []int{2, 6, 2, 16}, Data: make([]byte, 2*6*2*16)}
	scales := &tensor.Host{Name: "m.experts.down_proj_scales", DType: tensor.U8, Shape: []int{2, 6, 2}, Data: make([]byte, 2*6*2)}
	plain := tensor.FromFloat32("m.norm.weight", []int{6}, make([]float32, 6))
	cfg, _ := goldenTensors(t, "gpt_oss")
	cfg["quantization_config"] = map[string]any{"quant_method": "mxfp4"}
	dir := writeDir(t, cfg, []*tensor.Host{blocks, scales, plain})
	got, err := CheckpointShapes(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !slices.Equal(got["m.experts.down_proj"], []int{2, 64, 6}) || !slices.Equal(got["m.norm.weight"], []int{6}) {
		t.Errorf("shapes %v", got)
	}
}

// countFP4 is a CPU backend counting the matrices handed to it as MXFP4.
type countFP4 struct {
	*cpu.Backend
	n int
}

func (c *countFP4) WeightMXFP4(name string, blocks, scales []byte, n, k int) (backend.Tensor, error) {
	c.n++
	return c.Backend.WeightMXFP4(name, blocks, scales, n, k)
}
