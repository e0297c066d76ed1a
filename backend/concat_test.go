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

func TestSplitShape(t *testing.T) {
	for _, tc := range []struct {
		heads   int
		sizes   []int
		sum     int
		errWant string
	}{
		{heads: 4, sizes: []int{2, 5, 3}, sum: 10},
		{heads: 1, sizes: []int{0, 7}, sum: 7},
		{heads: 2, sizes: nil, sum: 0},
		{heads: 4, sizes: []int{2, -1}, errWant: "negative size"},
		{heads: 0, sizes: []int{2}, errWant: "heads = 0"},
	} {
		sum, err := SplitShape(tc.heads, tc.sizes)
		if tc.errWant != "" {
			if err == nil || !strings.Contains(err.Error(), tc.errWant) {
				t.Errorf("SplitShape(%d, %v) err %v, want %q", tc.heads, tc.sizes, err, tc.errWant)
			}
			continue
		}
		if err != nil || sum != tc.sum {
			t.Errorf("SplitShape(%d, %v) = %d, %v; want %d", tc.heads, tc.sizes, sum, err, tc.sum)
		}
	}
}
