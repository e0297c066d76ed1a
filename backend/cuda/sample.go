package cuda

import (
	"os"
	"sync"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

var _ backend.Sampler = (*Backend)(nil)

// Sample picks one token per row of logits [B, V] on the GPU
// (kernels.SampleF32: one block per row, no full sort) with the host
// sampler's semantics (backend.SampleRow). One upload carries every row's
// parameters and token lists, one download the results (44 words a row).
// Rows with a mask or a bias (backend.SampleRow.Allowed, BiasIDs) sample
// from a copy of the logits changed first (processCopy).
// It panics on programming errors: logits not [B, V] with len(rows) == B,
// TopLogprobs outside [0, 20], token ids outside [0, V), bad parameters.
func (be *Backend) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	t, B := matrix("Sample", "logits", logits, -1)
	_, V := t.dims()
	if len(rows) != B || B == 0 || V == 0 {
		panicf("Sample", "logits %v for %d rows", t.shape, len(rows))
	}
	krows, meta, pen, err := packRows(rows, V)
	if err != nil {
		panicf("Sample", "%v", err)
	}
	proc, nproc, err := kernels.PackProcess(krows, V)
	if err != nil {
		panicf("Sample", "%v", err)
	}
	words := make([]int32, B*kernels.SampleResultWords)
	be.do("Sample", func(d *kernels.Device) error {
		var mb *kernels.Buffer
		if !greedySplit(krows) {
			mb = upload(be, d, meta)
			defer be.alloc.put(mb)
		}
		ob := be.alloc.get(d, int64(len(words))*4)
		defer be.alloc.put(ob)
		lg := be.f32(d, t)
		if nproc > 0 {
			pb := upload(be, d, proc)
			defer be.alloc.put(pb)
			c, err := be.processCopy(d, lg, pb, len(proc), nproc, B, V)
			if err != nil {
				return err
			}
			defer be.alloc.put(c)
			lg = c
		}
		if err := be.sampleOn(d, ob, lg, mb, len(meta), krows, pen, V); err != nil {
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

// processCopy is a copy of logits [B, V] with the listed rows processed
// (kernels.ProcessLogitsF32; pb holds words words of kernels.PackProcess
// listing nproc rows): tensors are immutable, and a logits tensor sampled
// twice must not get its bias twice. The copy is the caller's to put back
// (stream-ordered, after the sampling that reads it).
func (be *Backend) processCopy(d *kernels.Device, lg, pb *kernels.Buffer, words, nproc, B, V int) (*kernels.Buffer, error) {
	n := int64(B) * int64(V) * 4
	c := be.alloc.get(d, n)
	if err := d.CopyAsync(nil, c, lg, n); err != nil {
		be.alloc.put(c)
		return nil, err
	}
	if err := d.ProcessLogitsF32(nil, c, pb, words, nproc, B, V); err != nil {
		be.alloc.put(c)
		return nil, err
	}
	return c, nil
}

// packRows converts rows to the kernels' form and packs their metadata for
// a vocabulary of V (kernels.PackSample).
func packRows(rows []backend.SampleRow, V int) (krows []kernels.SampleRow, meta []int32, pen bool, err error) {
	krows = make([]kernels.SampleRow, len(rows))
	for i := range rows {
		krows[i] = kernels.SampleRow(rows[i])
	}
	meta, pen, err = kernels.PackSample(krows, V)
	return krows, meta, pen, err
}

// sampleOn queues the sampling of rows (packed in meta, metaWords words) of
// logits [len(rows), V] into out: the split greedy kernel when every row is
// plain greedy (greedySplit; meta may then be nil), the split draw kernels
// when DrawSplit takes the rows, else the general one.
func (be *Backend) sampleOn(d *kernels.Device, out, logits, meta *kernels.Buffer, metaWords int, rows []kernels.SampleRow, pen bool, V int) error {
	B := len(rows)
	if greedySplit(rows) {
		work := be.alloc.get(d, d.SampleGreedyWork(B, V))
		defer be.alloc.put(work)
		return d.SampleGreedyF32(nil, out, logits, work, B, V)
	}
	if mode := sampleSplitMode(); mode >= 2 {
		if ok, kmax, cuts := d.DrawSplit(rows, V, mode >= 3); ok {
			work := be.alloc.get(d, d.SampleDrawWork(B, V, kmax))
			defer be.alloc.put(work)
			return d.SampleDrawF32(nil, out, logits, meta, metaWords, work, B, V, kmax, cuts)
		}
	}
	var sb *kernels.Buffer
	if pen {
		sb = be.alloc.get(d, int64(B)*int64(V)*4)
		defer be.alloc.put(sb)
	}
	return d.SampleF32(nil, out, logits, meta, metaWords, sb, B, V)
}

// SampleSplitEnv names the environment variable that, set to 0, samples
// every row with the general kernel (one CTA a row) instead of the split
// ones, for comparisons; set to 1 only greedy rows go to the split kernel.
// By default (2) the split draw kernels also take calls whose rows draw
// over the whole vocabulary (temperature > 0 without top-k, top-p or
// min-p: the API's defaults) or have a top-k (with any top-p and min-p) up
// to kernels.Device.SampleDrawKMax, none with penalties or alternatives
// (kernels.Device.DrawSplit; twentieth pass: Qwen3-8l's batch-1 step at
// temperature 1 0.89 → 0.74 ms, with Qwen3's top-k 20 / top-p 0.95
// 0.906 → 0.765 ms, docs/PERF.md). Set to 3 they also take rows with top-p
// or min-p but no top-k (answered from each chunk's best tokens where
// those hold the kept set, else by the general kernel in the same call;
// opt-in, its tests pass on the H200 since the twenty-first pass).
const SampleSplitEnv = "MKSERVE_SAMPLE_SPLIT"

var sampleSplitMode = sync.OnceValue(func() int {
	switch os.Getenv(SampleSplitEnv) {
	case "0":
		return 0
	case "1":
		return 1
	case "3":
		return 3
	}
	return 2
})

// greedySplit reports whether rows go to the split greedy kernel.
func greedySplit(rows []kernels.SampleRow) bool {
	return sampleSplitMode() > 0 && kernels.GreedyOnly(rows)
}
