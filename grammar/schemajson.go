package grammar

import (
	"bytes"
	"math"
	"math/bits"
	"slices"
)

// SchemaJSON validates, a byte at a time, the prefixes of one JSON object
// that matches a Schema: every property in the schema's order and no other,
// values of the allowed types or enum values, whitespace between tokens as
// JSON allows it (the same limits). The object must start the text. Make
// one with NewSchemaJSON; copy one with Clone.
type SchemaJSON struct {
	root     *Schema
	stack    []sframe // open objects and arrays
	started  bool
	leaf     JSON // the string, number or literal being read, when leafOn
	leafOn   bool
	leafNum  bool       // the leaf is a number (it ends at the first byte that is not part of it)
	leafInt  bool       // an integer: no fraction or exponent
	leafB    *Schema    // a bounded integer leaf's schema (its minimum / maximum)
	leafNB   *numBounds // a bounded number leaf's bounds, and its digits so far:
	nneg     bool       //   sign,
	ndot     bool       //   a dot read,
	nint     int8       //   integer digits (count, value)
	nfrac    int8       //   fraction digits (count, value)
	nP, nF   float64
	ineg     bool     // that integer's sign
	ival     int64    // and its digits' value so far
	idig     int      // and their count
	leafS    *Schema  // the string leaf's schema (its length bounds)
	leafKey  bool     // the string leaf is a map's key
	leafUniq bool     // the leaf is an item of a uniqueItems array (hashed in kh as written)
	kh       uint64   // its FNV-1a hash so far
	chars    int      // characters of the string leaf so far
	lre      reText   // the string leaf's match so far, when its schema has a regex (leafS.re)
	hexv     rune     // and a \u escape's value so far
	hexn     int8     // and its digits so far
	enum     [][]byte // the enum value being read: its candidates (nil: none)
	alive    uint64   // candidates still matching
	epos     int      // bytes of the value read
	ws       wsRun
	compact  bool     // between tokens at most one space, no other whitespace (NewWrapped)
	depth0   int      // nesting depth of the root object (a union object\'s validator: where the union is)
	scratch  []sframe // Accept's copy of the stack
	lstack   []byte   // Accept's copy of the leaf's stack (an any-object leaf nests)
}

// sframe is an open object or array.
type sframe struct {
	s     *Schema
	i     int           // object: the next property that may come; array: items started
	st    uint8         // what comes next (oOpen…)
	kpos  int           // oKey: bytes of the key matched
	kmask uint64        // oKey: the candidate properties i+j still matching (bit j)
	keys  []uint64      // map: hashes of the keys so far (a key may not come twice)
	subs  []*SchemaJSON // uUnion: a validator of each union object still matching the text (never changed in place)
}

const (
	oOpen  uint8 = iota // after '{': the first key, or '}' when there are no properties
	oNext               // after ',': the next key's '"'
	oKey                // inside a key (kpos bytes matched)
	oColon              // after a key
	oValue              // a property's value must start
	oAfter              // after a value: ',' or '}'
	aOpen               // after '[': an item or ']'
	aValue              // after ',': an item
	aAfter              // after an item: ',' or ']'
	mOpen               // map, after '{': a key or '}'
	mNext               // map, after ',': a key
	mColon              // map, after a key (read as a string leaf)
	mValue              // map: a value must start
	mAfter              // map, after a value: ',' or '}'
	uUnion              // inside an object of a union of objects (its subs read it)
)

// New is a fresh validator of one object matching s: a grammar factory for
// engine.SamplingParams.Grammar (the method value s.New).
func (s *Schema) New() Validator { return NewSchemaJSON(s) }

// NewSchemaJSON returns a validator at the start of a text that must be
// one object matching s (from CompileSchema).
func NewSchemaJSON(s *Schema) *SchemaJSON { return &SchemaJSON{root: s} }

// Clone returns an independent copy of j.
func (j *SchemaJSON) Clone() *SchemaJSON {
	c := *j
	c.stack = append([]sframe(nil), j.stack...)
	for i := range c.stack {
		c.stack[i].keys = append([]uint64(nil), c.stack[i].keys...)
	}
	c.leaf.stack = append([]byte(nil), j.leaf.stack...)
	c.scratch, c.lstack = nil, nil
	return &c
}

// SetCompact holds j to compact whitespace (Compacter).
func (j *SchemaJSON) SetCompact() { j.compact = true }

// scratchCopy is a copy of j to try bytes on (Accept, take), its stacks in
// j's scratch buffers; keep gives the buffers back.
func (j *SchemaJSON) scratchCopy() SchemaJSON {
	t := *j
	t.stack = append(j.scratch[:0], j.stack...)
	t.leaf.stack = append(j.lstack[:0], j.leaf.stack...)
	return t
}

func (j *SchemaJSON) keep(t *SchemaJSON) { j.scratch, j.lstack = t.stack[:0], t.leaf.stack[:0] }

// Complete reports whether the text is a whole object matching the schema
// (only whitespace may follow).
func (j *SchemaJSON) Complete() bool {
	return j.started && len(j.stack) == 0 && !j.leafOn && j.enum == nil
}

// Accept reports whether b may come next, leaving j unchanged; an empty b
// is not accepted.
func (j *SchemaJSON) Accept(b []byte) bool { return len(b) > 0 && j.AcceptLen(b) == len(b) }

// TokenClass is StringBody inside a string leaf with nothing pending and
// no maximum length (Classer).
func (j *SchemaJSON) TokenClass() TokenClass {
	if n := len(j.stack); n > 0 && j.stack[n-1].st == uUnion { // every object read so far inside a string
		for _, v := range j.stack[n-1].subs {
			if v.TokenClass() != StringBody {
				return NoClass
			}
		}
		return StringBody
	}
	if j.leafOn && !j.leafNum && j.enum == nil && j.leaf.st == stString && (j.leafS == nil || (j.leafS.maxN < 0 && j.leafS.re == nil)) {
		return StringBody
	}
	return NoClass
}

// pattern is the string leaf's regex and match (patterned).
func (j *SchemaJSON) pattern() (*Regex, reText, bool) {
	s := j.leafS
	if !j.leafOn || j.leafNum || j.enum != nil || j.leaf.st != stString || s == nil || s.re == nil || s.maxN >= 0 || j.lre.n != 0 {
		return nil, reText{}, false
	}
	return s.re, j.lre, true
}

// AcceptLen is the length of b's longest prefix that may come next
// (len(b): all of it), leaving j unchanged (Prefixer).
func (j *SchemaJSON) AcceptLen(b []byte) int {
	t := j.scratchCopy()
	n := 0
	for n < len(b) && t.byte(b[n]) {
		n++
	}
	j.keep(&t)
	return n
}

// Advance appends b if it is accepted and reports whether it was.
func (j *SchemaJSON) Advance(b []byte) bool {
	if !j.Accept(b) {
		return false
	}
	for _, c := range b {
		j.byte(c)
	}
	return true
}

// space takes a whitespace byte between tokens, within JSON's limits.
func (j *SchemaJSON) space(c byte) bool {
	if j.compact && (c != ' ' || j.ws.n > 0) {
		return false
	}
	return j.ws.take(c, j.depth0+len(j.stack))
}

func (j *SchemaJSON) push(s *Schema, st uint8) bool {
	if j.depth0+len(j.stack) >= MaxDepth {
		return false
	}
	j.stack = append(j.stack, sframe{s: s, st: st})
	return true
}

func (j *SchemaJSON) pop() { j.stack = j.stack[:len(j.stack)-1] }

// byte advances j by one byte.
func (j *SchemaJSON) byte(c byte) bool {
	if n := len(j.stack); n > 0 && j.stack[n-1].st == uUnion {
		return j.unionByte(c)
	}
	if j.leafOn {
		return j.leafByte(c)
	}
	if j.enum != nil {
		return j.enumByte(c)
	}
	if !j.started {
		j.started = true
		if j.root.objs != nil { // a union of objects at the top
			return c == '{' && j.startUnion(j.root.objs, c)
		}
		return c == '{' && j.push(j.root, oOpen)
	}
	if len(j.stack) == 0 { // the object is complete
		return isSpace(c) && j.space(c)
	}
	top := &j.stack[len(j.stack)-1]
	if top.st != oKey {
		if isSpace(c) {
			return j.space(c)
		}
		j.ws = wsRun{}
	}
	props := top.s.props
	switch top.st {
	case oOpen, oNext:
		if c == '}' && top.st == oOpen && optionalFrom(props, top.i) {
			j.pop()
			return true
		}
		if c != '"' || top.i >= len(props) {
			return false
		}
		// The key may be any property from i up to the next required one.
		top.st, top.kpos, top.kmask = oKey, 1, 0
		for k := top.i; k < len(props); k++ {
			top.kmask |= 1 << (k - top.i)
			if !props[k].opt {
				break
			}
		}
		return true
	case oKey:
		var next uint64
		done := -1
		for m := top.kmask; m != 0; m &= m - 1 {
			k := bits.TrailingZeros64(m)
			key := props[top.i+k].key
			if top.kpos < len(key) && key[top.kpos] == c {
				next |= 1 << k
				if top.kpos+1 == len(key) {
					done = top.i + k // keys end with '"' and differ: one at most ends here
				}
			}
		}
		if next == 0 {
			return false
		}
		top.kpos++
		top.kmask = next
		if done >= 0 {
			top.i, top.st = done, oColon
		}
		return true
	case oColon:
		if c != ':' {
			return false
		}
		top.st = oValue
		return true
	case oValue:
		child := props[top.i].s
		top.st = oAfter
		top.i++
		return j.value(child, c)
	case oAfter:
		switch {
		case c == ',' && top.i < len(props):
			top.st = oNext
			return true
		case c == '}' && optionalFrom(props, top.i):
			j.pop()
			return true
		}
		return false
	case aOpen, aValue:
		if c == ']' && top.st == aOpen && top.s.minN == 0 {
			j.pop()
			return true
		}
		it := top.s.itemAt(top.i)
		if it == nil {
			return false
		}
		top.st = aAfter
		top.i++
		j.kh, j.leafUniq = fnvOffset, top.s.unique
		return j.value(it, c)
	case mOpen, mNext:
		if c == '}' && top.st == mOpen {
			j.pop()
			return true
		}
		if c != '"' {
			return false
		}
		top.st = mColon // once the key (a string leaf) has been read
		j.leaf, j.leafOn, j.leafNum, j.leafS = JSON{st: stStart}, true, false, nil
		j.leafKey, j.kh = true, fnvOffset
		return j.leafByte(c)
	case mColon:
		if c != ':' {
			return false
		}
		top.st = mValue
		return true
	case mValue:
		top.st = mAfter
		return j.value(top.s.mapV, c)
	case mAfter:
		switch c {
		case ',':
			top.st = mNext
			return true
		case '}':
			j.pop()
			return true
		}
		return false
	case aAfter:
		switch {
		case c == ',' && (top.s.maxN < 0 || top.i < top.s.maxN) && top.s.itemAt(top.i) != nil:
			top.st = aValue
			return true
		case c == ']' && top.i >= top.s.minN:
			j.pop()
			return true
		}
		return false
	}
	return false
}

// optionalFrom reports whether props[i:] may all be left out.
func optionalFrom(props []prop, i int) bool {
	for _, p := range props[i:] {
		if !p.opt {
			return false
		}
	}
	return true
}

// value starts a value of schema s with byte c.
func (j *SchemaJSON) value(s *Schema, c byte) bool {
	j.ws = wsRun{}
	if s.pick != nil { // the alternative whose values can start with c
		switch k := s.pick[c]; {
		case k >= 0:
			return j.value(s.alts[k], c)
		case k == objUnion:
			return j.startUnion(s.objs, c)
		}
		return false
	}
	if s.enum != nil {
		j.enum, j.alive, j.epos = s.enum, 1<<len(s.enum)-1, 0
		return j.enumByte(c)
	}
	k := s.kinds
	switch {
	case c == '{' && hasKind(k, kObject) && s.any: // any object: JSON's grammar reads it
		j.leaf, j.leafOn, j.leafNum = JSON{st: stStart, objectOnly: true, compact: j.compact}, true, false
		return j.leafByte(c)
	case c == '{' && hasKind(k, kObject) && s.mapV != nil:
		return j.push(s, mOpen)
	case c == '{' && hasKind(k, kObject):
		return j.push(s, oOpen)
	case c == '[' && hasKind(k, kArray):
		return j.push(s, aOpen)
	case c == '"' && hasKind(k, kString):
		j.leafNum, j.leafS, j.chars = false, s, -1 // the opening quote is not a character
		if s.re != nil {
			j.lre = s.re.startText()
		}
	case (c == 't' || c == 'f') && hasKind(k, kBoolean),
		c == 'n' && hasKind(k, kNull):
		j.leafNum, j.leafS = false, nil
	case (c == '-' || isDigit(c)) && hasKind(k, kNumber|kInteger):
		j.leafNum, j.leafInt = true, !hasKind(k, kNumber)
		j.leafB, j.ineg, j.ival, j.idig = nil, false, 0, 0
		if j.leafInt && s.bounded() {
			j.leafB = s
		}
		j.leafNB, j.nneg, j.ndot, j.nint, j.nfrac, j.nP, j.nF = nil, false, false, 0, 0, 0, 0
		if !j.leafInt && s.nb != nil {
			j.leafNB = s.nb
		}
	default:
		return false
	}
	j.leaf, j.leafOn = JSON{st: stStart}, true
	return j.leafByte(c)
}

// leafByte feeds a string, number or literal; the value ends after its
// closing byte, or (a number) before the first byte that cannot extend it.
func (j *SchemaJSON) leafByte(c byte) bool {
	if j.leafNum {
		num := isDigit(c) || c == '-' || c == '+' || (!j.leafInt && (c == '.' || c == 'e' || c == 'E'))
		if num {
			if b := j.leafB; b != nil { // a bounded integer: every prefix must still fit
				switch {
				case c == '-':
					j.ineg = true
				case isDigit(c) && j.idig < 18:
					j.ival, j.idig = j.ival*10+int64(c-'0'), j.idig+1
				default:
					return false
				}
				if !b.intFeasible(j.ineg, j.ival, j.idig, false) {
					return false
				}
			}
			if nb := j.leafNB; nb != nil && !j.numberByte(nb, c) {
				return false
			}
			if j.leafUniq {
				j.kh = (j.kh ^ uint64(c)) * fnvPrime
			}
			return j.leaf.byte(c)
		}
		if !j.leaf.Complete() || (j.leafB != nil && !j.leafB.intFeasible(j.ineg, j.ival, j.idig, true)) ||
			(j.leafNB != nil && !j.leafNB.numFeasible(j.nneg, j.nP, int(j.nint), j.ndot, j.nF, int(j.nfrac), true)) ||
			(j.leafUniq && !j.uniqueItem()) {
			return false
		}
		j.leafOn = false
		return j.byte(c)
	}
	if s := j.leafS; s != nil && j.leaf.st == stString { // a character starts here, or the string ends
		if c == '"' && j.chars >= 0 {
			if j.chars < s.minN {
				return false
			}
		} else if c&0xC0 != 0x80 { // not a UTF-8 continuation byte
			if j.chars++; s.maxN >= 0 && j.chars > s.maxN {
				return false
			}
		}
	} else if j.leafS != nil && j.leaf.st == stStart {
		j.chars = 0 // the opening quote
	}
	if s := j.leafS; s != nil && s.re != nil && !j.patternByte(s.re, c) {
		return false
	}
	if !j.leaf.byte(c) {
		return false
	}
	if j.leafKey || j.leafUniq {
		j.kh = (j.kh ^ uint64(c)) * fnvPrime
	}
	if j.leaf.st == stDone {
		if j.leafUniq && !j.uniqueItem() { // (the closing quote: the string must go on)
			return false
		}
		j.leafOn = false
		if j.leafKey { // a map's key: not one it has had (compared as written, by hash)
			j.leafKey = false
			top := &j.stack[len(j.stack)-1]
			if slices.Contains(top.keys, j.kh) {
				return false
			}
			top.keys = append(top.keys, j.kh)
		}
	}
	return true
}

// startUnion starts a value of a union of objects with its '{': one
// validator per object (at this nesting depth, with this whitespace rule)
// in a uUnion frame.
func (j *SchemaJSON) startUnion(objs []*Schema, c byte) bool {
	if j.depth0+len(j.stack) >= MaxDepth {
		return false
	}
	var subs []*SchemaJSON
	for _, o := range objs {
		v := &SchemaJSON{root: o, compact: j.compact, depth0: j.depth0 + len(j.stack)}
		if v.byte(c) {
			subs = append(subs, v)
		}
	}
	if len(subs) == 0 {
		return false
	}
	j.stack = append(j.stack, sframe{st: uUnion, subs: subs})
	return true
}

// unionByte feeds c to a copy of each union object's validator still
// matching, keeps those that take it, and ends the union's value when its
// object closes. The validators are copied, never changed: a frame's subs
// may be shared with the copy Accept works on.
func (j *SchemaJSON) unionByte(c byte) bool {
	top := &j.stack[len(j.stack)-1]
	var alive []*SchemaJSON
	closed := false
	for _, v := range top.subs {
		t := v.Clone()
		if t.byte(c) {
			alive = append(alive, t)
			closed = closed || t.Complete()
		}
	}
	switch {
	case len(alive) == 0:
		return false
	case closed: // the object's '}': the value is done (the parent's state was set before it began)
		j.pop()
		j.ws = wsRun{}
	case len(alive) == 1: // decided: read on as that object, in place of the union
		j.collapse(alive[0])
	default:
		top.subs = alive
	}
	return true
}

// collapse replaces the union frame on top of j's stack by v, the one
// alternative still matching: v's frames go on j's stack and its leaf
// state becomes j's, so the rest of the object is read as any object is
// (no copy of a validator a byte). When v's object closes, its frame pops
// and the parent's state, set before the union began, goes on — as the
// union frame's would have.
func (j *SchemaJSON) collapse(v *SchemaJSON) {
	base := j.stack[:len(j.stack)-1]
	root, depth0, scratch, lstack, compact := j.root, j.depth0, j.scratch, j.lstack, j.compact
	*j = *v
	j.root, j.depth0, j.scratch, j.lstack, j.compact = root, depth0, scratch, lstack, compact
	j.started = true
	j.stack = append(append(make([]sframe, 0, len(base)+len(v.stack)+4), base...), v.stack...)
	j.leaf.stack = append([]byte(nil), v.leaf.stack...)
}

// uniqueItem records a uniqueItems array's item that ends here (its hash
// in kh), refusing one the array has had (compared as written).
func (j *SchemaJSON) uniqueItem() bool {
	top := &j.stack[len(j.stack)-1]
	if slices.Contains(top.keys, j.kh) {
		return false
	}
	top.keys = append(top.keys, j.kh)
	j.leafUniq = false
	return true
}

// numberByte takes byte c of a bounded number: no exponent, at most
// maxNumDigits digits, and every prefix must still reach a value within
// the bounds (numBounds.numFeasible).
func (j *SchemaJSON) numberByte(nb *numBounds, c byte) bool {
	switch {
	case c == '-':
		j.nneg = true
	case c == '.':
		j.ndot = true
	case isDigit(c):
		if int(j.nint)+int(j.nfrac) >= maxNumDigits {
			return false
		}
		d := float64(c - '0')
		if j.ndot {
			j.nfrac++
			j.nF += d * math.Pow(10, -float64(j.nfrac))
		} else {
			j.nint++
			j.nP = j.nP*10 + d
		}
	default: // an exponent
		return false
	}
	return nb.numFeasible(j.nneg, j.nP, int(j.nint), j.ndot, j.nF, int(j.nfrac), false)
}

// jsonEscapes are the characters of JSON's one-letter escapes.
var jsonEscapes = [256]rune{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// patternByte runs byte c of a string leaf whose schema has a regex through
// the match, by the leaf's state before c: a raw character (UTF-8, whole
// or begun), an escape — only those JSON requires: \", \\ and control
// characters (\n, \uXXXX below U+0020; a character that can be written
// raw must be, so a model cannot wander off in \u escapes) — or the
// closing quote (the match must be complete). Bytes the leaf itself
// refuses pass here (it refuses them next).
func (j *SchemaJSON) patternByte(re *Regex, c byte) bool {
	switch j.leaf.st {
	case stString:
		switch c {
		case '"':
			return re.done(&j.lre)
		case '\\': // an escape must be able to write a character that may come
			set := re.cur(&j.lre)
			return re.canRange(set, 0, 0x1F) || re.canRange(set, '"', '"') || re.canRange(set, '\\', '\\')
		}
		return re.byte(&j.lre, c)
	case stUTF8:
		return re.byte(&j.lre, c)
	case stEscape: // only the escapes JSON needs: \" \\ and control characters
		if c == 'u' {
			j.hexv, j.hexn = 0, 0
			return re.canRange(re.cur(&j.lre), 0, 0x1F)
		}
		if r := jsonEscapes[c]; r != 0 && c != '/' {
			return re.char(&j.lre, r)
		}
		return c != '/' // (others the leaf refuses)
	case stHex:
		if !isHex(c) {
			return true
		}
		d := rune(c - '0')
		if c > '9' {
			d = rune(c|0x20-'a') + 10
		}
		j.hexv, j.hexn = j.hexv<<4|d, j.hexn+1
		rest := 4 * (4 - int(j.hexn))
		lo, hi := j.hexv<<rest, j.hexv<<rest|(1<<rest-1)
		if lo > 0x1F {
			return false
		}
		if j.hexn == 4 {
			return re.char(&j.lre, lo)
		}
		return re.canRange(re.cur(&j.lre), lo, min(hi, 0x1F))
	}
	return true
}

// FNV-1a, for map keys.
const (
	fnvOffset uint64 = 14695981039346656037
	fnvPrime  uint64 = 1099511628211
)

// enumByte matches byte c against the enum candidates still alive.
func (j *SchemaJSON) enumByte(c byte) bool {
	var next uint64
	for k, e := range j.enum {
		if j.alive&(1<<k) != 0 && len(e) > j.epos && e[j.epos] == c {
			next |= 1 << k
		}
	}
	if next == 0 {
		// c does not continue any candidate: the value ended before it if
		// one is whole (a number such as 1 among 1 and 12).
		for k, e := range j.enum {
			if j.alive&(1<<k) != 0 && len(e) == j.epos {
				j.enum = nil
				return j.byte(c)
			}
		}
		return false
	}
	j.alive = next
	j.epos++
	whole, longer := false, false
	for k, e := range j.enum {
		if next&(1<<k) != 0 {
			if len(e) == j.epos {
				whole = true
			} else {
				longer = true
			}
		}
	}
	if whole && !longer {
		j.enum = nil
	}
	return true
}

// take feeds b to a copy of j, stopping as soon as the copy is complete:
// the number of bytes that belong to the object, and false if one of them
// was refused. j is unchanged.
func (j *SchemaJSON) take(b []byte) (int, bool) {
	t := j.scratchCopy()
	defer j.keep(&t)
	for i, c := range b {
		if t.Complete() {
			return i, true
		}
		if !t.byte(c) {
			return i, false
		}
	}
	return len(b), true
}

// Wrapped is a SchemaJSON object between fixed bytes: prefix, the object
// (no whitespace after it), suffix — a tool call as a chat template asks
// for it, "<tool_call>\n{…}\n</tool_call>". Inside the object at most one
// space separates tokens (every whitespace byte is a token a small model
// would rather spend, and the arguments are compacted anyway). It is
// complete once the suffix is.
type Wrapped struct {
	prefix, suffix []byte
	p, s           int // bytes of prefix and suffix matched
	inner          *SchemaJSON
}

// NewWrapped returns a validator of prefix, one object matching schema,
// then suffix.
func NewWrapped(prefix []byte, schema *Schema, suffix []byte) *Wrapped {
	inner := NewSchemaJSON(schema)
	inner.compact = true
	return &Wrapped{prefix: prefix, suffix: suffix, inner: inner}
}

// Complete reports whether the suffix has been written.
func (w *Wrapped) Complete() bool { return w.s == len(w.suffix) && w.inner.Complete() }

// TokenClass is the object's, once the prefix is written and until the
// object is complete (Classer).
func (w *Wrapped) TokenClass() TokenClass {
	if w.p == len(w.prefix) && !w.inner.Complete() {
		return w.inner.TokenClass()
	}
	return NoClass
}

// pattern is the object's, once the prefix is written (patterned).
func (w *Wrapped) pattern() (*Regex, reText, bool) {
	if w.p == len(w.prefix) && !w.inner.Complete() {
		return w.inner.pattern()
	}
	return nil, reText{}, false
}

// Accept reports whether b may come next, leaving w unchanged.
func (w *Wrapped) Accept(b []byte) bool {
	_, _, _, ok := w.split(b)
	return ok && len(b) > 0
}

// Advance appends b if it is accepted and reports whether it was.
func (w *Wrapped) Advance(b []byte) bool {
	np, inner, ns, ok := w.split(b)
	if !ok || len(b) == 0 {
		return false
	}
	w.p += np
	w.inner.Advance(inner)
	w.s += ns
	return true
}

// split cuts b into its prefix bytes (count), the object's bytes and its
// suffix bytes (count), and reports whether all of b fits.
func (w *Wrapped) split(b []byte) (int, []byte, int, bool) {
	np := 0
	for np < len(b) && w.p+np < len(w.prefix) {
		if b[np] != w.prefix[w.p+np] {
			return 0, nil, 0, false
		}
		np++
	}
	rest := b[np:]
	if len(rest) == 0 {
		return np, nil, 0, true
	}
	n := 0
	if !w.inner.Complete() {
		var ok bool
		if n, ok = w.inner.take(rest); !ok {
			return 0, nil, 0, false
		}
	}
	inner, tail := rest[:n], rest[n:]
	if w.s+len(tail) > len(w.suffix) || !bytes.Equal(tail, w.suffix[w.s:w.s+len(tail)]) {
		return 0, nil, 0, false
	}
	return np, inner, len(tail), true
}
