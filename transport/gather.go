package transport

import (
	"context"
	"fmt"
	"math"
)

// AllGatherBytes sends b to every rank of c and returns what each rank
// sent, indexed by rank (this rank's own b included). Every rank must call
// it with the same length, a multiple of 4 (the bytes travel as float32 bit
// patterns, unchanged). The multi-process GPU world exchanges its CUDA IPC
// handles (kernels.IPCHandle) this way at start-up.
func AllGatherBytes(ctx context.Context, c Comm, b []byte) ([][]byte, error) {
	if len(b)%4 != 0 {
		return nil, fmt.Errorf("transport: AllGatherBytes of %d bytes, not a multiple of 4", len(b))
	}
	words := make([]float32, len(b)/4)
	for i := range words {
		words[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
	}
	send := make([][]float32, c.Size())
	for r := range send {
		if r != c.Rank() {
			send[r] = words
		}
	}
	recv, err := c.AllToAllV(ctx, send)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, c.Size())
	for r := range out {
		if r == c.Rank() {
			out[r] = append([]byte(nil), b...)
			continue
		}
		if len(recv[r]) != len(words) {
			return nil, fmt.Errorf("transport: AllGatherBytes: rank %d sent %d bytes, this rank %d", r, 4*len(recv[r]), len(b))
		}
		v := make([]byte, len(b))
		for i, w := range recv[r] {
			u := math.Float32bits(w)
			v[4*i], v[4*i+1], v[4*i+2], v[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
		}
		out[r] = v
	}
	return out, nil
}
