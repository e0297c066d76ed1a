package cuda

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"

	"github.com/mkserve/mkserve/kernels"
)

// metaCache keeps one pool's attention metadata on the device: the slots,
// rows, positions, table offsets and block tables of the last call, packed
// into one int32 buffer [slots T | rows n | pos n | table n | blocks nb].
// Every layer of a step sends the same batch, so the arrays (rebuilt on the
// host per layer, which is cheap) compare equal after the first layer and
// the upload — one synchronous host-to-device copy — happens once per step
// and pool instead of five times per layer. Comparing contents, not batch
// identity, keeps it correct when a caller reuses or mutates a Batch.
type metaCache struct {
	host    []int32
	buf     *kernels.Buffer
	t, n    int
	group   *attnGroup // the group of the last get, whose arrays buf holds
	uploads int        // uploads so far (tests)

	// The per-span arrays of the prefill kernel, cached the same way:
	// [start B+1 | past B | table B].
	fhost []int32
	fbuf  *kernels.Buffer
}

// flashMeta are views of the prefill kernel's per-span arrays.
type flashMeta struct{ start, past, table *kernels.Buffer }

// flash returns g's per-span arrays on the device (qStart gets the end of
// the last span appended), uploading them unless they equal the cached ones.
func (mc *metaCache) flash(be *Backend, d *kernels.Device, g *attnGroup) flashMeta {
	B := len(g.seqStart)
	end := g.seqStart[B-1] + int32(g.lastLen)
	want := append(append(append(append(make([]int32, 0, 3*B+1), g.seqStart...), end), g.seqPast...), g.seqTable...)
	if mc.fbuf == nil || !slices.Equal(mc.fhost, want) {
		mc.fhost = want
		be.alloc.put(mc.fbuf)
		mc.fbuf = upload(be, d, want)
		mc.uploads++
	}
	return flashMeta{
		start: view(mc.fbuf, 0, int64(B+1)*4),
		past:  view(mc.fbuf, int64(B+1)*4, int64(B)*4),
		table: view(mc.fbuf, int64(2*B+1)*4, int64(B)*4),
	}
}

// FlashEnv names the environment variable that, set to 0, keeps prefill
// rows on the paged decode kernels instead of the flash prefill kernel, for
// comparisons.
const FlashEnv = "MKSERVE_FLASH"

// PrefillBF16Env names the environment variable that, set to 1, lets a
// prefill's attention write its output in bf16 only (the flash kernel's
// bf16 output; the o projection reads it as its GEMM operand) instead of
// float32 rows converted to bf16 before the o projection. Opt-in until
// measured on the GPU (written after the twenty-sixth pass's device time).
const PrefillBF16Env = "MKSERVE_PREFILL_BF16"

// prefillBF16 reports PrefillBF16Env.
var prefillBF16 = sync.OnceValue(func() bool { return os.Getenv(PrefillBF16Env) == "1" })

// flashOn reports whether prefill steps use the flash kernel (FlashEnv).
var flashOn = sync.OnceValue(func() bool { return os.Getenv(FlashEnv) != "0" })

// flashFits reports whether the prefill kernel takes these head dims.
func flashFits(d, dv int) bool { return d <= kernels.FlashMaxHeadDim && dv <= kernels.FlashMaxHeadDim }

// i32Cache keeps one int32 array on the device and uploads a new one only
// when its contents change. A synchronous upload from pageable memory
// waits for all queued GPU work, so an upload per layer would stop the
// host from running ahead of the GPU; arrays every layer of a step sends
// (RoPE positions) go up once per step. Used on the GPU goroutine only.
type i32Cache struct {
	host    []int32
	buf     *kernels.Buffer
	uploads int // uploads so far (tests)
}

// get returns v on the device (valid until the next get with other contents).
func (c *i32Cache) get(be *Backend, d *kernels.Device, v []int32) *kernels.Buffer {
	if c.buf == nil || !slices.Equal(c.host, v) {
		c.host = append(c.host[:0], v...)
		be.alloc.put(c.buf) // later work may reuse it: all work is ordered on one stream
		c.buf = upload(be, d, v)
		c.uploads++
	}
	return c.buf
}

// i32Caches is a few i32Caches looked up by their contents: a step whose
// layers each send the same few arrays (one a context-parallel span)
// uploads each once; a new array replaces the entries in turn. Used on the
// GPU goroutine only; a caller takes one array a call (a later get may
// replace an earlier one's buffer).
type i32Caches struct {
	c    [4]i32Cache
	next int
}

// get returns v on the device (valid until the entry holding it is replaced).
func (cs *i32Caches) get(be *Backend, d *kernels.Device, v []int32) *kernels.Buffer {
	for i := range cs.c {
		if c := &cs.c[i]; c.buf != nil && slices.Equal(c.host, v) {
			return c.buf
		}
	}
	c := &cs.c[cs.next]
	cs.next = (cs.next + 1) % len(cs.c)
	return c.get(be, d, v)
}

// reset drops every entry (their buffers back to the pool), keeping counts.
func (cs *i32Caches) reset(be *Backend) {
	for i := range cs.c {
		be.alloc.put(cs.c[i].buf)
		cs.c[i] = i32Cache{uploads: cs.c[i].uploads}
	}
}

// attnMeta are views of a metaCache's buffer.
type attnMeta struct{ slots, rows, pos, table, blocks *kernels.Buffer }

// get returns g's metadata on the device, uploading it unless it equals the
// cached arrays. T is the batch's token count (len(g.slots)).
func (mc *metaCache) get(be *Backend, d *kernels.Device, g *attnGroup, T int) attnMeta {
	n := len(g.rows)
	// The group of the last get needs no comparison: groups never change
	// once built, and mc holds it, so its address is no other group's.
	same := mc.buf != nil && mc.group == g && mc.t == T
	if !same && (mc.buf == nil || mc.t != T || mc.n != n || len(mc.host) != T+3*n+len(g.blocks) ||
		!slices.Equal(mc.host[:T], g.slots) || !slices.Equal(mc.host[T:T+n], g.rows) ||
		!slices.Equal(mc.host[T+n:T+2*n], g.pos) || !slices.Equal(mc.host[T+2*n:T+3*n], g.table) ||
		!slices.Equal(mc.host[T+3*n:], g.blocks)) {
		mc.host = packMeta(mc.host[:0], g)
		be.alloc.put(mc.buf) // later work may reuse it: all work is ordered on one stream
		mc.buf = upload(be, d, mc.host)
		mc.t, mc.n = T, n
		mc.uploads++
	}
	mc.group = g
	seg := func(off, len int) *kernels.Buffer { return view(mc.buf, int64(off)*4, int64(max(len, 1))*4) }
	return attnMeta{
		slots:  seg(0, T),
		rows:   seg(T, n),
		pos:    seg(T+n, n),
		table:  seg(T+2*n, n),
		blocks: seg(T+3*n, len(g.blocks)),
	}
}

// packMeta appends g's metadata to dst in a metaCache buffer's layout:
// [slots T | rows n | pos n | table n | blocks nb].
func packMeta(dst []int32, g *attnGroup) []int32 {
	dst = slices.Grow(dst, len(g.slots)+len(g.rows)+len(g.pos)+len(g.table)+len(g.blocks))
	return append(append(append(append(append(dst, g.slots...), g.rows...), g.pos...), g.table...), g.blocks...)
}

// release returns the cached buffers to the allocator.
func (mc *metaCache) release(be *Backend) {
	be.alloc.put(mc.buf)
	be.alloc.put(mc.fbuf)
	*mc = metaCache{}
}

// VariantEnv names the environment variable that, when set, selects the
// paged attention kernel of every CUDA backend in the process (0 auto, 1
// CUDA cores, 2 tensor cores, 3 warp-split: kernels.PagedVariant), for
// comparisons.
const VariantEnv = "MKSERVE_PAGED_VARIANT"

var variantOnce sync.Once

// pagedVariant applies VariantEnv once per process (on the GPU goroutine).
func pagedVariant(d *kernels.Device) error {
	var err error
	variantOnce.Do(func() {
		s := os.Getenv(VariantEnv)
		if s == "" {
			return
		}
		v, e := strconv.Atoi(s)
		if e != nil {
			err = fmt.Errorf("cuda: %s=%q: %v", VariantEnv, s, e)
			return
		}
		err = d.SetPagedVariant(kernels.PagedVariant(v))
	})
	return err
}
