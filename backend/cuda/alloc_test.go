package cuda

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/kernels"
)

// TestAllocClass: powers of two up to poolMax, eighths of an octave above
// it, never less than asked and never more than 12.5 % over above poolMax.
func TestAllocClass(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct{ bytes, want int64 }{
		{1, 256},
		{256, 256},
		{257, 512},
		{3 << 20, 4 << 20},
		{poolMax, poolMax},
		{poolMax + 1, 72 * mib},          // octave (64, 128] MiB in 8 MiB steps
		{128 * mib, 128 * mib},           // 8192 × 4096 float32
		{128*mib + 1, 144 * mib},         // the next octave's 16 MiB steps
		{537 * 1000 * 1000, 576 * mib},   // 512.1 MiB: (512, 1024] MiB in 64 MiB steps
		{1 << 29, 1 << 29},               // 8192 tokens × 8 × 2048 float32 rows
		{600 * mib, 640 * mib},           // (512, 1024] MiB in 64 MiB steps
		{int64(3) << 30, int64(3) << 30}, // a multiple of its step
		{int64(3)<<30 + 1, 3328 * mib},   // (2, 4] GiB in 256 MiB steps
		{1<<62 + 5, 1<<62 + 5},           // absurd: returned as is (no overflow)
	} {
		got := class(c.bytes)
		if got != c.want {
			t.Errorf("class(%d) = %d, want %d", c.bytes, got, c.want)
		}
		if got < c.bytes || (c.bytes > poolMax && float64(got) > 1.125*float64(c.bytes)) {
			t.Errorf("class(%d) = %d: below the request or over 12.5 %% above it", c.bytes, got)
		}
	}
}

// TestAllocLargePool: buffers above poolMax are reused up to the pool's
// byte cap and freed beyond it; a request of a nearby size (same eighth of
// its octave) reuses a pooled buffer.
func TestAllocLargePool(t *testing.T) {
	be := gpuBackend(t)
	const mib = 1 << 20
	a := newAllocator(300*mib, false)
	err := be.g.Do(func(d *kernels.Device) error {
		counts := func() (int64, int64) { return a.mallocs.Load(), a.frees.Load() }
		b1 := a.get(d, 130*mib) // class 144 MiB
		if m, _ := counts(); m != 1 || b1.Bytes() != 144*mib {
			return fmt.Errorf("first get: %d mallocs, %d bytes", m, b1.Bytes())
		}
		a.put(b1)
		b2 := a.get(d, 140*mib) // the same class: reused
		if m, f := counts(); m != 1 || f != 0 || b2 != b1 {
			return fmt.Errorf("second get: %d mallocs, %d frees, reused %v", m, f, b2 == b1)
		}
		b3 := a.get(d, 144*mib)
		b4 := a.get(d, 144*mib)
		a.put(b2)
		a.put(b3)
		a.put(b4) // 432 MiB > 300: b4 waits to be freed
		if err := checkLarge(a); err != nil {
			return err
		}
		if a.large != 288*mib || len(a.pending) != 1 {
			return fmt.Errorf("after three puts: %d bytes pooled, %d pending", a.large, len(a.pending))
		}
		b5 := a.get(d, 100*mib) // another class: frees the pending one, mallocs
		if m, f := counts(); m != 4 || f != 1 {
			return fmt.Errorf("fifth get: %d mallocs (want 4), %d frees (want 1)", m, f)
		}
		a.put(b5) // 288 + 104 MiB > 300: pending
		if err := checkLarge(a); err != nil {
			return err
		}
		a.freePending(true)
		if m, f := counts(); a.large != 0 || f != m || a.made.Load() != 0 {
			return fmt.Errorf("after freeing all: %d bytes pooled, %d mallocs, %d frees, %d made", a.large, m, f, a.made.Load())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRelease: a released activation's buffer is back in the pool at once,
// a later use panics naming the release, and weights are not released.
func TestRelease(t *testing.T) {
	be := gpuBackend(t)
	g := newGen(7, false)
	wa, err := be.Weight(g.f32(1, 64, 1024))
	if err != nil {
		t.Fatal(err)
	}
	wb, err := be.Weight(g.f32(1, 64, 1024))
	if err != nil {
		t.Fatal(err)
	}
	sum := be.Add(wa, wb).(*Tensor)
	buf := sum.st.f32
	want := be.ToHost(sum)
	be.Release(sum, wa)
	if !sum.st.released || sum.st.f32 != nil {
		t.Fatalf("sum not released: released %v", sum.st.released)
	}
	if wa.(*Tensor).st.released || wa.(*Tensor).st.f32 == nil {
		t.Fatalf("a weight was released")
	}
	be.alloc.mu.Lock()
	pooled := slices.Contains(be.alloc.pool[buf.Bytes()], buf)
	be.alloc.mu.Unlock()
	if !pooled {
		t.Errorf("the released buffer is not in the pool")
	}
	again := be.Add(wa, wb)
	if got := be.ToHost(again); !slices.Equal(got, want) {
		t.Errorf("recomputed sum differs")
	}
	func() {
		defer func() {
			r := recover()
			if s, _ := r.(string); !strings.Contains(s, "released") {
				t.Errorf("using a released tensor: recovered %v, want a panic naming the release", r)
			}
		}()
		be.Add(sum, wb)
	}()
}

// checkLarge reports an error unless a.large is the bytes of a's pooled
// buffers above poolMax.
func checkLarge(a *allocator) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var n int64
	for c, l := range a.pool {
		if c > poolMax {
			n += c * int64(len(l))
		}
	}
	if n != a.large {
		return fmt.Errorf("the pool holds %d bytes above poolMax, its count says %d", n, a.large)
	}
	return nil
}

// TestLargePoolSettles: an automatic cap drops to at most half the free
// memory at the first allocation above poolMax, once; an explicit one stays.
func TestLargePoolSettles(t *testing.T) {
	be := gpuBackend(t)
	const huge = int64(1) << 50
	err := be.g.Do(func(d *kernels.Device) error {
		free, err := d.FreeMem()
		if err != nil {
			return err
		}
		for _, auto := range []bool{true, false} {
			a := newAllocator(huge, auto)
			a.put(a.get(d, 1<<10)) // small: nothing settles
			if a.largeAuto != auto {
				return fmt.Errorf("auto %v: settled on a small allocation", auto)
			}
			b := a.get(d, poolMax+1)
			if auto && (a.largeAuto || a.largeMax > int64(free/2)) {
				return fmt.Errorf("auto: cap %d after a large allocation, free %d", a.largeMax, free)
			}
			if !auto && a.largeMax != huge {
				return fmt.Errorf("explicit cap changed to %d", a.largeMax)
			}
			a.put(b)
			a.freePending(true)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLargePoolMax: an eighth of the device's memory, at most 16 GiB,
// unless MKSERVE_LARGE_POOL_MB says otherwise; a bad value panics naming
// the variable.
func TestLargePoolMax(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		total    uint64
		env      string
		want     int64
		wantAuto bool
	}{
		{150 * gib, "", 16 * gib, true}, // an H200: capped
		{80 * gib, "", 10 * gib, true},
		{24 * gib, "", 3 * gib, true},
		{80 * gib, "0", 0, false},
		{80 * gib, "512", 512 << 20, false},
	} {
		t.Setenv(LargePoolEnv, c.env)
		if got, auto := largePoolMax(c.total); got != c.want || auto != c.wantAuto {
			t.Errorf("total %d GiB, %s=%q: %d bytes (auto %v), want %d (auto %v)", c.total/gib, LargePoolEnv, c.env,
				got, auto, c.want, c.wantAuto)
		}
	}
	t.Setenv(LargePoolEnv, "-1")
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), LargePoolEnv) {
			t.Errorf("a negative size: recovered %v, want a panic naming %s", r, LargePoolEnv)
		}
	}()
	largePoolMax(80 * gib)
}

// TestI32Caches: arrays already held are not uploaded again (a step's
// layers sending the same few), a fifth distinct array replaces the oldest
// entry, and the returned buffers hold the arrays.
func TestI32Caches(t *testing.T) {
	be := gpuBackend(t)
	var cs i32Caches
	uploads := func() (n int) {
		for i := range cs.c {
			n += cs.c[i].uploads
		}
		return n
	}
	arrays := [][]int32{{1, 2, 3}, {4, 5}, {6}, {7, 8, 9, 10}, {11, 12}}
	err := be.g.Do(func(d *kernels.Device) error {
		check := func(v []int32, wantUploads int) error {
			b := cs.get(be, d, v)
			got := make([]int32, len(v))
			if err := kernels.Download(d, got, b); err != nil {
				return err
			}
			if !slices.Equal(got, v) || uploads() != wantUploads {
				return fmt.Errorf("get %v: buffer holds %v after %d uploads, want %d", v, got, uploads(), wantUploads)
			}
			return nil
		}
		steps := []struct {
			v []int32
			n int
		}{
			{arrays[0], 1}, {arrays[1], 2}, {arrays[0], 2}, {arrays[1], 2}, // a step's layers: two spans, two uploads
			{arrays[2], 3}, {arrays[3], 4}, {arrays[4], 5}, // the fifth replaces arrays[0]'s entry
			{arrays[1], 5}, {arrays[0], 6},
		}
		for _, s := range steps {
			if err := check(s.v, s.n); err != nil {
				return err
			}
		}
		cs.reset(be)
		for i := range cs.c {
			if cs.c[i].buf != nil {
				return fmt.Errorf("entry %d kept a buffer after reset", i)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
