package backend

import (
	"fmt"
	"slices"

	"github.com/mkserve/mkserve/tensor"
)

// WeightShape checks a host tensor handed to Backend.Weight (F32, F16 or
// BF16, no negative dims, bytes matching shape × dtype) and returns the 2-D
// (or 1-D) shape the backend stores it as: more than 2 dims flatten to
// [shape[0]*...*shape[n-2], shape[n-1]], a scalar becomes [1]. Errors name
// the tensor.
func WeightShape(h *tensor.Host) ([]int, error) {
	if h == nil {
		return nil, fmt.Errorf("weight: nil host tensor")
	}
	if !h.DType.Float() {
		return nil, fmt.Errorf("weight %q: dtype %s cannot be converted to float32", h.Name, h.DType)
	}
	for _, d := range h.Shape {
		if d < 0 {
			return nil, fmt.Errorf("weight %q: negative dimension in shape %v", h.Name, h.Shape)
		}
	}
	if len(h.Data) != h.Len()*h.DType.Size() {
		return nil, fmt.Errorf("weight %q: %d bytes for shape %v of %s", h.Name, len(h.Data), h.Shape, h.DType)
	}
	switch n := len(h.Shape); {
	case n == 1 || n == 2:
		return slices.Clone(h.Shape), nil
	case n > 2:
		return []int{tensor.NumElements(h.Shape[:n-1]), h.Shape[n-1]}, nil
	}
	return []int{1}, nil
}
