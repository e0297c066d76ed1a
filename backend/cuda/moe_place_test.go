package cuda

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"weak"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/moe"
)

// skewedPlacement puts expert 0 on every rank and every other expert e on
// rank (e+1) mod R, away from its block rank; even ranks hold expert 0 in
// their first slot, odd ranks in their last, so slot counts differ by rank.
func skewedPlacement(E, R int) *moe.Placement {
	slots := make([][]int, R)
	for r := 0; r < R; r += 2 {
		slots[r] = []int{0}
	}
	for e := 1; e < E; e++ {
		r := (e + 1) % R
		slots[r] = append(slots[r], e)
	}
	S := 0
	for r := range R {
		if r%2 == 1 {
			slots[r] = append(slots[r], 0)
		}
		S = max(S, len(slots[r]))
	}
	return &moe.Placement{Experts: E, SlotsPerRank: S, Slots: slots}
}

// blockPlacement is the fused path's default layout as a moe.Placement.
func blockPlacement(E, R int) *moe.Placement {
	p := &moe.Placement{Experts: E, SlotsPerRank: E / R, Slots: make([][]int, R)}
	for e := range E {
		r := e * R / E
		p.Slots[r] = append(p.Slots[r], e)
	}
	return p
}

// TestPlaceExpertsGolden: golden models on the fused path over R emulated
// ranks, every MoE layer re-placed (a skewed layout with expert 0 on every
// rank and the others moved, then moe.Rebalance of the measured loads with
// one spare slot per rank, then back to the block layout), give the
// block placement's logits within 1e-5 relative L2; TakeExpertLoad's
// per-expert loads (folded from per-slot counters) sum to tokens × top-k
// per layer, and placed layers hold their own weight copies.
func TestPlaceExpertsGolden(t *testing.T) {
	for _, fam := range []string{"qwen3_moe", "mixtral", "deepseek_v3"} {
		for _, R := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s_r%d", fam, R), func(t *testing.T) {
				g := readGolden(t, fam)
				be := fusedBackend(t, R)
				l := loadModel(t, fam, be)
				T, K := len(g.IDs), l.Config.NumExpertsPerTok
				seq := uint64(0)
				forward := func() []float32 {
					seq++
					out, err := l.Model.Forward(backend.SingleSequence(seq, g.IDs, 0, true))
					if err != nil {
						t.Fatal(err)
					}
					return be.ToHost(out)
				}
				be.TakeExpertLoad()
				before := moeFusedCalls.Load()
				want := forward()
				if moeFusedCalls.Load() == before {
					t.Fatal("no layer took the fused path")
				}
				base := be.TakeExpertLoad()
				layers := slices.Sorted(maps.Keys(base))
				checkLoad := func(name string, load map[int][]int64) {
					t.Helper()
					if got := slices.Sorted(maps.Keys(load)); !slices.Equal(got, layers) {
						t.Errorf("%s: loads of layers %v, want %v", name, got, layers)
					}
					for _, layer := range layers {
						var sum int64
						for _, n := range load[layer] {
							sum += n
						}
						if sum != int64(T*K) || len(load[layer]) != len(base[layer]) {
							t.Errorf("%s: layer %d: %d experts counted %d tokens, want %d experts and %d×%d", name, layer,
								len(load[layer]), sum, len(base[layer]), T, K)
						}
					}
				}
				checkLoad("block", base)
				E := len(base[layers[0]])
				for _, pc := range []struct {
					name   string
					place  func(layer int) *moe.Placement
					copies bool
				}{
					{"skewed", func(int) *moe.Placement { return skewedPlacement(E, R) }, true},
					{"rebalanced", func(layer int) *moe.Placement {
						p, err := moe.Rebalance(base[layer], R, E/R+1)
						if err != nil {
							t.Fatal(err)
						}
						return p
					}, true},
					{"block", func(int) *moe.Placement { return blockPlacement(E, R) }, false},
				} {
					for _, layer := range layers {
						if err := be.PlaceExperts(layer, pc.place(layer)); err != nil {
							t.Fatalf("%s: PlaceExperts layer %d: %v", pc.name, layer, err)
						}
					}
					got := forward()
					e := relL2(got, want)
					t.Logf("PLACE %s R=%d %s: logits relative L2 to the block placement %.3g", fam, R, pc.name, e)
					if !(e <= 1e-5) {
						t.Errorf("%s: logits relative L2 %.3g > 1e-5", pc.name, e)
					}
					load := be.TakeExpertLoad()
					checkLoad(pc.name, load)
					for _, layer := range layers {
						if !slices.Equal(load[layer], base[layer]) {
							t.Logf("%s: layer %d: loads %v, block placement %v (routing moved)", pc.name, layer, load[layer], base[layer])
						}
					}
					be.fused.mu.Lock()
					placed := len(be.fused.placed)
					be.fused.mu.Unlock()
					wantPlaced := 0
					if pc.copies {
						wantPlaced = len(layers)
					}
					if placed != wantPlaced {
						t.Errorf("%s: %d layers hold placed copies, want %d", pc.name, placed, wantPlaced)
					}
				}
			})
		}
	}
}

// TestPlaceExpertsErrors: PlaceExperts refuses, before any device work, a
// backend without expert parallelism, an invalid placement, a wrong rank
// count, more slots than the kernel takes, a layer the fused path has not
// run, a placement of another expert count, and released weights; the
// block placement of a layer on the block placement is a no-op. Runs on
// the CPU (a Backend with only its rank count set).
func TestPlaceExpertsErrors(t *testing.T) {
	gu, dn := &Tensor{shape: []int{1}}, &Tensor{shape: []int{1}}
	live := &fusedLayer{E: 8, H: 16, I: 8, src: [2]weak.Pointer[Tensor]{weak.Make(gu), weak.Make(dn)}}
	gone := func() *fusedLayer {
		a, b := &Tensor{shape: []int{2}}, &Tensor{shape: []int{2}}
		return &fusedLayer{E: 8, H: 16, I: 8, src: [2]weak.Pointer[Tensor]{weak.Make(a), weak.Make(b)}}
	}()
	huge := &moe.Placement{Experts: 5000, SlotsPerRank: 5000, Slots: [][]int{make([]int, 5000), {0}}}
	for e := range huge.Slots[0] {
		huge.Slots[0][e] = e
	}
	cases := []struct {
		name  string
		ranks int
		layer int
		p     *moe.Placement
		want  string // "" : no error
	}{
		{"no ep", 1, 0, blockPlacement(8, 2), "no expert parallelism"},
		{"nil", 2, 0, nil, "nil"},
		{"expert in no slot", 2, 0, &moe.Placement{Experts: 8, SlotsPerRank: 4, Slots: [][]int{{0, 1, 2, 3}, {4, 5, 6}}}, "expert 7 is in no slot"},
		{"expert twice", 2, 0, &moe.Placement{Experts: 4, SlotsPerRank: 3, Slots: [][]int{{0, 1, 1}, {2, 3}}}, "twice"},
		{"id out of range", 2, 0, &moe.Placement{Experts: 4, SlotsPerRank: 2, Slots: [][]int{{0, 1}, {2, 9}}}, "expert 9"},
		{"wrong ranks", 2, 0, blockPlacement(8, 4), "4 ranks, the backend has 2"},
		{"too many slots", 2, 0, huge, "slots"},
		{"layer not run", 2, 7, skewedPlacement(8, 2), "has not run on the fused MoE path"},
		{"other expert count", 2, 0, skewedPlacement(16, 2), "16 experts for a layer of 8"},
		{"weights released", 2, 1, skewedPlacement(8, 2), "released"},
		{"block on block", 2, 0, blockPlacement(8, 2), ""},
	}
	runtime.GC() // gone's tensors are unreachable: its weak pointers turn nil
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			be := &Backend{epRanks: c.ranks}
			be.fused.layers = map[int]*fusedLayer{0: live, 1: gone}
			err := be.PlaceExperts(c.layer, c.p)
			switch {
			case c.want == "" && err != nil:
				t.Errorf("PlaceExperts: %v, want no error", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("PlaceExperts: %v, want an error naming %q", err, c.want)
			}
			if len(be.fused.pending) != 0 || be.gr.stale.Load() {
				t.Errorf("a refused or no-op placement left %d pending placements (graphs stale: %v)", len(be.fused.pending), be.gr.stale.Load())
			}
			if got := be.ExpertRanks(); got != max(c.ranks, 1) {
				t.Errorf("ExpertRanks = %d, want %d", got, c.ranks)
			}
		})
	}
	runtime.KeepAlive(gu)
	runtime.KeepAlive(dn)
}

// TestKernelPlacement: a moe.Placement becomes the kernel's placement slot
// for slot, replicas in rank order, and its table sends each source rank
// to a local copy when it has one (CPU).
func TestKernelPlacement(t *testing.T) {
	p := skewedPlacement(8, 2) // rank 0: 0 1 3 5 7; rank 1: 2 4 6 0
	kp := kernelPlacement(p)
	if err := kp.Check(); err != nil {
		t.Fatal(err)
	}
	if got := kp.SlotExperts(); !slices.EqualFunc(got, p.Slots, slices.Equal) {
		t.Errorf("slot experts %v, want %v", got, p.Slots)
	}
	if got := fmt.Sprint(kp.Replicas[0]); got != "[{0 0} {1 3}]" {
		t.Errorf("expert 0's replicas %s, want [{0 0} {1 3}]", got)
	}
	tab, err := kp.Table()
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		for e := range 8 {
			d, s := int(tab[r*8+e]>>16), int(tab[r*8+e]&0xffff)
			if p.Slots[d][s] != e {
				t.Errorf("table: source %d expert %d → rank %d slot %d, which holds %d", r, e, d, s, p.Slots[d][s])
			}
			if e == 0 && d != r {
				t.Errorf("table: source %d sends expert 0 to rank %d, not its own copy", r, d)
			}
		}
	}
}

// TestEngineRebalanceFused: the serving engine on the fused path over 4
// emulated ranks with rebalancing every 3 steps (decode steps as CUDA
// graphs, dropped and captured again at every new placement) installs
// placements and generates what it generates without rebalancing.
func TestEngineRebalanceFused(t *testing.T) {
	prompts := [][]int32{}
	for i := range 3 {
		r := rand.New(rand.NewPCG(uint64(i), 41))
		p := make([]int32, 12+5*i)
		for j := range p {
			p[j] = int32(1 + r.IntN(500))
		}
		prompts = append(prompts, p)
	}
	const maxTok = 12
	run := func(every int) ([][]int32, engine.Stats, *Backend) {
		be := fusedBackend(t, 4)
		l := loadModel(t, "qwen3_moe", be)
		e, err := engine.New(l.Model, be, idText{}, engine.Config{BlockSize: 4, MaxNumSeqs: 8, KVCacheBytes: 16 << 20,
			RebalanceEvery: every}, engine.Options{Name: "t"})
		if err != nil {
			t.Fatal(err)
		}
		defer stopEngine(e)
		var out [][]int32
		for i, p := range prompts {
			out = append(out, generate(t, e, fmt.Sprint(i), p, maxTok))
		}
		return out, e.Stats(), be
	}
	plain, st0, _ := run(0)
	moved, st, be := run(3)
	for i := range plain {
		if !slices.Equal(plain[i], moved[i]) || len(moved[i]) != maxTok {
			t.Errorf("prompt %d: %v without rebalancing, %v with", i, plain[i], moved[i])
		}
	}
	if st0.ExpertPlacements != 0 {
		t.Errorf("rebalancing off, yet %d placements", st0.ExpertPlacements)
	}
	if st.ExpertPlacements == 0 {
		t.Errorf("rebalancing every 3 steps over %d steps installed no placement", st.Steps)
	}
	be.fused.mu.Lock()
	placed := len(be.fused.placed)
	be.fused.mu.Unlock()
	if placed == 0 {
		t.Errorf("no layer holds a placed copy of its experts")
	}
	gs := be.Graphs()
	t.Logf("REBALANCE engine: %d placements over %d steps, %d layers placed; graphs: %d captures, %d replays, %d eager",
		st.ExpertPlacements, st.Steps, placed, gs.Captures, gs.Replays, gs.Eager)
}
