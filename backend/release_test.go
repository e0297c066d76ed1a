package backend_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
)

// recorder is the cpu backend with a Release that records its arguments.
type recorder struct {
	*cpu.Backend
	got [][]backend.Tensor
}

func (r *recorder) Release(ts ...backend.Tensor) { r.got = append(r.got, ts) }

// TestRelease: backend.Release passes the dead tensors that are not also
// live, once each and without nils, and calls nothing when none is left or
// the backend has no Releaser.
func TestRelease(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	a, b, c := randT(r, 2, 3), randT(r, 2, 3), randT(r, 1)
	for _, tc := range []struct {
		name       string
		live, dead []backend.Tensor
		want       []backend.Tensor // nil: no call
	}{
		{"all dead", nil, []backend.Tensor{a, b}, []backend.Tensor{a, b}},
		{"an output that is an input", []backend.Tensor{b}, []backend.Tensor{a, b}, []backend.Tensor{a}},
		{"nils and repeats", []backend.Tensor{c}, []backend.Tensor{nil, a, a, nil, c}, []backend.Tensor{a}},
		{"nothing left", []backend.Tensor{a}, []backend.Tensor{a, nil}, nil},
	} {
		rec := &recorder{Backend: cpu.New(cpu.Options{})}
		backend.Release(rec, tc.live, tc.dead...)
		switch {
		case tc.want == nil && len(rec.got) != 0:
			t.Errorf("%s: Release called with %v, want no call", tc.name, rec.got)
		case tc.want != nil && (len(rec.got) != 1 || !slices.Equal(rec.got[0], tc.want)):
			t.Errorf("%s: Release calls %v, want one with %v", tc.name, rec.got, tc.want)
		}
	}
	backend.Release(cpu.New(cpu.Options{}), nil, a, b) // no Releaser: nothing happens
}
