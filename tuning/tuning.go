// Package tuning stores launch parameters measured on a device, as data
// keyed by the device and the problem's shape: what `mkserve bench moe
// --tune` picks for the fused MoE kernel (persistent CTAs, CTAs starting on
// the dispatch role, per token count) and the CUDA backend reads back.
package tuning

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
)

// MoEKey is a fused MoE layer's shape on a device.
type MoEKey struct {
	Device       string `json:"device"` // kernels.DeviceInfo.Name, e.g. "NVIDIA H200"
	Hidden       int    `json:"hidden"`
	Intermediate int    `json:"intermediate"`
	Experts      int    `json:"experts"`
	TopK         int    `json:"topk"`
	Ranks        int    `json:"ranks"`
}

// MoEChoice is the best launch found for one token count (per rank).
type MoEChoice struct {
	Tokens       int     `json:"tokens"`
	Tile         int     `json:"tile,omitempty"` // row tile (kernels.MoEFusedArgs.Tile; 0: picked)
	CTAs         int     `json:"ctas"`           // persistent CTAs (0: every co-resident one)
	DispatchCTAs int     `json:"dispatch_ctas"`  // CTAs starting on the dispatch role (0: all)
	MS           float64 `json:"ms"`             // its measured median time
}

// MoEEntry is one shape's choices, by ascending token count.
type MoEEntry struct {
	MoEKey
	Choices []MoEChoice `json:"choices"`
}

// MoETable is every tuned shape.
type MoETable struct {
	Entries []MoEEntry `json:"moe_fused"`
}

// LoadMoE reads a table written by Save. A missing file is an empty table.
func LoadMoE(path string) (*MoETable, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &MoETable{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tuning: %w", err)
	}
	var t MoETable
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("tuning: %s: %w", path, err)
	}
	for _, e := range t.Entries {
		for _, c := range e.Choices {
			if c.Tokens <= 0 || c.CTAs < 0 || c.DispatchCTAs < 0 || (c.Tile != 0 && c.Tile != 16 && c.Tile != 64 && c.Tile != 128) {
				return nil, fmt.Errorf("tuning: %s: %+v: bad choice %+v", path, e.MoEKey, c)
			}
		}
	}
	return &t, nil
}

// Save writes the table as indented JSON.
func (t *MoETable) Save(path string) error {
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// Put records c for key, replacing a choice for the same token count.
func (t *MoETable) Put(key MoEKey, c MoEChoice) {
	i := slices.IndexFunc(t.Entries, func(e MoEEntry) bool { return e.MoEKey == key })
	if i < 0 {
		t.Entries = append(t.Entries, MoEEntry{MoEKey: key})
		i = len(t.Entries) - 1
	}
	e := &t.Entries[i]
	e.Choices = slices.DeleteFunc(e.Choices, func(x MoEChoice) bool { return x.Tokens == c.Tokens })
	e.Choices = append(e.Choices, c)
	slices.SortFunc(e.Choices, func(a, b MoEChoice) int { return a.Tokens - b.Tokens })
}

// Lookup returns the choice for key at tokens per rank: the one tuned for
// the smallest token count at or above tokens, else for the largest below.
// ok is false when key was never tuned (or t is nil).
func (t *MoETable) Lookup(key MoEKey, tokens int) (c MoEChoice, ok bool) {
	if t == nil {
		return c, false
	}
	i := slices.IndexFunc(t.Entries, func(e MoEEntry) bool { return e.MoEKey == key })
	if i < 0 || len(t.Entries[i].Choices) == 0 {
		return c, false
	}
	ch := t.Entries[i].Choices
	for _, x := range ch {
		if x.Tokens >= tokens {
			return x, true
		}
	}
	return ch[len(ch)-1], true
}
