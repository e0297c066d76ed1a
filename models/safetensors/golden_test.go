package safetensors

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// goldenDir holds tiny checkpoints written by Python (transformers
// save_pretrained with safetensors 0.8.0), described by MANIFEST.json.
const goldenDir = "../testdata/golden"

type goldenManifest struct {
	SafetensorsVersion string `json:"safetensors_version"`
	Families           map[string]struct {
		Tensors map[string]struct {
			DType string `json:"dtype"`
			Shape []int  `json:"shape"`
		} `json:"tensors"`
		Metadata map[string]map[string]string `json:"safetensors_metadata"`
		IDs      []int64                      `json:"ids"`
		GenOut   []int64                      `json:"gen_output"`
		Files    map[string]struct {
			Bytes  int64  `json:"bytes"`
			SHA256 string `json:"sha256"`
		} `json:"files"`
	} `json:"families"`
}

// TestPythonWrittenFiles reads the checkpoints Python wrote and checks them
// against the manifest written alongside: every tensor's name, dtype and
// shape, the metadata, integer tensor values, and that Write re-encodes
// each file to the very same bytes as the Python writer.
func TestPythonWrittenFiles(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(goldenDir, "MANIFEST.json"))
	if err != nil {
		t.Fatalf("golden checkpoints (written by scripts/gen_golden.py) are missing: %v", err)
	}
	var m goldenManifest
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	if len(m.Families) == 0 {
		t.Fatal("manifest lists no families")
	}
	t.Logf("files written by safetensors %s", m.SafetensorsVersion)
	for fam, want := range m.Families {
		t.Run(fam, func(t *testing.T) {
			dir := filepath.Join(goldenDir, fam)
			for _, name := range []string{SingleName, "golden.safetensors"} {
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Fatal(err)
				}
				sum := sha256.Sum256(b)
				if got := hex.EncodeToString(sum[:]); got != want.Files[name].SHA256 {
					t.Fatalf("%s: sha256 %s, manifest %s: not the file Python wrote", name, got, want.Files[name].SHA256)
				}
			}
			c, err := OpenDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var names []string
			for n := range want.Tensors {
				names = append(names, n)
			}
			sort.Strings(names)
			if got := c.Names(); !slices.Equal(got, names) {
				t.Fatalf("names %v, manifest %v", got, names)
			}
			var all []*tensor.Host
			for _, n := range names {
				x, err := c.Tensor(n)
				if err != nil {
					t.Fatal(err)
				}
				if string(x.DType) != want.Tensors[n].DType || !slices.Equal(x.Shape, want.Tensors[n].Shape) {
					t.Fatalf("%s: %s %v, manifest %s %v", n, x.DType, x.Shape, want.Tensors[n].DType, want.Tensors[n].Shape)
				}
				all = append(all, x)
			}
			if err := c.CheckFloat(); err != nil {
				t.Fatal(err)
			}
			f, err := Open(filepath.Join(dir, SingleName))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			md := want.Metadata[SingleName]
			if len(f.Metadata) != len(md) || f.Metadata["format"] != md["format"] {
				t.Fatalf("metadata %v, manifest %v", f.Metadata, md)
			}
			// Our writer lays files out as the reference does: same bytes.
			again := filepath.Join(t.TempDir(), SingleName)
			if err := Write(again, all, f.Metadata); err != nil {
				t.Fatal(err)
			}
			orig, _ := os.ReadFile(filepath.Join(dir, SingleName))
			ours, _ := os.ReadFile(again)
			if !bytes.Equal(orig, ours) {
				t.Fatalf("Write re-encoded %s to different bytes (%d vs %d)", SingleName, len(ours), len(orig))
			}
			g, err := Open(filepath.Join(dir, "golden.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			for name, vals := range map[string][]int64{"ids": want.IDs, "gen_output": want.GenOut} {
				x, ok := g.Tensor(name)
				if !ok || x.DType != tensor.I64 || len(x.Data) != 8*len(vals) {
					t.Fatalf("golden %s: %v", name, x)
				}
				for i, v := range vals {
					if got := int64(binary.LittleEndian.Uint64(x.Data[8*i:])); got != v {
						t.Fatalf("golden %s[%d] = %d, manifest %d", name, i, got, v)
					}
				}
			}
		})
	}
}
