package moe

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkEP runs EP and Experts.Forward on the same input and compares them,
// then checks the load counters against the routing.
func checkEP(t *testing.T, tb *Table, ex *Experts, x []float32, T, K int, ids []int32, w []float32) {
	t.Helper()
	p, err := NewEP(tb, ex)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]float32, T*ex.H)
	ex.Forward(want, x, T, K, ids, w)
	r := rand.New(rand.NewPCG(uint64(T), uint64(K)))
	got := randn(r, T*ex.H, 3) // garbage: Forward overwrites
	if err := p.Forward(got, x, T, K, ids, w); err != nil {
		t.Fatal(err)
	}
	if e := relL2(got, want); e > 1e-5 {
		t.Fatalf("relative L2 error vs Experts.Forward %.3g > 1e-5", e)
	}
	// Load: tokens per expert, and rows per rank as the table picks them.
	wantLoad := make([]uint64, ex.E)
	wantRank := make([]uint64, tb.Ranks())
	for i, e := range ids[:T*K] {
		wantLoad[e]++
		wantRank[tb.Pick(i/K, int(e))]++
	}
	if fmt.Sprint(p.Load()) != fmt.Sprint(wantLoad) {
		t.Fatalf("Load() = %v, want %v", p.Load(), wantLoad)
	}
	if fmt.Sprint(p.RankLoad()) != fmt.Sprint(wantRank) {
		t.Fatalf("RankLoad() = %v, want %v", p.RankLoad(), wantRank)
	}
	// A second call on the same world accumulates and still agrees.
	if err := p.Forward(got, x, T, K, ids, w); err != nil {
		t.Fatal(err)
	}
	if e := relL2(got, want); e > 1e-5 {
		t.Fatalf("second call: relative L2 error %.3g", e)
	}
	if l := p.Load(); T*K > 0 && l[ids[0]] != 2*wantLoad[ids[0]] {
		t.Fatalf("Load not cumulative: %d, want %d", l[ids[0]], 2*wantLoad[ids[0]])
	}
}

func TestEPMatchesExperts(t *testing.T) {
	const H, I = 12, 6
	for _, R := range []int{1, 2, 3, 4, 8} {
		for _, E := range []int{8, 64} {
			for _, K := range []int{1, 2, 4, 8} {
				for _, replicas := range []bool{false, true} {
					name := fmt.Sprintf("R%d_E%d_K%d_replicas=%v", R, E, K, replicas)
					t.Run(name, func(t *testing.T) {
						r := newRand(t)
						T := 2*R + 3 // never divisible by R > 1... except R=1
						ex := randExperts(r, E, H, I, Activation{Kind: SwiGLU}, r.IntN(2) == 0)
						tb := NewTable(E, R)
						if replicas && R > 1 {
							for range E / 2 {
								_ = tb.AddReplica(r.IntN(E), r.IntN(R)) // duplicates refused, fine
							}
						}
						x := randn(r, T*H, 1)
						ids, w := randRouting(r, T, K, E)
						checkEP(t, tb, ex, x, T, K, ids, w)
					})
				}
			}
		}
	}
}

func TestEPEdgeCases(t *testing.T) {
	const H, I = 10, 4
	act := Activation{Kind: ClampedSwiGLU, Alpha: 1.702, Limit: 1}
	cases := []struct {
		name    string
		R, E, K int
		T       int
		route   func(r *rand.Rand, T, K, E int) ([]int32, []float32)
		replica [][2]int // (expert, rank)
	}{
		{"all tokens to one expert", 4, 8, 1, 23, func(r *rand.Rand, T, K, E int) ([]int32, []float32) {
			ids := make([]int32, T*K)
			for i := range ids {
				ids[i] = 5
			}
			return ids, randn(r, T*K, 1)
		}, nil},
		{"all tokens to one replicated expert", 4, 8, 1, 23, func(r *rand.Rand, T, K, E int) ([]int32, []float32) {
			ids := make([]int32, T*K)
			for i := range ids {
				ids[i] = 5
			}
			return ids, randn(r, T*K, 1)
		}, [][2]int{{5, 0}, {5, 3}}},
		{"most experts idle", 8, 64, 2, 3, randRouting, nil},
		{"fewer tokens than ranks", 8, 8, 2, 2, randRouting, nil},
		{"one token", 3, 8, 8, 1, randRouting, [][2]int{{0, 2}}},
		{"more ranks than experts", 8, 4, 2, 11, randRouting, nil},
		{"every rank holds every expert", 3, 8, 4, 17, randRouting, [][2]int{
			{0, 1}, {0, 2}, {1, 1}, {1, 2}, {2, 1}, {2, 2},
			{3, 0}, {3, 2}, {4, 0}, {4, 2}, {5, 0}, {5, 2},
			{6, 0}, {6, 1}, {7, 0}, {7, 1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRand(t)
			ex := randExperts(r, tc.E, H, I, act, true)
			tb := NewTable(tc.E, tc.R)
			for _, rp := range tc.replica {
				if err := tb.AddReplica(rp[0], rp[1]); err != nil {
					t.Fatal(err)
				}
			}
			x := randn(r, tc.T*H, 1)
			ids, w := tc.route(r, tc.T, tc.K, tc.E)
			checkEP(t, tb, ex, x, tc.T, tc.K, ids, w)
		})
	}
}

func TestEPZeroTokens(t *testing.T) {
	r := newRand(t)
	ex := randExperts(r, 8, 4, 2, Activation{Kind: SwiGLU}, false)
	p, err := NewEP(NewTable(8, 4), ex)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Forward(nil, nil, 0, 2, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// Each rank's expert set holds views of exactly its table row.
func TestEPRanksHoldOnlyTheirExperts(t *testing.T) {
	r := newRand(t)
	ex := randExperts(r, 8, 4, 2, Activation{Kind: SwiGLU}, true)
	tb := NewTable(8, 3)
	if err := tb.AddReplica(7, 0); err != nil {
		t.Fatal(err)
	}
	p, err := NewEP(tb, ex)
	if err != nil {
		t.Fatal(err)
	}
	for rank := range 3 {
		local := tb.Local(rank)
		rk := p.ranks[rank]
		if len(rk.set.gateUp) != len(local) {
			t.Fatalf("rank %d holds %d experts, want %d", rank, len(rk.set.gateUp), len(local))
		}
		for li, e := range local {
			if &rk.set.gateUp[li].F32[0] != &ex.GateUp[e*2*ex.I*ex.H] || &rk.set.down[li].F32[0] != &ex.Down[e*ex.H*ex.I] {
				t.Fatalf("rank %d local %d is not a view of expert %d", rank, li, e)
			}
			if cap(rk.set.gateUp[li].F32) != 2*ex.I*ex.H {
				t.Fatalf("rank %d: view of expert %d can reach past it (cap %d)", rank, e, cap(rk.set.gateUp[li].F32))
			}
		}
	}
	// Changing the table after NewEP has no effect.
	if err := tb.AddReplica(0, 2); err != nil {
		t.Fatal(err)
	}
	if len(p.ranks[2].set.gateUp) != len(NewTable(8, 3).Local(2)) {
		t.Fatal("NewEP did not snapshot the table")
	}
}

func TestEPErrors(t *testing.T) {
	r := newRand(t)
	ex := randExperts(r, 8, 4, 2, Activation{Kind: SwiGLU}, false)
	if _, err := NewEP(NewTable(6, 2), ex); err == nil || !strings.Contains(err.Error(), "6 experts") {
		t.Fatalf("NewEP with a table of the wrong size: %v", err)
	}
	if _, err := NewEP(NewTable(8, 0), ex); err == nil {
		t.Fatal("NewEP with no ranks: no error")
	}
	if _, err := NewEP(NewTable(8, 2), &Experts{E: 8, H: 4, I: 2}); err == nil || !strings.Contains(err.Error(), "GateUp") {
		t.Fatalf("NewEP with empty experts: %v", err)
	}
	p, err := NewEP(NewTable(8, 2), ex)
	if err != nil {
		t.Fatal(err)
	}
	x := randn(r, 3*4, 1)
	out := make([]float32, 3*4)
	w := []float32{1, 1, 1}
	if err := p.Forward(out, x, 3, 1, []int32{0, 8, 1}, w); err == nil || !strings.Contains(err.Error(), "ids[1]") {
		t.Fatalf("id out of range: %v", err)
	}
	if err := p.Forward(out, x[:5], 3, 1, []int32{0, 1, 2}, w); err == nil || !strings.Contains(err.Error(), "x has 5") {
		t.Fatalf("short x: %v", err)
	}
	// A cancelled context is an error, and the EP recovers on the next call.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.ForwardContext(ctx, out, x, 3, 1, []int32{0, 5, 1}, w); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	ids := []int32{0, 5, 1}
	if err := p.Forward(out, x, 3, 1, ids, w); err != nil {
		t.Fatalf("call after a failed one: %v", err)
	}
	want := make([]float32, 3*4)
	ex.Forward(want, x, 3, 1, ids, w)
	if e := relL2(out, want); e > 1e-5 {
		t.Fatalf("after recovery: relative L2 error %.3g", e)
	}
}

// Forward calls from several goroutines are serialised, not mixed up.
func TestEPConcurrentCalls(t *testing.T) {
	r := newRand(t)
	const T, K, E, H, I = 9, 2, 8, 8, 4
	ex := randExperts(r, E, H, I, Activation{Kind: SwiGLU}, false)
	p, err := NewEP(NewTable(E, 3), ex)
	if err != nil {
		t.Fatal(err)
	}
	p.Timeout = 20 * time.Second
	type job struct {
		x, want []float32
		ids     []int32
		w       []float32
	}
	jobs := make([]job, 4)
	for i := range jobs {
		j := &jobs[i]
		j.x = randn(r, T*H, 1)
		j.ids, j.w = randRouting(r, T, K, E)
		j.want = make([]float32, T*H)
		ex.Forward(j.want, j.x, T, K, j.ids, j.w)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(jobs))
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := jobs[i]
			out := make([]float32, T*H)
			for range 3 {
				if err := p.Forward(out, j.x, T, K, j.ids, j.w); err != nil {
					errs[i] = err
					return
				}
				if e := relL2(out, j.want); e > 1e-5 {
					errs[i] = fmt.Errorf("relative L2 error %.3g", e)
					return
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("job %d: %v", i, err)
		}
	}
}

func BenchmarkEPForward(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	ex := qwen3Like(r)
	const K, R = 8, 4
	p, err := NewEP(NewTable(ex.E, R), ex)
	if err != nil {
		b.Fatal(err)
	}
	for _, T := range []int{4, 64} {
		b.Run(fmt.Sprintf("R4_E64_H512_I192_K8_T%d", T), func(b *testing.B) {
			x := randn(r, T*ex.H, 1)
			ids, w := randRouting(r, T, K, ex.E)
			out := make([]float32, T*ex.H)
			for b.Loop() {
				if err := p.Forward(out, x, T, K, ids, w); err != nil {
					b.Fatal(err)
				}
			}
			flops := float64(T*K) * 2 * 3 * float64(ex.H*ex.I)
			b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
