package kernels

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// CUDA graphs of one step. A step (for the CUDA backend: one decode step of
// a given batch shape) is captured once from the work stream (stream 0)
// into a StepGraph and then replayed: the Go code of the step runs again
// on a replay Device, which skips every kernel launch (they are in the
// graph) and only refills the graph's staged uploads with the new step's
// data; Launch then runs the whole step as one graph launch.
//
// What makes a step capturable: every launch on stream 0; uploads through
// Upload (captured as copies from pinned staging that the replay refills);
// no Download, Free or synchronisation inside; the same sequence of uploads
// (destination and size) and launches every time — the replay checks the
// uploads and reports ErrGraphDiverged when they differ. Launch arguments
// (buffers, sizes) are baked into the graph: the caller must hand the ops
// the same buffers on replay (the backend keeps a tape of its allocations).

// ErrGraphDiverged is wrapped by errors that mean a replayed step did not do
// what its capture did (another upload, another size, a query never seen at
// capture): the graph cannot stand for it; run the step without it.
var ErrGraphDiverged = errors.New("the step diverged from its captured graph")

// StepGraph is a captured step: the executable graph and its staged uploads.
type StepGraph struct {
	exec      uint64
	nodes     int
	ups       []staged
	chunks    []*Pinned
	used      int64 // bytes used in the last chunk
	pos       int   // uploads refilled by the running replay
	replaying bool
	// mark is recorded inside the graph after each staged upload (an
	// external event node): once it has fired after a launch, the staging
	// may be refilled while the rest of the launch still runs.
	mark uint64
	// Launch timing: launches alternate between two pairs of events
	// (recorded before and after), so that the pair a launch reuses belongs
	// to the launch before the previous one, done by then (WaitUploads of the
	// previous launch waited for work queued after it).
	start, done [2]uint64
	slot        int     // the pair of the last launch
	timed       [2]bool // a pair is recorded and not yet read
	gpuNs       int64   // GPU time of the launches whose events were read
	gpuRuns     int64   // how many launches gpuNs covers
}

// staged is one upload of the step: n bytes copied from host (pinned) to dst.
type staged struct {
	dst  uint64
	n    int64
	host unsafe.Pointer
}

const stageChunk = 256 << 10

// BeginCapture starts recording the work stream into a new StepGraph: until
// EndCapture or AbortCapture, launches on stream 0 are recorded, not run,
// and Upload stages its data (see the package comment on graphs).
func (d *Device) BeginCapture() (*StepGraph, error) {
	if err := d.ready("BeginCapture"); err != nil {
		return nil, err
	}
	if d.cap != nil || d.rep != nil {
		return nil, errors.New("kernels: BeginCapture: a capture or replay is already active")
	}
	if err := d.lib.check("mk_graph_begin", graphBegin()); err != nil {
		return nil, err
	}
	sg := &StepGraph{}
	if err := d.lib.check("mk_event_create", d.lib.eventCreate(&sg.mark)); err != nil {
		_ = d.lib.check("mk_graph_abort", graphAbort())
		return nil, err
	}
	d.cap = sg
	return sg, nil
}

// EndCapture ends the capture and instantiates the graph. The step has not
// run yet: Launch runs it.
func (d *Device) EndCapture(sg *StepGraph) error {
	if err := d.ready("EndCapture"); err != nil {
		return err
	}
	if d.cap != sg || sg == nil {
		return errors.New("kernels: EndCapture of a graph that is not being captured")
	}
	d.cap = nil
	var exec, nodes uint64
	if err := d.lib.check("mk_graph_end", graphEnd(&exec, &nodes)); err != nil {
		sg.freeStage()
		return err
	}
	sg.exec, sg.nodes = exec, int(nodes)
	var err error
	for i := range sg.start {
		for _, ev := range []*uint64{&sg.start[i], &sg.done[i]} {
			if err == nil {
				err = d.lib.check("mk_event_create", d.lib.eventCreate(ev))
			}
		}
	}
	if err != nil {
		_ = d.lib.check("mk_graph_destroy", graphDestroy(exec))
		sg.exec = 0
		sg.freeEvents(d)
		sg.freeStage()
		return err
	}
	return nil
}

// freeEvents destroys the graph's events.
func (sg *StepGraph) freeEvents(d *Device) error {
	var err error
	for _, ev := range []*uint64{&sg.mark, &sg.start[0], &sg.done[0], &sg.start[1], &sg.done[1]} {
		if *ev != 0 {
			err = errors.Join(err, d.lib.check("mk_event_destroy", d.lib.eventDestroy(*ev)))
			*ev = 0
		}
	}
	return err
}

// AbortCapture ends a capture without keeping it (nothing it recorded
// runs). A no-op when sg is not being captured.
func (d *Device) AbortCapture(sg *StepGraph) {
	if d.ready("AbortCapture") != nil || d.cap != sg || sg == nil {
		return
	}
	d.cap = nil
	_ = d.lib.check("mk_graph_abort", graphAbort())
	_ = sg.freeEvents(d)
	sg.freeStage()
}

// Nodes is the graph's node count (kernels and copies).
func (sg *StepGraph) Nodes() int { return sg.nodes }

// Uploads is the number of staged uploads the step makes.
func (sg *StepGraph) Uploads() int { return len(sg.ups) }

// Replay starts a replay: it returns the Device on which the step's Go code
// runs again. That device makes no CUDA calls and may be used on any
// goroutine, one at a time: launches return nil without running, Upload
// refills the next staged upload (the same destination and size as at
// capture, else an error wrapping ErrGraphDiverged), and whatever cannot be
// replayed (Download, Malloc, Free, Sync, queries not seen at capture) fails
// with an error wrapping ErrGraphDiverged. Launch then runs the step.
func (sg *StepGraph) Replay(real *Device) *Device {
	sg.pos, sg.replaying = 0, true
	return &Device{lib: real.lib, info: real.info, active: true, rep: sg, memo: real.memo}
}

// Launch queues the graph on stream 0 (inside GPU.Do). After a Replay, every
// staged upload must have been refilled.
func (sg *StepGraph) Launch(d *Device) error {
	if err := d.ready("StepGraph.Launch"); err != nil {
		return err
	}
	if d.rep != nil || d.cap != nil {
		return errors.New("kernels: StepGraph.Launch on a replay or capturing device")
	}
	if sg.exec == 0 {
		return errors.New("kernels: StepGraph.Launch of a graph that was not captured or was destroyed")
	}
	if sg.replaying {
		sg.replaying = false
		if sg.pos != len(sg.ups) {
			return fmt.Errorf("kernels: StepGraph.Launch: %w: the replay refilled %d of %d uploads", ErrGraphDiverged, sg.pos, len(sg.ups))
		}
	}
	i := 1 - sg.slot
	if sg.timed[i] {
		if err := sg.collect(d, i); err != nil {
			return err
		}
	}
	if err := d.lib.check("mk_event_record", d.lib.eventRecord(sg.start[i], 0)); err != nil {
		return err
	}
	if err := d.lib.check("mk_graph_launch", graphLaunch(sg.exec)); err != nil {
		return err
	}
	if err := d.lib.check("mk_event_record", d.lib.eventRecord(sg.done[i], 0)); err != nil {
		return err
	}
	sg.slot, sg.timed[i] = i, true
	return nil
}

// collect reads the GPU time of the launch timed by event pair i when it
// has run (not blocking: a pair whose launch still runs is dropped).
func (sg *StepGraph) collect(d *Device, i int) error {
	sg.timed[i] = false
	var done int32
	if err := d.lib.check("mk_event_query", d.lib.eventQuery(sg.done[i], &done)); err != nil || done == 0 {
		return err
	}
	var bits uint32
	if err := d.lib.check("mk_event_elapsed", d.lib.eventElapsed(sg.start[i], sg.done[i], &bits)); err != nil {
		return err
	}
	sg.gpuNs += int64(float64(math.Float32frombits(bits)) * 1e6)
	sg.gpuRuns++
	return nil
}

// GPUNs is the GPU time of the graph's launches so far, from an event
// before each launch to one after it, and how many launches it covers:
// those whose events were read (Wait reads the last launch's; a launch
// reads the one before the previous, when it has run). The events are
// queued with the launch, so a launch queued behind unfinished work is
// timed from when that work is done.
func (sg *StepGraph) GPUNs() (ns, launches int64) { return sg.gpuNs, sg.gpuRuns }

// Wait blocks until the graph's last launch has run (inside GPU.Do).
func (sg *StepGraph) Wait(d *Device) error {
	if err := d.ready("StepGraph.Wait"); err != nil {
		return err
	}
	i := sg.slot
	if sg.done[i] == 0 {
		return nil
	}
	if err := d.lib.check("mk_event_sync", d.lib.eventSync(sg.done[i])); err != nil {
		return err
	}
	if sg.timed[i] {
		return sg.collect(d, i)
	}
	return nil
}

// WaitUploads blocks until the graph's last launch has read its staged
// uploads (inside GPU.Do): then the staging may be refilled for the next
// launch while the last one still runs. A graph without uploads returns at
// once.
func (sg *StepGraph) WaitUploads(d *Device) error {
	if err := d.ready("StepGraph.WaitUploads"); err != nil {
		return err
	}
	if len(sg.ups) == 0 || sg.mark == 0 {
		return nil
	}
	return d.lib.check("mk_event_sync", d.lib.eventSync(sg.mark))
}

// Destroy frees the graph and its staging (inside GPU.Do). Work already
// launched completes. Destroying twice is a no-op.
func (sg *StepGraph) Destroy(d *Device) error {
	if err := d.ready("StepGraph.Destroy"); err != nil {
		return err
	}
	var err error
	if sg.exec != 0 {
		// The staging may still be read by a launched graph: wait first.
		err = errors.Join(d.Sync(), d.lib.check("mk_graph_destroy", graphDestroy(sg.exec)))
		sg.exec = 0
	}
	err = errors.Join(err, sg.freeEvents(d))
	sg.freeStage()
	return err
}

func (sg *StepGraph) freeStage() {
	for _, c := range sg.chunks {
		_ = c.Free()
	}
	sg.chunks, sg.ups, sg.used = nil, nil, 0
}

// stage records an upload of src to dst while capturing: src goes into
// pinned staging and a copy from there is queued (recorded) on stream 0.
func (sg *StepGraph) stage(d *Device, dst *Buffer, src []byte) error {
	n := int64(len(src))
	var last *Pinned
	if len(sg.chunks) > 0 {
		last = sg.chunks[len(sg.chunks)-1]
	}
	off := (sg.used + 15) &^ 15
	if last == nil || off+n > last.n {
		p, err := d.AllocPinned(max(n, stageChunk))
		if err != nil {
			return err
		}
		sg.chunks = append(sg.chunks, p)
		last, off = p, 0
	}
	host := unsafe.Add(last.p, off)
	copy(unsafe.Slice((*byte)(host), n), src)
	sg.used = off + n
	sg.ups = append(sg.ups, staged{dst: dst.ptr, n: n, host: host})
	if err := d.lib.check("mk_memcpy_h2d_async", d.lib.h2dAsync(dst.ptr, host, uint64(n), 0)); err != nil {
		return err
	}
	return d.lib.check("mk_graph_mark", graphMark(sg.mark))
}

// restage refills the next staged upload during a replay.
func (sg *StepGraph) restage(dst *Buffer, src []byte) error {
	if sg.pos >= len(sg.ups) {
		return fmt.Errorf("kernels: Upload: %w: more uploads than the %d captured", ErrGraphDiverged, len(sg.ups))
	}
	u := sg.ups[sg.pos]
	if u.dst != dst.ptr || u.n != int64(len(src)) {
		return fmt.Errorf("kernels: Upload %d: %w: %d bytes to %#x, captured %d bytes to %#x",
			sg.pos, ErrGraphDiverged, len(src), dst.ptr, u.n, u.dst)
	}
	copy(unsafe.Slice((*byte)(u.host), u.n), src)
	sg.pos++
	return nil
}

// StagedUploads is the number of uploads staged so far by the capture
// running on d, or -1 when d is not capturing.
func (d *Device) StagedUploads() int {
	if d.cap == nil {
		return -1
	}
	return len(d.cap.ups)
}

// Refill replaces the bytes of sg's staged upload i with src (the same size as
// at capture), for a replay that refills the uploads itself instead of
// running the step's Go code again (backend fast replays). The graph's last
// launch must be done reading its staging first (WaitUploads).
func Refill[T Elem](sg *StepGraph, i int, src []T) error {
	if sg.replaying {
		return errors.New("kernels: Refill during a replay")
	}
	if i < 0 || i >= len(sg.ups) {
		return fmt.Errorf("kernels: Refill: %w: upload %d of %d", ErrGraphDiverged, i, len(sg.ups))
	}
	u, n := sg.ups[i], byteLen(src)
	if u.n != n {
		return fmt.Errorf("kernels: Refill %d: %w: %d bytes, captured %d", i, ErrGraphDiverged, n, u.n)
	}
	copy(unsafe.Slice((*byte)(u.host), n), unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), n))
	runtime.KeepAlive(src)
	return nil
}

// graphRefusal is the error of an operation a capture or replay cannot hold.
func (d *Device) graphRefusal(what string) error {
	switch {
	case d.rep != nil:
		return fmt.Errorf("kernels: %s while replaying a graph: %w", what, ErrGraphDiverged)
	case d.cap != nil:
		return fmt.Errorf("kernels: %s while capturing a graph (it would synchronise or cannot be recorded): %w", what, ErrGraphDiverged)
	}
	return nil
}

// muted reports whether launches are skipped (a replay device).
func (d *Device) muted() bool { return d.rep != nil }

var graphBegin func() int32
var graphEnd func(exec, nodes *uint64) int32
var graphAbort func() int32
var graphLaunch func(exec uint64) int32
var graphDestroy func(exec uint64) int32
var graphMark func(event uint64) int32

func init() {
	registerSymbols(
		symbol{"mk_graph_begin", &graphBegin},
		symbol{"mk_graph_end", &graphEnd},
		symbol{"mk_graph_abort", &graphAbort},
		symbol{"mk_graph_launch", &graphLaunch},
		symbol{"mk_graph_destroy", &graphDestroy},
		symbol{"mk_graph_mark", &graphMark},
	)
}

// memo keeps the answers of the workspace queries (PagedAttnWorkspace,
// MoEWorkspace, MoEFusedWorkspace) by their arguments, so that a replay
// device, which makes no CUDA calls, answers them as the capture did.
type memo struct {
	mu sync.Mutex
	m  map[any]any
}

func newMemo() *memo { return &memo{m: map[any]any{}} }

// query returns f's answer for key (comparable), asking f (and remembering)
// unless d is a replay device, which only recalls.
func query[V any](d *Device, what string, key any, f func() (V, error)) (V, error) {
	if d.memo != nil {
		d.memo.mu.Lock()
		v, ok := d.memo.m[key]
		d.memo.mu.Unlock()
		if ok {
			return v.(V), nil
		}
	}
	if d.rep != nil {
		var zero V
		return zero, fmt.Errorf("kernels: %s %+v: %w: not asked at capture", what, key, ErrGraphDiverged)
	}
	v, err := f()
	if err == nil && d.memo != nil {
		d.memo.mu.Lock()
		d.memo.m[key] = v
		d.memo.mu.Unlock()
	}
	return v, err
}
