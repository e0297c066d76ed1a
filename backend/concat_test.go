package backend

import (
	"slices"
	"strings"
	"testing"
)

func TestConcatShape(t *testing.T) {
	T, w, b, err := ConcatShape(4, [][2]int{{3, 8}, {3, 5}, {3, 12}}, []int{2, 5, 3})
	if err != nil || T != 3 || w != 40 || !slices.Equal(b, []bool{false, true, false}) {
		t.Fatalf("T %d width %d bcast %v err %v", T, w, b, err)
	}
	for _, tc := range []struct {
		heads int
		dims  [][2]int
		sizes []int
		want  string
	}{
		{4, [][2]int{{3, 8}}, []int{2, 1}, "1 parts for 2 sizes"},
		{4, nil, nil, "0 parts"},
		{0, [][2]int{{3, 8}}, []int{2}, "heads = 0"},
		{4, [][2]int{{3, 8}}, []int{-2}, "negative size"},
		{4, [][2]int{{3, 7}}, []int{2}, "parts[0] has shape [3 7]"},
		{4, [][2]int{{3, 8}, {2, 8}}, []int{2, 2}, "parts[1] has 2 rows"},
	} {
		if _, _, _, err := ConcatShape(tc.heads, tc.dims, tc.sizes); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v %v: %v, want %q", tc.heads, tc.dims, tc.sizes, err, tc.want)
		}
	}
}
