package safetensors

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/mkserve/mkserve/tensor"
)

// File names a model directory's weights are looked for under.
const (
	IndexName  = "model.safetensors.index.json"
	SingleName = "model.safetensors"
)

// maxIndexBytes caps the size of an index file read into memory.
const maxIndexBytes = 100 << 20

// ErrUnsupported is wrapped by CheckFloat's errors.
var ErrUnsupported = errors.New("not supported yet")

// Checkpoint is a model directory's weights: model.safetensors, or the
// shards listed by model.safetensors.index.json. All files stay mapped until
// Close; tensors are views into them.
type Checkpoint struct {
	// Dir is the model directory given to OpenDir.
	Dir string
	// Index is the path of the shard index, or "" for a single file.
	Index string

	files []*File          // sorted by path
	where map[string]*File // tensor name → file holding it
	names []string         // sorted
}

// OpenDir opens the weights of a model directory: the shards listed by
// model.safetensors.index.json if present, else model.safetensors. Shards
// are cross-checked against the index: each listed shard must exist and
// contain the tensors the index assigns to it, and each tensor of a shard
// must be listed, for that shard, exactly once.
func OpenDir(dir string) (*Checkpoint, error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("safetensors: %s is not a directory (use Open for a single .safetensors file)", dir)
	}
	c := &Checkpoint{Dir: dir}
	index := filepath.Join(dir, IndexName)
	single := filepath.Join(dir, SingleName)
	switch {
	case exists(index):
		c.Index = index
		err = c.openSharded()
	case exists(single):
		var f *File
		if f, err = Open(single); err == nil {
			c.files = []*File{f}
			err = c.indexFiles(nil)
		}
	default:
		err = noWeights(dir)
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// exists reports whether path names something (following links).
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// noWeights explains why dir holds nothing OpenDir can read.
func noWeights(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("safetensors: %w", err)
	}
	var pickles, others []string
	for _, e := range ents {
		n := e.Name()
		switch ext := filepath.Ext(n); {
		case ext == ".bin" || ext == ".pt" || ext == ".pth" || strings.HasSuffix(n, ".bin.index.json"):
			pickles = append(pickles, n)
		case ext == ".safetensors":
			others = append(others, n)
		}
	}
	looked := fmt.Sprintf("looked for %s and %s", IndexName, SingleName)
	switch {
	case len(others) > 0:
		return fmt.Errorf("safetensors: %s: no weights found (%s); the directory has %s but no index naming them", dir, looked, strings.Join(others, ", "))
	case len(pickles) > 0:
		return fmt.Errorf("safetensors: %s: only PyTorch pickle weights (%s), which are not read; convert them to safetensors (e.g. transformers' save_pretrained(dir, safe_serialization=True)); %s", dir, strings.Join(pickles, ", "), looked)
	}
	return fmt.Errorf("safetensors: %s: no weights found: %s", dir, looked)
}

// openSharded reads the index, opens every shard it lists and cross-checks.
func (c *Checkpoint) openSharded() error {
	weightMap, err := readIndex(c.Index)
	if err != nil {
		return err
	}
	byFile := map[string][]string{} // shard → tensors the index puts there
	for name, file := range weightMap {
		byFile[file] = append(byFile[file], name)
	}
	shards := make([]string, 0, len(byFile))
	for file := range byFile {
		shards = append(shards, file)
	}
	sort.Strings(shards)
	for _, file := range shards {
		path := filepath.Join(c.Dir, filepath.FromSlash(file))
		listed := byFile[file]
		sort.Strings(listed)
		if !exists(path) {
			return fmt.Errorf("safetensors: %s: shard %s is missing (the index lists it for %d tensors, e.g. %q)", c.Index, path, len(listed), listed[0])
		}
		f, err := Open(path)
		if err != nil {
			return err
		}
		c.files = append(c.files, f)
	}
	return c.indexFiles(weightMap)
}

// readIndex parses an index file's weight_map (tensor name → shard file).
func readIndex(path string) (map[string]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if st.Size() > maxIndexBytes {
		return nil, fmt.Errorf("safetensors: %s: index of %d bytes exceeds the %d-byte limit", path, st.Size(), maxIndexBytes)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !utf8.Valid(raw) {
		return nil, fmt.Errorf("safetensors: %s: not valid UTF-8", path)
	}
	var weightMap map[string]string
	sc := &scanner{b: raw}
	err = sc.object(func(key string) error {
		if key != "weight_map" {
			return sc.skip(1)
		}
		if weightMap != nil {
			return errors.New(`"weight_map" appears twice`)
		}
		var err error
		if weightMap, err = sc.stringMap(); err != nil {
			return &tensorError{"", err} // marks an error inside weight_map
		}
		return nil
	})
	if err == nil {
		err = sc.end()
	}
	var te *tensorError
	var dup *dupKeyError
	switch {
	case err == nil:
	case errors.As(err, &te) && errors.As(te.err, &dup):
		return nil, fmt.Errorf("safetensors: %s: weight_map lists tensor %q twice", path, dup.key)
	case errors.As(err, &te):
		return nil, fmt.Errorf("safetensors: %s: weight_map: %v", path, te.err)
	default:
		return nil, fmt.Errorf("safetensors: %s: %v", path, err)
	}
	if weightMap == nil {
		return nil, fmt.Errorf("safetensors: %s: no \"weight_map\"", path)
	}
	if len(weightMap) == 0 {
		return nil, fmt.Errorf("safetensors: %s: weight_map is empty", path)
	}
	out := make(map[string]string, len(weightMap))
	for name, file := range weightMap {
		if !filepath.IsLocal(filepath.FromSlash(file)) {
			return nil, fmt.Errorf("safetensors: %s: weight_map: tensor %q: shard name %q is not a file inside the model directory", path, name, file)
		}
		out[name] = filepath.ToSlash(filepath.Clean(filepath.FromSlash(file)))
	}
	return out, nil
}

// indexFiles builds the name → file table from the opened files, checking
// them against weightMap when there is an index (nil for a single file).
func (c *Checkpoint) indexFiles(weightMap map[string]string) error {
	c.where = make(map[string]*File)
	for _, f := range c.files {
		for _, name := range f.names {
			if prev, dup := c.where[name]; dup {
				return fmt.Errorf("safetensors: %s: tensor %q is in two shards: %s and %s", c.Dir, name, prev.Path, f.Path)
			}
			c.where[name] = f
		}
	}
	if weightMap != nil {
		for _, f := range c.files {
			rel := c.relName(f)
			for _, name := range f.names {
				listed, ok := weightMap[name]
				if !ok {
					return fmt.Errorf("safetensors: %s: tensor %q is in shard %s but not in the index", c.Index, name, f.Path)
				}
				if listed != rel {
					return fmt.Errorf("safetensors: %s: tensor %q is in shard %s but the index lists it in %s", c.Index, name, f.Path, listed)
				}
			}
		}
	}
	var unfound []string
	for name := range weightMap {
		if _, ok := c.where[name]; !ok {
			unfound = append(unfound, name)
		}
	}
	if len(unfound) > 0 {
		sort.Strings(unfound)
		name := unfound[0]
		return fmt.Errorf("safetensors: %s: the index lists tensor %q in shard %s, which does not contain it (%d such tensors)", c.Index, name, filepath.Join(c.Dir, filepath.FromSlash(weightMap[name])), len(unfound))
	}
	c.names = make([]string, 0, len(c.where))
	for name := range c.where {
		c.names = append(c.names, name)
	}
	sort.Strings(c.names)
	return nil
}

// relName is f's path relative to the model directory, slash-separated, as
// an index names it.
func (c *Checkpoint) relName(f *File) string {
	rel, err := filepath.Rel(c.Dir, f.Path)
	if err != nil {
		return f.Path
	}
	return filepath.ToSlash(rel)
}

// Names lists all tensor names, sorted (none once closed).
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Files lists the paths of the open .safetensors files, sorted.
func (c *Checkpoint) Files() []string {
	out := make([]string, len(c.files))
	for i, f := range c.files {
		out[i] = f.Path
	}
	return out
}

// Tensor returns the named tensor as a view into its file (see File.Tensor).
func (c *Checkpoint) Tensor(name string) (*tensor.Host, error) {
	f, ok := c.where[name]
	if !ok {
		return nil, c.missing(name)
	}
	t, ok := f.Tensor(name)
	if !ok {
		return nil, fmt.Errorf("safetensors: %s: tensor %q: file is closed", f.Path, name)
	}
	return t, nil
}

// Info is a tensor's dtype and shape, without touching its data.
func (c *Checkpoint) Info(name string) (dtype tensor.DType, shape []int, err error) {
	f, ok := c.where[name]
	if !ok {
		return "", nil, c.missing(name)
	}
	dtype, shape, ok = f.Info(name)
	if !ok {
		return "", nil, fmt.Errorf("safetensors: %s: tensor %q: file is closed", f.Path, name)
	}
	return dtype, shape, nil
}

// missing is the error for a tensor the checkpoint lacks.
func (c *Checkpoint) missing(name string) error {
	where := c.Index
	if where == "" && len(c.files) == 1 {
		where = c.files[0].Path
	}
	if where == "" {
		where = c.Dir
	}
	return fmt.Errorf("safetensors: %s: no tensor %q", where, name)
}

// FileOf is the path of the file holding the tensor, or "" if there is none.
func (c *Checkpoint) FileOf(name string) string {
	if f, ok := c.where[name]; ok {
		return f.Path
	}
	return ""
}

// TotalBytes is the size of all tensors' data, summed over the files.
func (c *Checkpoint) TotalBytes() int64 {
	var n int64
	for _, f := range c.files {
		n += f.DataBytes()
	}
	return n
}

// Close unmaps every file. Tensors obtained from the checkpoint must not be
// used afterwards.
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	c.files, c.where, c.names = nil, nil, nil
	return errors.Join(errs...)
}

// CheckFloat returns an error (wrapping ErrUnsupported) naming file and
// tensor for every kind of tensor the compute path refuses: anything not
// F32, F16 or BF16. FP8 block-scaled weights (DeepSeek-V3), MXFP4 weights
// (gpt-oss) and GPTQ/AWQ packed weights are named as such.
func (c *Checkpoint) CheckFloat() error {
	var r unsupportedReport
	for _, name := range c.names {
		f := c.where[name]
		r.add(name, f.Path, f.entries[name].dtype)
	}
	return r.err(c.Dir)
}

// CheckFloat is Checkpoint.CheckFloat for a single file.
func (f *File) CheckFloat() error {
	var r unsupportedReport
	for _, name := range f.names {
		r.add(name, f.Path, f.entries[name].dtype)
	}
	return r.err(f.Path)
}

// Formats CheckFloat names.
const (
	formatFP8   = "FP8 weights (F8_E4M3 with block scales in `weight_scale_inv` tensors, DeepSeek-V3's format)"
	formatMXFP4 = "MXFP4 weights (U8 `*_blocks`/`*_scales` tensors, gpt-oss's format)"
	formatMX    = "microscaling dtypes (F4, F6, F8_E8M0)"
	formatGPTQ  = "GPTQ/AWQ packed integer weights (`qweight`/`qzeros` tensors)"
)

// unsupportedKind names the format a refused tensor belongs to ("" when the
// compute path accepts it).
func unsupportedKind(name string, dt tensor.DType) string {
	if dt.Float() {
		if strings.HasSuffix(name, "weight_scale_inv") {
			return formatFP8
		}
		return ""
	}
	switch {
	case dt == tensor.F8E4M3 || dt == tensor.F8E5M2:
		return formatFP8
	case dt == tensor.U8 && (strings.HasSuffix(name, "_blocks") || strings.HasSuffix(name, "_scales")):
		return formatMXFP4
	case dt == tensor.F4 || dt == "F6_E2M3" || dt == "F6_E3M2" || dt == tensor.F8E8M0:
		return formatMX
	case dt == tensor.I32 && (strings.HasSuffix(name, "qweight") || strings.HasSuffix(name, "qzeros") || strings.HasSuffix(name, "g_idx")):
		return formatGPTQ
	}
	return "dtype " + string(dt)
}

// unsupportedReport groups refused tensors by format, keeping the first
// (in name order) of each as the example.
type unsupportedReport struct {
	kinds []string
	count map[string]int
	first map[string][2]string // kind → {tensor, file}
}

func (r *unsupportedReport) add(name, file string, dt tensor.DType) {
	k := unsupportedKind(name, dt)
	if k == "" {
		return
	}
	if r.count == nil {
		r.count, r.first = map[string]int{}, map[string][2]string{}
	}
	if r.count[k] == 0 {
		r.kinds = append(r.kinds, k)
		r.first[k] = [2]string{name, file}
	}
	r.count[k]++
}

func (r *unsupportedReport) err(where string) error {
	if len(r.kinds) == 0 {
		return nil
	}
	parts := make([]string, len(r.kinds))
	for i, k := range r.kinds {
		ex := r.first[k]
		n := r.count[k]
		if n == 1 {
			parts[i] = fmt.Sprintf("%s: tensor %q in %s", k, ex[0], ex[1])
		} else {
			parts[i] = fmt.Sprintf("%s: %d tensors, e.g. tensor %q in %s", k, n, ex[0], ex[1])
		}
	}
	return fmt.Errorf("safetensors: %s: %w: %s; only F32, F16 and BF16 weights can be computed with", where, ErrUnsupported, strings.Join(parts, "; "))
}
