package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

// CUDA graphs for decode steps (backend.StepGrapher).
//
// A decode step of the fast profile is hundreds of small ops, each a call
// from Go; at small batches the host time of those calls, not the GPU,
// sets the step time. GraphStep captures such a step once per shape and
// replays it as one graph launch:
//
//   - Key: the batch's row count padded (1, 2, 4, then multiples of 8: a
//     step of 5 to 8 rows runs as 8, the extra rows storing nothing and
//     their logits dropped), and its key bucket (the next power of two, at
//     least 256, of the longest context). Within a key the launch
//     shapes are fixed: every row's block table is padded to the bucket's
//     blocks (stride ⌈bucket/blockSize⌉), the paged attention kernel is
//     planned for the bucket's keys, and the metadata uploads have fixed
//     sizes; the contents (token ids, positions, slots, block ids) change.
//   - The first step of a key runs eagerly (it creates whatever is made
//     once: f32 copies of norm weights, RoPE tables, expert counters); the
//     second is captured (kernels.Device.BeginCapture) and then launched;
//     later ones are replayed.
//   - Capture records every buffer the step gets from the allocator, in
//     order (the tape). Those buffers belong to the graphs' arena from then
//     on, never to the pool: graphs never run at the same time and a step's
//     buffers are dead once the step's output was read, so every capture
//     starts with the whole arena free and takes from it first; a buffer
//     the step gives back (put, or a dead tensor's cleanup) is free again
//     for the rest of the capture. The arena holds what the largest step
//     needs, not the sum over graphs. A replay runs the
//     model's Go code again on a replay device (kernels.StepGraph.Replay):
//     the allocator hands out the tape's buffers in the same order, uploads
//     refill the graph's pinned staging, launches are skipped, and nothing
//     is handed to the GPU goroutine until the one graph launch.
//   - Anything that differs from the capture (another allocation size,
//     another upload, a lazily made weight copy, a step that panics) makes
//     the replay diverge: the graph is destroyed and the step runs eagerly.
//     A failed capture marks its key as eager-only.
//
// The step's output (the logits tensor) lives in the graph's memory: it is
// valid until the next step of the same key, which is how the engine uses
// it (sampled or copied to the host before the next step).

// GraphsEnv names the environment variable that, set to 0, turns decode
// graphs off (every step runs eagerly), for comparisons.
const GraphsEnv = "MKSERVE_CUDA_GRAPHS"

// Graph limits: most rows a captured step may have, and most graphs kept
// (the least recently used is destroyed beyond that).
const (
	graphMaxRows = 256
	graphMax     = 48
)

// GraphStats counts what GraphStep did.
type GraphStats struct {
	Eager    int64 `json:"eager"`    // steps run without a graph (not eligible, warm-up, eager-only keys)
	Captures int64 `json:"captures"` // graphs captured
	Replays  int64 `json:"replays"`  // steps replayed from a graph
	// FastReplays counts the replays that refilled their uploads from the
	// batch without running the model's Go code (graph_fast.go).
	FastReplays int64 `json:"fast_replays"`
	Diverged    int64 `json:"diverged"`   // replays that diverged (graph dropped, step run eagerly)
	Failed      int64 `json:"failed"`     // captures that failed (key made eager-only)
	Live        int   `json:"live"`       // graphs held now
	Nodes       int   `json:"nodes"`      // nodes of the graphs held now
	TapeBytes   int64 `json:"tape_bytes"` // device memory of the graphs' arena (shared by all graphs)
	// ReplayHostNs is the host time of the replays so far: re-running the
	// model's Go code on the replay device (refilling the uploads) up to
	// the graph launch, waits for the previous launch excluded.
	ReplayHostNs int64 `json:"replay_host_ns"`
	// ReplayGPUNs is the GPU time of the replays' graph launches read so
	// far (events around each launch, read when the next replay of the same
	// graph waits for it), and ReplaysTimed how many launches it covers.
	ReplayGPUNs  int64  `json:"replay_gpu_ns"`
	ReplaysTimed int64  `json:"replays_timed"`
	LastError    string `json:"last_error,omitempty"` // why the last capture failed or replay diverged
}

// graphKey identifies a captured step's shape.
type graphKey struct {
	rows, keys int
	shared     bool // spans share block tables (speculative verify steps): the separate decode kernels (sharesBlocks)
}

// stepGraph is one key's graph and its tape.
type stepGraph struct {
	key    graphKey
	sg     *kernels.StepGraph
	real   *kernels.Device
	tape   []*kernels.Buffer // buffers the step gets, in order (arena buffers; repeats allowed)
	out    *kernels.Buffer   // the output tensor's memory (the capture's handle of it)
	eager  int               // eager runs so far
	broken bool              // capture failed: eager only
	used   uint64            // LRU clock

	// A fast graph (graph_fast.go): each staged upload's source, and the
	// output's arena buffer, shape and elements; inputs is nil for a slow
	// graph.
	inputs   []stepInput
	outBase  *kernels.Buffer
	outShape []int
	outN     int

	stampOps []string // with StepStampsEnv: the op after each clock stamp (stamps.go)
}

// graphMode is what the running step is doing.
type graphMode int32

const (
	graphOff graphMode = iota
	graphCapturing
	graphReplaying
)

// graphState is a Backend's graphs.
type graphState struct {
	mu    sync.Mutex // one GraphStep at a time
	m     map[graphKey]*stepGraph
	clock uint64
	stats GraphStats

	// The running step (set by GraphStep's goroutine).
	mode atomic.Int32
	rdev *kernels.Device // the replay device
	key  graphKey

	stale atomic.Bool                // set when captured addresses changed: drop every graph
	snap  atomic.Pointer[GraphStats] // what Graphs returns

	// padFrom > 0: rows from padFrom on are padding (padBatch) during the
	// running step.
	padFrom atomic.Int64

	batch  *backend.Batch // the running step's (padded) batch
	inputs []stepInput    // the capture's noted uploads so far (noteInput)
}

var graphsOn = sync.OnceValue(func() bool { return os.Getenv(GraphsEnv) != "0" })

// errDiverged marks a replay or capture that cannot stand for the step.
var errDiverged = kernels.ErrGraphDiverged

func (be *Backend) graphMode() graphMode { return graphMode(be.gr.mode.Load()) }

// stepKeyBucket is the key bucket of a longest context of n keys.
func stepKeyBucket(n int) int {
	b := 256
	for b < n {
		b <<= 1
	}
	return b
}

// eligible returns the key of b when its step can run as a graph: the fast
// profile (no host routing), every span one decode row with a block table,
// no context parallelism, logits of every row in order.
func (be *Backend) eligible(b *backend.Batch) (graphKey, bool) {
	if !graphsOn() || be.noGraphs || be.split || be.kvF32 || b == nil {
		return graphKey{}, false
	}
	be.kvMu.Lock()
	pk := be.paged
	be.kvMu.Unlock()
	T := len(b.Tokens)
	if pk == nil || T == 0 || T > graphMaxRows || len(b.Seqs) != T {
		return graphKey{}, false
	}
	if b.LogitRows != nil {
		if len(b.LogitRows) != T {
			return graphKey{}, false
		}
		for i, r := range b.LogitRows {
			if r != i {
				return graphKey{}, false
			}
		}
	}
	longest := 0
	for _, s := range b.Seqs {
		if s.Len != 1 || s.Blocks == nil || s.ContextParallel > 1 {
			return graphKey{}, false
		}
		longest = max(longest, s.Past+1)
	}
	return graphKey{rows: padRows(T), keys: stepKeyBucket(longest), shared: sharesBlocks(b)}, true
}

// GraphWarmupRows implements backend.GraphWarmer: every padded row count
// (padRows) up to min(maxRows, graphMaxRows), when decode graphs are on and
// the KV pool is allocated. Warm-up steps of short contexts capture the
// graphs of the smallest key bucket; longer contexts capture lazily.
func (be *Backend) GraphWarmupRows(maxRows int) []int {
	if !graphsOn() || be.noGraphs || be.split || be.kvF32 {
		return nil
	}
	be.kvMu.Lock()
	pk := be.paged
	be.kvMu.Unlock()
	if pk == nil {
		return nil
	}
	var out []int
	for T := 1; T <= min(maxRows, graphMaxRows); T++ {
		if padRows(T) == T {
			out = append(out, T)
		}
	}
	return out
}

// padRows is the row count a decode step of T rows is padded to, so that
// a few graphs serve every batch size (as vLLM's capture sizes): 1, 2, 4,
// then multiples of 8.
func padRows(T int) int {
	switch {
	case T <= 2:
		return T
	case T <= 4:
		return 4
	}
	return (T + 7) &^ 7
}

// padBatch appends rows T..n-1 to b as padding: one-token spans of token 0
// at position 0 whose key/value is not stored (Attention skips their slots;
// they read block 0 and their output is dropped; not fed), and asks for
// every row's logits. It returns the function that restores b.
func padBatch(b *backend.Batch, n int) (restore func()) {
	T := len(b.Tokens)
	rows, feed := b.LogitRows, b.Feed
	for i := T; i < n; i++ {
		b.Tokens = append(b.Tokens, 0)
		b.Positions = append(b.Positions, 0)
		b.Seqs = append(b.Seqs, backend.SeqSpan{ID: ^uint64(0) - uint64(i), Offset: i, Len: 1, Blocks: []int32{0}})
	}
	if feed != nil && n > T {
		b.Feed = append(slices.Clone(feed), slices.Repeat([]int32{-1}, n-T)...)
	}
	b.LogitRows = nil
	return func() {
		b.Tokens, b.Positions, b.Seqs, b.LogitRows, b.Feed = b.Tokens[:T], b.Positions[:T], b.Seqs[:T], rows, feed
	}
}

// firstRows is rows [0, T) of x [n, cols] as a tensor sharing x's memory.
func (be *Backend) firstRows(x backend.Tensor, T int) backend.Tensor {
	xt := tensorOf("GraphStep", "output", x)
	n, cols := xt.dims()
	if n == T {
		return x
	}
	if xt.st.f32 == nil || len(xt.shape) != 2 {
		idx := make([]int, T)
		for i := range idx {
			idx[i] = i
		}
		return be.Rows(x, idx)
	}
	// The view keeps xt alive: xt's cleanup returns the memory to the pool.
	return &Tensor{shape: []int{T, cols}, st: &store{n: T * cols, f32: view(xt.st.f32, 0, int64(T*cols)*4)}, parent: xt}
}

// GraphStep implements backend.StepGrapher: it runs f, the model's forward
// pass over b, eagerly, as a capture, or as a replay (see the file comment).
//
// A step of T rows runs padded to padRows(T) rows (padBatch), eagerly or
// as a graph, and returns the logits of its T rows.
func (be *Backend) GraphStep(b *backend.Batch, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	key, ok := be.eligible(b)
	if !ok || !be.feedOnDevice() {
		// Fed rows are read on the device by graph steps only, from picks
		// the device holds.
		be.resolveFeed(b)
	}
	if !ok {
		return be.eagerStep(f)
	}
	// Always through padBatch, even with nothing to pad: it also asks for
	// every row's logits with nil LogitRows, so that a full batch and a
	// padded one of the same key run the same ops (an explicit row list
	// would add a Rows op to one and not the other).
	T := len(b.Tokens)
	restore := padBatch(b, key.rows)
	be.gr.padFrom.Store(int64(T))
	defer func() { // also when f panics (the engine recovers, the backend goes on)
		be.gr.padFrom.Store(0)
		restore()
	}()
	out, err := be.graphStep(key, b, f)
	if err != nil {
		return nil, err
	}
	return be.firstRows(out, T), nil
}

// graphStep is GraphStep for an eligible (padded) batch b of key's shape.
func (be *Backend) graphStep(key graphKey, b *backend.Batch, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	gr := &be.gr
	if gr.stale.Swap(false) {
		be.dropGraphs()
	}
	gr.mu.Lock()
	defer gr.mu.Unlock()
	defer be.publish()
	if gr.m == nil {
		gr.m = map[graphKey]*stepGraph{}
	}
	g := gr.m[key]
	if g == nil {
		g = &stepGraph{key: key}
		gr.m[key] = g
	}
	gr.clock++
	g.used = gr.clock
	gr.key = key
	gr.batch = b
	defer func() { gr.batch, gr.inputs = nil, nil }()
	switch {
	case g.sg != nil:
		if g.inputs != nil && graphFastOn() && !be.slowReplays {
			if out, ok := be.fastReplay(g, b); ok {
				return out, nil
			}
		}
		return be.replayStep(g, f)
	case g.broken || g.eager == 0:
		g.eager++
		return be.eagerStepLocked(f)
	}
	return be.captureStep(g, f)
}

func (be *Backend) eagerStep(f func() (backend.Tensor, error)) (backend.Tensor, error) {
	be.gr.mu.Lock()
	be.gr.stats.Eager++
	be.publish()
	be.gr.mu.Unlock()
	return f()
}

// callStep runs f, turning a panic into an error.
func callStep(f func() (backend.Tensor, error)) (t backend.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	return f()
}

// resetStepCaches drops the metadata caches, so that a graph step makes the
// same uploads however the previous step left them, and no eager step reads
// a cache whose buffer a graph owns.
func (be *Backend) resetStepCaches() {
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	be.attnMemo.stepBatch, be.attnMemo.stepPaged = nil, false
	be.alloc.put(be.posCache.buf)
	be.posCache = i32Cache{uploads: be.posCache.uploads}
	be.stepArrays.reset(be)
	for _, mc := range []*metaCache{be.pagedMeta(), &be.priv.meta} {
		if mc != nil {
			up := mc.uploads
			mc.release(be)
			mc.uploads = up
		}
	}
}

func (be *Backend) pagedMeta() *metaCache {
	if be.paged == nil {
		return nil
	}
	return &be.paged.meta
}

// captureStep captures f's step into g, then launches it.
func (be *Backend) captureStep(g *stepGraph, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	gr := &be.gr
	be.resetStepCaches()
	var sg *kernels.StepGraph
	if err := be.g.Do(func(d *kernels.Device) (err error) {
		g.real = d
		if sg, err = d.BeginCapture(); err == nil {
			err = be.stampStart(d)
		}
		return err
	}); err != nil {
		g.broken = true
		gr.stats.Failed++
		gr.stats.LastError = "capture: " + err.Error()
		return be.eagerStepLocked(f)
	}
	be.alloc.startTape(g, graphCapturing)
	gr.mode.Store(int32(graphCapturing))
	out, ferr := callStep(f)
	gr.mode.Store(int32(graphOff))
	be.alloc.stopTape()
	ot, _ := out.(*Tensor)
	if ferr == nil && (ot == nil || ot.st.f32 == nil) {
		ferr = fmt.Errorf("cuda: the captured step returned %T without float32 memory", out)
	}
	err := be.g.Do(func(d *kernels.Device) error {
		serr := be.stampEnd(d)
		if ferr != nil {
			d.AbortCapture(sg)
			return nil
		}
		if err := d.EndCapture(sg); err != nil {
			return err
		}
		return errors.Join(serr, sg.Launch(d))
	})
	be.resetStepCaches()
	if err = errors.Join(ferr, err); err != nil {
		g.broken = true
		gr.stats.Failed++
		gr.stats.LastError = "capture: " + err.Error()
		g.tape, g.out = nil, nil // its buffers stay in the arena
		return be.eagerStepLocked(f)
	}
	g.sg, g.out = sg, ot.st.f32
	g.stampOps, be.st.ops = be.st.ops, nil
	be.fastGraph(g, sg, ot)
	gr.stats.Captures++
	be.evictGraphs()
	return out, nil
}

// eagerStepLocked is eagerStep with gr.mu held, for the running graph
// step's batch: its fed rows are resolved on the host first.
func (be *Backend) eagerStepLocked(f func() (backend.Tensor, error)) (backend.Tensor, error) {
	be.gr.stats.Eager++
	if b := be.gr.batch; b != nil {
		be.resolveFeed(b)
	}
	return f()
}

// replayStep runs f's Go code on g's replay device and launches g.
func (be *Backend) replayStep(g *stepGraph, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	gr := &be.gr
	be.waitLaunch(g)
	start := time.Now()
	be.resetStepCaches()
	gr.rdev = g.sg.Replay(g.real)
	be.alloc.startTape(g, graphReplaying)
	gr.mode.Store(int32(graphReplaying))
	out, ferr := callStep(f)
	gr.mode.Store(int32(graphOff))
	gr.rdev = nil
	pos := be.alloc.stopTape()
	if ferr == nil {
		if ot, _ := out.(*Tensor); ot == nil || !sameMemory(ot.st.f32, g.out) {
			ferr = fmt.Errorf("cuda: %w: the replayed step returned other memory than its capture", errDiverged)
		} else if pos != len(g.tape) {
			ferr = fmt.Errorf("cuda: %w: the replay took %d of the %d buffers of its capture", errDiverged, pos, len(g.tape))
		}
	}
	var err error
	if ferr == nil {
		err = be.g.Do(func(d *kernels.Device) error { return be.launch(d, g) })
	}
	be.resetStepCaches()
	if err = errors.Join(ferr, err); err != nil {
		gr.stats.Diverged++
		gr.stats.LastError = "replay: " + err.Error()
		be.destroyGraph(g)
		delete(gr.m, g.key)
		return be.eagerStepLocked(f)
	}
	gr.stats.Replays++
	gr.stats.ReplayHostNs += time.Since(start).Nanoseconds()
	return out, nil
}

// waitLaunch waits until g's previous launch is done reading its staging,
// so that a replay may refill it while that launch still runs (overlapped
// decode launches step N+1 before step N is done).
func (be *Backend) waitLaunch(g *stepGraph) {
	if err := be.g.Do(func(d *kernels.Device) error { return g.sg.WaitUploads(d) }); err != nil {
		panicf("GraphStep", "waiting for the previous launch: %v", err)
	}
}

// launch queues g's graph (inside GPU.Do) and counts the GPU time of the
// earlier launches that this one read (kernels.StepGraph.GPUNs).
func (be *Backend) launch(d *kernels.Device, g *stepGraph) error {
	gr := &be.gr
	ns0, n0 := g.sg.GPUNs()
	err := g.sg.Launch(d)
	be.st.last = g
	if ns, n := g.sg.GPUNs(); n > n0 {
		gr.stats.ReplayGPUNs += ns - ns0
		gr.stats.ReplaysTimed += n - n0
	}
	return err
}

// evictGraphs destroys the least recently used graphs beyond graphMax.
func (be *Backend) evictGraphs() {
	gr := &be.gr
	for {
		var live []*stepGraph
		for _, g := range gr.m {
			if g.sg != nil {
				live = append(live, g)
			}
		}
		if len(live) <= graphMax {
			return
		}
		old := slices.MinFunc(live, func(a, b *stepGraph) int { return int(a.used) - int(b.used) })
		be.destroyGraph(old)
		delete(gr.m, old.key)
	}
}

// destroyGraph frees g's graph (after the GPU is done with it); its
// buffers stay in the arena for later captures.
func (be *Backend) destroyGraph(g *stepGraph) {
	if g.sg != nil {
		sg := g.sg
		g.sg = nil
		if err := be.g.Do(func(d *kernels.Device) error { return sg.Destroy(d) }); err != nil {
			panicf("GraphStep", "destroying a graph: %v", err)
		}
	}
	g.tape, g.out = nil, nil
}

// dropGraphs destroys every graph (the KV pool or the expert counters they
// captured pointers to are about to change) and frees the arena. A tensor
// still holding arena memory sees a freed buffer.
func (be *Backend) dropGraphs() {
	gr := &be.gr
	gr.mu.Lock()
	defer gr.mu.Unlock()
	for k, g := range gr.m {
		be.destroyGraph(g)
		delete(gr.m, k)
	}
	defer be.publish()
	arena := be.alloc.takeArena()
	if len(arena) == 0 {
		return
	}
	if err := be.g.Do(func(d *kernels.Device) error {
		errs := []error{d.Sync()}
		for _, b := range arena {
			errs = append(errs, b.Free())
		}
		return errors.Join(errs...)
	}); err != nil {
		panicf("GraphStep", "freeing the graphs' memory: %v", err)
	}
}

// Graphs reports what GraphStep did so far and what the graphs hold.
// It does not wait for a running step: it reads the snapshot the last step
// (or graph change) published.
func (be *Backend) Graphs() GraphStats {
	if s := be.gr.snap.Load(); s != nil {
		return *s
	}
	return GraphStats{}
}

// publish stores the snapshot Graphs returns (gr.mu held).
func (be *Backend) publish() {
	gr := &be.gr
	s := gr.stats
	for _, g := range gr.m {
		if g.sg != nil {
			s.Live++
			s.Nodes += g.sg.Nodes()
		}
	}
	s.TapeBytes = be.alloc.arenaBytes()
	gr.snap.Store(&s)
}

// graphGuard panics (failing the capture or replay) when the running step
// is a graph step: what it guards (a lazily made weight copy, a table made
// once) must happen outside graphs.
func (be *Backend) graphGuard(what string) {
	if be.graphMode() != graphOff {
		panic(fmt.Errorf("cuda: %w: %s inside a graph step", errDiverged, what))
	}
}

// doReplay runs an op's closure on the replay device (no GPU hand-off).
func (be *Backend) doReplay(f func(d *kernels.Device) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("kernels: panic in a replayed op: %v", r)
		}
	}()
	return f(be.gr.rdev)
}

// sameMemory reports whether a and b (handles or views) are the same device
// memory.
func sameMemory(a, b *kernels.Buffer) bool {
	return a != nil && b != nil && a.Ptr() == b.Ptr() && a.Bytes() == b.Bytes()
}

// ---- the allocator's tape ----

// tapeState is the allocator's view of the running graph step.
type tapeState struct {
	g     *stepGraph
	mode  graphMode
	pos   int                         // replay: buffers handed out
	free  map[int64][]*kernels.Buffer // capture: arena buffers free now, by size class
	inUse map[*kernels.Buffer]bool    // capture: handles handed out and not given back
}

// startTape makes get record (capture) or hand out (replay) g's tape.
func (a *allocator) startTape(g *stepGraph, mode graphMode) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t := &tapeState{g: g, mode: mode}
	if mode == graphCapturing {
		t.free, t.inUse = map[int64][]*kernels.Buffer{}, map[*kernels.Buffer]bool{}
		for b := range a.owned {
			t.free[b.Bytes()] = append(t.free[b.Bytes()], b)
		}
		// The same placement in every process (map order is random): a
		// capture takes the lowest addresses first.
		for _, l := range t.free {
			slices.SortFunc(l, func(x, y *kernels.Buffer) int { return cmp.Compare(y.Ptr(), x.Ptr()) })
		}
	}
	a.tape = t
	if a.owned == nil {
		a.owned = map[*kernels.Buffer]bool{}
	}
	if a.handles == nil {
		a.handles = map[*kernels.Buffer]*kernels.Buffer{}
	}
}

// stopTape ends the tape and returns how many buffers a replay took.
func (a *allocator) stopTape() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	if a.tape != nil {
		n = a.tape.pos
	}
	a.tape = nil
	return n
}

// tapeGet is get during a graph step (a.mu held): capture takes a free arena
// buffer, else a pool or fresh one (which joins the arena), and records it;
// replay hands out the tape's next one. Either way the step gets a fresh
// handle (a view of the whole buffer): a buffer can be held by a dead
// tensor of an earlier step and by this step at once, and only this step's
// handle may give it back to the capture.
func (a *allocator) tapeGet(d *kernels.Device, c int64) *kernels.Buffer {
	t := a.tape
	if t.mode == graphReplaying {
		if t.pos >= len(t.g.tape) || t.g.tape[t.pos].Bytes() != c {
			panic(fmt.Errorf("cuda: %w: allocation %d of %d bytes, the capture's was %s", errDiverged, t.pos, c, tapeAt(t.g.tape, t.pos)))
		}
		b := t.g.tape[t.pos]
		t.pos++
		// The arena buffer itself, not a new handle: nothing a replay does
		// gives memory back (a put of an owned buffer is a no-op, and one
		// freed with its graph has no pointer left), and a handle per get
		// (a view and a map entry, cleaned up by the GC) was a fifth of the
		// replay's host time (Qwen3-30B-A3B at batch 1, pprof).
		return b
	}
	var b *kernels.Buffer
	if l := t.free[c]; len(l) > 0 {
		b = l[len(l)-1]
		t.free[c] = l[:len(l)-1]
	} else if l := a.pool[c]; len(l) > 0 {
		b = l[len(l)-1]
		a.pool[c] = l[:len(l)-1]
		if c > poolMax {
			a.large -= c
		}
		a.made.Add(-1) // the arena's now
	} else {
		var err error
		if b, err = d.Malloc(c); err != nil {
			panic(fmt.Sprintf("device memory (capturing a graph): %v", err))
		}
	}
	a.owned[b] = true
	t.g.tape = append(t.g.tape, b)
	h := a.handle(b)
	t.inUse[h] = true
	return h
}

// handle is a new handle of arena buffer b (a.mu held).
func (a *allocator) handle(b *kernels.Buffer) *kernels.Buffer {
	h := view(b, 0, b.Bytes())
	a.handles[h] = b
	return h
}

// tapePut is put of handle h of arena buffer base (a.mu held): during a
// capture, a buffer the capture had handed out is free again for the rest
// of it.
func (a *allocator) tapePut(h, base *kernels.Buffer) {
	if t := a.tape; t != nil && t.mode == graphCapturing && t.inUse[h] {
		delete(t.inUse, h)
		t.free[base.Bytes()] = append(t.free[base.Bytes()], base)
	}
}

func tapeAt(tape []*kernels.Buffer, i int) string {
	if i >= len(tape) {
		return "past its end"
	}
	return fmt.Sprintf("%d bytes", tape[i].Bytes())
}

// baseOf is the arena buffer of capture handle h, or nil.
func (a *allocator) baseOf(h *kernels.Buffer) *kernels.Buffer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.handles[h]
}

// takeArena removes every arena buffer from the allocator and returns them.
func (a *allocator) takeArena() []*kernels.Buffer {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*kernels.Buffer, 0, len(a.owned))
	for b := range a.owned {
		out = append(out, b)
	}
	a.owned = nil
	for h := range a.handles { // live handles now point at freed memory
		a.handles[h] = nil
	}
	return out
}

// arenaBytes is the arena's size.
func (a *allocator) arenaBytes() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for b := range a.owned {
		n += b.Bytes()
	}
	return n
}
