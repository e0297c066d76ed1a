package cuda

import (
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

// Overlapped decode (backend.AsyncSampler).
//
// SampleAsync samples into one fixed device buffer (the picks: up to
// feedMaxRows rows of kernels.SampleResultWords words) and queues the copy
// of the rows it wrote to pinned host memory, then returns. The next step's
// batch names the rows whose token is a pick (backend.Batch.Feed). A graph
// step's Embed reads those tokens on the device (GatherRowsFeedF32 from the
// picks, whose address is baked into the graph), so the engine launches
// step N+1 before step N's tokens reach the host and overlaps its own work
// (delivering step N's tokens, scheduling N+2, refilling the graph's
// uploads) with the GPU. Every other step (eager, or a capture that fell
// back) resolves fed rows on the host first, by waiting for the picks.
//
// Ordering: everything runs on stream 0 (or the work stream, ordered with
// it), so a step's sampling reads its logits before the next step
// overwrites them, and the next step's Embed reads the picks after they
// were written. The host copies go to a ring of feedSlots pinned buffers,
// each with an event; a slot is reused only after its event fired.

// feedMaxRows is the most rows a SampleAsync keeps on the device for the
// next step; a larger one samples synchronously (its picks feed on the
// host).
const feedMaxRows = 4096

// feedSlots is how many SampleAsync results may be on their way at once.
const feedSlots = 4

// feedState is a Backend's overlapped-decode state (inside be.do).
type feedState struct {
	picks *kernels.Buffer // [feedMaxRows, SampleResultWords] int32 (device)
	slots [feedSlots]*feedSlot
	next  int
	last  *pending // the latest SampleAsync: what Batch.Feed refers to
}

// feedSlot is one SampleAsync's host memory: its metadata (uploaded from
// here) and its results (copied here), and the event after both.
type feedSlot struct {
	meta, words *kernels.Pinned
	proc        *kernels.Pinned // the rows' logits processing (kernels.PackProcess), when any
	ev          *kernels.Event
	busy        bool   // ev recorded and not yet waited for
	gen         uint64 // uses so far: a pending holds the use it was
}

// pending is a SampleAsync in flight (backend.Pending).
type pending struct {
	be       *Backend
	slot     *feedSlot
	gen      uint64 // slot.gen when this sampling used it
	rows     int
	onDevice bool // the picks buffer holds these picks (not a synchronous fallback's)
	done     bool
	picked   []int32 // the tokens, once read on the host (resolveFeed or Wait)
	res      []backend.SampleResult
	err      error
}

var _ backend.AsyncSampler = (*Backend)(nil)

// picksBuf is the picks buffer, made on first use.
func (be *Backend) picksBuf(d *kernels.Device) (*kernels.Buffer, error) {
	if be.feed.picks == nil {
		b, err := d.Malloc(int64(feedMaxRows) * kernels.SampleResultWords * 4)
		if err != nil {
			return nil, fmt.Errorf("the sampling picks buffer: %w", err)
		}
		be.feed.picks = b
	}
	return be.feed.picks, nil
}

// growPinned makes p at least n bytes (a slot not in use).
func growPinned(d *kernels.Device, p **kernels.Pinned, n int64) error {
	if *p != nil && int64(len((*p).Bytes())) >= n {
		return nil
	}
	if *p != nil {
		if err := (*p).Free(); err != nil {
			return err
		}
		*p = nil
	}
	q, err := d.AllocPinned(max(n, 64<<10))
	if err != nil {
		return err
	}
	*p = q
	return nil
}

// SampleAsync implements backend.AsyncSampler: Sample's picks, left on the
// device for the next step and copied to the host behind the GPU's work.
func (be *Backend) SampleAsync(logits backend.Tensor, rows []backend.SampleRow) (p backend.Pending, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cuda: SampleAsync: %v", r)
		}
	}()
	t, B := matrix("SampleAsync", "logits", logits, -1)
	_, V := t.dims()
	if len(rows) != B || B == 0 || V == 0 {
		return nil, fmt.Errorf("cuda: SampleAsync: logits %v for %d rows", t.shape, len(rows))
	}
	if B > feedMaxRows {
		// Too many rows for the picks buffer: sample now; a feed from
		// these picks resolves on the host.
		res := be.Sample(logits, rows)
		pd := &pending{be: be, rows: B, done: true, res: res, picked: make([]int32, B)}
		for i, r := range res {
			pd.picked[i] = r.Token
		}
		be.feed.last = pd
		return pd, nil
	}
	krows, meta, pen, err := packRows(rows, V)
	if err != nil {
		return nil, fmt.Errorf("cuda: SampleAsync: %w", err)
	}
	proc, nproc, err := kernels.PackProcess(krows, V)
	if err != nil {
		return nil, fmt.Errorf("cuda: SampleAsync: %w", err)
	}
	pd := &pending{be: be, rows: B, onDevice: true}
	be.do("SampleAsync", func(d *kernels.Device) error {
		f := &be.feed
		picks, err := be.picksBuf(d)
		if err != nil {
			return err
		}
		sl := f.slots[f.next]
		if sl == nil {
			ev, err := d.NewEvent()
			if err != nil {
				return err
			}
			sl = &feedSlot{ev: ev}
			f.slots[f.next] = sl
		}
		if sl.busy { // its Pending was not waited for: it is at least feedSlots calls old
			if err := sl.ev.Sync(); err != nil {
				return err
			}
			sl.busy = false
		}
		f.next = (f.next + 1) % feedSlots
		nw := int64(B) * kernels.SampleResultWords * 4
		if err := errors.Join(growPinned(d, &sl.meta, int64(len(meta))*4), growPinned(d, &sl.words, nw)); err != nil {
			return err
		}
		var mb *kernels.Buffer
		if !greedySplit(krows) { // (the split greedy kernel reads no metadata)
			copy(unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(sl.meta.Bytes()))), len(meta)), meta)
			mb = be.alloc.get(d, int64(len(meta))*4)
			defer be.alloc.put(mb) // stream-ordered: later users of mb run after the sampling
			if err := d.UploadAsync(nil, mb, sl.meta, int64(len(meta))*4); err != nil {
				return err
			}
		}
		lg := be.f32(d, t)
		if nproc > 0 {
			if err := growPinned(d, &sl.proc, int64(len(proc))*4); err != nil {
				return err
			}
			copy(unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(sl.proc.Bytes()))), len(proc)), proc)
			pb := be.alloc.get(d, int64(len(proc))*4)
			defer be.alloc.put(pb)
			if err := d.UploadAsync(nil, pb, sl.proc, int64(len(proc))*4); err != nil {
				return err
			}
			c, err := be.processCopy(d, lg, pb, len(proc), nproc, B, V)
			if err != nil {
				return err
			}
			defer be.alloc.put(c)
			lg = c
		}
		if err := be.sampleOn(d, picks, lg, mb, len(meta), krows, pen, V); err != nil {
			return err
		}
		if err := d.DownloadAsync(nil, sl.words, picks, nw); err != nil {
			return err
		}
		if err := sl.ev.Record(nil); err != nil {
			return err
		}
		sl.busy = true
		sl.gen++
		pd.slot, pd.gen = sl, sl.gen
		return nil
	}, t)
	be.feed.last = pd
	return pd, nil
}

// Wait implements backend.Pending.
func (p *pending) Wait() ([]backend.SampleResult, error) {
	if p.done {
		if p.res == nil && p.err == nil {
			return nil, errors.New("cuda: Pending.Wait called twice")
		}
		res, err := p.res, p.err
		p.res, p.err = nil, nil
		return res, err
	}
	if err := p.read(); err != nil {
		return nil, err
	}
	return p.Wait()
}

// read waits for p's picks and decodes them (p.res, p.picked, or p.err).
func (p *pending) read() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cuda: waiting for sampled tokens: %v", r)
		}
	}()
	var words []int32
	p.be.do("Pending.Wait", func(d *kernels.Device) error {
		sl := p.slot
		if !sl.busy || sl.gen != p.gen {
			return errors.New("the sampling results were overwritten: waited for too late")
		}
		if err := sl.ev.Sync(); err != nil {
			return err
		}
		sl.busy = false
		n := p.rows * kernels.SampleResultWords
		words = slices.Clone(unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(sl.words.Bytes()))), n))
		return p.be.checkWatchdogs(d)
	})
	p.done = true
	outs, uerr := kernels.UnpackSample(words, p.rows)
	if uerr != nil {
		p.err = uerr
		return nil
	}
	p.res = make([]backend.SampleResult, p.rows)
	p.picked = make([]int32, p.rows)
	for i, o := range outs {
		p.res[i] = backend.SampleResult(o)
		p.picked[i] = o.Token
	}
	return nil
}

// resolveFeed writes the picked tokens into b's fed rows and drops the
// feed, waiting for the latest SampleAsync's picks: for steps that do not
// read them on the device.
func (be *Backend) resolveFeed(b *backend.Batch) {
	if !b.Fed() {
		b.Feed = nil
		return
	}
	p := be.feed.last
	if p == nil {
		panicf("Embed", "the batch takes tokens from sampling picks, but nothing was sampled asynchronously")
	}
	if !p.done {
		if err := p.read(); err != nil {
			panicf("Embed", "%v", err)
		}
	}
	if p.picked == nil {
		panicf("Embed", "the batch takes tokens from a sampling that failed: %v", p.err)
	}
	for i, f := range b.Feed {
		if f < 0 {
			continue
		}
		if int(f) >= len(p.picked) {
			panicf("Embed", "row %d takes pick %d of %d", i, f, len(p.picked))
		}
		b.Tokens[i] = p.picked[f]
	}
	b.Feed = nil
}

// feedIDs is the Embed upload of a graph step: the host's ids, then each
// row's feed row (-1: the host id), checked against a table of V rows and
// the latest SampleAsync's rows.
func (be *Backend) feedIDs(b *backend.Batch, V int) ([]int32, error) {
	T := len(b.Tokens)
	v := make([]int32, 2*T)
	copy(v, b.Tokens)
	for i := T; i < 2*T; i++ {
		v[i] = -1
	}
	picks := 0
	if p := be.feed.last; p != nil && p.onDevice {
		picks = p.rows
	}
	for i, id := range b.Tokens {
		if i < len(b.Feed) && b.Feed[i] >= 0 {
			if int(b.Feed[i]) >= picks {
				return nil, fmt.Errorf("row %d takes pick %d, but the device holds %d", i, b.Feed[i], picks)
			}
			v[T+i] = b.Feed[i]
			continue
		}
		if id < 0 || int(id) >= V {
			return nil, fmt.Errorf("ids[%d] = %d outside the embedding's %d rows", i, id, V)
		}
	}
	return v, nil
}

// feedOnDevice reports whether b's fed rows can be read from the picks
// buffer (the latest SampleAsync left its picks there).
func (be *Backend) feedOnDevice() bool {
	p := be.feed.last
	return p != nil && p.onDevice
}

// feedInput is the fast replays' source of the Embed upload (feedIDs).
func (be *Backend) feedInput(V int) stepInput {
	return func(b *backend.Batch) ([]int32, error) { return be.feedIDs(b, V) }
}
