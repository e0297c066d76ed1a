package tuning

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMoETable: choices are kept sorted and replaced per token count, a
// lookup takes the nearest tuned count at or above (else the largest), keys
// differ by device and shape, and a saved table loads back equal.
func TestMoETable(t *testing.T) {
	k := MoEKey{Device: "NVIDIA H200", Hidden: 2048, Intermediate: 768, Experts: 128, TopK: 8, Ranks: 8}
	var tb MoETable
	tb.Put(k, MoEChoice{Tokens: 256, CTAs: 0, DispatchCTAs: 32, MS: 1.2})
	tb.Put(k, MoEChoice{Tokens: 16, CTAs: 132, DispatchCTAs: 8, MS: 0.7})
	tb.Put(k, MoEChoice{Tokens: 256, CTAs: 0, DispatchCTAs: 16, MS: 1.1}) // replaces
	for _, c := range []struct{ tokens, wantDisp int }{{1, 8}, {16, 8}, {17, 16}, {256, 16}, {9999, 16}} {
		got, ok := tb.Lookup(k, c.tokens)
		if !ok || got.DispatchCTAs != c.wantDisp {
			t.Errorf("Lookup(%d) = %+v, %v; want dispatch %d", c.tokens, got, ok, c.wantDisp)
		}
	}
	other := k
	other.Device = "NVIDIA H100"
	if _, ok := tb.Lookup(other, 16); ok {
		t.Error("another device's key found")
	}
	if _, ok := (*MoETable)(nil).Lookup(k, 16); ok {
		t.Error("nil table found a choice")
	}
	path := filepath.Join(t.TempDir(), "moe.json")
	if err := tb.Save(path); err != nil {
		t.Fatal(err)
	}
	back, err := LoadMoE(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Entries) != 1 || len(back.Entries[0].Choices) != 2 || back.Entries[0].Choices[0].Tokens != 16 {
		t.Errorf("loaded %+v", back)
	}
	if empty, err := LoadMoE(filepath.Join(t.TempDir(), "none.json")); err != nil || len(empty.Entries) != 0 {
		t.Errorf("missing file: %+v, %v", empty, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"moe_fused":[{"device":"x","choices":[{"tokens":0}]}]}`), 0o644)
	if _, err := LoadMoE(bad); err == nil {
		t.Error("a choice for 0 tokens loaded")
	}
	os.WriteFile(bad, []byte(`{"moe_fused":[{"device":"x","choices":[{"tokens":4,"tile":32}]}]}`), 0o644)
	if _, err := LoadMoE(bad); err == nil {
		t.Error("a choice with a 32-row tile loaded")
	}
	os.WriteFile(bad, []byte(`{`), 0o644)
	if _, err := LoadMoE(bad); err == nil {
		t.Error("broken JSON loaded")
	}
}
