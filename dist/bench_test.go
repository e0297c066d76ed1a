package dist

import (
	"context"
	"fmt"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/models"
)

// BenchmarkWorldDecode: decode steps of the default model (batch 1 and 16,
// 64 cached tokens) on one process and on a world of R ranks over gRPC on
// loopback (the leader's Forward broadcast plus two exchanges per MoE layer,
// all ranks on this machine's cores): the transport's cost per step.
func BenchmarkWorldDecode(b *testing.B) {
	const dir = "../models/default"
	for _, R := range []int{1, 2, 4} {
		for _, B := range []int{1, 16} {
			b.Run(fmt.Sprintf("ranks=%d/batch=%d", R, B), func(b *testing.B) {
				forward := func(m models.Model, bt *backend.Batch) {
					if _, err := m.Forward(bt); err != nil {
						b.Fatal(err)
					}
				}
				var leaderModel models.Model
				var lbe backend.Backend
				if R == 1 {
					be := cpu.New(cpu.Options{})
					l, err := models.Load(dir, be, models.LoadOptions{})
					if err != nil {
						b.Fatal(err)
					}
					leaderModel, lbe = l.Model, be
				} else {
					comms := world(b, R)
					for r := 1; r < R; r++ {
						be := cpu.New(cpu.Options{EPComm: comms[r]})
						l, err := models.Load(dir, be, models.LoadOptions{})
						if err != nil {
							b.Fatal(err)
						}
						go Work(context.Background(), comms[r], l.Model, be)
					}
					be := cpu.New(cpu.Options{EPComm: comms[0]})
					l, err := models.Load(dir, be, models.LoadOptions{})
					if err != nil {
						b.Fatal(err)
					}
					leader, _ := NewLeader(comms[0])
					leaderModel, lbe = leader.Model(l.Model), leader.Backend(be)
					b.Cleanup(func() { leader.Stop() })
				}
				const ctx = 64
				if err := lbe.InitKV(16, B*(ctx/16+2)); err != nil {
					b.Fatal(err)
				}
				blocks := func(s int) []int32 {
					v := make([]int32, ctx/16+2)
					for i := range v {
						v[i] = int32(s*len(v) + i)
					}
					return v
				}
				for s := range B { // prefill each sequence's context
					ids := make([]int32, ctx)
					for i := range ids {
						ids[i] = int32((i*31 + s*7) % 4096)
					}
					bt := backend.SingleSequence(uint64(s), ids, 0, false)
					bt.Seqs[0].Blocks = blocks(s)
					forward(leaderModel, bt)
				}
				step := func() {
					bt := &backend.Batch{}
					for s := range B {
						bt.Tokens = append(bt.Tokens, int32(s+1))
						bt.Positions = append(bt.Positions, ctx)
						bt.Seqs = append(bt.Seqs, backend.SeqSpan{ID: uint64(s), Offset: s, Len: 1, Past: ctx, Blocks: blocks(s)})
					}
					forward(leaderModel, bt)
				}
				step()
				b.ResetTimer()
				for range b.N {
					step()
				}
				b.ReportMetric(float64(B*b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
