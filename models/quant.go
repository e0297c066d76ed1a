package models

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/mkserve/mkserve/internal/par"
	"github.com/mkserve/mkserve/models/safetensors"
	"github.com/mkserve/mkserve/tensor"
)

// Quantized checkpoints are dequantized to bf16 as they load, so every
// family binds them like bf16 checkpoints:
//
//   - FP8 with block scales (DeepSeek-V3; quantization_config quant_method
//     "fp8", fmt "e4m3", weight_block_size [b0, b1]): a tensor NAME of
//     dtype F8_E4M3 [rows, cols] and NAME_scale_inv [⌈rows/b0⌉, ⌈cols/b1⌉]
//     (F32 or BF16) give NAME = fp8 · scale_inv of its block, rounded to bf16.
//   - MXFP4 (gpt-oss; quant_method "mxfp4"): NAME_blocks U8 [..., rows, G,
//     16] and NAME_scales U8 [..., rows, G] give NAME [..., G·32, rows]:
//     each byte holds two E2M1 values, the low nibble first, each group of
//     32 is scaled by 2^(scale − 127), and the last two dims are swapped
//     (the layout transformers dequantizes gpt-oss's experts to). Exact in
//     bf16.

// fp4Values are the E2M1 values by nibble (sign in bit 3).
var fp4Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0, -0.5, -1, -1.5, -2, -3, -4, -6}

// fp8E4M3 decodes an OCP E4M3 ("fn": no infinities) byte: bias 7, 3
// mantissa bits, subnormals below 2^-6, S.1111.111 is NaN; ±448 the largest.
func fp8E4M3(b byte) float32 {
	sign := float32(1)
	if b&0x80 != 0 {
		sign = -1
	}
	e, m := int(b>>3&0xF), float32(b&7)
	switch {
	case e == 15 && m == 7:
		return float32(math.NaN())
	case e == 0:
		return sign * m / 8 * float32(math.Ldexp(1, -6))
	}
	return sign * (1 + m/8) * float32(math.Ldexp(1, e-7))
}

// quantConfig is the checkpoint's quantization_config, as far as loading
// needs it.
type quantConfig struct {
	method string // "", "fp8" or "mxfp4"
	block  [2]int // fp8 weight_block_size
}

// parseQuant reads config.json's quantization_config (nil: not quantized).
func parseQuant(raw map[string]any) (quantConfig, error) {
	q, ok := raw["quantization_config"].(map[string]any)
	if !ok || q == nil {
		return quantConfig{}, nil
	}
	method, _ := q["quant_method"].(string)
	switch method {
	case "mxfp4":
		return quantConfig{method: method}, nil
	case "fp8":
		if f, ok := q["fmt"].(string); ok && f != "e4m3" {
			return quantConfig{}, fmt.Errorf("field %q: fp8 format %q is not supported (e4m3 is)", "quantization_config.fmt", f)
		}
		bs, ok := q["weight_block_size"].([]any)
		if !ok || len(bs) != 2 {
			return quantConfig{}, fmt.Errorf("field %q: fp8 without a [rows, cols] weight_block_size is not supported", "quantization_config.weight_block_size")
		}
		c := quantConfig{method: method}
		for i, v := range bs {
			n, ok := v.(float64)
			if !ok || n < 1 || n != math.Trunc(n) || n > 1<<20 {
				return quantConfig{}, fmt.Errorf("field %q: %v is not a block size", "quantization_config.weight_block_size", v)
			}
			c.block[i] = int(n)
		}
		return c, nil
	}
	return quantConfig{}, fmt.Errorf("field %q: quantization method %q is not supported (fp8 with block scales and mxfp4 are; or use a bf16 checkpoint)",
		"quantization_config.quant_method", method)
}

// quantSource is a checkpoint whose FP8 and MXFP4 tensors read as bf16
// under their plain names (see the comment above fp4Values).
type quantSource struct {
	ck    *safetensors.Checkpoint
	q     quantConfig
	names []string
	fp8   map[string]bool // plain name → F8_E4M3 with a _scale_inv
	mxfp4 map[string]bool // plain name → _blocks and _scales
	plain map[string]bool // every name of names
}

// newQuantSource checks that every tensor of ck is float, or part of a
// complete FP8 or MXFP4 group of the configured method, naming the file and
// tensor of the first that is not.
func newQuantSource(ck *safetensors.Checkpoint, q quantConfig) (*quantSource, error) {
	s := &quantSource{ck: ck, q: q, fp8: map[string]bool{}, mxfp4: map[string]bool{}}
	all := ck.Names()
	has := make(map[string]bool, len(all))
	for _, n := range all {
		has[n] = true
	}
	info := func(n string) (tensor.DType, []int) {
		dt, sh, _ := ck.Info(n)
		return dt, sh
	}
	bad := func(n, why string) error {
		return fmt.Errorf("%s: tensor %q: %s", ck.FileOf(n), n, why)
	}
	for _, n := range all {
		dt, sh := info(n)
		switch {
		case strings.HasSuffix(n, "_scale_inv") && has[strings.TrimSuffix(n, "_scale_inv")]:
			continue // read with its weight
		case dt == tensor.F8E4M3:
			if q.method != "fp8" {
				return nil, bad(n, "FP8 (F8_E4M3) weights need quantization_config quant_method \"fp8\" with a weight_block_size")
			}
			if len(sh) != 2 {
				return nil, bad(n, fmt.Sprintf("FP8 weight of shape %v: only 2-D weights are supported", sh))
			}
			sdt, ssh := info(n + "_scale_inv")
			want := []int{ceilDiv(sh[0], q.block[0]), ceilDiv(sh[1], q.block[1])}
			if !has[n+"_scale_inv"] || !sdt.Float() || !slices.Equal(ssh, want) {
				return nil, bad(n, fmt.Sprintf("FP8 weight %v needs a float %s_scale_inv of shape %v (blocks of %v), found %q %v",
					sh, n, want, q.block, sdt, ssh))
			}
			s.fp8[n] = true
			s.names = append(s.names, n)
		case dt == tensor.U8 && strings.HasSuffix(n, "_scales") && has[strings.TrimSuffix(n, "_scales")+"_blocks"]:
			continue // read with its blocks
		case dt == tensor.U8 && strings.HasSuffix(n, "_blocks"):
			base := strings.TrimSuffix(n, "_blocks")
			if q.method != "mxfp4" {
				return nil, bad(n, "MXFP4 blocks (U8) need quantization_config quant_method \"mxfp4\"")
			}
			sdt, ssh := info(base + "_scales")
			if !has[base+"_scales"] || sdt != tensor.U8 || len(sh) < 3 || sh[len(sh)-1] != 16 || !slices.Equal(ssh, sh[:len(sh)-1]) {
				return nil, bad(n, fmt.Sprintf("MXFP4 blocks %v need U8 %s_scales of shape %v (16 bytes a block), found %s %v",
					sh, base, sh[:max(len(sh)-1, 0)], sdt, ssh))
			}
			s.mxfp4[base] = true
			s.names = append(s.names, base)
		case dt.Float():
			s.names = append(s.names, n)
		default:
			return nil, ck.CheckFloat() // names the format of what is left
		}
	}
	s.plain = make(map[string]bool, len(s.names))
	for _, n := range s.names {
		s.plain[n] = true
	}
	return s, nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Has reports whether the checkpoint holds name (plain), without reading
// or dequantizing it.
func (s *quantSource) Has(name string) bool { return s.plain[name] }

// Names lists the plain names.
func (s *quantSource) Names() []string { return slices.Clone(s.names) }

// FileOf is the file of a plain name's data.
func (s *quantSource) FileOf(name string) string {
	if s.mxfp4[name] {
		return s.ck.FileOf(name + "_blocks")
	}
	return s.ck.FileOf(name)
}

// Tensor returns name, dequantized to bf16 when it is stored quantized.
func (s *quantSource) Tensor(name string) (*tensor.Host, error) {
	switch {
	case s.fp8[name]:
		w, err := s.ck.Tensor(name)
		if err != nil {
			return nil, err
		}
		sc, err := s.ck.Tensor(name + "_scale_inv")
		if err != nil {
			return nil, err
		}
		scale, err := sc.Float32()
		if err != nil {
			return nil, err
		}
		return dequantFP8(name, w, scale, s.q.block), nil
	case s.mxfp4[name]:
		b, err := s.ck.Tensor(name + "_blocks")
		if err != nil {
			return nil, err
		}
		sc, err := s.ck.Tensor(name + "_scales")
		if err != nil {
			return nil, err
		}
		return dequantMXFP4(name, b, sc), nil
	}
	return s.ck.Tensor(name)
}

// mxfp4Raw returns name's MXFP4 blocks and scales as the checkpoint stores
// them (U8, [..., rows, G, 16] and [..., rows, G]); ok is false when name
// is not an MXFP4 tensor.
func (s *quantSource) mxfp4Raw(name string, _, _, _ int) (blocks, scales *tensor.Host, ok bool, err error) {
	if !s.mxfp4[name] {
		return nil, nil, false, nil
	}
	if blocks, err = s.ck.Tensor(name + "_blocks"); err != nil {
		return nil, nil, false, err
	}
	if scales, err = s.ck.Tensor(name + "_scales"); err != nil {
		return nil, nil, false, err
	}
	return blocks, scales, true, nil
}

// dequantFP8 is w [rows, cols] (F8_E4M3) times its block's scale
// [⌈rows/b0⌉, ⌈cols/b1⌉], in bf16.
func dequantFP8(name string, w *tensor.Host, scale []float32, block [2]int) *tensor.Host {
	rows, cols := w.Shape[0], w.Shape[1]
	sc := ceilDiv(cols, block[1])
	out := make([]byte, 2*rows*cols)
	par.For(rows, max(1, (1<<16)/max(cols, 1)), func() func(lo, hi int) {
		return func(lo, hi int) {
			for r := lo; r < hi; r++ {
				srow := scale[(r/block[0])*sc:]
				for c := 0; c < cols; c++ {
					v := fp8E4M3(w.Data[r*cols+c]) * srow[c/block[1]]
					binary.LittleEndian.PutUint16(out[2*(r*cols+c):], tensor.F32ToBF16(v))
				}
			}
		}
	})
	return &tensor.Host{Name: name, DType: tensor.BF16, Shape: []int{rows, cols}, Data: out}
}

// dequantMXFP4 turns blocks [..., rows, G, 16] and scales [..., rows, G]
// into [..., G·32, rows] bf16 (see the comment above fp4Values).
func dequantMXFP4(name string, blocks, scales *tensor.Host) *tensor.Host {
	sh := blocks.Shape
	rows, G := sh[len(sh)-3], sh[len(sh)-2]
	outer := 1
	for _, d := range sh[:len(sh)-3] {
		outer *= d
	}
	cols := G * 32
	out := make([]byte, 2*outer*rows*cols)
	par.For(outer*rows, 64, func() func(lo, hi int) {
		row := make([]float32, cols)
		return func(lo, hi int) {
			for i := lo; i < hi; i++ {
				o, r := i/rows, i%rows
				for g := 0; g < G; g++ {
					s := float32(math.Ldexp(1, int(scales.Data[i*G+g])-127))
					blk := blocks.Data[(i*G+g)*16:][:16]
					for j, b := range blk {
						row[g*32+2*j] = fp4Values[b&0xF] * s
						row[g*32+2*j+1] = fp4Values[b>>4] * s
					}
				}
				// Column c of this row lands at [o, c, r].
				base := o * cols * rows
				for c, v := range row {
					binary.LittleEndian.PutUint16(out[2*(base+c*rows+r):], tensor.F32ToBF16(v))
				}
			}
		}
	})
	shape := append(slices.Clone(sh[:len(sh)-3]), cols, rows)
	return &tensor.Host{Name: name, DType: tensor.BF16, Shape: shape, Data: out}
}
