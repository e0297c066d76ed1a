package cpu

import (
	"sync"
	"testing"

	"github.com/mkserve/mkserve/transport"
)

// processWorld joins R ranks over gRPC on loopback, as R processes would.
func processWorld(t *testing.T, R int) []*transport.GRPCComm { return transport.LoopbackForTest(t, R) }

// TestMoEAcrossProcesses: R backends, each one rank of a process world
// (Options.EPComm) holding only its experts, compute every MoE case's
// output as one backend does, over several calls.
func TestMoEAcrossProcesses(t *testing.T) {
	for _, c := range moeCases {
		t.Run(c.name, func(t *testing.T) {
			r := newRand(t)
			_, l := c.build(r)
			const R = 3
			comms := processWorld(t, R)
			ranks := make([]*Backend, R)
			for i := range R {
				ranks[i] = New(Options{EPComm: comms[i]})
			}
			one := New(Options{})
			for call := 0; call < 2; call++ {
				x := randT(r, c.T+call, c.H)
				want := data(t, one.MoE(x, l))
				got := make([][]float32, R)
				var wg sync.WaitGroup
				for i := range R {
					wg.Add(1)
					go func() {
						defer wg.Done()
						got[i] = data(t, ranks[i].MoE(x, l))
					}()
				}
				wg.Wait()
				for i := range R {
					if d := maxRelDiff(got[i], want); !(d <= 1e-5) {
						t.Fatalf("call %d rank %d: differs from one backend by %g relative", call, i, d)
					}
				}
			}
			if n := len(ranks[0].epRanks); n != 1 {
				t.Errorf("%d process-world ranks cached for one layer, want 1", n)
			}
		})
	}
}
