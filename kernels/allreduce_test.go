package kernels

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"
)

// arRanks sets up R all-reduce ranks in this process: zeroed workspaces of
// cap floats and one stream each.
func arRanks(a *arena, R int, cap int64, ctas int, timeout time.Duration) ([]*AllReduceArgs, []*Stream) {
	bytes, err := a.d.AllReduceWorkspace(cap)
	a.check(err)
	if a.err != nil {
		return nil, nil
	}
	ws := make([]*Buffer, R)
	for q := range ws {
		ws[q] = put(a, make([]int32, bytes/4))
	}
	args := make([]*AllReduceArgs, R)
	streams := make([]*Stream, R)
	for q := range R {
		args[q] = &AllReduceArgs{Me: q, WS: ws, Cap: cap, CTAs: ctas, Timeout: timeout}
		s, err := a.d.NewStream()
		a.check(err)
		streams[q] = s
	}
	return args, streams
}

// TestAllReduceStreams: R ranks on R streams of one GPU (each launch at most
// SMs/R CTAs, so all are resident) sum fresh random vectors over several
// calls of varying length, in place or not; every rank's result must equal,
// bit for bit, the float32 sum in rank order computed here.
func TestAllReduceStreams(t *testing.T) {
	g := testGPU(t)
	sms := g.Info().SMs
	cases := []struct {
		name string
		R    int
		ns   []int64 // one call each
		ctas int     // per launch (0: SMs/R)
	}{
		{"R2", 2, []int64{4096, 1, 0, 7 * 1024 * 33, 5}, 0},
		{"R3_small_grid", 3, []int64{1000, 12345, 64}, 2},
		{"R4", 4, []int64{2048 * 128, 3, 77777}, 0},
		{"R8_one_cta", 8, []int64{513, 9000}, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctas := c.ctas
			if ctas == 0 {
				ctas = sms / c.R
			}
			if ctas*c.R > sms {
				t.Skipf("%d ranks of %d CTAs need %d SMs, the GPU has %d", c.R, ctas, ctas*c.R, sms)
			}
			r := newRNG(t)
			var cap int64
			for _, n := range c.ns {
				cap = max(cap, n)
			}
			onGPU(t, g, func(a *arena) {
				args, streams := arRanks(a, c.R, cap, ctas, 5*time.Second)
				for _, s := range streams {
					if s != nil {
						defer s.Destroy()
					}
				}
				for call, n := range c.ns {
					if a.err != nil {
						return
					}
					inPlace := call%2 == 1
					src := make([][]float32, c.R)
					sb, db := make([]*Buffer, c.R), make([]*Buffer, c.R)
					for q := range c.R {
						src[q] = make([]float32, n)
						for i := range src[q] {
							src[q][i] = float32(r.NormFloat64() * math.Exp2(float64(r.IntN(8)-4)))
						}
						sb[q] = put(a, append(src[q], 1)) // one spare element: n may be 0
						db[q] = sb[q]
						if !inPlace {
							db[q] = put(a, f32Fill(int(n)+1, float32(math.NaN())))
						}
					}
					for q := range c.R {
						a.check(a.d.AllReduceSumF32(streams[q], args[q], sb[q], db[q], n))
					}
					for q := range c.R {
						a.check(streams[q].Sync(a.d))
						if a.err == nil {
							if err := a.d.AllReduceCheck(args[q].WS[q]); err != nil {
								t.Fatalf("call %d rank %d: %v", call, q, err)
							}
						}
					}
					want := make([]float32, n)
					for i := range want {
						s := src[0][i]
						for q := 1; q < c.R; q++ {
							s += src[q][i]
						}
						want[i] = s
					}
					for q := range c.R {
						if a.err != nil {
							return
						}
						got := get[float32](a, db[q], int(n))
						for i := range got {
							if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
								t.Fatalf("call %d (n %d, in place %v) rank %d: element %d is %v, want %v", call, n,
									inPlace, q, i, got[i], want[i])
							}
						}
					}
				}
			})
		})
	}
}

// TestAllReduceWatchdog: rank 0 of two calls alone; its launch must end
// with a timeout naming rank 0, peer 1 and the data it waited for.
func TestAllReduceWatchdog(t *testing.T) {
	g := testGPU(t)
	onGPU(t, g, func(a *arena) {
		args, streams := arRanks(a, 2, 1024, 1, 100*time.Millisecond)
		for _, s := range streams {
			if s != nil {
				defer s.Destroy()
			}
		}
		buf := put(a, f32Fill(1024, 1))
		start := time.Now()
		a.check(a.d.AllReduceSumF32(streams[0], args[0], buf, buf, 1024))
		a.check(streams[0].Sync(a.d))
		if a.err != nil {
			return
		}
		err := a.d.AllReduceCheck(args[0].WS[0])
		t.Logf("after %v: %v", time.Since(start), err)
		var te *AllReduceTimeoutError
		if !errors.As(err, &te) {
			t.Fatalf("got %v, want an *AllReduceTimeoutError", err)
		}
		if te.Rank != 0 || te.Peer != 1 || te.WaitedFor != "its data" || te.Want != 1 {
			t.Errorf("report %+v: want rank 0 waiting for rank 1's data of epoch 1", *te)
		}
	})
}

// TestAllReduceRecord (CPU): the error record decodes to the report naming
// the rank, the peer and what it waited for.
func TestAllReduceRecord(t *testing.T) {
	if err := allReduceRecord(make([]int32, allReduceErrWords)); err != nil {
		t.Fatalf("an unset record: %v", err)
	}
	for _, c := range []struct {
		rec  []int32
		want string
	}{
		{[]int32{1, 2, 1, 0, 4, 5}, "rank 2 timed out waiting for rank 0 (its data; epoch 4, want 5)"},
		{[]int32{1, 0, 0, 3, 9, 10}, "rank 0 timed out waiting for rank 3 (it to finish reading the previous call; epoch 9, want 10)"},
	} {
		err := allReduceRecord(c.rec)
		if err == nil || err.Error() != fmt.Sprintf("kernels: all-reduce watchdog: %s", c.want) {
			t.Errorf("record %v: %v, want %q", c.rec, err, c.want)
		}
	}
}
