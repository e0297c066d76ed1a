package engine

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models"
)

// seqIDs hands out KV-cache keys unique within the process.
var seqIDs atomic.Uint64

// NewSeqID returns a fresh sequence id.
func NewSeqID() uint64 { return seqIDs.Add(1) }

// Logits runs the prompt in one step and returns every position's logits
// [len(ids)][vocab].
func Logits(m models.Model, be backend.Backend, ids []int32) ([][]float32, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("no token ids")
	}
	id := NewSeqID()
	defer be.FreeSequence(id)
	out, err := m.Forward(backend.SingleSequence(id, ids, 0, true))
	if err != nil {
		return nil, err
	}
	return rows(be.ToHost(out), len(ids)), nil
}

func rows(flat []float32, n int) [][]float32 {
	v := len(flat) / n
	out := make([][]float32, n)
	for i := range out {
		out[i] = flat[i*v : (i+1)*v : (i+1)*v]
	}
	return out
}

// GreedyOptions bound a greedy generation.
type GreedyOptions struct {
	MaxTokens int     // new tokens at most
	StopIDs   []int32 // generation ends after emitting one of these
	// ChunkSize splits the prompt into prefill steps of at most this many
	// tokens (0: one step), exercising chunked prefill.
	ChunkSize int
	// OnToken is called with each new token as soon as it is chosen.
	OnToken func(id int32)
}

// Greedy decodes argmax tokens after prompt and returns the new tokens.
func Greedy(ctx context.Context, m models.Model, be backend.Backend, prompt []int32, o GreedyOptions) ([]int32, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("empty prompt")
	}
	id := NewSeqID()
	defer be.FreeSequence(id)
	chunk := o.ChunkSize
	if chunk <= 0 {
		chunk = len(prompt)
	}
	var last []float32
	for past := 0; past < len(prompt); past += chunk {
		end := min(past+chunk, len(prompt))
		out, err := m.Forward(backend.SingleSequence(id, prompt[past:end], past, false))
		if err != nil {
			return nil, err
		}
		last = be.ToHost(out)
	}
	var gen []int32
	for len(gen) < o.MaxTokens {
		if err := ctx.Err(); err != nil {
			return gen, err
		}
		next := int32(Argmax(last))
		gen = append(gen, next)
		if o.OnToken != nil {
			o.OnToken(next)
		}
		if slices.Contains(o.StopIDs, next) || len(gen) == o.MaxTokens {
			break
		}
		out, err := m.Forward(backend.SingleSequence(id, []int32{next}, len(prompt)+len(gen)-1, false))
		if err != nil {
			return gen, err
		}
		last = be.ToHost(out)
	}
	return gen, nil
}

// Argmax is the index of the largest value (the first on ties; NaN never wins).
func Argmax(v []float32) int {
	best := -1
	for i, x := range v {
		if x != x { // NaN
			continue
		}
		if best < 0 || x > v[best] {
			best = i
		}
	}
	return max(best, 0)
}
