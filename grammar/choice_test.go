package grammar

import (
	"fmt"
	"math/rand/v2"
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
	many := make([]string, MaxChoices+1)
	for i := range many {
		many[i] = fmt.Sprintf("label-%05d", i)
	}
	for _, bad := range [][]string{nil, {""}, {"a", "a"}, {"yes", "yes!"}, {"ab", "a"}, many, {strings.Repeat("x", MaxChoiceBytes+1)}} {
		if _, err := NewChoice(bad); err == nil {
			t.Errorf("NewChoice(%q) accepted", bad)
		}
	}
}

// TestChoiceMany: thousands of labels (a classifier's) — every one is
// taken whole and complete, byte by byte; random near misses are refused
// exactly where they leave every label; masks equal the naive scan.
func TestChoiceMany(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	labels := make([]string, MaxChoices)
	set := map[string]bool{}
	for i := range labels {
		labels[i] = fmt.Sprintf("%s/%d.", []string{"cat", "dog", "bird", "é"}[r.IntN(4)], i)
		set[labels[i]] = true
	}
	c, err := NewChoice(labels)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range labels {
		v := c.Clone()
		for k := 0; k < len(l); k++ {
			if !v.Advance([]byte{l[k]}) {
				t.Fatalf("%q refused at byte %d", l, k)
			}
		}
		if !v.Complete() {
			t.Fatalf("%q not complete", l)
		}
	}
	for range 2000 {
		l := []byte(labels[r.IntN(len(labels))])
		l[r.IntN(len(l))] = "0123456789./x"[r.IntN(13)]
		n := c.AcceptLen(l)
		// The reference: the longest prefix of l that starts some label.
		want := 0
		for k := len(l); k > 0; k-- {
			found := false
			for _, x := range labels {
				if strings.HasPrefix(x, string(l[:k])) {
					found = true
					break
				}
			}
			if found {
				want = k
				break
			}
		}
		if n != want {
			t.Fatalf("AcceptLen(%q) = %d, want %d", l, n, want)
		}
		if v := c.Clone(); n == len(l) && v.Advance(l) && v.Complete() != set[string(l)] {
			t.Fatalf("%q: complete %v", l, v.Complete())
		}
	}
	toks := [][]byte{[]byte("cat"), []byte("/1"), []byte("dog/"), []byte("é"), {0xC3}, []byte("."), []byte("x"), []byte("bird/12")}
	tb := func(id int32) []byte { return toks[id] }
	voc := NewVocab(len(toks), tb)
	dst := make([]uint64, voc.MaskWords())
	for _, prefix := range []string{"", "cat", "dog/1", "bird/12"} {
		v := c.Clone()
		v.Advance([]byte(prefix))
		voc.Mask(v, dst)
		if want := naiveMask(v, len(toks), tb); dst[0] != want[0] {
			t.Errorf("after %q: mask %b, want %b", prefix, dst[0], want[0])
		}
	}
}
