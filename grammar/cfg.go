package grammar

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Recognising a Grammar's prefixes. The parse state is the set of stacks
// that the text so far can have left (as llama.cpp's grammar sampler
// keeps it): a stack is the next element to match in an alternative, then
// where to go on when that alternative ends, and so on out to the root.
// Stacks are interned nodes of shared linked lists, a rule that is the
// last element of its alternative does not push a frame (so x* stays flat),
// and sets of stacks are interned too, with their transitions on each byte
// cached as they are found: a lazily built DFA whose states are parse
// states, so a mask's Accept calls are mostly table lookups. The
// validators of one Grammar share one cache (under its lock), masks
// included: a state's transitions and its mask over a vocabulary are
// computed once for every request that reaches it — a request's first
// pass through the bench grammar's states cost 0.5–0.8 ms a mask over
// GPT-2's vocabulary, a later request's ~1 µs. The cache is bounded; a
// validator whose cache grew too big rebuilds it from its current state,
// and the fresh cache becomes the Grammar's for the validators after it.

// Cache bounds: nodes and states a cache keeps before it is rebuilt (a
// state's transitions take 2 KiB once stepped from), the most stacks a
// parse state may hold (an ambiguous grammar can multiply them; past this
// the text is refused), and the bytes of masks a cache keeps. A cache
// lives as long as its Grammar (grammar.Cache keeps 64 sources), so it
// stays within about 16 MiB.
const (
	maxGNodes     = 1 << 17
	maxGStates    = 1 << 12
	MaxGStacks    = 1024
	maxGMaskBytes = 8 << 20
	// MaxGrammarWork bounds the parsing work (stacks visited and gathered)
	// of one mask or one appended token: a grammar that needs more — long
	// runs of optional items read all at once, heavy ambiguity — fails its
	// request with ErrGrammarTooComplex instead of stalling the engine's
	// step (about 0.1 s of one core). A mask of the JSON grammar over GPT-2's
	// 50k tokens costs about a thousand (the DFA's cached transitions).
	MaxGrammarWork = 1_000_000
	gDoneID        = 0
	gStateNoByte   = 256
)

// gNode is a stack: pos, the element to match next (an index into
// Grammar.elems), over parent; the done node is the empty stack (the text
// may end).
type gNode struct {
	pos    int32
	id     uint32
	parent *gNode
	tops   []*gNode // the closure: the stacks whose next elements are characters (or done) it expands to; nil until computed
	mark   uint32   // gCache.gen when last gathered by char (repeats skipped)
}

// gSet is an interned set of stacks, each at a character element (or the
// done node), sorted by id.
type gSet struct {
	tops []*gNode
	done bool
}

// gState is a parse state at a byte boundary: a set of stacks and the
// bytes of a character begun but not finished.
type gState struct {
	set   *gSet
	pend  string
	trans *[gStateNoByte]*gState // the state after each byte (the dead state: refused); nil entries not yet computed
	mask  []uint64               // the accepted tokens over maskOf, once computed
	maskN int
	maskV *Vocab
}

type gNodeKey struct {
	pos    int32
	parent *gNode
}

type gStateKey struct {
	set  *gSet
	pend string
}

// gCache is interned nodes, sets and states, shared by the validators of
// a Grammar: every use holds mu.
type gCache struct {
	mu       sync.Mutex
	g        *Grammar
	done     *gNode
	nodes    map[gNodeKey]*gNode
	sets     map[string]*gSet
	states   map[gStateKey]*gState
	dead     *gState
	maskB    int    // bytes of the masks kept
	overflow bool   // a byte was refused for needing more than MaxGStacks stacks
	gen      uint32 // char's pass (gNode.mark)
	work     int64  // units of parsing work done: stacks visited and gathered (bounded a mask or step: MaxGrammarWork)
	// scratch for closures and steps
	seen map[*gNode]struct{}
	buf  []*gNode
}

func newGCache(g *Grammar) *gCache {
	c := &gCache{g: g, done: &gNode{pos: -1, id: gDoneID}, dead: &gState{}}
	c.nodes = map[gNodeKey]*gNode{}
	c.sets = map[string]*gSet{}
	c.states = map[gStateKey]*gState{}
	c.seen = map[*gNode]struct{}{}
	return c
}

// node interns stack (pos, parent).
func (c *gCache) node(pos int32, parent *gNode) *gNode {
	k := gNodeKey{pos, parent}
	if n, ok := c.nodes[k]; ok {
		return n
	}
	n := &gNode{pos: pos, id: uint32(len(c.nodes) + 1), parent: parent}
	c.nodes[k] = n
	return n
}

// cont is where stack n goes on once its element at pos is matched: the
// next element, or — past the alternative's end — its parent (no frame
// for an element that ends an alternative).
func (c *gCache) cont(pos int32, parent *gNode) *gNode {
	if c.g.elems[pos+1].kind == gEnd {
		return parent
	}
	return c.node(pos+1, parent)
}

// closure is the stacks n expands to before its next character: rules
// entered, ended alternatives left. Memoised on n.
func (c *gCache) closure(n *gNode) []*gNode {
	if n.tops != nil {
		return n.tops
	}
	clear(c.seen)
	var out []*gNode
	work := append(c.buf[:0], n)
	for len(work) > 0 {
		x := work[len(work)-1]
		work = work[:len(work)-1]
		if _, ok := c.seen[x]; ok {
			continue
		}
		c.seen[x] = struct{}{}
		c.work++
		if x == c.done {
			out = append(out, x)
			continue
		}
		switch e := &c.g.elems[x.pos]; e.kind {
		case gChar:
			out = append(out, x)
		case gEnd:
			work = append(work, x.parent)
		case gRef:
			next := c.cont(x.pos, x.parent)
			alts := c.g.alts[e.ref]
			for i := len(alts) - 1; i >= 0; i-- {
				work = append(work, c.node(alts[i], next))
			}
		}
	}
	c.buf = work[:0]
	if out == nil {
		out = []*gNode{} // (never: every stack ends at done) non-nil marks it computed
	}
	n.tops = out
	return out
}

// set interns the set of the stacks in tops (any order, repeats allowed),
// nil when there are none or too many.
func (c *gCache) set(tops []*gNode) *gSet {
	if len(tops) == 0 {
		return nil
	}
	slices.SortFunc(tops, func(a, b *gNode) int { return int(a.id) - int(b.id) })
	tops = slices.Compact(tops)
	if len(tops) > MaxGStacks {
		c.overflow = true
		return nil
	}
	var kb strings.Builder
	for _, t := range tops {
		kb.WriteString(strconv.FormatUint(uint64(t.id), 36))
		kb.WriteByte(',')
	}
	k := kb.String()
	if s, ok := c.sets[k]; ok {
		return s
	}
	s := &gSet{tops: slices.Clone(tops)}
	s.done = s.tops[0] == c.done
	c.sets[k] = s
	return s
}

// state interns (set, pend).
func (c *gCache) state(s *gSet, pend string) *gState {
	k := gStateKey{s, pend}
	if st, ok := c.states[k]; ok {
		return st
	}
	st := &gState{set: s, pend: pend}
	c.states[k] = st
	return st
}

// start is the state before any text.
func (c *gCache) start() *gState {
	var tops []*gNode
	for _, a := range c.g.alts[c.g.root] {
		tops = append(tops, c.closure(c.node(a, c.done))...)
	}
	return c.state(c.set(tops), "")
}

// char is the set after character r from s (nil: refused).
func (c *gCache) char(s *gSet, r rune) *gSet {
	var tops []*gNode
	c.gen++
	for _, t := range s.tops {
		if t == c.done || !c.g.elems[t.pos].matches(r) {
			continue
		}
		cl := c.closure(c.cont(t.pos, t.parent))
		c.work += int64(len(cl))
		for _, x := range cl { // (each stack once: many tops can close over the same ones)
			if x.mark != c.gen {
				x.mark = c.gen
				tops = append(tops, x)
			}
		}
		if len(tops) > MaxGStacks {
			c.overflow = true
			return nil
		}
	}
	return c.set(tops)
}

// meets reports whether some stack of s takes a character in [lo, hi].
func (c *gCache) meets(s *gSet, lo, hi rune) bool {
	for _, t := range s.tops {
		if t != c.done && c.g.elems[t.pos].meets(lo, hi) {
			return true
		}
	}
	return false
}

// step is the state after byte b from st (c.dead: refused), cached.
func (c *gCache) step(st *gState, b byte) *gState {
	if st.trans == nil {
		st.trans = new([gStateNoByte]*gState)
	} else if nx := st.trans[b]; nx != nil {
		return nx
	}
	nx := c.dead
	if st.pend == "" && b < utf8.RuneSelf {
		if s := c.char(st.set, rune(b)); s != nil {
			nx = c.state(s, "")
		}
	} else {
		p := st.pend + string([]byte{b})
		if utf8.FullRuneInString(p) {
			if r, size := utf8.DecodeRuneInString(p); !(r == utf8.RuneError && size <= 1) {
				if s := c.char(st.set, r); s != nil {
					nx = c.state(s, "")
				}
			}
		} else if lo, hi, ok := utf8Range([]byte(p)); ok && c.meets(st.set, lo, hi) {
			nx = c.state(st.set, p)
		}
	}
	st.trans[b] = nx
	return nx
}

// full reports whether the cache should be rebuilt.
func (c *gCache) full() bool { return len(c.nodes) > maxGNodes || len(c.states) > maxGStates }

// rebuilt is a fresh cache holding state st's equivalent (its stacks
// interned anew).
func (c *gCache) rebuilt(st *gState) (*gCache, *gState) {
	nc := newGCache(c.g)
	var copyNode func(n *gNode) *gNode
	copyNode = func(n *gNode) *gNode {
		if n == c.done {
			return nc.done
		}
		return nc.node(n.pos, copyNode(n.parent))
	}
	tops := make([]*gNode, len(st.set.tops))
	for i, t := range st.set.tops {
		tops[i] = copyNode(t)
	}
	return nc, nc.state(nc.set(tops), st.pend)
}

// ErrGrammarTooComplex is a GrammarText's error once following its grammar
// took more than MaxGrammarWork for one mask or token.
var ErrGrammarTooComplex = errors.New("the grammar is too costly to follow: one token's parse took more than the work limit (long runs of optional items, or heavy ambiguity; write them as bounded repetitions {m,n})")

// GrammarText validates a text against a Grammar: a Validator and a
// Prefixer, whose masks are kept with its parse states. Once following
// the grammar costs too much (ErrGrammarTooComplex: Err), it takes nothing.
type GrammarText struct {
	c   *gCache
	cur *gState
	err error
}

// Err is the reason the validator stopped taking text (nil: it has not).
func (v *GrammarText) Err() error { return v.err }

// overBudget reports whether the work since start passed the limit, and
// stops the validator if so.
func (v *GrammarText) overBudget(start int64) bool {
	if v.c.work-start > MaxGrammarWork {
		v.err = ErrGrammarTooComplex
	}
	return v.err != nil
}

var (
	_ Validator  = (*GrammarText)(nil)
	_ Prefixer   = (*GrammarText)(nil)
	_ maskCacher = (*GrammarText)(nil)
)

// New is a fresh validator at the start of a text: a grammar factory for
// engine.SamplingParams.Grammar (the method value g.New). Validators of
// one Grammar share its parse-state cache: each may be used from its own
// goroutine.
func (g *Grammar) New() Validator {
	c := g.shared.Load()
	if c == nil {
		g.shared.CompareAndSwap(nil, newGCache(g))
		c = g.shared.Load()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v := &GrammarText{c: c, cur: c.start()}
	if v.cur.set == nil { // (CompileGrammar refuses such grammars)
		v.err, v.cur = ErrGrammarTooComplex, c.dead
	}
	return v
}

// Accept reports whether b may come next; an empty b is not accepted.
func (v *GrammarText) Accept(b []byte) bool { return len(b) > 0 && v.AcceptLen(b) == len(b) }

// AcceptLen is the length of b's longest prefix that may come next (Prefixer).
func (v *GrammarText) AcceptLen(b []byte) int {
	if v.err != nil {
		return 0
	}
	v.c.mu.Lock()
	defer v.c.mu.Unlock()
	st, start := v.cur, v.c.work
	for i, x := range b {
		if st = v.c.step(st, x); st == v.c.dead || v.overBudget(start) {
			return i
		}
	}
	return len(b)
}

// Advance appends b if it is accepted and reports whether it was.
func (v *GrammarText) Advance(b []byte) bool {
	if len(b) == 0 || v.err != nil {
		return false
	}
	c := v.c
	c.mu.Lock()
	defer c.mu.Unlock()
	st, start := v.cur, c.work
	for _, x := range b {
		if st = c.step(st, x); st == c.dead || v.overBudget(start) {
			return false
		}
	}
	v.cur = st
	if c.full() {
		v.c, v.cur = c.rebuilt(v.cur)
		c.g.shared.CompareAndSwap(c, v.c) // (the validators after this one start in the fresh cache)
	}
	return true
}

// Complete reports whether the text so far matches the grammar in full.
func (v *GrammarText) Complete() bool {
	return v.err == nil && v.cur.pend == "" && v.cur.set.done
}

// cachedMask is the current state's mask over vocab, if kept (under v.c.mu).
func (v *GrammarText) cachedMask(vocab *Vocab) ([]uint64, int, bool) {
	if v.cur.maskV == vocab && v.cur.mask != nil {
		return v.cur.mask, v.cur.maskN, true
	}
	return nil, 0, false
}

// keepMask keeps the current state's mask (up to maxGMaskBytes a cache;
// under v.c.mu).
func (v *GrammarText) keepMask(vocab *Vocab, m []uint64, n int) {
	if v.err != nil || v.c.maskB+8*len(m) > maxGMaskBytes || v.cur.mask != nil {
		return
	}
	v.c.maskB += 8 * len(m)
	v.cur.mask, v.cur.maskN, v.cur.maskV = slices.Clone(m), n, vocab
}
