package backend

import "fmt"

func validateBatch(b *Batch) error {
	T := len(b.Tokens)
	if T == 0 {
		return fmt.Errorf("batch: no tokens")
	}
	if len(b.Positions) != T {
		return fmt.Errorf("batch: %d positions for %d tokens", len(b.Positions), T)
	}
	next := 0
	for i, s := range b.Seqs {
		if s.Offset != next || s.Len <= 0 {
			return fmt.Errorf("batch: span %d (offset %d, len %d) does not continue at row %d", i, s.Offset, s.Len, next)
		}
		if s.Len > T-s.Offset {
			return fmt.Errorf("batch: span %d (offset %d, len %d) runs past the %d rows", i, s.Offset, s.Len, T)
		}
		if s.Past < 0 {
			return fmt.Errorf("batch: span %d has past %d", i, s.Past)
		}
		for j := 0; j < s.Len; j++ {
			if int(b.Positions[s.Offset+j]) != s.Past+j {
				return fmt.Errorf("batch: span %d row %d has position %d, want %d", i, j, b.Positions[s.Offset+j], s.Past+j)
			}
		}
		if s.ContextParallel < 0 {
			return fmt.Errorf("batch: span %d has context-parallel ranks %d", i, s.ContextParallel)
		}
		for _, blk := range s.Blocks {
			if blk < 0 {
				return fmt.Errorf("batch: span %d has negative block id %d", i, blk)
			}
		}
		next += s.Len
	}
	if next != T {
		return fmt.Errorf("batch: spans cover %d of %d rows", next, T)
	}
	for _, r := range b.LogitRows {
		if r < 0 || r >= T {
			return fmt.Errorf("batch: logit row %d out of range [0,%d)", r, T)
		}
	}
	if b.Feed != nil {
		if len(b.Feed) != T {
			return fmt.Errorf("batch: %d feed rows for %d tokens", len(b.Feed), T)
		}
		for i, f := range b.Feed {
			if f < -1 {
				return fmt.Errorf("batch: row %d is fed from pick %d", i, f)
			}
		}
	}
	return nil
}

// Fed reports whether a row of b takes its token from the device (Feed).
func (b *Batch) Fed() bool {
	for _, f := range b.Feed {
		if f >= 0 {
			return true
		}
	}
	return false
}

// SingleSequence builds the batch for ids appended to sequence id, which
// already has past tokens cached; logits are wanted for every row when
// allLogits, else for the last one only.
func SingleSequence(id uint64, ids []int32, past int, allLogits bool) *Batch {
	pos := make([]int32, len(ids))
	for i := range pos {
		pos[i] = int32(past + i)
	}
	b := &Batch{Tokens: ids, Positions: pos, Seqs: []SeqSpan{{ID: id, Offset: 0, Len: len(ids), Past: past}}}
	if !allLogits {
		b.LogitRows = []int{len(ids) - 1}
	}
	return b
}
