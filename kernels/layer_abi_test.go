package kernels

import (
	"strings"
	"testing"
)

// TestLayerABINext checks how Layer.abi takes the next layer's q/k/v
// weights (a prefetch hint): all three or none, each of this layer's
// sizes, copied into mk_layer. It needs no GPU: the buffers are host-side
// stand-ins with addresses and sizes only.
func TestLayerABINext(t *testing.T) {
	const H, HQ, KV, D, E, K, I = 64, 4, 2, 128, 8, 2, 32
	var next uint64 = 1 << 20
	buf := func(bytes int64) *Buffer {
		next += 1 << 20
		return &Buffer{ptr: next, bytes: bytes}
	}
	base := func() *Layer {
		return &Layer{Hidden: H, Heads: HQ, KVHeads: KV, HeadDim: D, Experts: E, TopK: K, Inter: I, BlockSize: 16,
			X: buf(H * 4), Out: buf(H * 4), InNorm: buf(H * 4), PostNorm: buf(H * 4),
			WQ: buf(HQ * D * H * 2), WK: buf(KV * D * H * 2), WV: buf(KV * D * H * 2), WO: buf(H * HQ * D * 2),
			PoolK: buf(KV * D * 2 * 64), PoolV: buf(KV * D * 2 * 64), Blocks: buf(64), Pos: buf(4), Table: buf(4),
			Slot: buf(4), RoPEPos: buf(4), Gate: buf(E * H * 2), GateUp: buf(E * 2 * I * H * 2),
			Down: buf(E * H * I * 2), Work: buf(1 << 10), Sync: buf(LayerSyncBytes)}
	}
	cases := []struct {
		name string
		set  func(l *Layer)
		err  string // "" : no error
	}{
		{"none", func(l *Layer) {}, ""},
		{"all", func(l *Layer) {
			l.NextWQ, l.NextWK, l.NextWV = buf(HQ*D*H*2), buf(KV*D*H*2), buf(KV*D*H*2)
		}, ""},
		{"only q", func(l *Layer) { l.NextWQ = buf(HQ * D * H * 2) }, "all set or all nil"},
		{"q and k", func(l *Layer) { l.NextWQ, l.NextWK = buf(HQ*D*H*2), buf(KV*D*H*2) }, "all set or all nil"},
		{"short v", func(l *Layer) {
			l.NextWQ, l.NextWK, l.NextWV = buf(HQ*D*H*2), buf(KV*D*H*2), buf(KV*D*H*2-2)
		}, "NextWV holds"},
		{"short q", func(l *Layer) {
			l.NextWQ, l.NextWK, l.NextWV = buf(HQ*D*H), buf(KV*D*H*2), buf(KV*D*H*2)
		}, "NextWQ holds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l := base()
			c.set(l)
			m, err := l.abi("LayerDecode", true)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := [3]uint64{}
			if l.NextWQ != nil {
				want = [3]uint64{l.NextWQ.ptr, l.NextWK.ptr, l.NextWV.ptr}
			}
			if got := [3]uint64{m.nextWQ, m.nextWK, m.nextWV}; got != want {
				t.Fatalf("next pointers %v, want %v", got, want)
			}
			if m.wq != l.WQ.ptr || m.sync != l.Sync.ptr {
				t.Fatalf("wq %#x sync %#x, want %#x %#x", m.wq, m.sync, l.WQ.ptr, l.Sync.ptr)
			}
		})
	}
}
