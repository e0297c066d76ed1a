package backend

import (
	"maps"
	"testing"
)

// TestWeightBytes: totals, values, the dominant form and the bytes by form
// of a mix of forms (the cpu's FP4 group of 20 bytes).
func TestWeightBytes(t *testing.T) {
	w := WeightBytes{F32: 400, BF16: 2000, Q8: 72, FP4: 40, FP4Group: 20}
	if got := w.Total(); got != 2512 {
		t.Errorf("Total %d, want 2512", got)
	}
	if got := w.Values(); got != 100+1000+64+64 {
		t.Errorf("Values %d, want %d", got, 100+1000+64+64)
	}
	if got := w.Dominant(); got != "BF16" {
		t.Errorf("Dominant %q, want BF16", got)
	}
	if got, want := w.Forms(), map[string]int64{"f32": 400, "bf16": 2000, "q8": 72, "fp4": 40}; !maps.Equal(got, want) {
		t.Errorf("Forms %v, want %v", got, want)
	}
	if got := (WeightBytes{}).Dominant(); got != "" {
		t.Errorf("no weights: Dominant %q", got)
	}
}
