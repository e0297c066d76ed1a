package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/models"
)

// TestInspect: `mkserve inspect`'s estimates, from the headers alone, are
// the bytes the cpu backend then holds for each cpu_weights it can
// foresee (stored and q8) on the bundled model and every golden family,
// its parameter count the values the model binds and its KV bytes a token
// the model's; an MXFP4 expert counts 20 bytes a group of 32 under auto.
func TestInspect(t *testing.T) {
	dirs := []string{"../../models/default"}
	for _, fam := range []string{"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss"} {
		dirs = append(dirs, filepath.Join("../../models/testdata/golden", fam))
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			var out bytes.Buffer
			if err := cmdInspect([]string{"--model", dir, "--json"}, nil, &out); err != nil {
				t.Fatal(err)
			}
			var r inspectReport
			if err := json.Unmarshal(out.Bytes(), &r); err != nil {
				t.Fatal(err)
			}
			for _, c := range []struct {
				name string
				w    cpu.WeightFormat
			}{{"stored", cpu.WeightsStored}, {"q8", cpu.WeightsQ8}} {
				be := cpu.New(cpu.Options{Weights: c.w})
				l, err := models.Load(dir, be, models.LoadOptions{})
				if err != nil {
					t.Fatal(err)
				}
				held := be.WeightBytes()
				if kv := int64(l.Model.KVFloatsPerToken()) * 4; kv != r.KVBytesPerToken["float32"] {
					t.Errorf("inspect says %d KV bytes a token, the model caches %d", r.KVBytesPerToken["float32"], kv)
				}
				l.Close()
				if r.CPUBytes[c.name] != held.Total() {
					t.Errorf("%s: inspect says %d bytes, the backend holds %d (%+v)", c.name, r.CPUBytes[c.name], held.Total(), held)
				}
				if c.w == cpu.WeightsStored && r.Parameters+r.DerivedParameters != held.Values() {
					t.Errorf("inspect counts %d parameters and %d derived, the backend holds %d values", r.Parameters, r.DerivedParameters, held.Values())
				}
			}
			if r.ActiveParameters <= 0 || r.ActiveParameters > r.Parameters || r.ExpertParameters <= 0 || r.KVBytesPerToken["bf16"]*2 != r.KVBytesPerToken["float32"] {
				t.Errorf("report %+v", r)
			}
		})
	}
	inv := &models.Inventory{Config: &models.Config{NumLayers: 1, NumExperts: 4, NumExpertsPerTok: 1, NumKVHeads: 1, HeadDim: 32},
		Tensors: []models.TensorInfo{
			{Name: "model.layers.0.mlp.experts.gate_up_proj", Shape: []int{4, 64, 128}, Stored: "MXFP4"},
			{Name: "model.layers.0.mlp.router.weight", Shape: []int{4, 64}, Stored: "BF16"},
			{Name: "model.norm.weight", Shape: []int{64}, Stored: "BF16"},
		}}
	r := inspect(inv)
	if want := int64(4*64*128/32*20 + 4*64*2 + 64*4); r.CPUBytes["auto"] != want || r.CPUBytes["stored"] != int64(4*64*128*2+4*64*2+64*4) ||
		r.ActiveParameters != int64(64*128+4*64+64) {
		t.Errorf("MXFP4 inventory: %+v; want auto %d bytes", r, want)
	}
	// The cuda backend: bf16 matrices, float32 vectors; under fp4 the
	// experts at 17/32 of a byte a value (codes and E8M0 scales).
	if stored, fp4 := int64(4*64*128*2+4*64*2+64*4), int64(4*64*128*17/32+4*64*2+64*4); r.CUDABytes["stored"] != stored || r.CUDABytes["fp4"] != fp4 {
		t.Errorf("MXFP4 inventory on cuda: %v, want stored %d, fp4 %d", r.CUDABytes, stored, fp4)
	}
}
