package transport

import (
	"context"
	"errors"
)

// Comm is one rank's endpoint in a world of Size ranks.
//
// Calls are collective: every rank makes the same sequence of calls, and a
// rank makes one call at a time. The payload is host float32; a backend that
// moves device memory (CUDA IPC, RDMA proxy, NCCL) stages through or maps
// these buffers, or adds a device-buffer interface of its own beside this one.
type Comm interface {
	// Rank is this endpoint's index in [0, Size).
	Rank() int
	// Size is the number of ranks.
	Size() int
	// AllToAllV sends send[r] to rank r (len(send) == Size; an empty or nil
	// slice sends nothing) and returns recv, where recv[r] is what rank r
	// sent to this rank. The send slices may be reused as soon as the call
	// returns; recv belongs to the caller. When ctx ends, or any rank of the
	// world fails, the call returns an error instead of waiting; after an
	// error the world is aborted and every later call fails (as with an
	// aborted NCCL communicator): build a new world.
	AllToAllV(ctx context.Context, send [][]float32) (recv [][]float32, err error)
}

// ErrAborted is wrapped by every error a Comm returns once its world has
// been aborted by an earlier failure.
var ErrAborted = errors.New("transport: world aborted")
