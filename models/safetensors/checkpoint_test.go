package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// shardedDir writes nShards shards of random tensors and a matching index
// into a new directory. It returns the directory and the tensors by name.
func shardedDir(t *testing.T, rng *rand.Rand, nShards int) (string, map[string]*tensor.Host, map[string]string) {
	t.Helper()
	dir := t.TempDir()
	all := map[string]*tensor.Host{}
	weightMap := map[string]string{}
	dtypes := []tensor.DType{tensor.F32, tensor.F16, tensor.BF16}
	total := 0
	for s := 0; s < nShards; s++ {
		file := fmt.Sprintf("model-%05d-of-%05d.safetensors", s+1, nShards)
		var ts []*tensor.Host
		for i := 0; i < 3+rng.IntN(4); i++ {
			name := fmt.Sprintf("model.layers.%d.mlp.experts.%d.w%d.weight", s, i, rng.IntN(3)+1)
			x := randTensor(rng, name, dtypes[rng.IntN(len(dtypes))], []int{1 + rng.IntN(6), 1 + rng.IntN(6)})
			ts = append(ts, x)
			all[name] = x
			weightMap[name] = file
			total += len(x.Data)
		}
		if err := Write(filepath.Join(dir, file), ts, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
	}
	writeIndex(t, dir, weightMap, total)
	return dir, all, weightMap
}

// writeIndex writes model.safetensors.index.json the way transformers does.
func writeIndex(t *testing.T, dir string, weightMap map[string]string, total int) {
	t.Helper()
	b, err := json.MarshalIndent(map[string]any{
		"metadata":   map[string]any{"total_size": total},
		"weight_map": weightMap,
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	writeRaw(t, dir, IndexName, b)
}

func TestSingleFileDir(t *testing.T) {
	rng := newRNG(t)
	dir := t.TempDir()
	ts := []*tensor.Host{
		randTensor(rng, "lm_head.weight", tensor.BF16, []int{7, 4}),
		randTensor(rng, "model.embed_tokens.weight", tensor.BF16, []int{7, 4}),
		randTensor(rng, "model.norm.weight", tensor.F32, []int{4}),
	}
	path := filepath.Join(dir, SingleName)
	if err := Write(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	writeRaw(t, dir, "config.json", []byte(`{}`))
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Index != "" {
		t.Fatalf("Index %q for a single-file checkpoint", c.Index)
	}
	want := []string{"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}
	if got := c.Names(); !slices.Equal(got, want) {
		t.Fatalf("names %v, want %v", got, want)
	}
	var total int64
	for _, x := range ts {
		got, err := c.Tensor(x.Name)
		if err != nil {
			t.Fatal(err)
		}
		sameTensor(t, got, x)
		if c.FileOf(x.Name) != path {
			t.Fatalf("FileOf(%q) = %q, want %q", x.Name, c.FileOf(x.Name), path)
		}
		total += int64(len(x.Data))
	}
	if c.TotalBytes() != total {
		t.Fatalf("TotalBytes %d, want %d", c.TotalBytes(), total)
	}
	if err := c.CheckFloat(); err != nil {
		t.Fatal(err)
	}
	_, err = c.Tensor("model.layers.0.self_attn.q_proj.weight")
	checkErr(t, err, `no tensor "model.layers.0.self_attn.q_proj.weight"`, path)
	if c.FileOf("nope") != "" {
		t.Fatal("FileOf of a missing tensor is not empty")
	}
}

func TestShardedDir(t *testing.T) {
	rng := newRNG(t)
	dir, all, weightMap := shardedDir(t, rng, 4)
	// A stray shard not in the index is not opened.
	writeRaw(t, dir, "consolidated.safetensors", []byte("junk"))
	c, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Index != filepath.Join(dir, IndexName) {
		t.Fatalf("Index %q", c.Index)
	}
	var want []string
	var total int64
	for name, x := range all {
		want = append(want, name)
		total += int64(len(x.Data))
	}
	sort.Strings(want)
	if got := c.Names(); !slices.Equal(got, want) {
		t.Fatalf("names %v, want %v", got, want)
	}
	for name, x := range all {
		got, err := c.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		sameTensor(t, got, x)
		if fw := filepath.Join(dir, weightMap[name]); c.FileOf(name) != fw {
			t.Fatalf("FileOf(%q) = %q, want %q", name, c.FileOf(name), fw)
		}
		dt, shape, err := c.Info(name)
		if err != nil || dt != x.DType || !slices.Equal(shape, x.Shape) {
			t.Fatalf("Info(%q) = %s %v %v", name, dt, shape, err)
		}
	}
	if c.TotalBytes() != total {
		t.Fatalf("TotalBytes %d, want %d", c.TotalBytes(), total)
	}
	if len(c.Files()) != 4 {
		t.Fatalf("Files %v", c.Files())
	}
	_, err = c.Tensor("missing.weight")
	checkErr(t, err, `no tensor "missing.weight"`, IndexName)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Tensor(want[0]); err == nil {
		t.Fatal("Tensor after Close succeeded")
	}
	if len(c.Names()) != 0 || c.CheckFloat() != nil || c.TotalBytes() != 0 {
		t.Fatal("a closed checkpoint still lists tensors")
	}
}

// TestShardedMalformed breaks a good sharded directory in one way each.
func TestShardedMalformed(t *testing.T) {
	shard1 := "model-00001-of-00002.safetensors"
	shard2 := "model-00002-of-00002.safetensors"
	cases := []struct {
		name   string
		break_ func(t *testing.T, dir string, wm map[string]string, all map[string]*tensor.Host)
		want   []string
	}{
		{"missing shard", func(t *testing.T, dir string, wm map[string]string, _ map[string]*tensor.Host) {
			os.Remove(filepath.Join(dir, shard2))
		}, []string{IndexName, shard2, "is missing"}},
		{"tensor in index not in shard", func(t *testing.T, dir string, wm map[string]string, _ map[string]*tensor.Host) {
			wm["model.ghost.weight"] = shard1
			writeIndex(t, dir, wm, 0)
		}, []string{IndexName, `"model.ghost.weight"`, shard1, "does not contain it"}},
		{"tensor in shard not in index", func(t *testing.T, dir string, wm map[string]string, _ map[string]*tensor.Host) {
			for name, f := range wm {
				if f == shard2 {
					delete(wm, name)
					break
				}
			}
			writeIndex(t, dir, wm, 0)
		}, []string{IndexName, shard2, "not in the index"}},
		{"index names wrong shard", func(t *testing.T, dir string, wm map[string]string, _ map[string]*tensor.Host) {
			for name, f := range wm {
				if f == shard2 {
					wm[name] = shard1
					break
				}
			}
			writeIndex(t, dir, wm, 0)
		}, []string{IndexName, "is in shard", shard2, "the index lists it in " + shard1}},
		{"tensor in two shards", func(t *testing.T, dir string, wm map[string]string, all map[string]*tensor.Host) {
			// Rewrite shard 2 with one of shard 1's tensors added.
			var ts []*tensor.Host
			var dup string
			for name, f := range wm {
				if f == shard2 {
					ts = append(ts, all[name])
				} else if dup == "" {
					dup = name
				}
			}
			ts = append(ts, all[dup])
			if err := Write(filepath.Join(dir, shard2), ts, nil); err != nil {
				t.Fatal(err)
			}
		}, []string{"is in two shards", shard1, shard2}},
		{"bad shard file", func(t *testing.T, dir string, _ map[string]string, _ map[string]*tensor.Host) {
			writeRaw(t, dir, shard2, []byte{1, 2})
		}, []string{shard2, "shorter than the 8-byte"}},
		{"index not json", func(t *testing.T, dir string, _ map[string]string, _ map[string]*tensor.Host) {
			writeRaw(t, dir, IndexName, []byte(`{"weight_map": {`))
		}, []string{IndexName, "not valid JSON"}},
		{"index without weight_map", func(t *testing.T, dir string, _ map[string]string, _ map[string]*tensor.Host) {
			writeRaw(t, dir, IndexName, []byte(`{"metadata": {}}`))
		}, []string{IndexName, `no "weight_map"`}},
		{"empty weight_map", func(t *testing.T, dir string, _ map[string]string, _ map[string]*tensor.Host) {
			writeRaw(t, dir, IndexName, []byte(`{"weight_map": {}}`))
		}, []string{IndexName, "weight_map is empty"}},
		{"weight_map not object", func(t *testing.T, dir string, _ map[string]string, _ map[string]*tensor.Host) {
			writeRaw(t, dir, IndexName, []byte(`{"weight_map": ["a"]}`))
		}, []string{IndexName, "weight_map", "not a JSON object"}},
		{"weight_map value not string", func(t *testing.T, dir string, _ map[string]string, _ map[string]*tensor.Host) {
			writeRaw(t, dir, IndexName, []byte(`{"weight_map": {"a.weight": 1}}`))
		}, []string{IndexName, `"a.weight"`, "not a string"}},
		{"weight_map duplicate", func(t *testing.T, dir string, _ map[string]string, _ map[string]*tensor.Host) {
			writeRaw(t, dir, IndexName, []byte(`{"weight_map": {"a.weight": "`+shard1+`", "a.weight": "`+shard2+`"}}`))
		}, []string{IndexName, `"a.weight" twice`}},
		{"shard outside dir", func(t *testing.T, dir string, wm map[string]string, _ map[string]*tensor.Host) {
			for name := range wm {
				wm[name] = "../" + shard1
				break
			}
			writeIndex(t, dir, wm, 0)
		}, []string{IndexName, `"../` + shard1 + `"`, "not a file inside the model directory"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rng := newRNG(t)
			dir, all, wm := shardedDir(t, rng, 2)
			c.break_(t, dir, wm, all)
			ck, err := OpenDir(dir)
			if err == nil {
				ck.Close()
			}
			checkErr(t, err, c.want...)
		})
	}
}

func TestDirWithoutWeights(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		dir := t.TempDir()
		writeRaw(t, dir, "config.json", []byte(`{}`))
		_, err := OpenDir(dir)
		checkErr(t, err, dir, "no weights found", IndexName, SingleName)
	})
	t.Run("pytorch bins", func(t *testing.T) {
		dir := t.TempDir()
		writeRaw(t, dir, "pytorch_model-00001-of-00002.bin", []byte("x"))
		writeRaw(t, dir, "pytorch_model.bin.index.json", []byte("{}"))
		_, err := OpenDir(dir)
		checkErr(t, err, dir, "pytorch_model-00001-of-00002.bin", "PyTorch pickle", "convert them to safetensors")
	})
	t.Run("other safetensors names", func(t *testing.T) {
		dir := t.TempDir()
		writeRaw(t, dir, "consolidated.safetensors", []byte("x"))
		_, err := OpenDir(dir)
		checkErr(t, err, dir, "consolidated.safetensors", "no index")
	})
	t.Run("not a directory", func(t *testing.T) {
		p := writeRaw(t, t.TempDir(), SingleName, []byte("x"))
		_, err := OpenDir(p)
		checkErr(t, err, p, "not a directory")
	})
	t.Run("missing", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "nope")
		_, err := OpenDir(p)
		checkErr(t, err, p)
	})
}

func TestCheckFloat(t *testing.T) {
	rng := newRNG(t)
	cases := []struct {
		name    string
		tensors []*tensor.Host
		want    []string // empty: no error
	}{
		{"bf16 f16 f32", []*tensor.Host{
			randTensor(rng, "a.weight", tensor.BF16, []int{2, 2}),
			randTensor(rng, "b.weight", tensor.F16, []int{2}),
			randTensor(rng, "c.weight", tensor.F32, []int{3}),
		}, nil},
		{"deepseek fp8", []*tensor.Host{
			randTensor(rng, "model.layers.3.mlp.experts.0.down_proj.weight", tensor.F8E4M3, []int{4, 8}),
			randTensor(rng, "model.layers.3.mlp.experts.0.down_proj.weight_scale_inv", tensor.F32, []int{1, 1}),
			randTensor(rng, "model.layers.3.mlp.experts.0.up_proj.weight", tensor.F8E4M3, []int{4, 8}),
			randTensor(rng, "model.norm.weight", tensor.BF16, []int{8}),
		}, []string{"FP8", "F8_E4M3", "weight_scale_inv", "DeepSeek-V3", "3 tensors", `"model.layers.3.mlp.experts.0.down_proj.weight"`, "not supported yet"}},
		{"gpt-oss mxfp4", []*tensor.Host{
			randTensor(rng, "model.layers.0.mlp.experts.gate_up_proj_blocks", tensor.U8, []int{2, 4, 16}),
			randTensor(rng, "model.layers.0.mlp.experts.gate_up_proj_scales", tensor.U8, []int{2, 4}),
			randTensor(rng, "model.layers.0.mlp.experts.gate_up_proj_bias", tensor.BF16, []int{2, 4}),
		}, []string{"MXFP4", "gpt-oss", "_blocks", "2 tensors", `"model.layers.0.mlp.experts.gate_up_proj_blocks"`, "not supported yet"}},
		{"gptq", []*tensor.Host{
			randTensor(rng, "model.layers.0.mlp.down_proj.qweight", tensor.I32, []int{2, 4}),
		}, []string{"GPTQ/AWQ", `tensor "model.layers.0.mlp.down_proj.qweight"`}},
		{"int64 buffer", []*tensor.Host{
			randTensor(rng, "model.position_ids", tensor.I64, []int{1, 8}),
			randTensor(rng, "model.mask", tensor.Bool, []int{8}),
		}, []string{"dtype I64", `"model.position_ids"`, "dtype BOOL", `"model.mask"`}},
		{"microscaling", []*tensor.Host{
			randTensor(rng, "w", tensor.F4, []int{4, 8}),
			randTensor(rng, "s", tensor.F8E8M0, []int{4}),
		}, []string{"microscaling", "2 tensors"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, SingleName)
			if err := Write(path, c.tensors, nil); err != nil {
				t.Fatal(err)
			}
			ck, err := OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer ck.Close()
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, err := range []error{ck.CheckFloat(), f.CheckFloat()} {
				if c.want == nil {
					if err != nil {
						t.Fatal(err)
					}
					continue
				}
				checkErr(t, err, append([]string{path}, c.want...)...)
				if !errors.Is(err, ErrUnsupported) {
					t.Errorf("error %v does not wrap ErrUnsupported", err)
				}
			}
		})
	}
}
