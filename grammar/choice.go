package grammar

import (
	"fmt"
	"slices"
)

// Choice validates text that must be exactly one of a list of strings
// (vLLM's guided_choice): a prefix of one of them, complete once it is
// one. No choice may be a prefix of another (NewChoice refuses that), so
// completion is never ambiguous. The choices are a byte trie shared by
// every copy; a validator is its node, so a copy is two words and Accept a
// walk down the trie (AcceptLen tells masks where a token leaves it).
type Choice struct {
	t    *choiceTrie
	node int32
}

// choiceTrie is the choices' trie: node i's edges are edges[first[i]:
// first[i+1]], sorted by byte; end[i] reports whether a choice ends there.
type choiceTrie struct {
	first []int32
	edges []choiceEdge
	end   []bool
}

type choiceEdge struct {
	b  byte
	to int32
}

// Choice limits: how many strings, and their bytes in all.
const (
	MaxChoices     = 4096
	MaxChoiceBytes = 1 << 20
)

// NewChoice returns a validator of one of opts (1 to MaxChoices non-empty,
// distinct strings, none a prefix of another, MaxChoiceBytes in all).
func NewChoice(opts []string) (*Choice, error) {
	if len(opts) == 0 || len(opts) > MaxChoices {
		return nil, fmt.Errorf("between 1 and %d choices, got %d", MaxChoices, len(opts))
	}
	total := 0
	for _, o := range opts {
		total += len(o)
	}
	if total > MaxChoiceBytes {
		return nil, fmt.Errorf("the choices hold %d bytes; at most %d", total, MaxChoiceBytes)
	}
	// Build with maps, then flatten.
	type node struct {
		kids map[byte]int32
		end  int // the choice ending here + 1 (0: none)
	}
	nodes := []node{{kids: map[byte]int32{}}}
	for i, o := range opts {
		if o == "" {
			return nil, fmt.Errorf("choice %d is empty", i)
		}
		n := int32(0)
		for k := 0; k < len(o); k++ {
			if e := nodes[n].end; e > 0 {
				return nil, fmt.Errorf("choices %q and %q: one is a prefix of the other", opts[e-1], o)
			}
			next, ok := nodes[n].kids[o[k]]
			if !ok {
				next = int32(len(nodes))
				nodes = append(nodes, node{kids: map[byte]int32{}})
				nodes[n].kids[o[k]] = next
			}
			n = next
		}
		switch {
		case nodes[n].end > 0:
			return nil, fmt.Errorf("choice %d repeats choice %d (%q)", i, nodes[n].end-1, o)
		case len(nodes[n].kids) > 0:
			return nil, fmt.Errorf("choice %q is a prefix of another choice", o)
		}
		nodes[n].end = i + 1
	}
	t := &choiceTrie{first: make([]int32, len(nodes)+1), end: make([]bool, len(nodes))}
	for i, n := range nodes {
		t.first[i] = int32(len(t.edges))
		t.end[i] = n.end > 0
		for b, to := range n.kids {
			t.edges = append(t.edges, choiceEdge{b, to})
		}
		slices.SortFunc(t.edges[t.first[i]:], func(x, y choiceEdge) int { return int(x.b) - int(y.b) })
	}
	t.first[len(nodes)] = int32(len(t.edges))
	return &Choice{t: t}, nil
}

// Clone returns an independent copy (a fresh one for each choice of a
// request: NewChoice once, Clone per use).
func (c *Choice) Clone() *Choice { d := *c; return &d }

// New is a fresh copy as a Validator: a grammar factory for
// engine.SamplingParams.Grammar (the method value c.New).
func (c *Choice) New() Validator { return c.Clone() }

// Complete reports whether the text is one of the choices.
func (c *Choice) Complete() bool { return c.t.end[c.node] }

// child is node n's child by byte b (-1: none).
func (t *choiceTrie) child(n int32, b byte) int32 {
	es := t.edges[t.first[n]:t.first[n+1]]
	if i, ok := slices.BinarySearchFunc(es, b, func(e choiceEdge, b byte) int { return int(e.b) - int(b) }); ok {
		return es[i].to
	}
	return -1
}

// AcceptLen is the length of b's longest prefix that may come next (Prefixer).
func (c *Choice) AcceptLen(b []byte) int {
	n := c.node
	for i, x := range b {
		if n = c.t.child(n, x); n < 0 {
			return i
		}
	}
	return len(b)
}

// Accept reports whether b may come next; an empty b is not accepted.
func (c *Choice) Accept(b []byte) bool { return len(b) > 0 && c.AcceptLen(b) == len(b) }

// Advance appends b if it is accepted and reports whether it was.
func (c *Choice) Advance(b []byte) bool {
	if !c.Accept(b) {
		return false
	}
	for _, x := range b {
		c.node = c.t.child(c.node, x)
	}
	return true
}

var (
	_ Validator = (*Choice)(nil)
	_ Prefixer  = (*Choice)(nil)
)
