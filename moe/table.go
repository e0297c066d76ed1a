package moe

import (
	"fmt"
	"slices"
)

// Table maps each expert to the ranks that hold its weights. The first owner
// of an expert is its home rank (contiguous blocks, as vLLM and DeepSeek lay
// out expert parallelism); AddReplica adds more. A Table is not safe for
// concurrent mutation; NewEP takes a snapshot.
type Table struct {
	experts, ranks int
	owners         [][]int // [expert] → ranks, home rank first
}

// NewTable places numExperts experts on ranks ranks in contiguous blocks:
// rank r holds experts [r*b + min(r, m), …) where b = numExperts/ranks and the
// first m = numExperts%ranks ranks hold one extra. With more ranks than
// experts the last ranks hold none. Non-positive arguments give a Table that
// fails Validate.
func NewTable(numExperts, ranks int) *Table {
	t := &Table{experts: numExperts, ranks: ranks}
	if numExperts <= 0 || ranks <= 0 {
		return t
	}
	t.owners = make([][]int, numExperts)
	b, m := numExperts/ranks, numExperts%ranks
	for r := range ranks {
		lo := r*b + min(r, m)
		hi := lo + b
		if r < m {
			hi++
		}
		for e := lo; e < hi; e++ {
			t.owners[e] = []int{r}
		}
	}
	return t
}

// NumExperts is the number of experts the table covers.
func (t *Table) NumExperts() int { return t.experts }

// Ranks is the number of ranks.
func (t *Table) Ranks() int { return t.ranks }

// AddReplica makes rank also hold expert.
func (t *Table) AddReplica(expert, rank int) error {
	if err := t.Validate(); err != nil {
		return err
	}
	if expert < 0 || expert >= t.experts {
		return fmt.Errorf("moe: table: replica of expert %d, want 0..%d", expert, t.experts-1)
	}
	if rank < 0 || rank >= t.ranks {
		return fmt.Errorf("moe: table: replica of expert %d on rank %d, want 0..%d", expert, rank, t.ranks-1)
	}
	if slices.Contains(t.owners[expert], rank) {
		return fmt.Errorf("moe: table: rank %d already holds expert %d", rank, expert)
	}
	t.owners[expert] = append(t.owners[expert], rank)
	return nil
}

// Owners lists the ranks holding expert, home rank first then replicas in
// the order added; nil for an expert out of range. The slice is a copy.
func (t *Table) Owners(expert int) []int {
	if expert < 0 || expert >= len(t.owners) {
		return nil
	}
	return slices.Clone(t.owners[expert])
}

// Local lists the experts rank holds, ascending; nil for a rank out of range.
func (t *Table) Local(rank int) []int {
	if rank < 0 || rank >= t.ranks {
		return nil
	}
	var out []int
	for e, o := range t.owners {
		if slices.Contains(o, rank) {
			out = append(out, e)
		}
	}
	return out
}

// Pick is the rank that computes expert for the token at index token of a
// batch: Owners(expert)[token mod len(Owners(expert))]. Deterministic, and it
// spreads a replicated expert's tokens round-robin over its owners. Returns
// -1 for an expert out of range or a negative token.
func (t *Table) Pick(token, expert int) int {
	if expert < 0 || expert >= len(t.owners) || token < 0 || len(t.owners[expert]) == 0 {
		return -1
	}
	o := t.owners[expert]
	return o[token%len(o)]
}

// Validate reports a table with bad sizes or an expert that no rank holds.
func (t *Table) Validate() error {
	if t == nil {
		return fmt.Errorf("moe: table is nil")
	}
	if t.experts <= 0 || t.ranks <= 0 {
		return fmt.Errorf("moe: table: %d experts on %d ranks, want both > 0", t.experts, t.ranks)
	}
	if len(t.owners) != t.experts {
		return fmt.Errorf("moe: table: %d owner lists for %d experts", len(t.owners), t.experts)
	}
	for e, o := range t.owners {
		if len(o) == 0 {
			return fmt.Errorf("moe: table: expert %d has no owner", e)
		}
		for _, r := range o {
			if r < 0 || r >= t.ranks {
				return fmt.Errorf("moe: table: expert %d owned by rank %d, want 0..%d", e, r, t.ranks-1)
			}
		}
	}
	return nil
}

// clone is a deep copy.
func (t *Table) clone() *Table {
	c := &Table{experts: t.experts, ranks: t.ranks, owners: make([][]int, len(t.owners))}
	for e, o := range t.owners {
		c.owners[e] = slices.Clone(o)
	}
	return c
}
