package kernels

import (
	"errors"
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
