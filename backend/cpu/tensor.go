package cpu

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/linalg"
	"github.com/mkserve/mkserve/tensor"
)

// Tensor is the CPU backend's tensor: float32 values, row-major, 1-D or 2-D.
// A 1-D tensor [n] counts as one row of n columns wherever an op wants rows.
// A matrix weight of a BF16 checkpoint keeps its bf16 values instead (bf;
// data is nil): the ops that read weights (Linear, MLP, MoE, Embed) compute
// with them directly (linalg.MatMulTBF16, the same sums as on the widened
// values), every other op sees a widened copy (tensorOf).
//
// A matrix weight may be held as a linalg.Q8 or linalg.FP4 matrix instead
// (q8, fp4; data is nil; Options.Weights): the same ops read it directly
// (linalg.MatMulTQ8, MatMulTFP4), every other op sees a dequantized copy.
type Tensor struct {
	shape []int
	data  []float32
	bf    []uint16
	q8    []byte
	fp4   []byte // a linalg.FP4 matrix (Options.Weights)
}

// FromFloat32 wraps v as a tensor of the given shape (no copy: v must not be
// changed while the tensor is in use). It panics if the shape is not 1-D or
// 2-D or does not hold len(v) values.
func FromFloat32(shape []int, v []float32) *Tensor {
	if len(shape) < 1 || len(shape) > 2 || tensor.NumElements(shape) != len(v) || slices.ContainsFunc(shape, func(d int) bool { return d < 0 }) {
		panic(fmt.Sprintf("cpu.FromFloat32: shape %v for %d values", shape, len(v)))
	}
	return &Tensor{shape: slices.Clone(shape), data: v}
}

// newTensor allocates a zeroed [rows, cols] tensor.
func newTensor(rows, cols int) *Tensor {
	return &Tensor{shape: []int{rows, cols}, data: make([]float32, rows*cols)}
}

// Shape returns a copy of the tensor's dimensions.
func (t *Tensor) Shape() []int { return slices.Clone(t.shape) }

// Data returns the tensor's values, row-major; they alias the tensor and
// must not be modified (a bf16 weight's are a widened copy).
func (t *Tensor) Data() []float32 {
	if t.data == nil {
		return t.widened().data
	}
	return t.data
}

// widened is t with float32 values: t itself, or a bf16 or Q8 weight's
// copy.
func (t *Tensor) widened() *Tensor {
	switch {
	case t.bf != nil:
		w := &Tensor{shape: t.shape, data: make([]float32, len(t.bf))}
		linalg.WidenBF16(w.data, t.bf)
		return w
	case t.q8 != nil:
		N, K := t.dims()
		w := &Tensor{shape: t.shape, data: make([]float32, N*K)}
		linalg.DequantQ8(w.data, t.q8, N, K)
		return w
	case t.fp4 != nil:
		N, K := t.dims()
		w := &Tensor{shape: t.shape, data: make([]float32, N*K)}
		linalg.DequantFP4(w.data, t.fp4, N, K)
		return w
	}
	return t
}

// form is t's values as a linalg matrix in a form other than float32
// (the zero Weights for a float32 tensor).
func (t *Tensor) form() linalg.Weights {
	return linalg.Weights{BF16: t.bf, Q8: t.q8, FP4: t.fp4}
}

// weights is t's values as a linalg matrix, float32, bf16 or Q8.
func (t *Tensor) weights() linalg.Weights {
	switch {
	case t.bf != nil:
		return linalg.Weights{BF16: t.bf}
	case t.q8 != nil:
		return linalg.Weights{Q8: t.q8}
	case t.fp4 != nil:
		return linalg.Weights{FP4: t.fp4}
	}
	return linalg.Weights{F32: t.data}
}

// dims is (rows, cols), a 1-D tensor being one row.
func (t *Tensor) dims() (rows, cols int) {
	if len(t.shape) == 1 {
		return 1, t.shape[0]
	}
	return t.shape[0], t.shape[1]
}

// panicf reports a programming error of the caller: an op given shapes it
// cannot use. The message names the op.
func panicf(op, format string, args ...any) {
	panic(fmt.Sprintf("cpu.%s: %s", op, fmt.Sprintf(format, args...)))
}

// tensorOf unwraps a backend tensor that must be non-nil and this backend's,
// with float32 values (a bf16 weight widened: ops built for weights take
// weightOf instead).
func tensorOf(op, name string, x backend.Tensor) *Tensor {
	return weightOf(op, name, x).widened()
}

// weightOf is tensorOf keeping a weight's bf16 values.
func weightOf(op, name string, x backend.Tensor) *Tensor {
	t, ok := x.(*Tensor)
	if !ok || t == nil {
		panicf(op, "%s is %T, want a non-nil *cpu.Tensor", name, x)
	}
	return t
}

// weightMatrix is matrix keeping a weight's bf16 values.
func weightMatrix(op, name string, x backend.Tensor, cols int) (t *Tensor, rows int) {
	t = weightOf(op, name, x)
	r, c := t.dims()
	if cols >= 0 && c != cols {
		panicf(op, "%s has shape %v, want %d columns", name, t.shape, cols)
	}
	return t, r
}

// optional unwraps a tensor that may be nil.
func optional(op, name string, x backend.Tensor) *Tensor {
	if x == nil {
		return nil
	}
	if t, ok := x.(*Tensor); ok && t == nil {
		return nil
	}
	return tensorOf(op, name, x)
}

// matrix unwraps x and checks that it has cols columns (any cols when cols < 0).
func matrix(op, name string, x backend.Tensor, cols int) (t *Tensor, rows int) {
	t, rows = weightMatrix(op, name, x, cols)
	return t.widened(), rows
}

// vector unwraps an optional 1-D (or [1, n]) tensor of n values; nil stays nil.
func vector(op, name string, x backend.Tensor, n int) []float32 {
	t := optional(op, name, x)
	if t == nil {
		return nil
	}
	if r, c := t.dims(); r != 1 || c != n {
		panicf(op, "%s has shape %v, want [%d]", name, t.shape, n)
	}
	return t.data
}

// parallelMin is the number of values below which an elementwise op runs on
// one goroutine.
const parallelMin = 1 << 15

// parallelRows runs f over [0, rows) in contiguous chunks on all cores when
// rows*cost (values touched) is large enough to be worth it.
func parallelRows(rows, cost int, f func(lo, hi int)) {
	w := runtime.GOMAXPROCS(0)
	if rows*cost < parallelMin || w <= 1 || rows <= 1 {
		f(0, rows)
		return
	}
	w = min(w, rows)
	chunk := (rows + w - 1) / w
	var wg sync.WaitGroup
	for lo := chunk; lo < rows; lo += chunk {
		wg.Add(1)
		go func() { defer wg.Done(); f(lo, min(lo+chunk, rows)) }()
	}
	f(0, min(chunk, rows))
	wg.Wait()
}
