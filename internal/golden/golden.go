// Package golden reads the reference outputs scripts/gen_golden.py wrote
// with transformers next to each tiny checkpoint in models/testdata/golden.
package golden

import (
	"encoding/binary"
	"fmt"
	"path/filepath"

	"github.com/mkserve/mkserve/models/safetensors"
)

// Families are the checkpoints under models/testdata/golden, one per
// supported family.
var Families = []string{"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"}

// Data is one family's reference.
type Data struct {
	IDs       []int32   // [S] the token sequence
	Logits    []float32 // [S, vocab] transformers' float32 logits
	GenPrompt []int32   // the prompt given to generate()
	GenOutput []int32   // generate()'s output: the prompt, then the greedy continuation
}

// Read loads dir/family/golden.safetensors.
func Read(dir, family string) (*Data, error) {
	path := filepath.Join(dir, family, "golden.safetensors")
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("golden data for %s (regenerate with scripts/gen_golden.py): %w", family, err)
	}
	defer f.Close()
	ints := func(name string) ([]int32, error) {
		h, ok := f.Tensor(name)
		if !ok || len(h.Data) != 8*h.Len() {
			return nil, fmt.Errorf("%s: no I64 tensor %q", path, name)
		}
		out := make([]int32, h.Len())
		for i := range out {
			out[i] = int32(int64(binary.LittleEndian.Uint64(h.Data[8*i:])))
		}
		return out, nil
	}
	d := &Data{}
	for name, dst := range map[string]*[]int32{"ids": &d.IDs, "gen_prompt": &d.GenPrompt, "gen_output": &d.GenOutput} {
		if *dst, err = ints(name); err != nil {
			return nil, err
		}
	}
	h, ok := f.Tensor("logits")
	if !ok {
		return nil, fmt.Errorf("%s: no tensor %q", path, "logits")
	}
	if d.Logits, err = h.Float32(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}
