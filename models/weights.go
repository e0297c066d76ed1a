package models

import (
	"fmt"
	"slices"
	"strings"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/tensor"
)

// TensorSource is where named checkpoint tensors come from
// (*safetensors.Checkpoint, or a map in tests).
type TensorSource interface {
	Names() []string
	Tensor(name string) (*tensor.Host, error)
	FileOf(name string) string
}

// Weights binds checkpoint tensors to backend tensors by name, checking
// shapes and remembering which tensors were used so that leftovers can be
// reported.
type Weights struct {
	src      TensorSource
	be       backend.Backend
	used     map[string]bool
	progress func(name string, bytes int64) // called after each upload, or nil
}

// NewWeights binds src to be.
func NewWeights(src TensorSource, be backend.Backend) *Weights {
	return &Weights{src: src, be: be, used: map[string]bool{}}
}

// shapedSource is a TensorSource that makes tensors on demand in the shape
// the config implies (RandomSource) and answers Has without making one.
type shapedSource interface {
	TensorSource
	Has(name string) bool
	TensorOfShape(name string, shape []int) (*tensor.Host, error)
}

// Has reports whether the checkpoint holds name.
func (w *Weights) Has(name string) bool {
	if s, ok := w.src.(interface{ Has(string) bool }); ok { // without making the tensor
		return s.Has(name)
	}
	_, err := w.src.Tensor(name)
	return err == nil
}

// host fetches a tensor and checks its shape (nil want: any shape).
func (w *Weights) host(name string, want ...int) (*tensor.Host, error) {
	var h *tensor.Host
	var err error
	if s, ok := w.src.(shapedSource); ok && want != nil {
		h, err = s.TensorOfShape(name, want)
	} else {
		h, err = w.src.Tensor(name)
	}
	if err != nil {
		return nil, err
	}
	if want != nil && !slices.Equal(h.Shape, want) {
		return nil, fmt.Errorf("%s: tensor %q has shape %v, the config implies %v", w.src.FileOf(name), name, h.Shape, want)
	}
	if !h.DType.Float() {
		return nil, fmt.Errorf("%s: tensor %q has dtype %s; only F32, F16 and BF16 are supported", w.src.FileOf(name), name, h.DType)
	}
	w.used[name] = true
	return h, nil
}

// mxfp4Source is a TensorSource that can give an MXFP4 tensor as its blocks
// and scales (quantSource, RandomSource); ok false for other names. E,
// rows and G are the shape the config implies ([E, rows, G, 16] blocks).
type mxfp4Source interface {
	mxfp4Raw(name string, E, rows, G int) (blocks, scales *tensor.Host, ok bool, err error)
}

// mxfp4 returns name's MXFP4 blocks and scales as stored when the source is
// a checkpoint holding it so, checked against the shapes the config
// implies (blocks [E, rows, G, 16], scales [E, rows, G]) and marked used;
// ok false otherwise.
func (w *Weights) mxfp4(name string, E, rows, G int) (blocks, scales *tensor.Host, ok bool, err error) {
	q, isQ := w.src.(mxfp4Source)
	if !isQ {
		return nil, nil, false, nil
	}
	if blocks, scales, ok, err = q.mxfp4Raw(name, E, rows, G); !ok || err != nil {
		return nil, nil, false, err
	}
	if !slices.Equal(blocks.Shape, []int{E, rows, G, 16}) || !slices.Equal(scales.Shape, []int{E, rows, G}) {
		return nil, nil, false, fmt.Errorf("%s: MXFP4 tensor %q has blocks %v and scales %v, the config implies %v and %v",
			w.src.FileOf(name), name, blocks.Shape, scales.Shape, []int{E, rows, G, 16}, []int{E, rows, G})
	}
	w.used[name] = true
	return blocks, scales, true, nil
}

// upload hands a host tensor to the backend.
func (w *Weights) upload(h *tensor.Host) (backend.Tensor, error) {
	t, err := w.be.Weight(h)
	if err != nil {
		return nil, fmt.Errorf("tensor %q: %w", h.Name, err)
	}
	if w.progress != nil {
		w.progress(h.Name, int64(len(h.Data)))
	}
	return t, nil
}

// Get loads a required tensor of the given shape.
func (w *Weights) Get(name string, shape ...int) (backend.Tensor, error) {
	h, err := w.host(name, shape...)
	if err != nil {
		return nil, err
	}
	return w.upload(h)
}

// getRows loads rows [lo, hi) of the first dimension (E) of a tensor of
// shape [E, rest...]: one rank's block of a stacked expert tensor.
func (w *Weights) getRows(name string, lo, hi int, shape ...int) (backend.Tensor, error) {
	h, err := w.host(name, shape...)
	if err != nil || (lo == 0 && hi == shape[0]) {
		if err != nil {
			return nil, err
		}
		return w.upload(h)
	}
	row := len(h.Data) / shape[0]
	part := &tensor.Host{Name: h.Name, DType: h.DType, Shape: append([]int{hi - lo}, shape[1:]...),
		Data: h.Data[lo*row : hi*row]}
	return w.upload(part)
}

// Optional loads a tensor if the checkpoint has it (nil, nil otherwise).
func (w *Weights) Optional(name string, shape ...int) (backend.Tensor, error) {
	if !w.Has(name) {
		return nil, nil
	}
	return w.Get(name, shape...)
}

// stack concatenates host tensors along their first dimension into one
// upload named name; same-dtype inputs are joined byte-wise, mixed ones are
// widened to F32.
func (w *Weights) stack(name string, parts []*tensor.Host) (backend.Tensor, error) {
	same := true
	rows := 0
	for _, p := range parts {
		if !slices.Equal(p.Shape[1:], parts[0].Shape[1:]) {
			return nil, fmt.Errorf("tensor %q: cannot stack shape %v with %q's %v", p.Name, p.Shape, parts[0].Name, parts[0].Shape)
		}
		same = same && p.DType == parts[0].DType
		rows += p.Shape[0]
	}
	shape := append([]int{rows}, parts[0].Shape[1:]...)
	if same {
		var data []byte
		for _, p := range parts {
			data = append(data, p.Data...)
		}
		return w.upload(&tensor.Host{Name: name, DType: parts[0].DType, Shape: shape, Data: data})
	}
	var all []float32
	for _, p := range parts {
		v, err := p.Float32()
		if err != nil {
			return nil, err
		}
		all = append(all, v...)
	}
	return w.upload(tensor.FromFloat32(name, shape, all))
}

// Unused lists the checkpoint's tensors that no Get touched, except those
// that transformers keeps as buffers or that are known to be redundant.
func (w *Weights) Unused() []string {
	var out []string
	for _, n := range w.src.Names() {
		if w.used[n] || strings.HasSuffix(n, "rotary_emb.inv_freq") {
			continue
		}
		out = append(out, n)
	}
	return out
}

// CheckAllUsed fails naming the first few tensors the model did not use.
func (w *Weights) CheckAllUsed() error {
	u := w.Unused()
	if len(u) == 0 {
		return nil
	}
	shown := u
	if len(shown) > 5 {
		shown = shown[:5]
	}
	var desc []string
	for _, n := range shown {
		desc = append(desc, fmt.Sprintf("%q (%s)", n, w.src.FileOf(n)))
	}
	return fmt.Errorf("checkpoint has %d tensor(s) this architecture does not use: %s", len(u), strings.Join(desc, ", "))
}

// mlaWeights loads an MLA layer's kv_b_proj [heads*(nope+v), lora] (per
// head: nope rows of W_UK, then v rows of W_UV) split for
// backend.LatentAttender: each head's W_UK rows (UK), the same transposed
// (UKT), and each head's W_UV rows (UV). Elements are moved, not converted.
func (w *Weights) mlaWeights(name string, heads, nope, rope, v, lora int) (*backend.MLAWeights, error) {
	h, err := w.host(name, heads*(nope+v), lora)
	if err != nil {
		return nil, err
	}
	es := h.DType.Size()
	row := lora * es
	ukt := make([]byte, heads*lora*nope*es) // [heads, lora, nope]
	uk := make([]byte, 0, heads*nope*row)   // [heads, nope, lora]
	uv := make([]byte, 0, heads*v*row)      // [heads, v, lora]
	for hd := range heads {
		base := hd * (nope + v) // the head's first row
		for n := range nope {
			src := h.Data[(base+n)*row:]
			for c := range lora {
				copy(ukt[((hd*lora+c)*nope+n)*es:][:es], src[c*es:])
			}
		}
		uk = append(uk, h.Data[base*row:(base+nope)*row]...)
		uv = append(uv, h.Data[(base+nope)*row:(base+nope+v)*row]...)
	}
	m := &backend.MLAWeights{Lora: lora, Nope: nope, Rope: rope, V: v}
	for _, p := range []struct {
		dst   *backend.Tensor
		what  string
		shape []int
		data  []byte
	}{
		{&m.UKT, "W_UK per head, transposed", []int{heads * lora, nope}, ukt},
		{&m.UK, "W_UK per head", []int{heads * nope, lora}, uk},
		{&m.UV, "W_UV per head", []int{heads * v, lora}, uv},
	} {
		if *p.dst, err = w.upload(&tensor.Host{Name: name + " (" + p.what + ")", DType: h.DType, Shape: p.shape,
			Data: p.data}); err != nil {
			return nil, err
		}
	}
	return m, nil
}
