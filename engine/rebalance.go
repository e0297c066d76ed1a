package engine

import (
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/metrics"
	"github.com/mkserve/mkserve/moe"
)

// rebalancer re-places each MoE layer's experts on the expert-parallel
// ranks from the loads the backend counted (Config.RebalanceEvery). It is
// owned by the step loop.
type rebalancer struct {
	placer backend.ExpertPlacer
	every  int
	spare  int
	layers map[int]*moe.Rebalancer // by MoE layer index, made on the layer's first counts
	log    *zap.Logger
	met    *metrics.Metrics
	moves  int64 // placements installed so far
}

// newRebalancer returns nil when cfg.RebalanceEvery is 0, and an error when
// it is set but be has no expert parallelism to rebalance.
func newRebalancer(cfg Config, be backend.Backend, log *zap.Logger, met *metrics.Metrics) (*rebalancer, error) {
	if cfg.RebalanceEvery == 0 {
		return nil, nil
	}
	p, ok := be.(backend.ExpertPlacer)
	if !ok || p.ExpertRanks() < 2 {
		return nil, fmt.Errorf("rebalance_every %d needs expert parallelism (ep ≥ 2) on a backend that can move experts", cfg.RebalanceEvery)
	}
	if _, ok := be.(backend.ExpertCounter); !ok {
		return nil, fmt.Errorf("rebalance_every %d needs a backend that counts expert loads", cfg.RebalanceEvery)
	}
	spare := cfg.RebalanceSpare
	if spare == 0 {
		spare = 1
	}
	return &rebalancer{placer: p, every: cfg.RebalanceEvery, spare: spare, layers: map[int]*moe.Rebalancer{}, log: log, met: met}, nil
}

// observe adds one step's counts of a layer and installs a new placement
// when the layer's window is full. Errors are logged: a failed rebalance
// keeps the old placement and serving goes on.
func (r *rebalancer) observe(layer int, counts []int64) {
	b := r.layers[layer]
	if b == nil {
		R := r.placer.ExpertRanks()
		E := len(counts)
		slots := min(E, (E+R-1)/R+r.spare)
		var err error
		if b, err = moe.NewRebalancer(E, R, slots, r.every); err != nil {
			r.log.Warn("expert rebalancing off for a layer", zap.Int("layer", layer), zap.Error(err))
			b = &moe.Rebalancer{} // off: Observe and Maybe do nothing
		}
		r.layers[layer] = b
	}
	if err := b.Observe(counts); err != nil {
		r.log.Warn("expert load not usable for rebalancing", zap.Int("layer", layer), zap.Error(err))
		return
	}
	p, ok := b.Maybe()
	if !ok {
		return
	}
	if err := r.placer.PlaceExperts(layer, p); err != nil {
		if errors.Is(err, backend.ErrNotPlaceable) { // for good: stop asking
			r.log.Warn("expert rebalancing off for a layer the backend cannot place", zap.Int("layer", layer), zap.Error(err))
			r.layers[layer] = &moe.Rebalancer{}
			return
		}
		r.log.Error("expert rebalance failed; keeping the old placement", zap.Int("layer", layer), zap.Error(err))
		return
	}
	r.moves++
	r.met.ExpertPlacement()
	r.log.Debug("experts re-placed", zap.Int("layer", layer), zap.Ints("replicas", p.Replicas()))
}
