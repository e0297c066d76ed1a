package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models/safetensors"
)

// GenerationConfig is generation_config.json: the checkpoint's decoding
// defaults. Sampling fields are nil when the file does not set them.
type GenerationConfig struct {
	EOSTokenIDs       []int // eos_token_id (int or list)
	BOSTokenID        int   // bos_token_id (-1 if unset)
	DoSample          bool
	Temperature       *float64
	TopP              *float64
	TopK              *int
	MinP              *float64
	RepetitionPenalty *float64
}

// LoadGenerationConfig reads dir/generation_config.json; a missing file is
// not an error (nil, nil).
func LoadGenerationConfig(dir string) (*GenerationConfig, error) {
	path := filepath.Join(dir, "generation_config.json")
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil || raw == nil {
		return nil, fmt.Errorf("%s: not a JSON object", path)
	}
	r := reader{raw: raw}
	g := &GenerationConfig{
		EOSTokenIDs: r.ints("eos_token_id"),
		DoSample:    r.bool("do_sample", false),
		BOSTokenID:  -1,
	}
	if b := r.ints("bos_token_id"); len(b) > 0 {
		g.BOSTokenID = b[0]
	}
	optFloat := func(key string) *float64 {
		if _, ok := r.get(key); !ok {
			return nil
		}
		v := r.float(key, 0)
		return &v
	}
	g.Temperature, g.TopP = optFloat("temperature"), optFloat("top_p")
	g.MinP, g.RepetitionPenalty = optFloat("min_p"), optFloat("repetition_penalty")
	if _, ok := r.get("top_k"); ok {
		k := r.int("top_k", 0)
		g.TopK = &k
	}
	if r.err != nil {
		return nil, fmt.Errorf("%s: %w", path, r.err)
	}
	return g, nil
}

// LoadOptions tune Load.
type LoadOptions struct {
	// Progress writes a progress bar here while weights upload; nil picks
	// stderr when it is a terminal and nothing otherwise.
	Progress io.Writer
}

// Loaded is a model with its checkpoint metadata.
type Loaded struct {
	Model      Model
	Config     *Config
	Generation *GenerationConfig // nil when the checkpoint has none
	Dir        string
	ckpt       *safetensors.Checkpoint
}

// Close releases the checkpoint's memory mappings. The backend keeps its
// own copy of the weights, so the model stays usable.
func (l *Loaded) Close() error {
	if l.ckpt == nil { // LoadRandom
		return nil
	}
	return l.ckpt.Close()
}

// Load reads a Hugging Face checkpoint directory (config.json,
// *.safetensors, generation_config.json) and binds it to be.
func Load(dir string, be backend.Backend, opts LoadOptions) (*Loaded, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("model directory: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("model directory %s: not a directory", dir)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if _, ok := families[cfg.Architecture]; !ok {
		return nil, fmt.Errorf("%s: architecture %q is not supported (supported: %v)", filepath.Join(dir, "config.json"), cfg.Architecture, Architectures())
	}
	gen, err := LoadGenerationConfig(dir)
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	q, err := parseQuant(cfg.Raw)
	if err != nil {
		ck.Close()
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "config.json"), err)
	}
	src, err := newQuantSource(ck, q)
	if err != nil {
		ck.Close()
		return nil, err
	}
	w := NewWeights(src, be)
	out := opts.Progress
	if out == nil && term.IsTerminal(int(os.Stderr.Fd())) {
		out = os.Stderr
	}
	if out != nil {
		bar := progressbar.NewOptions64(ck.TotalBytes(),
			progressbar.OptionSetWriter(out), progressbar.OptionShowBytes(true),
			progressbar.OptionSetDescription("loading "+filepath.Base(dir)),
			progressbar.OptionClearOnFinish(), progressbar.OptionThrottle(100_000_000))
		w.progress = func(_ string, n int64) { _ = bar.Add64(n) }
		defer bar.Finish()
	}
	m, err := Build(cfg, w, be)
	if err != nil {
		ck.Close()
		return nil, err
	}
	return &Loaded{Model: m, Config: cfg, Generation: gen, Dir: dir, ckpt: ck}, nil
}

// TensorInfo is one tensor of a checkpoint as the model binds it, without
// its data.
type TensorInfo struct {
	Name  string
	Shape []int // as bound: a quantized tensor's dequantized shape
	// Stored is how the checkpoint holds it: its dtype ("BF16", "F32",
	// ...), "FP8" (E4M3 with block scales) or "MXFP4".
	Stored string
}

// Inventory is a checkpoint's configuration, tensors and size on disk.
type Inventory struct {
	Config    *Config
	Tensors   []TensorInfo // by name
	FileBytes int64        // the safetensors files
}

// Inspect lists the checkpoint in dir — its config and every tensor the
// model binds, quantized ones under their plain names in their
// dequantized shapes — without reading the tensors' data.
func Inspect(dir string) (*Inventory, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	q, err := parseQuant(cfg.Raw)
	if err != nil {
		return nil, err
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	src, err := newQuantSource(ck, q)
	if err != nil {
		return nil, err
	}
	inv := &Inventory{Config: cfg, FileBytes: ck.TotalBytes()}
	for _, n := range src.Names() {
		ti := TensorInfo{Name: n}
		switch {
		case src.mxfp4[n]:
			_, sh, err := ck.Info(n + "_blocks") // [..., rows, G, 16] → [..., G·32, rows]
			if err != nil {
				return nil, err
			}
			k := len(sh)
			ti.Shape, ti.Stored = append(slices.Clone(sh[:k-3]), sh[k-2]*32, sh[k-3]), "MXFP4"
		default:
			dt, sh, err := ck.Info(n)
			if err != nil {
				return nil, err
			}
			ti.Shape, ti.Stored = sh, string(dt)
			if src.fp8[n] {
				ti.Stored = "FP8"
			}
		}
		inv.Tensors = append(inv.Tensors, ti)
	}
	slices.SortFunc(inv.Tensors, func(a, b TensorInfo) int { return strings.Compare(a.Name, b.Name) })
	return inv, nil
}

// CheckpointShapes returns the shape of every tensor of the checkpoint in
// dir, by name, as the model binds it (quantized tensors under their plain
// names, in their dequantized shapes), without reading the data.
func CheckpointShapes(dir string) (map[string][]int, error) {
	inv, err := Inspect(dir)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]int, len(inv.Tensors))
	for _, t := range inv.Tensors {
		out[t.Name] = t.Shape
	}
	return out, nil
}
