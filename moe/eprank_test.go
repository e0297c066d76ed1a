package moe

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/mkserve/mkserve/transport"
)

// grpcWorld joins R ranks over gRPC on loopback, as R processes would.
func grpcWorld(t *testing.T, R int) []*transport.GRPCComm { return transport.LoopbackForTest(t, R) }

// TestEPRankOverGRPC: R ranks, each holding only its experts and talking
// over gRPC, compute what Experts.Forward computes, with the contiguous
// table and with replicas of a hot expert, over several calls; each rank
// serves only rows of experts it holds.
func TestEPRankOverGRPC(t *testing.T) {
	r := newRand(t)
	const H, I, E, K = 12, 6, 8, 2
	ex := randExperts(r, E, H, I, Activation{Kind: SwiGLU}, true)
	for _, R := range []int{2, 4} {
		tables := map[string]*Table{"contiguous": NewTable(E, R)}
		load := make([]int64, E)
		load[3] = 100
		p, err := Rebalance(load, R, E/R+1)
		if err != nil {
			t.Fatal(err)
		}
		tables["replicated"] = p.Table()
		for name, tb := range tables {
			t.Run(fmt.Sprintf("R=%d/%s", R, name), func(t *testing.T) {
				comms := grpcWorld(t, R)
				ranks := make([]*EPRank, R)
				for i, c := range comms {
					if ranks[i], err = NewEPRank(tb, ex, c); err != nil {
						t.Fatal(err)
					}
				}
				for call, T := range []int{1, 7, 33} {
					x := randn(r, T*H, 1)
					ids, w := randRouting(r, T, K, E)
					want := make([]float32, T*H)
					ex.Forward(want, x, T, K, ids, w)
					outs := make([][]float32, R)
					errs := make([]error, R)
					var wg sync.WaitGroup
					for i := range R {
						outs[i] = randn(r, T*H, 3) // garbage: Forward overwrites
						wg.Add(1)
						go func() {
							defer wg.Done()
							errs[i] = ranks[i].Forward(context.Background(), outs[i], x, T, K, ids, w)
						}()
					}
					wg.Wait()
					for i := range R {
						if errs[i] != nil {
							t.Fatalf("call %d rank %d: %v", call, i, errs[i])
						}
						if e := relL2(outs[i], want); !(e <= 1e-5) {
							t.Fatalf("call %d rank %d: relative L2 %.3g vs Experts.Forward", call, i, e)
						}
					}
				}
				var total uint64
				for _, rk := range ranks {
					total += rk.Rows()
				}
				if want := uint64((1 + 7 + 33) * K); total != want {
					t.Errorf("ranks computed %d rows, want %d", total, want)
				}
			})
		}
	}
}
