package backend

import "fmt"

// SplitShape checks SplitCols's arguments and returns a head's width in x,
// Σsizes.
func SplitShape(heads int, sizes []int) (sum int, err error) {
	for _, s := range sizes {
		if s < 0 {
			return 0, fmt.Errorf("negative size in %v", sizes)
		}
		sum += s
	}
	if heads <= 0 {
		return 0, fmt.Errorf("heads = %d, want > 0", heads)
	}
	return sum, nil
}

// ConcatShape checks ConcatCols's arguments given each part's [rows, cols]
// and returns the rows T, the output width heads·Σsizes, and which parts hold
// a single head broadcast to every head. The error names the bad part.
func ConcatShape(heads int, dims [][2]int, sizes []int) (T, width int, bcast []bool, err error) {
	if len(dims) != len(sizes) || len(dims) == 0 {
		return 0, 0, nil, fmt.Errorf("%d parts for %d sizes", len(dims), len(sizes))
	}
	if heads <= 0 {
		return 0, 0, nil, fmt.Errorf("heads = %d, want > 0", heads)
	}
	bcast = make([]bool, len(dims))
	sum := 0
	T = -1
	for i, d := range dims {
		r, c := d[0], d[1]
		switch {
		case sizes[i] < 0:
			return 0, 0, nil, fmt.Errorf("negative size in %v", sizes)
		case c == heads*sizes[i]:
		case c == sizes[i]:
			bcast[i] = true
		default:
			return 0, 0, nil, fmt.Errorf("parts[%d] has shape [%d %d], want %d or %d columns (heads %d, size %d)",
				i, r, c, heads*sizes[i], sizes[i], heads, sizes[i])
		}
		if T >= 0 && r != T {
			return 0, 0, nil, fmt.Errorf("parts[%d] has %d rows, parts[0] %d", i, r, T)
		}
		T = r
		sum += sizes[i]
	}
	return T, heads * sum, bcast, nil
}
