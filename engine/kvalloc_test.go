package engine_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
)

// kvAllocBackend is the CPU backend claiming a 2-byte KV element and
// recording AllocKV's widths, or failing it.
type kvAllocBackend struct {
	*cpu.Backend
	widths []backend.KVWidth
	fail   error
}

func (b *kvAllocBackend) KVElemBytes() int { return 2 }

func (b *kvAllocBackend) AllocKV(w []backend.KVWidth) error {
	b.widths = slices.Clone(w)
	return b.fail
}

// TestKVAllocatedUpFront: a backend that allocates its KV cache up front
// gets every attention layer's widths when the engine starts, the block
// count follows its element size (2 bytes: twice the blocks of float32),
// and an allocation failure is the engine's start-up error.
func TestKVAllocatedUpFront(t *testing.T) {
	f := load(t)
	cfg := engine.Config{BlockSize: 4, KVCacheBytes: 1 << 20}
	plain := newEngine(t, f, cfg)
	b := &kvAllocBackend{Backend: cpu.New(cpu.Options{})}
	e, err := engine.New(f.m.Model, b, f.tok, cfg, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer shutdown(t, e)
	if want := f.m.Model.KVWidths(); len(want) == 0 || !slices.Equal(b.widths, want) {
		t.Errorf("AllocKV got %v, the model has %v", b.widths, want)
	}
	if p, h := plain.Stats().BlocksFree, e.Stats().BlocksFree; h != 2*p && h != 2*p+1 { // both rounded down
		t.Errorf("%d blocks with 2-byte elements, %d with float32: want twice as many", h, p)
	}
	n := 0
	for _, w := range f.m.Model.KVWidths() {
		n += w.K + w.V
	}
	if n != f.m.Model.KVFloatsPerToken() {
		t.Errorf("KVWidths sum to %d, KVFloatsPerToken is %d", n, f.m.Model.KVFloatsPerToken())
	}
	b2 := &kvAllocBackend{Backend: cpu.New(cpu.Options{}), fail: errors.New("out of memory")}
	if _, err := engine.New(f.m.Model, b2, f.tok, cfg, engine.Options{Name: "t"}); err == nil ||
		!strings.Contains(err.Error(), "out of memory") || !strings.Contains(err.Error(), "kv_cache_bytes") {
		t.Errorf("failed allocation: %v, want an error naming kv_cache_bytes and the cause", err)
	}
}
