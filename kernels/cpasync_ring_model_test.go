package kernels

import (
	"fmt"
	"testing"
)

// A model of the cp.async rings of the mma.sync expert GEMMs
// (moe_gemm.cuh: ring_prologue + mma_ring, and the paired form
// ring2_prologue + mma_ring2 behind MK_MOE_DEC_PAIR), run on the CPU: the
// schedule of copies, commit groups, waits, barriers and multiplications of
// one CTA, with the hardware's latitude taken at its worst — a commit group
// lands only when a cp.async.wait_group forces it. The test checks, for
// every ring depth and k-tile count the kernels use, that each k tile is
// multiplied exactly once, in k order, from the stage its own copy filled,
// after that copy was waited for, and that no copy overwrites a stage
// before the multiplication that reads it (the barrier before each issue
// orders every thread's earlier multiplications before it).

// ringModel is one CTA's ring: stage contents and the commit groups.
type ringModel struct {
	err     error  // the first hazard found
	stage   []int  // k tile each stage holds (-1: none)
	read    []bool // the stage's tile has been multiplied
	groups  [][]int
	landed  int   // groups [0, landed) have landed
	pending []int // stages written by the open (uncommitted) group
	order   []int // k tiles in multiplication order
	where   string
}

func newRingModel(stages int, where string) *ringModel {
	m := &ringModel{stage: make([]int, stages), read: make([]bool, stages), where: where}
	for i := range m.stage {
		m.stage[i] = -1
	}
	return m
}

func (m *ringModel) fail(format string, args ...any) {
	if m.err == nil {
		m.err = fmt.Errorf("%s: "+format, append([]any{m.where}, args...)...)
	}
}

// load issues k tile kt's copy into stage s (joining the open group).
func (m *ringModel) load(s, kt int) {
	if m.stage[s] >= 0 && !m.read[s] {
		m.fail("k tile %d overwrites stage %d holding k tile %d, not yet multiplied", kt, s, m.stage[s])
	}
	m.stage[s], m.read[s] = kt, false
	m.pending = append(m.pending, s)
}

// touch adds a second copy into stage s (its A rows after its weights) to
// the open group.
func (m *ringModel) touch(s int) { m.pending = append(m.pending, s) }

func (m *ringModel) commit() {
	m.groups = append(m.groups, m.pending)
	m.pending = nil
}

// wait is cp.async.wait_group n: every group but the newest n has landed.
func (m *ringModel) wait(n int) {
	if l := len(m.groups) - n; l > m.landed {
		m.landed = l
	}
}

// mma multiplies the tile of stage s, which must be kt and must have landed.
func (m *ringModel) mma(s, kt int) {
	if m.stage[s] != kt {
		m.fail("multiplying k tile %d from stage %d, which holds %d", kt, s, m.stage[s])
	}
	for g := m.landed; g < len(m.groups); g++ {
		for _, w := range m.groups[g] {
			if w == s {
				m.fail("k tile %d read from stage %d before its group %d landed", kt, s, g)
			}
		}
	}
	for _, w := range m.pending {
		if w == s {
			m.fail("k tile %d read from stage %d, written by an uncommitted copy", kt, s)
		}
	}
	m.read[s] = true
	m.order = append(m.order, kt)
}

// check returns the first hazard, or a wrong count or order of the
// multiplications of kt k tiles.
func (m *ringModel) check(kt int) error {
	if m.err != nil {
		return m.err
	}
	if len(m.order) != kt {
		return fmt.Errorf("%s: %d multiplications for %d k tiles", m.where, len(m.order), kt)
	}
	for i, k := range m.order {
		if k != i {
			return fmt.Errorf("%s: multiplication %d took k tile %d", m.where, i, k)
		}
	}
	return nil
}

// plainRing is ring_prologue + mma_ring.
func plainRing(m *ringModel, st, kt int) {
	for s := 0; s < st-1; s++ {
		if s < kt {
			m.load(s, s)
		}
		m.commit()
	}
	for k := 0; k < kt; k++ {
		m.wait(st - 2)
		// __syncthreads: every earlier multiplication is done (sequential here).
		if nk := k + st - 1; nk < kt {
			m.load(nk%st, nk)
		}
		m.commit()
		m.mma(k%st, k)
	}
	m.wait(0)
}

// pairedRing is ring2_prologue (or ring2_prologue_b_first, bFirst) + mma_ring2.
func pairedRing(m *ringModel, st, kt int, bFirst bool) {
	load2 := func(s, k int, two bool) {
		m.load(s, k)
		if two {
			m.load(s+1, k+1)
		}
	}
	if bFirst {
		// ring2_prologue_b_first: the weights of every prologue pair in one
		// group, then the A rows of each pair in a group of its own.
		for s := 0; s < st-2; s += 2 {
			if s < kt {
				load2(s, s, s+1 < kt)
			}
		}
		m.commit()
		for s := 0; s < st-2; s += 2 {
			if s < kt {
				m.touch(s)
				if s+1 < kt {
					m.touch(s + 1)
				}
			}
			m.commit()
		}
	} else {
		for s := 0; s < st-2; s += 2 {
			if s < kt {
				load2(s, s, s+1 < kt)
			}
			m.commit()
		}
	}
	for k := 0; k < kt; k += 2 {
		m.wait((st-2)/2 - 1)
		if nk := k + st - 2; nk < kt {
			load2(nk%st, nk, nk+1 < kt)
		}
		m.commit()
		m.mma(k%st, k)
		if k+1 < kt {
			m.mma((k+1)%st, k+1)
		}
	}
	m.wait(0)
}

func TestCPAsyncRingModel(t *testing.T) {
	for _, st := range []int{3, 4, 6, 8} {
		for kt := 1; kt <= 40; kt++ {
			where := fmt.Sprintf("plain ring, %d stages, %d k tiles", st, kt)
			m := newRingModel(st, where)
			plainRing(m, st, kt)
			if err := m.check(kt); err != nil {
				t.Fatal(err)
			}
			if st%2 != 0 {
				continue // the paired ring takes even depths only (static_assert)
			}
			for _, bFirst := range []bool{false, true} {
				where := fmt.Sprintf("paired ring, %d stages, %d k tiles, weights first %v", st, kt, bFirst)
				m := newRingModel(st, where)
				pairedRing(m, st, kt, bFirst)
				if err := m.check(kt); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestCPAsyncRingModelCatches checks that the model finds the mistakes it
// is there for: a wait one group short, and a ring that refills the stage
// it is about to read.
func TestCPAsyncRingModelCatches(t *testing.T) {
	cases := []struct {
		name string
		run  func(m *ringModel)
	}{
		{"paired ring waiting one group short", func(m *ringModel) {
			for s := 0; s < 6; s += 2 {
				m.load(s, s)
				m.load(s+1, s+1)
				m.commit()
			}
			m.wait(3) // mma_ring2 waits for (8-2)/2-1 = 2
			m.mma(0, 0)
		}},
		{"plain ring one stage too deep", func(m *ringModel) {
			for s := 0; s < 8; s++ { // ring_prologue issues 7
				m.load(s, s)
				m.commit()
			}
			m.wait(6)
			m.load(0, 8) // k tile 8 into tile 0's stage before its multiplication
			m.commit()
			m.mma(0, 0)
		}},
	}
	for _, c := range cases {
		m := newRingModel(8, c.name)
		c.run(m)
		if m.err == nil {
			t.Errorf("%s: the model found nothing", c.name)
		}
	}
}
