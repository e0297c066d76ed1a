package moe

import (
	"fmt"
	"strings"
	"testing"
)

func TestNewTableBlocks(t *testing.T) {
	cases := []struct {
		E, R int
		want [][]int // Local(r)
	}{
		{8, 1, [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
		{8, 2, [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}},
		{8, 3, [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7}}},
		{3, 5, [][]int{{0}, {1}, {2}, nil, nil}},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("E%d_R%d", tc.E, tc.R), func(t *testing.T) {
			tb := NewTable(tc.E, tc.R)
			if err := tb.Validate(); err != nil {
				t.Fatal(err)
			}
			for r := range tc.R {
				if got := tb.Local(r); fmt.Sprint(got) != fmt.Sprint(tc.want[r]) {
					t.Fatalf("Local(%d) = %v, want %v", r, got, tc.want[r])
				}
				for _, e := range tc.want[r] {
					if o := tb.Owners(e); len(o) != 1 || o[0] != r {
						t.Fatalf("Owners(%d) = %v, want [%d]", e, o, r)
					}
				}
			}
		})
	}
}

func TestTableReplicas(t *testing.T) {
	tb := NewTable(8, 4) // homes: 0,1→0; 2,3→1; 4,5→2; 6,7→3
	if err := tb.AddReplica(0, 3); err != nil {
		t.Fatal(err)
	}
	if err := tb.AddReplica(0, 2); err != nil {
		t.Fatal(err)
	}
	if o := tb.Owners(0); fmt.Sprint(o) != "[0 3 2]" {
		t.Fatalf("Owners(0) = %v, want [0 3 2]", o)
	}
	if l := tb.Local(3); fmt.Sprint(l) != "[0 6 7]" {
		t.Fatalf("Local(3) = %v, want [0 6 7]", l)
	}
	// Round-robin by token index.
	for tok, want := range []int{0, 3, 2, 0, 3, 2} {
		if got := tb.Pick(tok, 0); got != want {
			t.Fatalf("Pick(%d, 0) = %d, want %d", tok, got, want)
		}
	}
	if got := tb.Pick(5, 7); got != 3 {
		t.Fatalf("Pick(5, 7) = %d, want 3", got)
	}
	// Owners is a copy.
	tb.Owners(0)[0] = 99
	if tb.Owners(0)[0] != 0 {
		t.Fatal("Owners returned the table's own slice")
	}
	bad := []struct {
		e, r int
		want string
	}{
		{0, 3, "already holds"},
		{8, 0, "expert 8"},
		{-1, 0, "expert -1"},
		{1, 4, "rank 4"},
	}
	for _, b := range bad {
		if err := tb.AddReplica(b.e, b.r); err == nil || !strings.Contains(err.Error(), b.want) {
			t.Fatalf("AddReplica(%d, %d) = %v, want error naming %q", b.e, b.r, err, b.want)
		}
	}
	if tb.Pick(0, 8) != -1 || tb.Pick(-1, 0) != -1 || tb.Owners(8) != nil || tb.Local(4) != nil {
		t.Fatal("out-of-range lookups must give -1 / nil")
	}
}

func TestTableValidate(t *testing.T) {
	cases := []struct {
		name string
		tb   *Table
		want string
	}{
		{"nil", nil, "nil"},
		{"no experts", NewTable(0, 2), "0 experts"},
		{"no ranks", NewTable(4, 0), "0 ranks"},
		{"orphan expert", &Table{experts: 2, ranks: 1, owners: [][]int{{0}, nil}}, "expert 1 has no owner"},
		{"bad rank", &Table{experts: 1, ranks: 1, owners: [][]int{{1}}}, "rank 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.tb.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want error naming %q", err, tc.want)
			}
		})
	}
}
