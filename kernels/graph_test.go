package kernels

import (
	"errors"
	"fmt"
	"math"
	"testing"
)

// TestStepGraph: a captured step (an upload and two launches) replays with
// new upload data and gives the new result; a replay that uploads another
// size, downloads or allocates diverges; nothing captured runs before
// Launch.
func TestStepGraph(t *testing.T) {
	g := testGPU(t)
	rng := newRNG(t)
	const n = 4099
	rand := func() []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = rng.Float32()*2 - 1
		}
		return v
	}
	x1, x2, bv := rand(), rand(), rand()
	nan := make([]float32, n)
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	err := g.Do(func(d *Device) error {
		var bufs []*Buffer
		defer func() {
			for _, b := range bufs {
				b.Free()
			}
		}()
		alloc := func() *Buffer {
			b, err := d.Malloc(4 * n)
			if err != nil {
				t.Fatal(err)
			}
			bufs = append(bufs, b)
			return b
		}
		xb, bb, tmp, out := alloc(), alloc(), alloc(), alloc()
		if err := Upload(d, bb, bv); err != nil {
			return err
		}
		if err := Upload(d, out, nan); err != nil {
			return err
		}
		// The step: out = (x + b) + b.
		step := func(d *Device, x []float32) error {
			if err := Upload(d, xb, x); err != nil {
				return err
			}
			if err := d.AddF32(nil, tmp, xb, bb, n); err != nil {
				return err
			}
			return d.AddF32(nil, out, tmp, bb, n)
		}
		check := func(what string, x []float32) {
			got := make([]float32, n)
			if err := Download(d, got, out); err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if want := (x[i] + bv[i]) + bv[i]; got[i] != want {
					t.Fatalf("%s: out[%d] = %v, want %v", what, i, got[i], want)
				}
			}
		}
		sg, err := d.BeginCapture()
		if err != nil {
			return err
		}
		if err := step(d, x1); err != nil {
			d.AbortCapture(sg)
			return err
		}
		if err := d.EndCapture(sg); err != nil {
			return err
		}
		defer sg.Destroy(d)
		got := make([]float32, n)
		if err := Download(d, got, out); err != nil {
			return err
		}
		if got[0] == got[0] { // not NaN: the capture ran something
			t.Fatalf("out written before Launch: %v", got[0])
		}
		if sg.Uploads() != 1 || sg.Nodes() < 3 {
			t.Errorf("graph has %d uploads and %d nodes, want 1 and ≥ 3", sg.Uploads(), sg.Nodes())
		}
		if err := sg.Launch(d); err != nil {
			return err
		}
		check("captured", x1)
		rd := sg.Replay(d)
		if err := step(rd, x2); err != nil {
			return err
		}
		if err := sg.Launch(d); err != nil {
			return err
		}
		check("replayed", x2)
		// Divergence: another size, a download, an allocation, a missing upload.
		rd = sg.Replay(d)
		if err := Upload(rd, xb, x2[:n-1]); !errors.Is(err, ErrGraphDiverged) {
			t.Errorf("upload of another size: %v", err)
		}
		if err := Download(rd, got, out); !errors.Is(err, ErrGraphDiverged) {
			t.Errorf("download on a replay device: %v", err)
		}
		if _, err := rd.Malloc(16); !errors.Is(err, ErrGraphDiverged) {
			t.Errorf("malloc on a replay device: %v", err)
		}
		if err := sg.Launch(d); !errors.Is(err, ErrGraphDiverged) {
			t.Errorf("launch after a replay that refilled nothing: %v", err)
		}
		check("after a refused launch", x2)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestQueryMemo (no GPU): a workspace query is asked once and remembered;
// a replay device recalls it and reports a query never asked as divergence.
func TestQueryMemo(t *testing.T) {
	m := newMemo()
	d := &Device{memo: m}
	rep := &Device{memo: m, rep: &StepGraph{}}
	calls := 0
	f := func() ([]int64, error) { calls++; return []int64{7, 9}, nil }
	for range 2 {
		v, err := query(d, "q", [2]int{1, 2}, f)
		if err != nil || len(v) != 2 || v[1] != 9 {
			t.Fatalf("query: %v %v", v, err)
		}
	}
	if calls != 1 {
		t.Errorf("asked %d times, want 1", calls)
	}
	if v, err := query(rep, "q", [2]int{1, 2}, f); err != nil || v[0] != 7 || calls != 1 {
		t.Errorf("replay recall: %v %v (calls %d)", v, err, calls)
	}
	if _, err := query(rep, "q", [2]int{3, 4}, f); !errors.Is(err, ErrGraphDiverged) || calls != 1 {
		t.Errorf("replay miss: %v (calls %d)", err, calls)
	}
}

// TestStepGraphRefillWhileRunning: WaitUploads returns once a launch has
// read its staged uploads, so the staging can be refilled for the next
// launch while the first still runs (overlapped decode): each launch
// computes from its own upload. The step is long (a chain of adds over 64
// MB) so that the refill happens while the first launch runs.
func TestStepGraphRefillWhileRunning(t *testing.T) {
	g := testGPU(t)
	rng := newRNG(t)
	const n, big, chain = 1 << 12, 16 << 20, 40
	x1, x2, bv := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range x1 {
		x1[i], x2[i], bv[i] = rng.Float32(), rng.Float32()+2, rng.Float32()
	}
	onGPU(t, g, func(a *arena) {
		d := a.d
		xb, bb, out, snap := a.alloc(4*n), put(a, bv), a.alloc(4*n), a.alloc(4*n)
		work := a.alloc(4 * big)
		if a.err != nil {
			return
		}
		a.check(d.FillF32(nil, work, big, 1))
		step := func(d *Device, x []float32) error {
			if err := Upload(d, xb, x); err != nil {
				return err
			}
			for range chain { // GPU time after the upload
				if err := d.AddF32(nil, work, work, work, big); err != nil {
					return err
				}
			}
			return d.AddF32(nil, out, xb, bb, n)
		}
		sg, err := d.BeginCapture()
		a.check(err)
		if a.err != nil {
			return
		}
		if err := step(d, x1); err != nil {
			d.AbortCapture(sg)
			a.check(err)
			return
		}
		a.check(d.EndCapture(sg))
		defer sg.Destroy(d)
		a.check(sg.Launch(d))
		a.check(sg.WaitUploads(d))
		a.check(Refill(sg, 0, x2)) // the first launch still runs its chain
		a.check(d.CopyAsync(nil, snap, out, 4*n))
		a.check(sg.Launch(d))
		got1, got2 := get[float32](a, snap, n), get[float32](a, out, n)
		for i := range n {
			if w1, w2 := x1[i]+bv[i], x2[i]+bv[i]; got1[i] != w1 || got2[i] != w2 {
				t.Fatalf("element %d: launches gave %v and %v, want %v and %v", i, got1[i], got2[i], w1, w2)
			}
		}
		a.check(sg.Wait(d))
		if ns, runs := sg.GPUNs(); runs < 1 || ns <= 0 {
			t.Errorf("GPU time of %d launches read: %d ns", runs, ns)
		}
	})
}

// TestGatherRowsFeed: rows gathered by the host's ids or, for fed rows, by
// the token in word 0 of a pick row, against the host; out-of-range ids and
// pick rows give rows of NaN. Both table types.
func TestGatherRowsFeed(t *testing.T) {
	g := testGPU(t)
	rng := newRNG(t)
	const V, cols, n, pickRows = 1000, 96, 37, 6
	tbits, tab := randBF16(rng, V*cols, 1)
	picks := make([]int32, pickRows*SampleResultWords)
	for r := range pickRows {
		picks[r*SampleResultWords] = int32(rng.IntN(V))
		for w := 1; w < SampleResultWords; w++ {
			picks[r*SampleResultWords+w] = -7 // not a token: never read
		}
	}
	picks[3*SampleResultWords] = V + 5 // a pick outside the table
	ids := make([]int32, 2*n)
	want := make([]int32, n) // -1: NaN
	for i := range n {
		ids[i], ids[n+i] = int32(rng.IntN(V)), -1
		want[i] = ids[i]
		switch {
		case i == 5:
			ids[i], want[i] = -2, -1
		case i == 6:
			ids[n+i], want[i] = pickRows, -1 // a feed row past the picks
		case i%3 == 0:
			r := rng.IntN(pickRows)
			ids[i], ids[n+i] = 0, int32(r)
			want[i] = picks[r*SampleResultWords]
			if want[i] >= V {
				want[i] = -1
			}
		}
	}
	onGPU(t, g, func(a *arena) {
		srcs := []struct {
			name string
			buf  *Buffer
			dt   DType
		}{{"bf16", put(a, tbits), BF16}, {"f32", put(a, tab), F32}}
		ib, pb, out := put(a, ids), put(a, picks), a.alloc(4*n*cols)
		for _, s := range srcs {
			if a.err != nil {
				return
			}
			a.check(a.d.GatherRowsFeedF32(nil, out, s.buf, s.dt, ib, pb, pickRows, n, cols, V))
			got := get[float32](a, out, n*cols)
			for i := range n {
				for c := range cols {
					v := got[i*cols+c]
					if want[i] < 0 {
						if !math.IsNaN(float64(v)) {
							t.Fatalf("%s row %d: %v, want NaN", s.name, i, v)
						}
					} else if w := tab[int(want[i])*cols+c]; v != w {
						t.Fatalf("%s row %d col %d: %v, want %v (token %d)", s.name, i, c, v, w, want[i])
					}
				}
			}
		}
	})
}

// TestStamp: clock stamps around work, eager and captured into a graph,
// increase in stream order, the work between two of them (a chain of
// 16 MB adds) takes time between them, a replay writes new stamps, and
// indexes outside the buffer are refused.
func TestStamp(t *testing.T) {
	g := testGPU(t)
	const n, chain = 4 << 20, 8
	onGPU(t, g, func(a *arena) {
		d := a.d
		work, buf := a.alloc(4*n), a.alloc(8*4)
		if a.err != nil {
			return
		}
		a.check(d.FillF32(nil, work, n, 1))
		for _, idx := range []int{-1, 4} {
			if err := d.Stamp(buf, idx); err == nil {
				t.Errorf("Stamp(index %d) of a 4-stamp buffer accepted", idx)
			}
		}
		step := func() error {
			if err := d.Stamp(buf, 0); err != nil {
				return err
			}
			for range chain {
				if err := d.AddF32(nil, work, work, work, n); err != nil {
					return err
				}
			}
			if err := d.Stamp(buf, 1); err != nil {
				return err
			}
			return d.Stamp(buf, 2)
		}
		check := func(what string, prev uint64) uint64 {
			ts := get[uint64](a, buf, 3)
			if ts[0] <= prev || ts[1] <= ts[0] || ts[2] < ts[1] {
				t.Fatalf("%s: stamps %v after %d: want increasing", what, ts, prev)
			}
			// 8 adds of 16 MB read and write 256 MB: tens of µs at least.
			if ts[1]-ts[0] < 10_000 {
				t.Errorf("%s: the chain took %d ns between its stamps", what, ts[1]-ts[0])
			}
			return ts[2]
		}
		a.check(step())
		last := check("eager", 0)
		sg, err := d.BeginCapture()
		a.check(err)
		if a.err != nil {
			return
		}
		if err := step(); err != nil {
			d.AbortCapture(sg)
			a.check(err)
			return
		}
		a.check(d.EndCapture(sg))
		defer sg.Destroy(d)
		for r := range 2 {
			a.check(sg.Launch(d))
			a.check(sg.Wait(d))
			last = check(fmt.Sprintf("replay %d", r), last)
		}
	})
}
