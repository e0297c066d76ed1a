package grammar

import (
	"strings"
	"testing"
)

func TestChoice(t *testing.T) {
	c, err := NewChoice([]string{"positive", "negative", "neutral 😐"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pieces   []string
		ok       bool
		complete bool
	}{
		{[]string{"pos", "itive"}, true, true},
		{[]string{"ne", "g"}, true, false},
		{[]string{"neutral ", "😐"}, true, true},
		{[]string{"neutral ", "\xf0\x9f"}, true, false},
		{[]string{"posit", "ivel"}, false, false},
		{[]string{"x"}, false, false},
		{[]string{"positive", " "}, false, true},
	} {
		v := c.Clone()
		ok := true
		for _, p := range tc.pieces {
			if !v.Advance([]byte(p)) {
				ok = false
				break
			}
		}
		if ok != tc.ok || v.Complete() != tc.complete {
			t.Errorf("%q: advanced %v, complete %v; want %v, %v", tc.pieces, ok, v.Complete(), tc.ok, tc.complete)
		}
	}
	if c.Complete() || c.Accept(nil) {
		t.Error("the fresh validator is complete or takes nothing")
	}
	for _, bad := range [][]string{nil, {""}, {"a", "a"}, {"yes", "yes!"}, {"ab", "a"}, strings.Split(strings.Repeat("x,", 65), ",")} {
		if _, err := NewChoice(bad); err == nil {
			t.Errorf("NewChoice(%q) accepted", bad)
		}
	}
}
