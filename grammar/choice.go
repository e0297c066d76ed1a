package grammar

import (
	"bytes"
	"fmt"
)

// Choice validates text that must be exactly one of a list of strings
// (vLLM's guided_choice): a prefix of one of them, complete once it is
// one. No choice may be a prefix of another (NewChoice refuses that), so
// completion is never ambiguous.
type Choice struct {
	opts  [][]byte
	alive uint64 // choices the text is still a prefix of (bit k)
	pos   int    // bytes of text so far
}

// MaxChoices is the most strings a Choice takes.
const MaxChoices = 64

// NewChoice returns a validator of one of opts (1 to MaxChoices non-empty,
// distinct strings, none a prefix of another).
func NewChoice(opts []string) (*Choice, error) {
	if len(opts) == 0 || len(opts) > MaxChoices {
		return nil, fmt.Errorf("between 1 and %d choices, got %d", MaxChoices, len(opts))
	}
	c := &Choice{alive: 1<<len(opts) - 1}
	for i, o := range opts {
		if o == "" {
			return nil, fmt.Errorf("choice %d is empty", i)
		}
		for j, p := range opts[:i] {
			if o == p {
				return nil, fmt.Errorf("choice %d repeats choice %d (%q)", i, j, o)
			}
			if len(o) != len(p) && (bytes.HasPrefix([]byte(o), []byte(p)) || bytes.HasPrefix([]byte(p), []byte(o))) {
				return nil, fmt.Errorf("choices %q and %q: one is a prefix of the other", p, o)
			}
		}
		c.opts = append(c.opts, []byte(o))
	}
	return c, nil
}

// Clone returns an independent copy (a fresh one for each choice of a
// request: NewChoice once, Clone per use).
func (c *Choice) Clone() *Choice { d := *c; return &d }

// New is a fresh copy as a Validator: a grammar factory for
// engine.SamplingParams.Grammar (the method value c.New).
func (c *Choice) New() Validator { return c.Clone() }

// Complete reports whether the text is one of the choices.
func (c *Choice) Complete() bool {
	for k, o := range c.opts {
		if c.alive&(1<<k) != 0 && len(o) == c.pos {
			return true
		}
	}
	return false
}

// next is the alive set after b, or 0 when b fits no choice.
func (c *Choice) next(b []byte) uint64 {
	var m uint64
	for k, o := range c.opts {
		if c.alive&(1<<k) != 0 && len(o) >= c.pos+len(b) && bytes.Equal(o[c.pos:c.pos+len(b)], b) {
			m |= 1 << k
		}
	}
	return m
}

// Accept reports whether b may come next; an empty b is not accepted.
func (c *Choice) Accept(b []byte) bool { return len(b) > 0 && c.next(b) != 0 }

// Advance appends b if it is accepted and reports whether it was.
func (c *Choice) Advance(b []byte) bool {
	m := c.next(b)
	if len(b) == 0 || m == 0 {
		return false
	}
	c.alive, c.pos = m, c.pos+len(b)
	return true
}

var _ Validator = (*Choice)(nil)
