package tensor

import (
	"math"
	"testing"
)

func TestToBF16(t *testing.T) {
	v := []float32{1, -2.5, 1 + 1.0/256, 3.0e38, float32(math.NaN()), 0}
	h := ToBF16(FromFloat32("x", []int{2, 3}, v))
	if h.DType != BF16 || h.Len() != 6 || h.Name != "x" {
		t.Fatalf("%s %v %q", h.DType, h.Shape, h.Name)
	}
	got, err := h.Float32()
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range v {
		want := BF16ToF32(F32ToBF16(x))
		if got[i] != want && !(x != x && got[i] != got[i]) {
			t.Errorf("[%d] %v → %v, want %v", i, x, got[i], want)
		}
	}
	if got[2] != 1 { // 1 + 2^-8 is a tie: rounds to even (1)
		t.Errorf("1+2^-8 rounded to %v, want 1", got[2])
	}
	b := &Host{DType: BF16, Data: []byte{1, 2}}
	if ToBF16(b) != b {
		t.Error("a BF16 tensor was copied")
	}
}
