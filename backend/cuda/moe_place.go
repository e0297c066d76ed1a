package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"weak"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/moe"
)

// Expert placement on the fused path's emulated ranks (backend.ExpertPlacer).
//
// Without a placement a layer runs the block placement: rank r's weights are
// views of experts [r·E/R, (r+1)·E/R) of the stacked weights, no copies.
// PlaceExperts(layer, p) for any other layout (replicas of hot experts,
// experts moved between ranks) prepares, between steps:
//
//	per rank r: GateUp_r [Slots_r, 2I, H] and Down_r [Slots_r, H, I] bf16,
//	            filled by device-to-device copies from the stacked weights
//	            (which stay as the source of later placements)
//	table       int32 [R·E] (kernels.MoEPlacement.Table)
//	counters    int64 [Σ Slots_r], a slice of the shared expert counters
//
// and marks the decode graphs stale (they captured the old pointers). The
// layer's next step that is not a graph capture or replay installs it: the
// per-slot counters so far are folded into the layer's expert loads, the
// new buffers take over and the old ones are freed. A placement that does
// not fit in device memory fails PlaceExperts and the old one stays.
// TakeExpertLoad reports per-expert loads: each slot's counter added to its
// expert.
//
// Cost: Σ_r Slots_r · 3·H·I·2 bytes of device memory per placed layer (on
// top of the stacked weights), the copies once per placement (one device
// pass over those bytes), and a re-capture of every decode graph after it.

// placedExperts is one layer's non-block placement on the device.
type placedExperts struct {
	E, H, I int
	src     [2]weak.Pointer[Tensor] // the stacked GateUp and Down it was copied from
	experts [][]int                 // [rank][slot] → expert
	slots   []int                   // [rank] slots
	gateUp  []*kernels.Buffer       // [rank] [Slots_r, 2I, H] bf16; nil for a rank of no slots
	down    []*kernels.Buffer       // [rank] [Slots_r, H, I] bf16
	table   *kernels.Buffer         // int32 [R·E]
	counter *slotCounter            // per-slot counters (installed with the placement)
}

// fusedLayer is what the fused path last saw of a layer: PlaceExperts copies
// from its weights.
type fusedLayer struct {
	E, H, I int
	src     [2]weak.Pointer[Tensor] // stacked GateUp [E·2I, H] and Down [E·H, I]
}

// slotCounter is a placed layer's per-slot expert counters: [off, off+n) of
// the shared counter buffer (moeDevState), n ≥ the slots in use.
type slotCounter struct {
	off, n int
	E      int
	expert []int // [slot, rank-major] → expert of the installed placement; nil: unused
}

// ExpertRanks implements backend.ExpertPlacer: the emulated expert-parallel
// ranks of the fused path (Options.EPRanks; 1 without).
func (be *Backend) ExpertRanks() int { return max(1, be.epRanks) }

// PlaceExperts implements backend.ExpertPlacer for a layer that has run on
// the fused MoE path: p is checked, its weights, table and counters are
// prepared on the device now (between steps; an error, such as too little
// device memory, keeps the old placement), and the layer's next eager step
// installs them (see the comment at the top of moe_place.go). The block
// placement goes back to views of the stacked weights. A placement equal to
// the one installed or pending does nothing.
func (be *Backend) PlaceExperts(layer int, p *moe.Placement) error {
	R := be.ExpertRanks()
	if R <= 1 {
		return fmt.Errorf("cuda: PlaceExperts: no expert parallelism (EPRanks %d)", be.epRanks)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("cuda: PlaceExperts layer %d: %w", layer, err)
	}
	if p.Ranks() != R {
		return fmt.Errorf("cuda: PlaceExperts layer %d: placement on %d ranks, the backend has %d", layer, p.Ranks(), R)
	}
	kp := kernelPlacement(p)
	table, err := kp.Table() // Check: slot counts within the kernel's limits
	if err != nil {
		return fmt.Errorf("cuda: PlaceExperts layer %d: %w", layer, err)
	}
	fs := &be.fused
	fs.mu.Lock()
	li := fs.layers[layer]
	fs.mu.Unlock()
	if li == nil {
		return fmt.Errorf("cuda: PlaceExperts layer %d: %w: it has not run on the fused MoE path (moe_path fused, experts without biases, E a multiple of %d)", layer, backend.ErrNotPlaceable, R)
	}
	if p.Experts != li.E {
		return fmt.Errorf("cuda: PlaceExperts layer %d: placement of %d experts for a layer of %d", layer, p.Experts, li.E)
	}
	gu, dn := li.src[0].Value(), li.src[1].Value()
	if gu == nil || dn == nil {
		return fmt.Errorf("cuda: PlaceExperts layer %d: the layer's expert weights were released", layer)
	}
	experts := kp.SlotExperts()
	block := slices.EqualFunc(experts, kernels.MoEBlockPlacement(li.E, R).SlotExperts(), slices.Equal)

	// No capture or replay runs while the placement is prepared and queued.
	be.gr.mu.Lock()
	defer be.gr.mu.Unlock()
	fs.mu.Lock()
	cur, queued := fs.pending[layer]
	if !queued {
		cur = fs.placed[layer]
	}
	same := cur == nil && block ||
		cur != nil && !block && cur.src == li.src && slices.EqualFunc(cur.experts, experts, slices.Equal)
	fs.mu.Unlock()
	if same {
		return nil
	}

	var pl *placedExperts // nil: the block placement
	if !block {
		pl = &placedExperts{E: li.E, H: li.H, I: li.I, src: li.src, experts: experts, slots: kp.Slots}
		err := be.g.Do(func(d *kernels.Device) error { return be.preparePlacement(d, layer, pl, gu, dn, table) })
		runtime.KeepAlive(gu)
		runtime.KeepAlive(dn)
		if err != nil {
			return fmt.Errorf("cuda: PlaceExperts layer %d: %w (the old placement stays)", layer, err)
		}
	}
	fs.mu.Lock()
	old, hadOld := fs.pending[layer]
	if fs.pending == nil {
		fs.pending = map[int]*placedExperts{}
	}
	fs.pending[layer] = pl
	fs.mu.Unlock()
	// The decode graphs hold the installed buffers' addresses: the next
	// graph step drops them, and its eager run installs pl.
	be.gr.stale.Store(true)
	if hadOld && old != nil { // prepared, never installed: no kernel used it
		if err := be.g.Do(func(*kernels.Device) error { return old.free() }); err != nil {
			return fmt.Errorf("cuda: PlaceExperts layer %d: freeing the replaced pending placement: %w", layer, err)
		}
	}
	return nil
}

// kernelPlacement converts p (validated) to the kernel's form: rank r's
// slot i holds expert p.Slots[r][i]; an expert's copies in rank order.
func kernelPlacement(p *moe.Placement) *kernels.MoEPlacement {
	kp := &kernels.MoEPlacement{Slots: make([]int, p.Ranks()), Replicas: make([][]kernels.MoEReplica, p.Experts)}
	for r, s := range p.Slots {
		kp.Slots[r] = len(s)
		for i, e := range s {
			kp.Replicas[e] = append(kp.Replicas[e], kernels.MoEReplica{Rank: r, Slot: i})
		}
	}
	return kp
}

// preparePlacement allocates pl's buffers, copies every slot's expert from
// the stacked weights gu [E·2I, H] and dn [E·H, I], uploads the table and
// finds pl's counters (on the GPU goroutine, no graph running). On failure
// nothing stays allocated.
func (be *Backend) preparePlacement(d *kernels.Device, layer int, pl *placedExperts, gu, dn *Tensor, table []int32) (err error) {
	R, H, I := len(pl.slots), int64(pl.H), int64(pl.I)
	guE, dnE := 2*I*H*2, H*I*2 // bytes of one expert
	defer func() {
		if err != nil {
			err = errors.Join(err, pl.free())
		}
	}()
	malloc := func(bytes int64) (*kernels.Buffer, error) {
		b, err := d.Malloc(bytes)
		if err != nil { // the pool's idle buffers may be what is missing
			be.alloc.freePending(true)
			b, err = d.Malloc(bytes)
		}
		return b, err
	}
	pl.gateUp, pl.down = make([]*kernels.Buffer, R), make([]*kernels.Buffer, R)
	for r, s := range pl.experts {
		if len(s) == 0 {
			continue
		}
		S := int64(len(s))
		if pl.gateUp[r], err = malloc(S * guE); err != nil {
			return fmt.Errorf("rank %d's expert weights (%d slots, %d bytes): %w", r, S, S*(guE+dnE), err)
		}
		if pl.down[r], err = malloc(S * dnE); err != nil {
			return fmt.Errorf("rank %d's expert weights (%d slots, %d bytes): %w", r, S, S*(guE+dnE), err)
		}
		// Runs of consecutive experts in consecutive slots are one copy each.
		for i := 0; i < len(s); {
			j := i + 1
			for j < len(s) && s[j] == s[j-1]+1 {
				j++
			}
			n, e := int64(j-i), int64(s[i])
			if err := d.CopyAsync(nil, view(pl.gateUp[r], int64(i)*guE, n*guE), view(gu.st.bf16, e*guE, n*guE), n*guE); err != nil {
				return err
			}
			if err := d.CopyAsync(nil, view(pl.down[r], int64(i)*dnE, n*dnE), view(dn.st.bf16, e*dnE, n*dnE), n*dnE); err != nil {
				return err
			}
			i = j
		}
	}
	if pl.table, err = malloc(int64(len(table)) * 4); err != nil {
		return fmt.Errorf("the placement table: %w", err)
	}
	if err := kernels.Upload(d, pl.table, table); err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		return err
	}
	n := 0
	for _, S := range pl.slots {
		n += S
	}
	pl.counter = be.slotCounterFor(d, layer, n)
	return nil
}

// free releases pl's own buffers (on the GPU goroutine); the counters stay
// with the layer.
func (pl *placedExperts) free() error {
	if pl == nil {
		return nil
	}
	var errs []error
	for _, b := range slices.Concat(pl.gateUp, pl.down, []*kernels.Buffer{pl.table}) {
		errs = append(errs, b.Free())
	}
	pl.gateUp, pl.down, pl.table = nil, nil, nil
	return errors.Join(errs...)
}

// slotCounterFor returns the layer's per-slot counters when they hold n
// slots, else new ones of n (made room for in the shared buffer); on the GPU
// goroutine outside graphs. They become the layer's when a placement using
// them is installed.
func (be *Backend) slotCounterFor(d *kernels.Device, layer, n int) *slotCounter {
	s := &be.moe
	s.mu.Lock()
	c := s.slots[layer]
	if c == nil || c.n < n {
		c = &slotCounter{off: s.used, n: n}
		s.used += n
	}
	s.mu.Unlock()
	be.counterBuffer(d, &moeCounter{E: n, off: c.off}) // grows the shared buffer if needed
	return c
}

// notePlaced records what the fused path sees of a layer (fs.mu held) and
// returns the layer's installed placement for these weights, or nil for the
// block placement. Outside graph steps it first installs a pending
// placement and frees a placement whose weights were released.
func (be *Backend) notePlaced(d *kernels.Device, layer int, gu, dn *Tensor, E, H, I int) *placedExperts {
	fs := &be.fused
	li := fs.layers[layer]
	if li == nil || li.src[0].Value() != gu || li.src[1].Value() != dn || li.E != E || li.H != H || li.I != I {
		li = &fusedLayer{E: E, H: H, I: I, src: [2]weak.Pointer[Tensor]{weak.Make(gu), weak.Make(dn)}}
		if fs.layers == nil {
			fs.layers = map[int]*fusedLayer{}
		}
		fs.layers[layer] = li
	}
	if be.graphMode() == graphOff {
		if pl, ok := fs.pending[layer]; ok {
			delete(fs.pending, layer)
			be.installPlacement(d, layer, pl)
		} else if pl := fs.placed[layer]; pl != nil && (pl.src[0].Value() == nil || pl.src[1].Value() == nil) {
			be.installPlacement(d, layer, nil)
		}
	}
	pl := fs.placed[layer]
	if pl == nil || pl.src != li.src || pl.E != E || pl.H != H || pl.I != I {
		return nil // another model's layer of this index: the block placement
	}
	return pl
}

// installPlacement makes pl (nil: the block placement) the layer's, on the
// GPU goroutine outside graphs (fs.mu held): the per-slot counts so far go
// to the layer's expert loads, the counters are cleared and re-mapped, the
// old placement's buffers are freed. The graphs that captured them were
// marked stale by PlaceExperts and are dropped before any replay.
func (be *Backend) installPlacement(d *kernels.Device, layer int, pl *placedExperts) {
	fs := &be.fused
	s := &be.moe
	s.mu.Lock()
	if old := s.slots[layer]; old != nil && old.expert != nil {
		if old.off+old.n <= s.cap {
			v := make([]int64, len(old.expert))
			cv := view(s.buf, int64(old.off)*8, int64(len(v))*8)
			must("expert counters", kernels.Download(d, v, cv))
			must("expert counters", kernels.Upload(d, cv, make([]int64, len(v))))
			load := make([]int64, old.E)
			for i, e := range old.expert {
				load[e] += v[i]
			}
			be.load.AddCounts(layer, load)
		}
		old.expert = nil
	}
	if pl != nil {
		c := pl.counter
		c.E = pl.E
		c.expert = slices.Concat(pl.experts...)
		if s.slots == nil {
			s.slots = map[int]*slotCounter{}
		}
		s.slots[layer] = c
	}
	s.mu.Unlock()
	old := fs.placed[layer]
	if pl == nil {
		delete(fs.placed, layer)
	} else {
		if fs.placed == nil {
			fs.placed = map[int]*placedExperts{}
		}
		fs.placed[layer] = pl
	}
	must("freeing the old expert placement", old.free())
}
