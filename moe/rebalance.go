package moe

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
)

// Placement lays experts out in physical slots for expert parallelism with
// redundant experts (DeepSeek's EPLB layout): every rank holds SlotsPerRank
// slots, each holding the weights of one expert. With R ranks, R·SlotsPerRank
// ≥ Experts; the slots beyond one per expert hold replicas of hot experts.
// A rank never holds the same expert twice.
type Placement struct {
	Experts      int     // number of logical experts E
	SlotsPerRank int     // slots per rank S
	Slots        [][]int // [rank][slot] → expert id; len(Slots) is the rank count R
}

// Ranks is the rank count R.
func (p *Placement) Ranks() int { return len(p.Slots) }

// Replicas counts the slots holding each expert, [E]; ids out of range are
// skipped.
func (p *Placement) Replicas() []int {
	n := make([]int, max(p.Experts, 0))
	for _, s := range p.Slots {
		for _, e := range s {
			if e >= 0 && e < len(n) {
				n[e]++
			}
		}
	}
	return n
}

// Validate reports bad sizes, an expert id out of range, a rank holding more
// than SlotsPerRank slots or one expert twice, and an expert no rank holds.
func (p *Placement) Validate() error {
	if p == nil {
		return fmt.Errorf("moe: placement is nil")
	}
	if p.Experts <= 0 || len(p.Slots) == 0 || p.SlotsPerRank <= 0 {
		return fmt.Errorf("moe: placement: %d experts on %d ranks of %d slots, want all > 0", p.Experts, len(p.Slots), p.SlotsPerRank)
	}
	seen := make([]int, p.Experts) // [E] → last rank+1 that held it
	for r, s := range p.Slots {
		if len(s) > p.SlotsPerRank {
			return fmt.Errorf("moe: placement: rank %d holds %d slots, want at most %d", r, len(s), p.SlotsPerRank)
		}
		for i, e := range s {
			if e < 0 || e >= p.Experts {
				return fmt.Errorf("moe: placement: rank %d slot %d holds expert %d, want 0..%d", r, i, e, p.Experts-1)
			}
			if seen[e] == r+1 {
				return fmt.Errorf("moe: placement: rank %d holds expert %d twice", r, e)
			}
			seen[e] = r + 1
		}
	}
	for e, s := range seen {
		if s == 0 {
			return fmt.Errorf("moe: placement: expert %d is in no slot", e)
		}
	}
	return nil
}

// Table converts p to a routing Table: an expert's owners are the ranks
// holding it, ordered by slot index then rank (so in the contiguous layout of
// a zero-load Rebalance the home rank comes first). It does not check slot
// counts or duplicates (call Validate for that): ids out of range are
// skipped, and an expert in no slot makes the Table fail Validate.
func (p *Placement) Table() *Table {
	if p == nil {
		return &Table{}
	}
	t := &Table{experts: p.Experts, ranks: len(p.Slots)}
	if p.Experts <= 0 {
		return t
	}
	t.owners = make([][]int, p.Experts)
	for i := 0; ; i++ {
		more := false
		for r, s := range p.Slots {
			if i >= len(s) {
				continue
			}
			more = true
			if e := s[i]; e >= 0 && e < p.Experts && !slices.Contains(t.owners[e], r) {
				t.owners[e] = append(t.owners[e], r)
			}
		}
		if !more {
			break
		}
	}
	return t
}

// checkRebalance validates Rebalance's sizes for E experts.
func checkRebalance(E, ranks, slotsPerRank int) error {
	if E <= 0 {
		return fmt.Errorf("moe: rebalance: %d experts, want > 0", E)
	}
	if ranks <= 0 {
		return fmt.Errorf("moe: rebalance: %d ranks, want > 0", ranks)
	}
	if slotsPerRank <= 0 {
		return fmt.Errorf("moe: rebalance: %d slots per rank, want > 0", slotsPerRank)
	}
	if slotsPerRank > E {
		return fmt.Errorf("moe: rebalance: %d slots per rank but only %d experts: a rank would hold an expert twice", slotsPerRank, E)
	}
	if ranks > math.MaxInt32/slotsPerRank {
		return fmt.Errorf("moe: rebalance: %d ranks × %d slots is too many slots", ranks, slotsPerRank)
	}
	if ranks*slotsPerRank < E {
		return fmt.Errorf("moe: rebalance: %d ranks × %d slots = %d slots for %d experts, want at least one slot per expert", ranks, slotsPerRank, ranks*slotsPerRank, E)
	}
	return nil
}

// Rebalance places E = len(load) experts in ranks × slotsPerRank slots so
// that ranks get equal work, in the manner of DeepSeek's EPLB (global
// policy). load [E] is the tokens routed to each expert over a window; an
// expert's tokens are assumed to split evenly over its replicas.
//
//  1. Replicas: every expert gets one; each remaining slot goes to the expert
//     with the highest load per replica (ties: fewer replicas, then lower
//     id), never more than ranks replicas.
//  2. Packing: replicas in order of load per replica, heaviest first (ties:
//     lower expert id), each onto the least-loaded rank (ties: lower rank)
//     that has a free slot and does not hold that expert yet. When only ranks
//     already holding it have free slots, the replica swaps with an expert of
//     a full rank, moved into the free slot (the swap that keeps the larger of
//     the two rank loads lowest).
//
// Every slot is used. All-zero load gives the contiguous layout of NewTable
// (rank r's first slots hold its NewTable block) with the spare slots filled
// by replicas of experts in id order, cycling. The result is deterministic.
// Errors: no experts, ranks or slots ≤ 0, slotsPerRank > E (a rank would
// hold an expert twice), fewer slots than experts, a negative load.
func Rebalance(load []int64, ranks, slotsPerRank int) (*Placement, error) {
	E := len(load)
	if err := checkRebalance(E, ranks, slotsPerRank); err != nil {
		return nil, err
	}
	busy := false
	for e, l := range load {
		if l < 0 {
			return nil, fmt.Errorf("moe: rebalance: expert %d has load %d, want ≥ 0", e, l)
		}
		busy = busy || l > 0
	}
	if !busy {
		return contiguousPlacement(E, ranks, slotsPerRank), nil
	}
	reps := replicaCounts(load, ranks, ranks*slotsPerRank)
	p, _ := packReplicas(load, reps, ranks, slotsPerRank)
	return p, nil
}

// contiguousPlacement is NewTable's layout with spare slots filled by
// replicas of experts 0, 1, … in turn (skipping those a rank already holds).
func contiguousPlacement(E, R, S int) *Placement {
	p := &Placement{Experts: E, SlotsPerRank: S, Slots: make([][]int, R)}
	held := make([]bool, E)
	b, m := E/R, E%R
	next := 0
	for r := range R {
		lo := r*b + min(r, m)
		hi := lo + b
		if r < m {
			hi++
		}
		s := make([]int, 0, S)
		clear(held)
		for e := lo; e < hi; e++ {
			s = append(s, e)
			held[e] = true
		}
		// S ≤ E, so E−(hi−lo) ≥ S−(hi−lo) candidates remain: this ends.
		for len(s) < S {
			if e := next % E; !held[e] {
				s = append(s, e)
				held[e] = true
			}
			next++
		}
		p.Slots[r] = s
	}
	return p
}

// perReplicaGreater reports a/ca > b/cb exactly (all non-negative).
func perReplicaGreater(a int64, ca int, b int64, cb int) bool {
	hi1, lo1 := bits.Mul64(uint64(a), uint64(cb))
	hi2, lo2 := bits.Mul64(uint64(b), uint64(ca))
	return hi1 > hi2 || (hi1 == hi2 && lo1 > lo2)
}

// replicaCounts gives every expert one replica and each of the remaining
// slots−E to the expert with the highest load per replica, at most maxRep
// each. Requires E ≤ slots ≤ E·maxRep.
func replicaCounts(load []int64, maxRep, slots int) []int {
	E := len(load)
	reps := make([]int, E)
	for e := range reps {
		reps[e] = 1
	}
	for range slots - E {
		best := -1
		for e := range E {
			if reps[e] >= maxRep {
				continue
			}
			if best < 0 || perReplicaGreater(load[e], reps[e], load[best], reps[best]) ||
				(!perReplicaGreater(load[best], reps[best], load[e], reps[e]) && reps[e] < reps[best]) {
				best = e
			}
		}
		reps[best]++
	}
	return reps
}

// packReplicas places reps[e] replicas of each expert on R ranks of S slots
// (Σ reps = R·S, reps[e] ≤ R) by greedy longest-first packing. swaps counts
// the repairs needed when only ranks already holding an expert had room.
func packReplicas(load []int64, reps []int, R, S int) (p *Placement, swaps int) {
	E := len(load)
	w := make([]float64, E) // [E] load per replica
	for e := range E {
		w[e] = float64(load[e]) / float64(reps[e])
	}
	order := make([]int, E)
	for e := range order {
		order[e] = e
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(w[b], w[a]) })

	p = &Placement{Experts: E, SlotsPerRank: S, Slots: make([][]int, R)}
	for r := range p.Slots {
		p.Slots[r] = make([]int, 0, S)
	}
	rankLoad := make([]float64, R)
	holds := make([]int, R) // [R] → expert+1 last placed there; replicas of one expert are placed together
	for _, e := range order {
		for range reps[e] {
			best := -1
			for r := range R {
				if len(p.Slots[r]) < S && holds[r] != e+1 && (best < 0 || rankLoad[r] < rankLoad[best]) {
					best = r
				}
			}
			if best < 0 {
				best = swapIn(p, w, rankLoad, holds, e)
				swaps++
			}
			p.Slots[best] = append(p.Slots[best], e)
			rankLoad[best] += w[e]
			holds[best] = e + 1
		}
	}
	return p, swaps
}

// swapIn makes room for expert e when every rank with a free slot already
// holds e: it moves some expert f from a full rank q (not holding e) into the
// free slot of a rank r (which does not hold f) and returns q, whose slot f
// left is now free for e. Such a move always exists: q holds S experts other
// than e, r at most S−2, so at least two of q's are missing on r.
func swapIn(p *Placement, w, rankLoad []float64, holds []int, e int) int {
	R, S := len(p.Slots), p.SlotsPerRank
	bq, bi, br, bestMax := -1, -1, -1, math.Inf(1)
	for r := range R {
		if len(p.Slots[r]) >= S {
			continue
		}
		for q := range R {
			if q == r || holds[q] == e+1 {
				continue
			}
			for i, f := range p.Slots[q] {
				if slices.Contains(p.Slots[r], f) {
					continue
				}
				m := max(rankLoad[q]-w[f]+w[e], rankLoad[r]+w[f])
				if m < bestMax {
					bq, bi, br, bestMax = q, i, r, m
				}
			}
		}
	}
	f := p.Slots[bq][bi]
	p.Slots[bq] = slices.Delete(p.Slots[bq], bi, bi+1)
	rankLoad[bq] -= w[f]
	p.Slots[br] = append(p.Slots[br], f)
	rankLoad[br] += w[f]
	return bq
}

// Imbalance is max over ranks of rank load divided by the mean rank load
// under p (1 is perfect), where a rank's load is Σ over its slots of
// load[e] / replicas(e): each expert's tokens split evenly over its replicas.
// All-zero load gives 1. A placement failing Validate, len(load) ≠
// p.Experts or a negative load give NaN.
func Imbalance(load []int64, p *Placement) float64 {
	if p.Validate() != nil || len(load) != p.Experts {
		return math.NaN()
	}
	var total float64
	for _, l := range load {
		if l < 0 {
			return math.NaN()
		}
		total += float64(l)
	}
	if total == 0 {
		return 1
	}
	reps := p.Replicas()
	var hi float64
	for _, s := range p.Slots {
		var sum float64
		for _, e := range s {
			sum += float64(load[e]) / float64(reps[e])
		}
		hi = max(hi, sum)
	}
	return hi / (total / float64(len(p.Slots)))
}

// Rebalancer accumulates per-expert token counts over a window of steps and
// proposes a new Placement every Every steps. It is off by default: the zero
// value, or Every = 0, ignores Observe and never proposes. The engine calls
// Observe after each step and Maybe between steps, and hands a placement
// that comes back to the backend (engine/rebalance.go; Config.RebalanceEvery).
// Not safe for concurrent use.
type Rebalancer struct {
	// Every is the number of observed steps between rebalances; 0 means off.
	Every int

	ranks, slots int
	window       []int64 // [E] tokens per expert this window
	n            int     // observations in the window
}

// NewRebalancer returns a Rebalancer for experts experts on ranks ranks of
// slotsPerRank slots, proposing a placement every every steps (0: off). The
// sizes are checked as Rebalance checks them.
func NewRebalancer(experts, ranks, slotsPerRank, every int) (*Rebalancer, error) {
	if err := checkRebalance(experts, ranks, slotsPerRank); err != nil {
		return nil, err
	}
	if every < 0 {
		return nil, fmt.Errorf("moe: rebalancer: every %d steps, want ≥ 0", every)
	}
	return &Rebalancer{Every: every, ranks: ranks, slots: slotsPerRank, window: make([]int64, experts)}, nil
}

// Observe adds one step's tokens per expert, counts [E], to the window
// (saturating at MaxInt64). It does nothing while the rebalancer is off.
// Counts of the wrong length or a negative count are an error and are not
// added.
func (b *Rebalancer) Observe(counts []int64) error {
	if b.Every <= 0 {
		return nil
	}
	if len(counts) != len(b.window) {
		return fmt.Errorf("moe: rebalancer: %d counts, want %d (one per expert)", len(counts), len(b.window))
	}
	for e, c := range counts {
		if c < 0 {
			return fmt.Errorf("moe: rebalancer: expert %d count %d, want ≥ 0", e, c)
		}
	}
	for e, c := range counts {
		if b.window[e] > math.MaxInt64-c {
			b.window[e] = math.MaxInt64
		} else {
			b.window[e] += c
		}
	}
	b.n++
	return nil
}

// Maybe returns Rebalance of the window and true once Every steps have been
// observed since the last one, and starts a new window; otherwise nil and
// false.
func (b *Rebalancer) Maybe() (*Placement, bool) {
	if b.Every <= 0 || b.n < b.Every {
		return nil, false
	}
	p, err := Rebalance(b.window, b.ranks, b.slots)
	clear(b.window)
	b.n = 0
	if err != nil { // unreachable: sizes checked by NewRebalancer, counts by Observe
		return nil, false
	}
	return p, true
}
