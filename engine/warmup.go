package engine

import (
	"time"

	"go.uber.org/zap"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models"
)

// warmupSeqID is the first sequence id of warm-up rows (counting down; the
// engine's own ids count up from 1).
const warmupSeqID = ^uint64(0) >> 1

// warmGraphs runs two decode steps of every row count be's GraphWarmer
// names (the first eager, the second captured), before the engine serves:
// one-token rows at position 0 whose KV goes to block 0, which no sequence
// owns yet (a sequence that gets it later writes its own KV there before
// reading). A failed warm-up step is logged and ends the warm-up: serving
// then captures lazily, as without it.
func warmGraphs(m models.Model, be backend.Backend, maxRows int, log *zap.Logger) {
	w, ok := be.(backend.GraphWarmer)
	if !ok {
		return
	}
	rows := w.GraphWarmupRows(maxRows)
	if len(rows) == 0 {
		return
	}
	start := time.Now()
	for _, n := range rows {
		b := &backend.Batch{Tokens: make([]int32, n), Positions: make([]int32, n)}
		for i := range n {
			b.Seqs = append(b.Seqs, backend.SeqSpan{ID: warmupSeqID - uint64(i), Offset: i, Len: 1, Blocks: []int32{0}})
		}
		for range 2 {
			if _, err := backend.RunStep(be, b, func() (backend.Tensor, error) { return m.Forward(b) }); err != nil {
				log.Warn("decode graph warm-up stopped; later batch sizes are captured while serving",
					zap.Int("rows", n), zap.Error(err))
				return
			}
		}
		for i := range n {
			be.FreeSequence(warmupSeqID - uint64(i))
		}
	}
	if c, ok := be.(backend.ExpertCounter); ok {
		c.TakeExpertLoad() // the warm-up's routing is not load
	}
	log.Info("decode graphs warmed up", zap.Ints("rows", rows), zap.Duration("took", time.Since(start)))
}
