package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/mkserve/mkserve/moe"
)

// The rank-local fused MoE layer (MoEFusedRankLocal) with its two ranks in
// two processes: this test binary re-executes itself (TestMoEFusedIPCChild)
// as rank 1, the parent is rank 0; they swap their workspaces' IPC handles
// over a pair of pipes, and each checks its own output against the float64
// CPU reference. Both draw every input from the seed the parent passes, so
// each can compute its own reference.

// ipcCaseEnv carries the JSON of an ipcCase to the child.
const ipcCaseEnv = "MKSERVE_TEST_FUSED_IPC"

// ipcCase is one two-process layer.
type ipcCase struct {
	Name        string
	E, K        int
	Tokens      [2]int
	H, I        int
	Epochs      int // layer calls on the same workspaces (epochs 1..Epochs), fresh tokens each
	ChildDevice int // the child's GPU ordinal (the parent uses device 0)
	Idle        bool
	Seed        uint64
	TimeoutMs   int
	Tile        int // MoEFusedArgs.Tile
}

// TestMoEFusedIPC: ranks 0 and 1 of a fused MoE layer in two processes, on
// one GPU and (when there are two) on two; rel. L2 ≤ 1e-2 per rank per
// epoch. The idle case is the watchdog: the child maps the parent's
// workspace but never launches, and the parent's launch must end with a
// timeout naming rank 1 and the plan role instead of hanging.
func TestMoEFusedIPC(t *testing.T) {
	g := testGPU(t)
	ndev, err := DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	cases := []ipcCase{
		{Name: "one_gpu_E16_K4_T37_50", E: 16, K: 4, Tokens: [2]int{37, 50}, H: 256, I: 128, Epochs: 3},
		{Name: "one_gpu_E8_K2_T300_200_tile64", E: 8, K: 2, Tokens: [2]int{300, 200}, H: 256, I: 128, Epochs: 2,
			Tile: 64},
		{Name: "one_gpu_E8_K2_T300_200_tile128", E: 8, K: 2, Tokens: [2]int{300, 200}, H: 256, I: 128, Epochs: 3,
			Tile: 128},
		{Name: "one_gpu_E64_K8_T1_0", E: 64, K: 8, Tokens: [2]int{1, 0}, H: 128, I: 64, Epochs: 2},
		{Name: "one_gpu_watchdog", E: 16, K: 4, Tokens: [2]int{20, 20}, H: 128, I: 64, Epochs: 1, Idle: true,
			TimeoutMs: 200},
		{Name: "two_gpus_E16_K4_T37_50", E: 16, K: 4, Tokens: [2]int{37, 50}, H: 256, I: 128, Epochs: 3,
			ChildDevice: 1},
		{Name: "two_gpus_E8_K2_T300_200_tile64", E: 8, K: 2, Tokens: [2]int{300, 200}, H: 256, I: 128, Epochs: 2,
			ChildDevice: 1, Tile: 64},
		{Name: "two_gpus_E8_K2_T300_200_tile128", E: 8, K: 2, Tokens: [2]int{300, 200}, H: 256, I: 128, Epochs: 3,
			ChildDevice: 1, Tile: 128},
		{Name: "two_gpus_watchdog", E: 16, K: 4, Tokens: [2]int{20, 20}, H: 128, I: 64, Epochs: 1, Idle: true,
			TimeoutMs: 200, ChildDevice: 1},
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.ChildDevice >= ndev {
				t.Skipf("needs %d GPUs (peer access between them), this machine has %d", c.ChildDevice+1, ndev)
			}
			c.Seed = uint64(time.Now().UnixNano())
			t.Logf("seed %d", c.Seed)
			runFusedIPCParent(t, g, c)
		})
	}
}

func runFusedIPCParent(t *testing.T, g *GPU, c ipcCase) {
	runIPCPair(t, "TestMoEFusedIPCChild", ipcCaseEnv, c, c.ChildDevice, func(peer lineIO) {
		runFusedIPCRank(t, g, c, 0, peer)
	})
}

// TestMoEFusedIPCChild is rank 1 of TestMoEFusedIPC (skipped when run on its own).
func TestMoEFusedIPCChild(t *testing.T) {
	var c ipcCase
	peer := ipcChild(t, ipcCaseEnv, &c)
	g := testGPU(t) // device c.ChildDevice: the parent set testDeviceEnv
	runFusedIPCRank(t, g, c, 1, peer)
}

// ipcWeights draws the placement and every expert's weights from c.Seed
// (the same in both processes).
func ipcWeights(c ipcCase) (pl *MoEPlacement, table []int32, gub16, dnb16 []uint16, gu, dn []float32, err error) {
	r := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	pl = MoEBlockPlacement(c.E, 2)
	if table, err = pl.Table(); err != nil {
		return
	}
	gub16, gu, dnb16, dn = randExperts(r, c.E, c.H, c.I)
	return
}

// ipcTokens draws rank me's tokens and routing of one epoch from c.Seed.
func ipcTokens(c ipcCase, ep, me int) (xb []uint16, x []float32, ids []int32, w []float32) {
	r := rand.New(rand.NewPCG(c.Seed, uint64(ep*16+me+1)))
	T := c.Tokens[me]
	xb, x = randBF16(r, T*c.H, 1)
	if T > 0 {
		cfg := moe.RouterConfig{NumExperts: c.E, TopK: c.K, Scoring: moe.Softmax, NormTopK: true}
		ids, w = moe.Route(&cfg, randF32(r, T*c.E, 1), nil, T)
	}
	return
}

// runFusedIPCRank is one process's rank me: its workspace (0xff-filled, as
// the epochs need), handles swapped, then c.Epochs layer calls, each
// checked; then "done" and "closed" are swapped so that no process unmaps
// or frees memory the other may still write.
func runFusedIPCRank(t *testing.T, g *GPU, c ipcCase, me int, peer lineIO) {
	pl, table, gub16, dnb16, gu, dn, err := ipcWeights(c)
	if err != nil {
		t.Fatal(err)
	}
	slotExp := pl.SlotExperts()
	act := moe.Activation{Kind: moe.SwiGLU}
	H, I, K := c.H, c.I, c.K
	T := c.Tokens[me]
	args := MoEFusedArgs{Tokens: c.Tokens[:], Slots: pl.Slots, Experts: c.E, TopK: K, H: H, I: I,
		Timeout: 10 * time.Second, Tile: c.Tile}
	if c.TimeoutMs > 0 {
		args.Timeout = time.Duration(c.TimeoutMs) * time.Millisecond
	}
	onGPU(t, g, func(a *arena) {
		ctlBytes, rankBytes, tileM, err := a.d.MoEFusedWorkspace(args, false)
		a.check(err)
		if a.err != nil {
			return
		}
		t.Logf("rank %d: row tile %d, workspaces %v bytes", me, tileM, rankBytes)
		ctl := put(a, make([]int32, ctlBytes/4))
		ws := put(a, bf16Fill(int(rankBytes[me]/2), 0xffff))
		args.Table = put(a, table)
		var mine MoEFusedRank
		mine.WS = ws
		if S := pl.Slots[me]; S > 0 {
			gu16, dn16 := slotWeights(gub16, dnb16, slotExp[me], H, I)
			mine.GateUp, mine.Down = put(a, gu16), put(a, dn16)
		}
		if a.err != nil {
			return
		}
		pws := swapIPC(a, peer, ws, rankBytes[1-me])
		if a.err != nil {
			return
		}
		wss := make([]*Buffer, 2)
		wss[me], wss[1-me] = ws, pws
		for ep := 1; ep <= c.Epochs && !(c.Idle && me == 1); ep++ {
			xb, x, ids, w := ipcTokens(c, ep, me)
			if T > 0 {
				mine.X, mine.IDs, mine.Weights = put(a, xb), put(a, ids), put(a, w)
				mine.Out = put(a, f32Fill(T*H, float32(math.NaN())))
			}
			if a.err != nil {
				break
			}
			start := time.Now()
			a.check(a.d.MoEFusedRankLocal(nil, me, mine, wss, ctl, args, ep))
			if a.err != nil {
				break
			}
			cerr := a.d.MoEFusedCheck(ctl)
			took := time.Since(start)
			if c.Idle {
				var te *MoEFusedTimeoutError
				switch {
				case !errors.As(cerr, &te):
					t.Errorf("rank %d with an idle peer: MoEFusedCheck = %v, want a *MoEFusedTimeoutError", me, cerr)
				case te.Rank != 1-me || te.Role != "plan" || te.Tile != -1 || te.Seen >= te.Want:
					t.Errorf("rank %d with an idle peer: %v (%+v), want rank %d role plan", me, te, *te, 1-me)
				default:
					t.Logf("rank %d: watchdog after %v: %v", me, took, te)
				}
				if took > 5*time.Second {
					t.Errorf("the watchdog took %v with a %v timeout", took, args.Timeout)
				}
				break
			}
			if cerr != nil {
				t.Errorf("rank %d epoch %d: %v", me, ep, cerr)
				break
			}
			if T == 0 {
				t.Logf("rank %d epoch %d: no tokens, served the peer in %v", me, ep, took)
				continue
			}
			got := get[float32](a, mine.Out, T*H)
			want := moeRef(x, gu, nil, dn, nil, ids, w, T, K, H, I, act)
			checkClose(t, fmt.Sprintf("rank %d epoch %d (%v)", me, ep, took), got, want, 1e-2)
		}
		closeIPC(t, a, peer, pws)
	})
}

// TestMoEFusedRankLocalStreams: the rank-local launches of R ranks in ONE
// process on one GPU, each on its own stream with SMs/R CTAs (so that all
// of them are co-resident), the peers' workspaces being plain local
// buffers; several epochs on the same workspaces. Each rank's output
// matches the CPU reference and is bit-identical to the emulated
// single-launch MoEFused on the same inputs. Routed cases give the
// rank-local calls a router (MoEFusedArgs.Router: each call routes its own
// rank's tokens before its plan pushes their ids to the peers): the ids they
// write must be moe.Route's, and the emulated launch runs on those ids.
func TestMoEFusedRankLocalStreams(t *testing.T) {
	g := testGPU(t)
	sms := g.Info().SMs
	cases := []struct {
		name   string
		E, K   int
		tokens []int
		H, I   int
		tile   int
		routed bool
	}{
		{"R2_E16_K4_T37_50", 16, 4, []int{37, 50}, 256, 128, 0, false},
		{"R2_E8_K2_T300_200_tile64", 8, 2, []int{300, 200}, 256, 128, 64, false},
		{"R2_E8_K2_T300_200_tile128", 8, 2, []int{300, 200}, 256, 128, 128, false},
		{"R4_E64_K8_T33_0_16_50", 64, 8, []int{33, 0, 16, 50}, 256, 128, 0, false},
		{"R2_E16_K4_T37_50_routed", 16, 4, []int{37, 50}, 256, 128, 0, true},
		{"R2_E16_K4_T3_8_routed", 16, 4, []int{3, 8}, 256, 128, 0, true},
		{"R4_E64_K8_T33_0_16_64_routed", 64, 8, []int{33, 0, 16, 64}, 256, 128, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			R := len(c.tokens)
			if sms < 2*R {
				t.Skipf("%d SMs for %d ranks", sms, R)
			}
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			r := rand.New(rand.NewPCG(seed, 1))
			pl := MoEBlockPlacement(c.E, R)
			table, err := pl.Table()
			if err != nil {
				t.Fatal(err)
			}
			slotExp := pl.SlotExperts()
			H, I, K := c.H, c.I, c.K
			gub16, gu, dnb16, dn := randExperts(r, c.E, H, I)
			cfg := moe.RouterConfig{NumExperts: c.E, TopK: K, Scoring: moe.Softmax, NormTopK: true}
			args := MoEFusedArgs{Tokens: c.tokens, Slots: pl.Slots, Experts: c.E, TopK: K, H: H, I: I,
				CTAs: sms / R, Timeout: 5 * time.Second, Tile: c.tile}
			onGPU(t, g, func(a *arena) {
				ctlBytes, rankBytes, _, err := a.d.MoEFusedWorkspace(args, false)
				a.check(err)
				if a.err != nil {
					return
				}
				args.Table = put(a, table)
				ranks := make([]MoEFusedRank, R)
				ws := make([]*Buffer, R)
				ctls := make([]*Buffer, R)
				streams := make([]*Stream, R)
				for q := range R {
					ctls[q] = put(a, make([]int32, ctlBytes/4))
					ws[q] = put(a, bf16Fill(int(rankBytes[q]/2), 0xffff))
					ranks[q].WS = ws[q]
					if pl.Slots[q] > 0 {
						gu16, dn16 := slotWeights(gub16, dnb16, slotExp[q], H, I)
						ranks[q].GateUp, ranks[q].Down = put(a, gu16), put(a, dn16)
					}
					s, err := a.d.NewStream()
					a.check(err)
					streams[q] = s
					if s != nil {
						defer s.Destroy()
					}
				}
				emuCtl := put(a, make([]int32, ctlBytes/4))
				emuWS := make([]*Buffer, R)
				for q := range R {
					emuWS[q] = a.alloc(rankBytes[q])
				}
				for ep := 1; ep <= 3 && a.err == nil; ep++ {
					xs := make([][]float32, R)
					ids := make([][]int32, R)
					ws8 := make([][]float32, R)
					for q := range R {
						T := c.tokens[q]
						if T == 0 {
							continue
						}
						var xb []uint16
						xb, xs[q] = randBF16(r, T*H, 1)
						logits := randF32(r, T*c.E, 1)
						ids[q], ws8[q] = moe.Route(&cfg, logits, nil, T)
						ranks[q].X = put(a, xb)
						if c.routed { // written by the call: poisoned
							ranks[q].Logits = put(a, logits)
							ranks[q].IDs = put(a, f32Fill(T*K, math.Float32frombits(0xffffffff)))
							ranks[q].Weights = put(a, f32Fill(T*K, float32(math.NaN())))
						} else {
							ranks[q].IDs, ranks[q].Weights = put(a, ids[q]), put(a, ws8[q])
						}
						ranks[q].Out = put(a, f32Fill(T*H, float32(math.NaN())))
					}
					if a.err != nil {
						return
					}
					la := args
					if c.routed {
						rt := moeRouter(cfg)
						la.Router = &rt
					}
					for q := range R {
						a.check(a.d.MoEFusedRankLocal(streams[q], q, ranks[q], ws, ctls[q], la, ep))
					}
					for q := range R {
						if a.err == nil {
							if err := a.d.MoEFusedCheck(ctls[q]); err != nil {
								t.Errorf("epoch %d rank %d: %v", ep, q, err)
							}
						}
					}
					local := make([][]float32, R)
					for q := range R {
						if T := c.tokens[q]; T > 0 && c.routed && a.err == nil {
							gi, gw := get[int32](a, ranks[q].IDs, T*K), get[float32](a, ranks[q].Weights, T*K)
							for i := range gi {
								if gi[i] != ids[q][i] || math.Abs(float64(gw[i]-ws8[q][i])) > 1e-6 {
									t.Errorf("epoch %d rank %d: assignment %d routed to %d (%v), moe.Route: %d (%v)",
										ep, q, i, gi[i], gw[i], ids[q][i], ws8[q][i])
									break
								}
							}
						}
						if c.tokens[q] > 0 {
							local[q] = get[float32](a, ranks[q].Out, c.tokens[q]*H)
							a.check(Upload(a.d, ranks[q].Out, f32Fill(c.tokens[q]*H, float32(math.NaN()))))
						}
					}
					emu := make([]MoEFusedRank, R)
					for q := range R {
						emu[q] = ranks[q]
						emu[q].WS = emuWS[q]
					}
					emuArgs := args
					emuArgs.CTAs = 0
					a.check(a.d.MoEFused(nil, emu, emuCtl, emuArgs))
					if a.err == nil {
						if err := a.d.MoEFusedCheck(emuCtl); err != nil {
							t.Errorf("epoch %d emulated: %v", ep, err)
						}
					}
					for q := range R {
						T := c.tokens[q]
						if T == 0 || a.err != nil {
							continue
						}
						e := get[float32](a, ranks[q].Out, T*H)
						name := fmt.Sprintf("epoch %d rank %d", ep, q)
						checkClose(t, name, local[q], moeRef(xs[q], gu, nil, dn, nil, ids[q], ws8[q], T, K, H, I,
							moe.Activation{Kind: moe.SwiGLU}), 1e-2)
						for i := range e {
							if math.Float32bits(e[i]) != math.Float32bits(local[q][i]) {
								t.Errorf("%s: element %d: rank-local %v, emulated %v", name, i, local[q][i], e[i])
								break
							}
						}
					}
				}
			})
		})
	}
}

// TestMoEFusedRecord (CPU): the error record's words decode to the report
// naming rank, role and tile, the rank-local roles included.
func TestMoEFusedRecord(t *testing.T) {
	if err := moeFusedRecord(make([]int32, moeFusedErrWords)); err != nil {
		t.Fatalf("an unset record: %v", err)
	}
	for _, c := range []struct {
		role       int32
		name, what string
	}{
		{1, "compute (gemm1)", "dispatch"}, {2, "compute (gemm2)", "gemm1"}, {3, "combine", "gemm2"},
		{4, "plan", "routing"}, {5, "dispatch or combine", "peer plan"},
		{7, "compute (wgmma CTA)", "its own stage or task ring"}, {9, "role 9", "?"},
	} {
		rec := []int32{1, 1, c.role, -1, -1, 7, 0, 0}
		var te *MoEFusedTimeoutError
		if err := moeFusedRecord(rec); !errors.As(err, &te) {
			t.Fatalf("role %d: %v", c.role, err)
		}
		if te.Rank != 1 || te.Role != c.name || te.WaitedFor != c.what || te.Tile != -1 || te.Seen != -1 || te.Want != 7 {
			t.Errorf("role %d: %+v", c.role, *te)
		}
		if !strings.Contains(te.Error(), "rank 1 "+c.name) {
			t.Errorf("role %d: %q does not name the rank and role", c.role, te.Error())
		}
	}
	var ce *MoEFusedCapacityError
	if err := moeFusedRecord([]int32{1, 3, 6, -1, 4224, 4096, 0, 0}); !errors.As(err, &ce) ||
		ce.Rank != 3 || ce.Rows != 4224 || ce.Cap != 4096 || !strings.Contains(ce.Error(), "rank 3") {
		t.Errorf("role 6: %v (%+v)", err, ce)
	}
}
