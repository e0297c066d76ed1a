package grammar

import (
	"bytes"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Token masks: which tokens of a vocabulary a Validator accepts next, as a
// bitmask the sampler applies to the logits (on the host, or on the device
// before its sampling kernels) — the whole vocabulary is checked every
// step, so a constrained draw is exactly a draw from the model's
// distribution restricted to the acceptable tokens.

// Prefixer is a Validator that says where it refuses: AcceptLen(b) is the
// length of b's longest prefix that may come next (len(b) when all of b
// may), leaving the validator unchanged. Vocab.Mask uses it to skip every
// token that extends a refused prefix; JSON and SchemaJSON are Prefixers.
type Prefixer interface {
	AcceptLen(b []byte) int
}

// TokenClass names a kind of validator state in which a fixed set of
// tokens is sure to be accepted whatever the rest of the state, so a mask
// starts from that set and checks only the other tokens (what xgrammar
// calls context-independent tokens).
type TokenClass uint8

const (
	// NoClass: every token is checked.
	NoClass TokenClass = iota
	// StringBody: inside a JSON string, no escape or UTF-8 character
	// pending and no length limit: a token of plain string characters
	// (bytes 0x20–0x7F other than '"' and '\', and whole well-formed
	// UTF-8 characters) is accepted.
	StringBody
	numClasses
)

// Classer is a Validator that names its state's TokenClass.
type Classer interface {
	TokenClass() TokenClass
}

var (
	_ Prefixer = (*JSON)(nil)
	_ Prefixer = (*SchemaJSON)(nil)
	_ Classer  = (*JSON)(nil)
	_ Classer  = (*SchemaJSON)(nil)
	_ Classer  = (*Wrapped)(nil)
)

// inClass reports whether token bytes b are sure to be accepted in class c.
func inClass(c TokenClass, b []byte) bool {
	switch c {
	case StringBody:
		for i := 0; i < len(b); {
			if b[i] < utf8.RuneSelf {
				if b[i] < 0x20 || b[i] == '"' || b[i] == '\\' {
					return false
				}
				i++
				continue
			}
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				return false
			}
			i += n
		}
		return true
	}
	return false
}

// classSet is a TokenClass's sure tokens over a Vocab: their mask and
// count, and the positions (in byte order) of the others.
type classSet struct {
	sure []uint64
	n    int
	rest []int32
}

// Vocab is a vocabulary arranged for masks: the tokens that have bytes,
// sorted by them, each with the length of its common prefix with the one
// before — so the tokens that extend a refused prefix are the run that
// follows it. Safe for concurrent use once built.
type Vocab struct {
	size int      // tokens in the vocabulary (ids 0 … size−1)
	ids  []int32  // tokens with bytes, in byte order
	off  []uint32 // token i's bytes are data[off[i]:off[i+1]]
	data []byte
	lcp  []uint16 // lcp[i]: common prefix of tokens i−1 and i (capped at 65535)
	// end1[c] is the end of the run of tokens that start with byte c, and
	// end2[c1<<8|c2] of those that start with c1 c2 (a refusal at the first
	// or second byte — the usual ones — jumps there at once).
	end1 [256]int32
	end2 []int32

	classes [numClasses]struct {
		once sync.Once
		set  classSet
	}
	// loops caches, by a set of ASCII bytes (grammarMask's self-loop set),
	// the tokens made of those bytes alone and the positions of the others.
	loops  sync.Map // [2]uint64 → *loopSet
	loopsN atomic.Int32
}

// loopSet is the tokens made of a set of ASCII bytes alone (sure, n of
// them) and the positions of the others, in byte order, each with its
// common prefix with the one before it in rest.
type loopSet struct {
	sure    []uint64
	n       int
	rest    []int32
	restLCP []uint16
}

// maxLoopSets is the most loop sets a Vocab keeps.
const maxLoopSets = 64

// loopSet is the loopSet of the bytes in loop, built on first use.
func (v *Vocab) loopSet(loop [2]uint64) *loopSet {
	if ls, ok := v.loops.Load(loop); ok {
		return ls.(*loopSet)
	}
	ls := &loopSet{sure: make([]uint64, v.MaskWords())}
	run := uint16(65535) // the common prefix since the last rest token
	for i, id := range v.ids {
		run = min(run, v.lcp[i])
		in := true
		for _, c := range v.data[v.off[i]:v.off[i+1]] {
			if c >= utf8.RuneSelf || loop[c>>6]&(1<<(c&63)) == 0 {
				in = false
				break
			}
		}
		if in {
			ls.sure[id>>6] |= 1 << (id & 63)
			ls.n++
			continue
		}
		if len(ls.rest) == 0 {
			run = 0
		}
		ls.rest = append(ls.rest, int32(i))
		ls.restLCP = append(ls.restLCP, run)
		run = 65535
	}
	if v.loopsN.Add(1) > maxLoopSets {
		return ls
	}
	got, _ := v.loops.LoadOrStore(loop, ls)
	return got.(*loopSet)
}

// class is c's sure set, built on first use.
func (v *Vocab) class(c TokenClass) *classSet {
	cl := &v.classes[c]
	cl.once.Do(func() {
		cl.set.sure = make([]uint64, v.MaskWords())
		for i, id := range v.ids {
			if inClass(c, v.data[v.off[i]:v.off[i+1]]) {
				cl.set.sure[id>>6] |= 1 << (id & 63)
				cl.set.n++
			} else {
				cl.set.rest = append(cl.set.rest, int32(i))
			}
		}
	})
	return &cl.set
}

// NewVocab arranges the size tokens whose bytes tokBytes gives (nil: a
// token that has none, such as a special token; never accepted).
func NewVocab(size int, tokBytes func(int32) []byte) *Vocab {
	v := &Vocab{size: size}
	for id := range int32(size) {
		if len(tokBytes(id)) > 0 {
			v.ids = append(v.ids, id)
		}
	}
	slices.SortFunc(v.ids, func(a, b int32) int {
		if c := bytes.Compare(tokBytes(a), tokBytes(b)); c != 0 {
			return c
		}
		return int(a - b)
	})
	v.off = make([]uint32, 1, len(v.ids)+1)
	v.lcp = make([]uint16, len(v.ids))
	var prev []byte
	for i, id := range v.ids {
		b := tokBytes(id)
		v.data = append(v.data, b...)
		v.off = append(v.off, uint32(len(v.data)))
		n := 0
		for n < len(b) && n < len(prev) && b[n] == prev[n] && n < 65535 {
			n++
		}
		v.lcp[i] = uint16(n)
		prev = b
	}
	v.end2 = make([]int32, 1<<16)
	for i := range v.ids {
		b := v.data[v.off[i]:v.off[i+1]]
		v.end1[b[0]] = int32(i + 1)
		if len(b) > 1 {
			v.end2[int(b[0])<<8|int(b[1])] = int32(i + 1)
		}
	}
	return v
}

// Size is the vocabulary's size (ids 0 … Size−1).
func (v *Vocab) Size() int { return v.size }

// MaskWords is the length of a mask over the vocabulary: one bit a token,
// token t at bit t%64 of word t/64.
func (v *Vocab) MaskWords() int { return (v.size + 63) / 64 }

// Mask sets dst (at least MaskWords words) to the tokens g accepts next and
// returns how many there are. In a TokenClass (Classer) it starts from the
// class's sure tokens and checks the others one by one; otherwise it checks
// the tokens in byte order, and with a Prefixer a refused token's whole run
// of extensions is skipped unchecked (without one, the run that extends all
// of a refused token's bytes).
func (v *Vocab) Mask(g Validator, dst []uint64) int {
	dst = dst[:v.MaskWords()]
	if gt, ok := g.(*GrammarText); ok { // (its cache is shared with other validators)
		gt.c.mu.Lock()
		defer gt.c.mu.Unlock()
	}
	if mc, ok := g.(maskCacher); ok {
		if m, n, ok := mc.cachedMask(v); ok {
			copy(dst, m)
			return n
		}
		n := v.mask(g, dst)
		mc.keepMask(v, dst, n)
		return n
	}
	return v.mask(g, dst)
}

// maskCacher is a Validator that keeps the masks of the states it has been
// in (GrammarText: a context-free grammar's states recur, and its masks
// cost the most to compute).
type maskCacher interface {
	cachedMask(v *Vocab) ([]uint64, int, bool)
	keepMask(v *Vocab, m []uint64, n int)
}

// mask is Mask without a cache.
func (v *Vocab) mask(g Validator, dst []uint64) int {
	if gt, ok := g.(*GrammarText); ok {
		return v.grammarMask(gt, dst)
	}
	if cg, ok := g.(Classer); ok {
		if c := cg.TokenClass(); c != NoClass {
			return v.classMask(g, v.class(c), dst)
		}
	}
	clear(dst)
	px, _ := g.(Prefixer)
	// Inside a pattern-constrained string, a token of plain string
	// characters is the regex's alone to judge: no copy of the whole
	// validator for it.
	var re *Regex
	var rt reText
	var plain *classSet
	if pg, ok := g.(patterned); ok {
		var in bool
		if re, rt, in = pg.pattern(); in {
			plain = v.class(StringBody)
		} else {
			re = nil
		}
	}
	if re != nil && rt.d >= 0 {
		return v.patternMask(g, re, rt.d, plain, dst)
	}
	n := 0
	for i := 0; i < len(v.ids); {
		b := v.data[v.off[i]:v.off[i+1]]
		var k int // bytes of b accepted
		switch id := v.ids[i]; {
		case re != nil && Allowed(plain.sure, id):
			t := rt
			for k < len(b) && re.byte(&t, b[k]) {
				k++
			}
		case px != nil:
			k = px.AcceptLen(b)
		case g.Accept(b):
			k = len(b)
		default:
			k = len(b) - 1 // refused somewhere: at worst at its last byte
		}
		if k == len(b) {
			id := v.ids[i]
			dst[id>>6] |= 1 << (id & 63)
			n++
			i++
			continue
		}
		// b[:k+1] is refused, and so is every token that starts with it:
		// the run after i whose common prefixes with their predecessors
		// stay longer than k.
		i = v.pastRun(i, b, k)
	}
	return n
}

// loopMask is grammarMask from a loop set: its sure tokens, then the
// others walked from the states their common prefixes share.
func (v *Vocab) loopMask(g *GrammarText, ls *loopSet, dst []uint64, start int64) int {
	c := g.c
	copy(dst, ls.sure)
	n := ls.n
	states := append(make([]*gState, 0, 64), g.cur)
	for r, i := range ls.rest {
		b := v.data[v.off[i]:v.off[i+1]]
		var k int
		states, k = walkToken(c, states, b, int(ls.restLCP[r]))
		if g.overBudget(start) {
			clear(dst)
			return 0
		}
		if k == len(b) {
			id := v.ids[i]
			dst[id>>6] |= 1 << (id & 63)
			n++
		}
	}
	return n
}

// walkToken steps a token's bytes b on from the state after the first lcp
// of them (states[d]: the state after d bytes of the token walked before,
// which shares lcp bytes with this one), extending states with each byte
// taken; k is how many were.
func walkToken(c *gCache, states []*gState, b []byte, lcp int) (_ []*gState, k int) {
	k = min(lcp, len(states)-1)
	states = states[:k+1]
	for st := states[k]; k < len(b); k++ {
		if st = c.step(st, b[k]); st == c.dead {
			break
		}
		states = append(states, st)
	}
	return states, k
}

// pastRun is the position after token i (bytes b) and every token after it
// that extends b[:k+1], a refused prefix: the run whose common prefixes with
// their predecessors stay longer than k (jump tables for k 0 and 1).
func (v *Vocab) pastRun(i int, b []byte, k int) int {
	switch k {
	case 0:
		return int(v.end1[b[0]])
	case 1:
		return int(v.end2[int(b[0])<<8|int(b[1])])
	}
	for i++; i < len(v.ids) && int(v.lcp[i]) > k; i++ {
	}
	return i
}

// grammarMask is Mask for a context-free grammar: the vocabulary walked
// as a trie, each token stepped on from the parse state its common prefix
// with the token before left (so most tokens cost a byte or two of cached
// transitions), a refused prefix's run skipped.
func (v *Vocab) grammarMask(g *GrammarText, dst []uint64) int {
	clear(dst)
	c := g.c
	if g.err != nil {
		return 0
	}
	start := c.work
	// The ASCII bytes that lead from the state back to itself (inside a
	// string of the grammar, say): the tokens made of them alone are all
	// taken (a set kept with the vocabulary), and only the others walked.
	if g.cur.pend == "" && len(g.cur.set.tops) <= 64 && (c.step(g.cur, 'e') == g.cur || c.step(g.cur, 'a') == g.cur) { // (a probe first: states that loop on text loop on these)
		var loop [2]uint64
		for b := range byte(utf8.RuneSelf) {
			if c.step(g.cur, b) == g.cur {
				loop[b>>6] |= 1 << (b & 63)
			}
			if g.overBudget(start) {
				clear(dst)
				return 0
			}
		}
		if bits.OnesCount64(loop[0])+bits.OnesCount64(loop[1]) >= 16 {
			return v.loopMask(g, v.loopSet(loop), dst, start)
		}
	}
	states := append(make([]*gState, 0, 64), g.cur) // states[d]: after the first d bytes of the last token walked
	n := 0
	for i := 0; i < len(v.ids); {
		b := v.data[v.off[i]:v.off[i+1]]
		var k int
		states, k = walkToken(c, states, b, int(v.lcp[i]))
		if g.overBudget(start) {
			clear(dst)
			return 0
		}
		if k == len(b) {
			id := v.ids[i]
			dst[id>>6] |= 1 << (id & 63)
			n++
			i++
			continue
		}
		i = v.pastRun(i, b, k)
	}
	if n == 0 && c.overflow && !g.Complete() { // nothing left but paths cut for their stacks: give up, not a silent end
		g.err = ErrGrammarTooComplex
	}
	return n
}

// patternMask is Mask inside a pattern-constrained string whose match is
// DFA state d of re: the plain tokens' mask for that state (computed once
// and kept with re: the plain tokens depend on nothing else), and the
// other tokens checked one by one.
func (v *Vocab) patternMask(g Validator, re *Regex, d int32, plain *classSet, dst []uint64) int {
	pm := re.plainMask(v, d, plain)
	return v.fromSet(g, pm.mask, pm.n, plain.rest, dst)
}

// plainMasks is a Regex's cache of plain-token masks, by vocabulary and
// DFA state.
type plainKey struct {
	v *Vocab
	d int32
}

type plainMask struct {
	mask []uint64
	n    int
}

// plainMask is the mask of the plain tokens (StringBody's) that the regex
// takes from DFA state d, computed on first use.
func (r *Regex) plainMask(v *Vocab, d int32, plain *classSet) *plainMask {
	key := plainKey{v, d}
	if pm, ok := r.plain.Load(key); ok {
		return pm.(*plainMask)
	}
	pm := &plainMask{mask: make([]uint64, v.MaskWords())}
	for i := 0; i < len(v.ids); {
		id := v.ids[i]
		if !Allowed(plain.sure, id) {
			i++
			continue
		}
		b := v.data[v.off[i]:v.off[i+1]]
		t, k := reText{d: d}, 0
		for k < len(b) && r.byte(&t, b[k]) {
			k++
		}
		if k == len(b) {
			pm.mask[id>>6] |= 1 << (id & 63)
			pm.n++
			i++
			continue
		}
		for i++; i < len(v.ids) && int(v.lcp[i]) > k; i++ { // the run that extends the refused b[:k+1]
		}
	}
	if r.plainN.Add(1) > maxPlainMasks { // (a bound on the memory a request's regex keeps)
		return pm
	}
	got, _ := r.plain.LoadOrStore(key, pm)
	return got.(*plainMask)
}

// maxPlainMasks is the most plain-token masks a Regex keeps.
const maxPlainMasks = 256

// classMask is Mask from class set cs.
func (v *Vocab) classMask(g Validator, cs *classSet, dst []uint64) int {
	return v.fromSet(g, cs.sure, cs.n, cs.rest, dst)
}

// fromSet is Mask from sure, n tokens known to be accepted, and rest, the
// positions (in byte order) of the others, each checked.
func (v *Vocab) fromSet(g Validator, sure []uint64, n int, rest []int32, dst []uint64) int {
	copy(dst, sure)
	for _, i := range rest {
		if g.Accept(v.data[v.off[i]:v.off[i+1]]) {
			id := v.ids[i]
			dst[id>>6] |= 1 << (id & 63)
			n++
		}
	}
	return n
}

// Count is the number of tokens set in mask.
func Count(mask []uint64) int {
	n := 0
	for _, w := range mask {
		n += bits.OnesCount64(w)
	}
	return n
}

// patterned is a validator that may be inside a string whose characters a
// Regex constrains: pattern returns the regex and the match so far when it
// is, with no escape or character pending and no length limit — a token
// of plain string characters (StringBody's) is then accepted exactly when
// the regex takes its bytes.
type patterned interface {
	pattern() (*Regex, reText, bool)
}

var (
	_ patterned = (*SchemaJSON)(nil)
	_ patterned = (*Wrapped)(nil)
)

// Allowed reports whether token t is set in mask.
func Allowed(mask []uint64, t int32) bool { return mask[t>>6]&(1<<(t&63)) != 0 }
