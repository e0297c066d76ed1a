package cuda

import (
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

var _ backend.Sampler = (*Backend)(nil)

// Sample picks one token per row of logits [B, V] on the GPU
// (kernels.SampleF32: one block per row, no full sort) with the host
// sampler's semantics (backend.SampleRow). One upload carries every row's
// parameters and token lists, one download the results (44 words a row).
// It panics on programming errors: logits not [B, V] with len(rows) == B,
// TopLogprobs outside [0, 20], token ids outside [0, V), bad parameters.
func (be *Backend) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	t, B := matrix("Sample", "logits", logits, -1)
	_, V := t.dims()
	if len(rows) != B || B == 0 || V == 0 {
		panicf("Sample", "logits %v for %d rows", t.shape, len(rows))
	}
	krows := make([]kernels.SampleRow, B)
	for i := range rows {
		krows[i] = kernels.SampleRow(rows[i])
	}
	meta, pen, err := kernels.PackSample(krows, V)
	if err != nil {
		panicf("Sample", "%v", err)
	}
	words := make([]int32, B*kernels.SampleResultWords)
	be.do("Sample", func(d *kernels.Device) error {
		mb := upload(be, d, meta)
		defer be.alloc.put(mb)
		ob := be.alloc.get(d, int64(len(words))*4)
		defer be.alloc.put(ob)
		var sb *kernels.Buffer
		if pen {
			sb = be.alloc.get(d, int64(B)*int64(V)*4)
			defer be.alloc.put(sb)
		}
		if err := d.SampleF32(nil, ob, be.f32(d, t), mb, len(meta), sb, B, V); err != nil {
			return err
		}
		if err := kernels.Download(d, words, ob); err != nil {
			return err
		}
		return be.checkWatchdogs(d)
	}, t)
	outs, err := kernels.UnpackSample(words, B)
	if err != nil {
		panicf("Sample", "%v", err)
	}
	res := make([]backend.SampleResult, B)
	for i, o := range outs {
		res[i] = backend.SampleResult(o)
	}
	return res
}
