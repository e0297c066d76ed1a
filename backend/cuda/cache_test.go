package cuda

import (
	"testing"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend/cpu"
)

// TestRoPEPositionsOnce: RoPE calls with the same positions (every layer's
// q and k in a step) upload them once, new positions upload again, and the
// results match the CPU backend each time (a stale cached buffer would not).
func TestRoPEPositionsOnce(t *testing.T) {
	be := gpuBackend(t)
	cb := cpu.New(cpu.Options{})
	g := newGen(0x7093, false)
	rope := &attention.RoPE{Dim: 16, Theta: 10000}
	steps := [][]int32{{3, 4, 5, 900}, {3, 4, 5, 900}, {4, 5, 6, 901}, {0, 1, 2}}
	wantUploads := []int{1, 0, 1, 1}
	for si, pos := range steps {
		before := be.posCache.uploads
		for call := 0; call < 3; call++ {
			x := g.f32(1, len(pos), 2*16)
			got := be.ToHost(be.RoPE(W(t, be, x), 2, 16, rope, pos))
			want := cb.ToHost(cb.RoPE(W(t, cb, x), 2, 16, rope, pos))
			if e := relL2(got, want); !(e <= 1e-6) {
				t.Errorf("step %d call %d: relative L2 %.3g > 1e-6", si, call, e)
			}
		}
		if n := be.posCache.uploads - before; n != wantUploads[si] {
			t.Errorf("step %d: %d position uploads for 3 calls, want %d", si, n, wantUploads[si])
		}
	}
}
