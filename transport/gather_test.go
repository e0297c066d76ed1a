package transport

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestAllGatherBytes: over a loopback gRPC world of 3 ranks, every rank gets
// every rank's bytes unchanged, NaN bit patterns included (IPC handles are
// arbitrary bytes); a length that is not a word multiple fails.
func TestAllGatherBytes(t *testing.T) {
	const R = 3
	comms := LoopbackForTest(t, R)
	data := make([][]byte, R)
	for r := range data {
		data[r] = make([]byte, 64)
		rng := rand.New(rand.NewPCG(uint64(r), 9))
		for i := range data[r] {
			data[r][i] = byte(rng.Uint32())
		}
		copy(data[r][:4], []byte{0x01, 0x00, 0xc0, 0x7f}) // a signalling-style NaN word
	}
	got := make([][][]byte, R)
	var wg sync.WaitGroup
	for r := range R {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if got[r], err = AllGatherBytes(context.Background(), comms[r], data[r]); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for r := range R {
		for s := range R {
			if !bytes.Equal(got[r][s], data[s]) {
				t.Errorf("rank %d got %x from rank %d, which sent %x", r, got[r][s], s, data[s])
			}
		}
	}
	if _, err := AllGatherBytes(context.Background(), comms[0], make([]byte, 6)); err == nil {
		t.Error("6 bytes accepted")
	}
}
