package cuda

import (
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

// Fast replays: a decode graph whose every upload comes from the step's
// batch alone is replayed without running the model's Go code again.
//
// A regular replay (replayStep) runs the model's forward pass once more on
// a replay device only to refill the graph's staged uploads: hundreds of
// ops of Go for a handful of uploads (Qwen3-30B-A3B at batch 1: 0.67 ms of
// host time before each launch, serial with the GPU's 3.8 ms). In a decode
// step those uploads are the token ids (Embed: the host's, and which rows
// take theirs from the previous step's picks on the device, feed.go), the
// RoPE positions and the
// paged attention metadata (slots, rows, positions and block tables), each
// a function of the batch. While a step is captured, the op that makes
// such an upload says so (noteInput) with a function that computes it
// from a batch (a stepInput). When every staged upload of the capture has
// one, the graph is fast: its replays compute the uploads from the new
// batch, refill the staging (kernels.Refill) and launch, and the step's
// output is the capture's logits buffer.
//
// What a fast replay does not do that a regular one does: run the model's
// host-side checks (it checks the batch, the token ids against the
// embedding's rows and the positions against the key), and compare the
// step's allocations and upload sizes with the capture's. Neither can
// differ within a key: the key fixes the batch's shape (rows, one token
// each, block tables padded to the key's stride), which fixes every op's
// shape, and a stepInput whose result does not fit its upload fails the
// fast replay, which then falls back to a regular one. Graphs of a world of
// processes are never fast: their steps also run the all-reduce watchdog's
// host checks. MKSERVE_GRAPH_FAST=0 turns fast replays off (comparisons).

// GraphFastEnv names the environment variable that, set to 0, makes every
// replay run the model's Go code again.
const GraphFastEnv = "MKSERVE_GRAPH_FAST"

var graphFastOn = sync.OnceValue(func() bool { return os.Getenv(GraphFastEnv) != "0" })

// stepInput computes one staged upload of a captured step from a batch of
// the graph's key (padded as GraphStep pads it).
type stepInput func(b *backend.Batch) ([]int32, error)

// noteInput records, while a step is captured, that the upload just staged
// on d is f of the step's batch (on the GPU goroutine, right after the
// upload). Uploads without a note leave their graph slow.
func (be *Backend) noteInput(d *kernels.Device, f stepInput) {
	if be.graphMode() != graphCapturing {
		return
	}
	n := d.StagedUploads()
	gr := &be.gr
	if n <= 0 || len(gr.inputs) >= n {
		return
	}
	for len(gr.inputs) < n-1 {
		gr.inputs = append(gr.inputs, nil) // an upload nobody noted
	}
	gr.inputs = append(gr.inputs, f)
}

// aliases reports whether a and b are the same slice (same memory, same
// length): an op's argument that is a field of the step's batch.
func aliases(a, b []int32) bool {
	return len(a) == len(b) && len(a) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}

// stepBatch is the batch of the step being captured, or nil.
func (be *Backend) stepBatch() *backend.Batch {
	if be.graphMode() != graphCapturing {
		return nil
	}
	return be.gr.batch
}

// positionsInput is the RoPE positions upload.
func positionsInput(b *backend.Batch) ([]int32, error) { return b.Positions, nil }

// positions returns pos on the device (once per step, posCache), noting
// the upload as the batch's positions when pos is that field.
func (be *Backend) positions(d *kernels.Device, pos []int32) *kernels.Buffer {
	ups := be.posCache.uploads
	pb := be.posCache.get(be, d, pos)
	if sb := be.stepBatch(); sb != nil && be.posCache.uploads != ups && aliases(pos, sb.Positions) {
		be.noteInput(d, positionsInput)
	}
	return pb
}

// pagedMetaInput is the upload of a step's paged attention metadata
// (metaCache.get) for groups of ring flag ring: the group Attention builds
// for the batch, packed the same way.
func (be *Backend) pagedMetaInput(ring bool) stepInput {
	return func(b *backend.Batch) (v []int32, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%v", r)
			}
		}()
		be.kvMu.Lock()
		defer be.kvMu.Unlock()
		stride := (be.gr.key.keys + be.paged.blockSize - 1) / be.paged.blockSize
		g := newGroupCap(len(b.Tokens), len(b.Seqs), len(b.Seqs)*stride) // decode: a row and a stride a span
		g.ring = ring
		for i, s := range b.Seqs {
			if s.Blocks == nil {
				return nil, fmt.Errorf("span %d has no block table", i)
			}
			be.addPaged(g, s, i, be.gr.key.keys)
		}
		return packMeta(nil, g), nil
	}
}

// fastGraph decides, at the end of g's capture, whether its replays can be
// fast (every upload noted; the output a whole arena buffer) and records
// what they need.
func (be *Backend) fastGraph(g *stepGraph, sg *kernels.StepGraph, out *Tensor) {
	inputs := be.gr.inputs
	be.gr.inputs = nil
	g.inputs, g.outBase, g.outShape, g.outN = nil, nil, nil, 0
	if be.world != nil || len(inputs) != sg.Uploads() || slices.ContainsFunc(inputs, func(f stepInput) bool { return f == nil }) || out.parent != nil {
		return
	}
	base := be.alloc.baseOf(out.st.f32)
	if base == nil || base.Bytes() != out.st.f32.Bytes() {
		return
	}
	g.inputs, g.outBase, g.outShape, g.outN = inputs, base, slices.Clone(out.shape), out.st.n
}

// fastReplay replays g for batch b without running the model's Go code;
// false when it cannot (then nothing was launched and a regular replay
// decides).
func (be *Backend) fastReplay(g *stepGraph, b *backend.Batch) (backend.Tensor, bool) {
	gr := &be.gr
	be.waitLaunch(g)
	start := time.Now()
	if err := b.Validate(); err != nil {
		return nil, false
	}
	for i, in := range g.inputs {
		v, err := in(b)
		if err == nil {
			err = kernels.Refill(g.sg, i, v)
		}
		if err != nil {
			gr.stats.LastError = fmt.Sprintf("fast replay: upload %d: %v", i, err)
			return nil, false
		}
	}
	if err := be.g.Do(func(d *kernels.Device) error { return be.launch(d, g) }); err != nil {
		gr.stats.LastError = "fast replay: " + err.Error()
		return nil, false
	}
	gr.stats.Replays++
	gr.stats.FastReplays++
	gr.stats.ReplayHostNs += time.Since(start).Nanoseconds()
	return &Tensor{shape: slices.Clone(g.outShape), st: &store{n: g.outN, f32: g.outBase}}, true
}
