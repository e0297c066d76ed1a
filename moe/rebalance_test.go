package moe

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// zipfLoad returns E Zipf-like expert loads: the expert of popularity rank k
// gets about base/(k+1)^s tokens times a random factor in [0.75, 1.25), with
// expert ids randomly permuted (hot experts are scattered, as in real models)
// unless sorted, when expert 0 is the hottest. Never all equal for s > 0.
func zipfLoad(r *rand.Rand, E int, s float64, sorted bool) []int64 {
	load := make([]int64, E)
	perm := r.Perm(E)
	for k := range E {
		v := int64(1e6 / math.Pow(float64(k+1), s) * (0.75 + 0.5*r.Float64()))
		if sorted {
			load[k] = v
		} else {
			load[perm[k]] = v
		}
	}
	return load
}

// contiguous is the NewTable layout as a Placement (no replicas).
func contiguous(E, R int) *Placement {
	t := NewTable(E, R)
	p := &Placement{Experts: E, SlotsPerRank: (E + R - 1) / R, Slots: make([][]int, R)}
	for r := range R {
		p.Slots[r] = t.Local(r)
	}
	return p
}

// refMaxPerReplica is the least possible max_e load[e]/c[e] over replica
// counts 1 ≤ c[e] ≤ R with Σc = N (found independently of Rebalance: the
// optimum is one of the values load[e]/k, and a threshold T is reachable iff
// Σ max(1, ⌈load[e]/T⌉) ≤ N with every term ≤ R).
func refMaxPerReplica(load []int64, R, N int) float64 {
	var cand []float64
	for _, l := range load {
		for k := 1; k <= R; k++ {
			cand = append(cand, float64(l)/float64(k))
		}
	}
	slices.Sort(cand)
	for _, T := range cand {
		need, ok := 0, true
		for _, l := range load {
			c := 1
			if T > 0 {
				c = max(1, int(math.Ceil(float64(l)/T-1e-9)))
			} else if l > 0 {
				ok = false
			}
			if c > R {
				ok = false
			}
			need += c
		}
		if ok && need <= N {
			return T
		}
	}
	return math.NaN()
}

// checkPlacement checks p against the rules every Rebalance result keeps.
func checkPlacement(t *testing.T, load []int64, p *Placement, R, S int) {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.Ranks() != R || p.Experts != len(load) || p.SlotsPerRank != S {
		t.Fatalf("placement sizes E%d R%d S%d, want E%d R%d S%d", p.Experts, p.Ranks(), p.SlotsPerRank, len(load), R, S)
	}
	for r, s := range p.Slots {
		if len(s) != S {
			t.Fatalf("rank %d uses %d slots, want all %d", r, len(s), S)
		}
	}
	reps := p.Replicas()
	maxPer := 0.0
	for e, c := range reps {
		if c > R {
			t.Fatalf("expert %d has %d replicas on %d ranks", e, c, R)
		}
		maxPer = max(maxPer, float64(load[e])/float64(c))
	}
	if ref := refMaxPerReplica(load, R, R*S); math.Abs(maxPer-ref) > 1e-9*max(ref, 1) {
		t.Fatalf("max load per replica %g, reference optimum %g (replicas %v)", maxPer, ref, reps)
	}
	hot := 0
	for e := range load {
		if load[e] > load[hot] {
			hot = e
		}
	}
	for e, c := range reps {
		if load[e] < load[hot] && c > reps[hot] {
			t.Fatalf("hottest expert %d (load %d) has %d replicas, expert %d (load %d) has %d", hot, load[hot], reps[hot], e, load[e], c)
		}
	}
}

func TestRebalanceValid(t *testing.T) {
	cases := []struct{ E, R, S int }{
		{8, 2, 4},    // S·R = E: no replicas
		{8, 4, 2},    // no replicas
		{8, 2, 5},    // replicas
		{8, 3, 3},    // E not divisible by R
		{7, 3, 3},    // E not divisible by R
		{8, 1, 8},    // one rank
		{5, 5, 1},    // one slot per rank
		{1, 3, 1},    // one expert everywhere
		{6, 4, 2},    // replicas, E not divisible by R
		{10, 3, 4},   // E not divisible by R, replicas
		{16, 4, 6},   // replicas
		{64, 8, 12},  // replicas
		{60, 7, 9},   // E not divisible by R, replicas
		{256, 8, 36}, // DeepSeek-V3-like
		{256, 64, 8}, // DeepSeek-V3-like, wide
	}
	for _, tc := range cases {
		for _, skew := range []float64{0.6, 1.2} {
			t.Run(fmt.Sprintf("E%d_R%d_S%d_s%.1f", tc.E, tc.R, tc.S, skew), func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(tc.E*1000+tc.R*10+tc.S), uint64(skew*10)))
				load := zipfLoad(r, tc.E, skew, false)
				p, err := Rebalance(load, tc.R, tc.S)
				if err != nil {
					t.Fatal(err)
				}
				checkPlacement(t, load, p, tc.R, tc.S)
				if tc.R*tc.S == tc.E && slices.ContainsFunc(p.Replicas(), func(c int) bool { return c != 1 }) {
					t.Fatalf("S·R = E but replicas %v", p.Replicas())
				}
			})
		}
	}
}

// TestRebalanceRandomSmall sweeps many small shapes and loads with zeros and
// ties, where the greedy packing sometimes needs its swap repair.
func TestRebalanceRandomSmall(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	swapped := 0
	for range 20000 {
		E, R := 1+r.IntN(9), 1+r.IntN(6)
		S := 1 + r.IntN(E)
		if R*S < E {
			continue
		}
		load := make([]int64, E)
		for e := range load {
			if r.IntN(3) > 0 {
				load[e] = int64(r.IntN(30))
			}
		}
		p, err := Rebalance(load, R, S)
		if err != nil {
			t.Fatalf("E%d R%d S%d load %v: %v", E, R, S, load, err)
		}
		checkPlacement(t, load, p, R, S)
		if slices.ContainsFunc(load, func(l int64) bool { return l > 0 }) {
			if _, n := packReplicas(load, replicaCounts(load, R, R*S), R, S); n > 0 {
				swapped++
			}
		}
	}
	t.Logf("%d of the placements needed a swap repair", swapped)
	if swapped == 0 {
		t.Fatal("the sweep never exercised the swap repair")
	}
}

func TestRebalanceSwapRepair(t *testing.T) {
	// Greedy packing fills ranks 0, 1, 2 and leaves the last slots for
	// expert 0's replicas on ranks that already hold it.
	load := []int64{0, 19, 0, 0}
	reps := replicaCounts(load, 4, 12)
	if fmt.Sprint(reps) != "[3 4 3 2]" {
		t.Fatalf("replicas %v, want [3 4 3 2]", reps)
	}
	p, swaps := packReplicas(load, reps, 4, 3)
	if swaps == 0 {
		t.Fatal("want a swap repair for this input")
	}
	checkPlacement(t, load, p, 4, 3)
}

func TestRebalanceBeatsContiguous(t *testing.T) {
	cases := []struct {
		E, R, S int
		skew    float64
		sorted  bool
	}{
		{8, 4, 2, 1.0, false},   // Mixtral-like, no replicas
		{8, 4, 3, 1.0, false},   // Mixtral-like, one replica per rank
		{64, 8, 8, 1.0, false},  // no replicas
		{64, 8, 10, 1.0, false}, // 16 replicas
		{128, 16, 12, 0.8, false},
		{256, 8, 32, 1.0, false}, // no replicas
		{256, 8, 36, 1.0, false},
		{256, 64, 8, 1.0, false},
		{256, 8, 36, 1.0, true}, // hot experts contiguous: worst case for NewTable
		{256, 64, 8, 1.0, true},
		{256, 8, 36, 0.3, false}, // mild skew
	}
	for _, tc := range cases {
		name := fmt.Sprintf("E%d_R%d_S%d_s%.1f_sorted%v", tc.E, tc.R, tc.S, tc.skew, tc.sorted)
		t.Run(name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(42, uint64(tc.E*tc.R*tc.S)))
			load := zipfLoad(r, tc.E, tc.skew, tc.sorted)
			p, err := Rebalance(load, tc.R, tc.S)
			if err != nil {
				t.Fatal(err)
			}
			got, base := Imbalance(load, p), Imbalance(load, contiguous(tc.E, tc.R))
			t.Logf("imbalance: contiguous %.3f, rebalanced %.3f", base, got)
			if math.IsNaN(got) || math.IsNaN(base) || got < 1-1e-12 {
				t.Fatalf("bad imbalance %g / %g", got, base)
			}
			if got >= base {
				t.Fatalf("rebalanced imbalance %.4f, contiguous %.4f: want strictly lower", got, base)
			}
		})
	}
}

func TestRebalanceDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	load := zipfLoad(r, 64, 1.0, false)
	load[5], load[9] = load[3], load[3] // ties
	a, err := Rebalance(load, 8, 10)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b, err := Rebalance(slices.Clone(load), 8, 10)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("two runs differ:\n%v\n%v", a.Slots, b.Slots)
		}
	}
}

func TestRebalanceZeroLoad(t *testing.T) {
	for _, tc := range []struct{ E, R, S int }{{8, 2, 4}, {8, 3, 3}, {8, 3, 5}, {10, 4, 3}, {3, 5, 1}, {256, 64, 8}, {1, 1, 1}} {
		t.Run(fmt.Sprintf("E%d_R%d_S%d", tc.E, tc.R, tc.S), func(t *testing.T) {
			load := make([]int64, tc.E)
			p, err := Rebalance(load, tc.R, tc.S)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Validate(); err != nil {
				t.Fatal(err)
			}
			home := NewTable(tc.E, tc.R)
			tb := p.Table()
			for r := range tc.R {
				if len(p.Slots[r]) != tc.S {
					t.Fatalf("rank %d uses %d slots, want %d", r, len(p.Slots[r]), tc.S)
				}
				blk := home.Local(r)
				if !slices.Equal(p.Slots[r][:len(blk)], blk) {
					t.Fatalf("rank %d slots %v do not start with its NewTable block %v", r, p.Slots[r], blk)
				}
			}
			for e := range tc.E {
				if got, want := tb.Owners(e)[0], home.Owners(e)[0]; got != want {
					t.Fatalf("expert %d first owner %d, NewTable home %d", e, got, want)
				}
			}
			if im := Imbalance(load, p); im != 1 {
				t.Fatalf("Imbalance of zero load = %g, want 1", im)
			}
		})
	}
}

func TestRebalanceErrors(t *testing.T) {
	cases := []struct {
		load []int64
		R, S int
		want string
	}{
		{[]int64{1, 2, 3, 4}, 1, 3, "3 slots for 4 experts"},
		{[]int64{1, 2, 3, 4, 5}, 2, 2, "4 slots for 5 experts"},
		{[]int64{1, 2, 3, 4}, 0, 4, "0 ranks"},
		{[]int64{1, 2, 3, 4}, -2, 4, "-2 ranks"},
		{[]int64{1, 2, 3, 4}, 2, 0, "0 slots per rank"},
		{[]int64{1, 2, 3, 4}, 2, 5, "5 slots per rank but only 4 experts"},
		{nil, 2, 2, "0 experts"},
		{[]int64{1, 2, -3, 4}, 2, 2, "expert 2 has load -3"},
		{[]int64{1, 2}, math.MaxInt, 2, "too many slots"},
	}
	for _, tc := range cases {
		p, err := Rebalance(tc.load, tc.R, tc.S)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Rebalance(%v, %d, %d) = %v, %v; want error naming %q", tc.load, tc.R, tc.S, p, err, tc.want)
		}
	}
}

func TestPlacementValidate(t *testing.T) {
	cases := []struct {
		p    *Placement
		want string
	}{
		{nil, "nil"},
		{&Placement{Experts: 0, SlotsPerRank: 1, Slots: [][]int{{0}}}, "0 experts"},
		{&Placement{Experts: 2, SlotsPerRank: 2, Slots: nil}, "on 0 ranks"},
		{&Placement{Experts: 2, SlotsPerRank: 0, Slots: [][]int{{0, 1}}}, "of 0 slots"},
		{&Placement{Experts: 3, SlotsPerRank: 2, Slots: [][]int{{0, 1, 2}, {1}}}, "rank 0 holds 3 slots, want at most 2"},
		{&Placement{Experts: 3, SlotsPerRank: 2, Slots: [][]int{{0, 1}, {2, 3}}}, "rank 1 slot 1 holds expert 3"},
		{&Placement{Experts: 3, SlotsPerRank: 2, Slots: [][]int{{0, -1}, {2, 1}}}, "expert -1"},
		{&Placement{Experts: 3, SlotsPerRank: 2, Slots: [][]int{{0, 1}, {2, 2}}}, "rank 1 holds expert 2 twice"},
		{&Placement{Experts: 4, SlotsPerRank: 2, Slots: [][]int{{0, 1}, {1, 3}}}, "expert 2 is in no slot"},
	}
	for _, tc := range cases {
		err := tc.p.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want error naming %q", tc.p, err, tc.want)
		}
	}
	ok := &Placement{Experts: 3, SlotsPerRank: 2, Slots: [][]int{{0, 1}, {2}, {1, 0}}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	var nilP *Placement
	if tb := nilP.Table(); tb.Validate() == nil {
		t.Fatal("Table of a nil placement validates")
	}
	if tb := (&Placement{Experts: 4, SlotsPerRank: 2, Slots: [][]int{{0, 1}, {1, 3}}}).Table(); tb.Validate() == nil {
		t.Fatal("Table of a placement missing expert 2 validates")
	}
	if im := Imbalance([]int64{1, 2, 3, 4}, &Placement{Experts: 4, SlotsPerRank: 2, Slots: [][]int{{0, 1}, {1, 3}}}); !math.IsNaN(im) {
		t.Fatalf("Imbalance of an invalid placement = %g, want NaN", im)
	}
	if im := Imbalance([]int64{1, 2}, ok); !math.IsNaN(im) {
		t.Fatalf("Imbalance with 2 loads for 3 experts = %g, want NaN", im)
	}
	if im := Imbalance([]int64{1, -2, 3}, ok); !math.IsNaN(im) {
		t.Fatalf("Imbalance with a negative load = %g, want NaN", im)
	}
}

// TestPlacementTable routes tokens through Table().Pick and checks that every
// expert goes only to ranks holding it, that all its replicas get used, and
// that the rank loads this gives match Imbalance.
func TestPlacementTable(t *testing.T) {
	for _, tc := range []struct{ E, R, S int }{{8, 3, 4}, {16, 4, 6}, {64, 8, 10}, {12, 1, 12}} {
		t.Run(fmt.Sprintf("E%d_R%d_S%d", tc.E, tc.R, tc.S), func(t *testing.T) {
			r := rand.New(rand.NewPCG(99, uint64(tc.E)))
			load := zipfLoad(r, tc.E, 1.0, false)
			for e := range load {
				load[e] /= 100 // keep the token walk short
			}
			p, err := Rebalance(load, tc.R, tc.S)
			if err != nil {
				t.Fatal(err)
			}
			tb := p.Table()
			if err := tb.Validate(); err != nil {
				t.Fatal(err)
			}
			if tb.NumExperts() != tc.E || tb.Ranks() != tc.R {
				t.Fatalf("table E%d R%d, want E%d R%d", tb.NumExperts(), tb.Ranks(), tc.E, tc.R)
			}
			reps := p.Replicas()
			rankTok := make([]float64, tc.R)
			for e := range tc.E {
				var holders []int
				for rk, s := range p.Slots {
					if slices.Contains(s, e) {
						holders = append(holders, rk)
					}
				}
				own := tb.Owners(e)
				if got := slices.Sorted(slices.Values(own)); !slices.Equal(got, holders) {
					t.Fatalf("expert %d owners %v, ranks holding it %v", e, own, holders)
				}
				if len(own) != reps[e] {
					t.Fatalf("expert %d: %d owners, %d replicas", e, len(own), reps[e])
				}
				used := map[int]bool{}
				for tok := range int(load[e]) {
					rk := tb.Pick(tok, e)
					if !slices.Contains(holders, rk) {
						t.Fatalf("Pick(%d, %d) = rank %d, which does not hold it (holders %v)", tok, e, rk, holders)
					}
					used[rk] = true
					rankTok[rk]++
				}
				if load[e] >= int64(len(holders)) && len(used) != len(holders) {
					t.Fatalf("expert %d: tokens went to %d of its %d holders", e, len(used), len(holders))
				}
			}
			var hi, sum float64
			for _, x := range rankTok {
				hi, sum = max(hi, x), sum+x
			}
			routed := hi / (sum / float64(tc.R))
			// Round-robin splits differ from an even split by < 1 token per slot.
			if im := Imbalance(load, p); math.Abs(routed-im) > float64(tc.S)*float64(tc.R)/sum*im+1e-9 {
				t.Fatalf("Imbalance %g, routed tokens give %g", im, routed)
			}
		})
	}
}

func TestRebalancer(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 8))
	const E, R, S = 16, 4, 5
	step := func() []int64 { return zipfLoad(r, E, 1.0, false) }

	// Off by default: the zero value and Every = 0 never propose.
	var zero Rebalancer
	off, err := NewRebalancer(E, R, S, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		for _, b := range []*Rebalancer{&zero, off} {
			if err := b.Observe(step()); err != nil {
				t.Fatal(err)
			}
			if p, ok := b.Maybe(); ok || p != nil {
				t.Fatal("a rebalancer that is off proposed a placement")
			}
		}
	}

	b, err := NewRebalancer(E, R, S, 3)
	if err != nil {
		t.Fatal(err)
	}
	for window := range 3 {
		sum := make([]int64, E)
		for i := range 3 {
			c := step()
			for e := range c {
				sum[e] += c[e]
			}
			if err := b.Observe(c); err != nil {
				t.Fatal(err)
			}
			p, ok := b.Maybe()
			if i < 2 {
				if ok || p != nil {
					t.Fatalf("window %d: placement after %d observations", window, i+1)
				}
				continue
			}
			if !ok {
				t.Fatalf("window %d: no placement after 3 observations", window)
			}
			want, err := Rebalance(sum, R, S)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, want) {
				t.Fatalf("window %d: placement %v, want Rebalance of the window %v", window, p.Slots, want.Slots)
			}
		}
	}
	if err := b.Observe(make([]int64, E-1)); err == nil || !strings.Contains(err.Error(), "15 counts, want 16") {
		t.Fatalf("Observe of 15 counts: %v", err)
	}
	bad := step()
	bad[4] = -1
	if err := b.Observe(bad); err == nil || !strings.Contains(err.Error(), "expert 4 count -1") {
		t.Fatalf("Observe of a negative count: %v", err)
	}
	// Saturation instead of overflow.
	b.Every = 2
	big := make([]int64, E)
	big[0] = math.MaxInt64 - 1
	big[1] = 1
	for range 2 {
		if err := b.Observe(big); err != nil {
			t.Fatal(err)
		}
	}
	p, ok := b.Maybe()
	if !ok {
		t.Fatal("no placement after 2 observations")
	}
	if reps := p.Replicas(); reps[0] != R {
		t.Fatalf("saturated hot expert has %d replicas, want %d", reps[0], R)
	}

	for _, tc := range []struct {
		E, R, S, every int
		want           string
	}{
		{16, 4, 3, 1, "12 slots for 16 experts"},
		{16, 0, 4, 1, "0 ranks"},
		{16, 4, 4, -1, "every -1"},
	} {
		if _, err := NewRebalancer(tc.E, tc.R, tc.S, tc.every); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewRebalancer(%d, %d, %d, %d) = %v, want error naming %q", tc.E, tc.R, tc.S, tc.every, err, tc.want)
		}
	}
}

func BenchmarkRebalance(b *testing.B) {
	for _, R := range []int{8, 64} {
		const E = 256
		S := E/R + 4
		b.Run(fmt.Sprintf("E%d_R%d_S%d", E, R, S), func(b *testing.B) {
			load := zipfLoad(rand.New(rand.NewPCG(1, 2)), E, 1.0, false)
			for b.Loop() {
				if _, err := Rebalance(load, R, S); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
