package kernels

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// ErrClosed is returned by GPU.Do after Close.
var ErrClosed = errors.New("kernels: GPU is closed")

// DeviceInfo describes the opened device.
type DeviceInfo struct {
	Name             string
	Ordinal          int
	SMs              int    // multiprocessors
	CCMajor, CCMinor int    // compute capability
	TotalMem         uint64 // bytes
	FreeMem          uint64 // bytes free when Open ran
	L2Bytes          uint64
	SmemPerBlock     uint64 // shared memory a block can opt into, bytes
	Driver, Runtime  int    // CUDA versions, e.g. 13000
}

// GPU owns one CUDA device through one goroutine locked to its OS thread;
// Do runs closures there. A process opens its GPU once: the library keeps
// its context on that thread.
type GPU struct {
	info      DeviceInfo
	work      chan func()
	quit      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	dev       *Device

	// Direct mode (SetDirect): Do runs f on the calling goroutine, its OS
	// thread locked for the call, one call at a time under mu.
	direct atomic.Bool
	mu     sync.Mutex
}

// Open loads libmkernel.so and initialises device ordinal on a new owning
// goroutine. Errors that mean the machine cannot run the CUDA backend wrap
// ErrUnavailable.
func Open(ordinal int) (*GPU, error) {
	if ordinal < 0 || ordinal > math.MaxInt32 {
		return nil, fmt.Errorf("kernels: bad device ordinal %d", ordinal)
	}
	l, err := library()
	if err != nil {
		return nil, err
	}
	g := &GPU{
		work: make(chan func()),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	started := make(chan error, 1)
	go g.loop(l, ordinal, started)
	if err := <-started; err != nil {
		<-g.done
		return nil, err
	}
	return g, nil
}

// loop is the owning goroutine. It never unlocks its thread: the CUDA
// context is current there, and the thread ends with the goroutine.
func (g *GPU) loop(l *lib, ordinal int, started chan<- error) {
	defer close(g.done)
	runtime.LockOSThread()
	if err := l.check("mk_init", l.init(int32(ordinal))); err != nil {
		started <- err
		return
	}
	var c deviceInfoC
	if err := l.check("mk_device_info", l.deviceInfo(&c)); err != nil {
		started <- err
		return
	}
	name := string(c.Name[:])
	if i := strings.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	g.info = DeviceInfo{
		Name: name, Ordinal: int(c.Device), SMs: int(c.SMCount),
		CCMajor: int(c.CCMajor), CCMinor: int(c.CCMinor),
		TotalMem: c.TotalMem, FreeMem: c.FreeMem, L2Bytes: c.L2Bytes,
		SmemPerBlock: c.SmemPerBlockOptin,
		Driver:       int(c.DriverVersion), Runtime: int(c.RuntimeVersion),
	}
	g.dev = &Device{lib: l, info: g.info, memo: newMemo()}
	started <- nil
	for {
		select {
		case f := <-g.work:
			f()
		case <-g.quit:
			return
		}
	}
}

// Info describes the device.
func (g *GPU) Info() DeviceInfo { return g.info }

// Do runs f on the owning goroutine and returns its error. f must not call
// Do (that would wait on itself) and must not keep d after it returns.
// A panic in f comes back as an error.
func (g *GPU) Do(f func(d *Device) error) error {
	if g.direct.Load() {
		return g.doDirect(f)
	}
	res := make(chan error, 1)
	job := func() {
		d := g.dev
		d.active = true
		defer func() {
			d.active = false
			if r := recover(); r != nil {
				res <- fmt.Errorf("kernels: panic on the GPU goroutine: %v", r)
			}
		}()
		res <- f(d)
	}
	select {
	case g.work <- job:
	case <-g.done:
		return ErrClosed
	}
	return <-res
}

// SetDirect switches Do to direct mode (on) or back: f then runs on the
// caller's goroutine, with its OS thread locked for the call and one call
// at a time, instead of being handed to the owning goroutine. A hand-off to
// a locked thread wakes that thread through the OS twice per call (tens of
// microseconds in a VM), which dominates a step of many small ops; direct
// mode has none. The library then accepts calls from any thread
// (mk_set_any_thread), making the device current on each. Experimental:
// off unless asked for.
func (g *GPU) SetDirect(on bool) error {
	var v int32
	if on {
		v = 1
	}
	if !on {
		g.direct.Store(false)
	}
	err := g.Do(func(d *Device) error { return d.lib.check("mk_set_any_thread", d.lib.anyThread(v)) })
	if err == nil && on {
		g.direct.Store(true)
	}
	return err
}

// doDirect is Do in direct mode.
func (g *GPU) doDirect(f func(d *Device) error) (err error) {
	select {
	case <-g.done:
		return ErrClosed
	default:
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	g.mu.Lock()
	defer g.mu.Unlock()
	d := g.dev
	d.active = true
	defer func() {
		d.active = false
		if r := recover(); r != nil {
			err = fmt.Errorf("kernels: panic in a GPU call: %v", r)
		}
	}()
	return f(d)
}

// Close waits for the running closure, if any, and stops the owning
// goroutine. Device memory is not freed: free it first.
func (g *GPU) Close() error {
	g.closeOnce.Do(func() { close(g.quit) })
	<-g.done
	return nil
}

// Device is the handle closures get from GPU.Do; its methods call into the
// library and are valid only inside Do.
type Device struct {
	lib    *lib
	info   DeviceInfo
	active bool

	cap  *StepGraph // capturing into cap (BeginCapture)
	rep  *StepGraph // a replay device of rep (StepGraph.Replay)
	memo *memo      // workspace queries, shared with replay devices
}

// Info describes the device.
func (d *Device) Info() DeviceInfo { return d.info }

// FreeMem reports the device memory free now (cudaMemGetInfo, through
// mk_device_info). Not inside a graph capture.
func (d *Device) FreeMem() (uint64, error) {
	if err := d.ready("FreeMem"); err != nil {
		return 0, err
	}
	var c deviceInfoC
	if err := d.lib.check("mk_device_info", d.lib.deviceInfo(&c)); err != nil {
		return 0, err
	}
	return c.FreeMem, nil
}

func (d *Device) ready(what string) error {
	if d == nil || !d.active {
		return fmt.Errorf("kernels: %s: Device used outside GPU.Do", what)
	}
	return nil
}

// Sync waits for all work on the device.
func (d *Device) Sync() error {
	if err := d.ready("Sync"); err != nil {
		return err
	}
	if err := d.graphRefusal("Sync"); err != nil {
		return err
	}
	return d.lib.check("mk_device_sync", d.lib.deviceSync())
}

// GemmStats reports how many GEMMs ran through cuBLASLt and how many through
// the cublasGemmEx fallback (shapes cuBLASLt offered no algorithm for).
func (d *Device) GemmStats() (lt, fallback uint64, err error) {
	if err := d.ready("GemmStats"); err != nil {
		return 0, 0, err
	}
	err = d.lib.check("mk_gemm_stats", d.lib.gemmStats(&lt, &fallback))
	return lt, fallback, err
}

// ---- device memory ----

// Buffer is device memory: an allocation from Malloc, or a View of one.
type Buffer struct {
	d     *Device
	ptr   uint64
	bytes int64
	view  bool
	ipc   bool // mapped from another process (OpenIPC): Free unmaps it
}

// Malloc allocates bytes of device memory.
func (d *Device) Malloc(bytes int64) (*Buffer, error) {
	if err := d.ready("Malloc"); err != nil {
		return nil, err
	}
	if d.rep != nil {
		return nil, d.graphRefusal("Malloc")
	}
	if bytes <= 0 {
		return nil, fmt.Errorf("kernels: Malloc of %d bytes", bytes)
	}
	var p uint64
	if err := d.lib.check("mk_malloc", d.lib.malloc(uint64(bytes), &p)); err != nil {
		return nil, err
	}
	return &Buffer{d: d, ptr: p, bytes: bytes}, nil
}

// Ptr is the device address (0 once freed).
func (b *Buffer) Ptr() uint64 { return b.ptr }

// Bytes is the buffer's size.
func (b *Buffer) Bytes() int64 { return b.bytes }

// View is the bytes [off, off+n) of b, sharing its memory; it is not freed.
func (b *Buffer) View(off, n int64) (*Buffer, error) {
	if b == nil || b.ptr == 0 {
		return nil, errors.New("kernels: View of a freed or nil buffer")
	}
	if off < 0 || n <= 0 || off > b.bytes || n > b.bytes-off {
		return nil, fmt.Errorf("kernels: View [%d, +%d) outside a buffer of %d bytes", off, n, b.bytes)
	}
	return &Buffer{d: b.d, ptr: b.ptr + uint64(off), bytes: n, view: true}, nil
}

// Free releases the memory (inside GPU.Do). Freeing twice is a no-op.
func (b *Buffer) Free() error {
	if b == nil || b.ptr == 0 {
		return nil
	}
	if b.view {
		return errors.New("kernels: Free of a View; free the buffer it came from")
	}
	if err := b.d.ready("Buffer.Free"); err != nil {
		return err
	}
	if err := b.d.graphRefusal("Buffer.Free"); err != nil {
		return err
	}
	if b.ipc {
		if err := b.d.lib.check("mk_ipc_close", ipcClose(b.ptr)); err != nil {
			return err
		}
	} else if err := b.d.lib.check("mk_free", b.d.lib.free(b.ptr)); err != nil {
		return err
	}
	b.ptr = 0
	return nil
}

// Elem is an element type that can travel between host slices and buffers.
type Elem interface {
	~uint8 | ~int8 | ~uint16 | ~int16 | ~uint32 | ~int32 | ~float32 | ~uint64 | ~int64 | ~float64
}

func byteLen[T Elem](s []T) int64 {
	var z T
	return int64(len(s)) * int64(unsafe.Sizeof(z))
}

// Upload copies src into the start of dst, synchronously.
func Upload[T Elem](d *Device, dst *Buffer, src []T) error {
	if err := d.ready("Upload"); err != nil {
		return err
	}
	n := byteLen(src)
	if err := dst.fits("Upload destination", n); err != nil || n == 0 {
		return err
	}
	if d.cap != nil || d.rep != nil {
		b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), n)
		var err error
		if d.cap != nil {
			err = d.cap.stage(d, dst, b)
		} else {
			err = d.rep.restage(dst, b)
		}
		runtime.KeepAlive(src)
		return err
	}
	err := d.lib.check("mk_memcpy_h2d", d.lib.h2d(dst.ptr, unsafe.Pointer(unsafe.SliceData(src)), uint64(n)))
	runtime.KeepAlive(src)
	return err
}

// Download copies the start of src into dst, synchronously.
func Download[T Elem](d *Device, dst []T, src *Buffer) error {
	if err := d.ready("Download"); err != nil {
		return err
	}
	if err := d.graphRefusal("Download"); err != nil {
		return err
	}
	n := byteLen(dst)
	if err := src.fits("Download source", n); err != nil || n == 0 {
		return err
	}
	err := d.lib.check("mk_memcpy_d2h", d.lib.d2h(unsafe.Pointer(unsafe.SliceData(dst)), src.ptr, uint64(n)))
	runtime.KeepAlive(dst)
	return err
}

// Copy copies bytes from src to dst on the device, synchronously.
func (d *Device) Copy(dst, src *Buffer, bytes int64) error {
	if err := d.ready("Copy"); err != nil {
		return err
	}
	if err := dst.fits("Copy destination", bytes); err != nil {
		return err
	}
	if err := src.fits("Copy source", bytes); err != nil {
		return err
	}
	switch {
	case d.rep != nil:
		return nil // in the graph
	case d.cap != nil:
		return d.lib.check("mk_memcpy_d2d_async", d.lib.d2dAsync(dst.ptr, src.ptr, uint64(bytes), 0))
	}
	return d.lib.check("mk_memcpy_d2d", d.lib.d2d(dst.ptr, src.ptr, uint64(bytes)))
}

// CopyAsync copies bytes from src to dst on stream s.
func (d *Device) CopyAsync(s *Stream, dst, src *Buffer, bytes int64) error {
	if err := d.ready("CopyAsync"); err != nil || d.muted() {
		return err
	}
	if err := dst.fits("CopyAsync destination", bytes); err != nil {
		return err
	}
	if err := src.fits("CopyAsync source", bytes); err != nil {
		return err
	}
	return d.lib.check("mk_memcpy_d2d_async", d.lib.d2dAsync(dst.ptr, src.ptr, uint64(bytes), s.handle()))
}

// fits checks that b is live and holds at least n bytes.
func (b *Buffer) fits(what string, n int64) error {
	if b == nil || b.ptr == 0 {
		return fmt.Errorf("kernels: %s is a nil or freed buffer", what)
	}
	if n < 0 || n > b.bytes {
		return fmt.Errorf("kernels: %s holds %d bytes, %d needed", what, b.bytes, n)
	}
	return nil
}

// ---- pinned host memory ----

// Pinned is page-locked host memory from the library, the only host memory
// asynchronous copies accept.
type Pinned struct {
	d *Device
	p unsafe.Pointer
	n int64
}

// AllocPinned allocates bytes of pinned host memory.
func (d *Device) AllocPinned(bytes int64) (*Pinned, error) {
	if err := d.ready("AllocPinned"); err != nil {
		return nil, err
	}
	if d.rep != nil {
		return nil, d.graphRefusal("AllocPinned")
	}
	if bytes <= 0 {
		return nil, fmt.Errorf("kernels: AllocPinned of %d bytes", bytes)
	}
	var p unsafe.Pointer
	if err := d.lib.check("mk_host_alloc_pinned", d.lib.hostAlloc(uint64(bytes), &p)); err != nil {
		return nil, err
	}
	return &Pinned{d: d, p: p, n: bytes}, nil
}

// Bytes is the memory as a byte slice (nil once freed).
func (h *Pinned) Bytes() []byte {
	if h == nil || h.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(h.p), h.n)
}

// Free releases the memory (inside GPU.Do). Freeing twice is a no-op.
func (h *Pinned) Free() error {
	if h == nil || h.p == nil {
		return nil
	}
	if err := h.d.ready("Pinned.Free"); err != nil {
		return err
	}
	if err := h.d.lib.check("mk_host_free_pinned", h.d.lib.hostFree(h.p)); err != nil {
		return err
	}
	h.p = nil
	return nil
}

// UploadAsync copies bytes from pinned src to dst on stream s.
func (d *Device) UploadAsync(s *Stream, dst *Buffer, src *Pinned, bytes int64) error {
	if err := d.ready("UploadAsync"); err != nil || d.muted() {
		return err
	}
	if err := dst.fits("UploadAsync destination", bytes); err != nil {
		return err
	}
	if src == nil || src.p == nil || bytes < 0 || bytes > src.n {
		return fmt.Errorf("kernels: UploadAsync source: freed, or fewer than %d bytes", bytes)
	}
	return d.lib.check("mk_memcpy_h2d_async", d.lib.h2dAsync(dst.ptr, src.p, uint64(bytes), s.handle()))
}

// DownloadAsync copies bytes from src to pinned dst on stream s.
func (d *Device) DownloadAsync(s *Stream, dst *Pinned, src *Buffer, bytes int64) error {
	if err := d.ready("DownloadAsync"); err != nil || d.muted() {
		return err
	}
	if err := src.fits("DownloadAsync source", bytes); err != nil {
		return err
	}
	if dst == nil || dst.p == nil || bytes < 0 || bytes > dst.n {
		return fmt.Errorf("kernels: DownloadAsync destination: freed, or fewer than %d bytes", bytes)
	}
	return d.lib.check("mk_memcpy_d2h_async", d.lib.d2hAsync(dst.p, src.ptr, uint64(bytes), s.handle()))
}

// ---- streams and events ----

// Stream is a CUDA stream; a nil *Stream means the default stream.
type Stream struct {
	d *Device
	h uint64
}

func (s *Stream) handle() uint64 {
	if s == nil {
		return 0
	}
	return s.h
}

// NewStream creates a stream (ordered with the synchronous copies).
func (d *Device) NewStream() (*Stream, error) {
	if err := d.ready("NewStream"); err != nil {
		return nil, err
	}
	var h uint64
	if err := d.lib.check("mk_stream_create", d.lib.streamCreate(&h)); err != nil {
		return nil, err
	}
	return &Stream{d: d, h: h}, nil
}

// Sync waits for the stream's work (inside GPU.Do).
func (s *Stream) Sync(d *Device) error {
	if err := d.ready("Stream.Sync"); err != nil {
		return err
	}
	return d.lib.check("mk_stream_sync", d.lib.streamSync(s.handle()))
}

// Destroy releases the stream (inside GPU.Do); the default stream stays.
func (s *Stream) Destroy() error {
	if s == nil || s.h == 0 {
		return nil
	}
	if err := s.d.ready("Stream.Destroy"); err != nil {
		return err
	}
	if err := s.d.lib.check("mk_stream_destroy", s.d.lib.streamDestroy(s.h)); err != nil {
		return err
	}
	s.h = 0
	return nil
}

// Event is a CUDA event with timing.
type Event struct {
	d *Device
	h uint64
}

// NewEvent creates an event.
func (d *Device) NewEvent() (*Event, error) {
	if err := d.ready("NewEvent"); err != nil {
		return nil, err
	}
	var h uint64
	if err := d.lib.check("mk_event_create", d.lib.eventCreate(&h)); err != nil {
		return nil, err
	}
	return &Event{d: d, h: h}, nil
}

// Record records the event on stream s (nil: the default stream).
func (e *Event) Record(s *Stream) error {
	if err := e.d.ready("Event.Record"); err != nil {
		return err
	}
	return e.d.lib.check("mk_event_record", e.d.lib.eventRecord(e.h, s.handle()))
}

// Sync waits for the event.
func (e *Event) Sync() error {
	if err := e.d.ready("Event.Sync"); err != nil {
		return err
	}
	return e.d.lib.check("mk_event_sync", e.d.lib.eventSync(e.h))
}

// Destroy releases the event.
func (e *Event) Destroy() error {
	if e == nil || e.h == 0 {
		return nil
	}
	if err := e.d.ready("Event.Destroy"); err != nil {
		return err
	}
	if err := e.d.lib.check("mk_event_destroy", e.d.lib.eventDestroy(e.h)); err != nil {
		return err
	}
	e.h = 0
	return nil
}

// Elapsed is the time in milliseconds from start to end, both recorded and complete.
func Elapsed(start, end *Event) (float32, error) {
	if err := start.d.ready("Elapsed"); err != nil {
		return 0, err
	}
	var bits uint32
	if err := start.d.lib.check("mk_event_elapsed", start.d.lib.eventElapsed(start.h, end.h, &bits)); err != nil {
		return 0, err
	}
	return math.Float32frombits(bits), nil
}

// TimeCalls times n consecutive calls issued on stream s with CUDA events
// (one event before the first, one after the last) and returns the mean
// milliseconds per call; call(i) issues the i-th (0-based) asynchronously
// on s. Rank-local ring launches with consecutive epochs synchronise with
// their peers by themselves, so each rank of a multi-process ring can time
// its own calls this way.
func (d *Device) TimeCalls(s *Stream, n int, call func(i int) error) (float64, error) {
	if n < 1 {
		return 0, fmt.Errorf("kernels: TimeCalls of %d calls", n)
	}
	start, err := d.NewEvent()
	if err != nil {
		return 0, err
	}
	defer start.Destroy()
	end, err := d.NewEvent()
	if err != nil {
		return 0, err
	}
	defer end.Destroy()
	if err := start.Record(s); err != nil {
		return 0, err
	}
	for i := range n {
		if err := call(i); err != nil {
			return 0, err
		}
	}
	if err := end.Record(s); err != nil {
		return 0, err
	}
	if err := end.Sync(); err != nil {
		return 0, err
	}
	ms, err := Elapsed(start, end)
	return float64(ms) / float64(n), err
}
