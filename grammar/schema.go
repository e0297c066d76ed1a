package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Schema is a compiled subset of JSON Schema, the part structured outputs
// use (OpenAI's strict mode, pydantic's models): typed objects whose
// properties are generated in the schema's order with no others (required
// ones always, optional ones when the model chooses; an object schema that
// lists no properties and does not refuse additional ones takes any object),
// arrays of one item schema, strings, numbers, integers, booleans, null,
// unions of those types
// ("type": [...], or anyOf / oneOf whose alternatives differ in their first
// byte: at most one object, one array, one string…), enum / const values,
// $ref into $defs / definitions (recursive too), maps (additionalProperties
// as a schema), minItems / maxItems and minLength / maxLength
// (characters). CompileSchema names any other
// keyword instead of ignoring it.
type Schema struct {
	kinds  uint8      // allowed types (kObject…); 0 with enum or alts
	minN   int        // array: items at least (minItems); string: characters at least (minLength)
	maxN   int        // the same at most (maxItems / maxLength); -1: no bound
	ilo    int64      // integer: the least value (minimum, exclusiveMinimum); math.MinInt64: none
	ihi    int64      // integer: the greatest (maximum, exclusiveMaximum); math.MaxInt64: none
	nb     *numBounds // number: its bounds (nil: none)
	mult   int64      // integer: a value must be a multiple of it (multipleOf; 0: none)
	props  []prop     // object: every property, in order
	items  *Schema    // array: each item (after prefix's; nil with prefix: none)
	prefix []*Schema  // array: the first items' schemas, one each (prefixItems: a tuple)
	unique bool       // array: no item twice (uniqueItems; items of strings or numbers, compared as written)
	enum   [][]byte   // the allowed values, JSON-encoded (enum / const)
	any    bool       // object: any JSON object (no properties listed, additional ones allowed)
	mapV   *Schema    // object: a map, every value of this schema (additionalProperties: {schema})
	alts   []*Schema  // anyOf / oneOf: alternatives told apart by their first byte
	objs   []*Schema  // anyOf / oneOf: objects with properties, all starting with { (pick[{] is objUnion)
	pick   *[256]int8 // alts: the alternative a value starting with byte b takes (-1: none)
	re     *Regex     // string: its characters match this in full (pattern, or a known format)
}

type prop struct {
	key []byte // the JSON-encoded name, quotes included
	s   *Schema
	opt bool // may be left out
}

const (
	kObject uint8 = 1 << iota
	kArray
	kString
	kNumber
	kInteger
	kBoolean
	kNull
)

var kindNames = map[string]uint8{"object": kObject, "array": kArray, "string": kString, "number": kNumber,
	"integer": kInteger, "boolean": kBoolean, "null": kNull}

// maxEnum is the most enum values a schema may list; maxOptRun the most
// optional properties in a row (a key is matched against all of them).
const (
	maxEnum   = 64
	maxOptRun = 63
)

// annotations are keywords that do not constrain the value. "format" is
// one too, except for the formats in formatRegex: JSON Schema (2019-09 on)
// makes it an annotation unless the format-assertion vocabulary is on, but
// a generated date, time, date-time, uuid, ipv4 or email had better be one,
// so those are constrained (as OpenAI's strict mode and xgrammar do);
// others are generated as plain strings.
var annotations = map[string]bool{"title": true, "description": true, "$schema": true, "$id": true, "$comment": true,
	"examples": true, "default": true, "strict": true, "$defs": true, "definitions": true, "format": true,
	"readOnly": true, "writeOnly": true, "deprecated": true,
	"discriminator": true} // (OpenAPI's: a union's objects are read side by side anyway)

// formatRegex are the string formats generated to their shape (RFC 3339's
// full-date, full-time and date-time; RFC 4122 UUIDs; dotted-quad IPv4; a
// plain address@domain email).
var formatRegex = map[string]string{
	"date":      `\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])`,
	"time":      `([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)`,
	"date-time": `\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)`,
	"uuid":      `[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`,
	"ipv4":      `((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)`,
	"email":     `[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}`,
}

// CompileSchema compiles a JSON Schema (the subset Schema describes; the
// top level must be an object) or says which part it does not support.
func CompileSchema(raw []byte) (*Schema, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	v, err := decodeOrdered(d, 0)
	if err != nil {
		return nil, fmt.Errorf("schema: %v", err)
	}
	if _, err := d.Token(); err == nil {
		return nil, fmt.Errorf("schema: more than one JSON value")
	}
	c := &compiler{resolving: map[string]*Schema{}, done: map[string]*Schema{}, cyclic: map[*Schema]string{}, unknown: map[*Schema]string{}}
	if root, ok := v.(*object); ok {
		for _, k := range []string{"$defs", "definitions"} {
			if d, ok := root.vals[k].(*object); ok {
				c.defs = append(c.defs, defs{"#/" + k + "/", d})
			}
		}
	}
	s, err := c.compile(v, "schema", 0)
	if err != nil {
		return nil, err
	}
	if len(c.cyclic) > 0 && !finite(s) {
		return nil, fmt.Errorf("schema: no finite value matches it (a $ref recurses through required properties or minItems)")
	}
	rootUnion := s.pick != nil && len(s.alts) == 0 && len(s.objs) > 1 // anyOf of objects: one of them
	if !rootUnion && (s.kinds != kObject || s.enum != nil || s.alts != nil) {
		return nil, fmt.Errorf("schema: the top level must be {\"type\": \"object\", …} (or anyOf objects)")
	}
	return s, nil
}

// compiler holds what $ref resolves against.
type compiler struct {
	defs      []defs
	resolving map[string]*Schema // refs being compiled: their placeholders (nil: none), which a recursive $ref returns
	done      map[string]*Schema // refs compiled
	cyclic    map[*Schema]string // placeholders a recursive $ref returned, and their refs
	unknown   map[*Schema]string // placeholders of definitions without a plain type, until filled: nothing may look inside them
}

type defs struct {
	prefix string // "#/$defs/" or "#/definitions/"
	o      *object
}

// object is a decoded JSON object with its keys in written order.
type object struct {
	keys []string
	vals map[string]any
}

// decodeOrdered decodes one JSON value from d: objects as *object,
// arrays as []any, numbers as json.Number.
func decodeOrdered(d *json.Decoder, depth int) (any, error) {
	if depth > 2*MaxDepth {
		return nil, fmt.Errorf("nested deeper than %d", 2*MaxDepth)
	}
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t {
	case json.Delim('{'):
		o := &object{vals: map[string]any{}}
		for d.More() {
			kt, err := d.Token()
			if err != nil {
				return nil, err
			}
			k := kt.(string)
			v, err := decodeOrdered(d, depth+1)
			if err != nil {
				return nil, err
			}
			if _, dup := o.vals[k]; dup {
				return nil, fmt.Errorf("key %q twice in one object", k)
			}
			o.keys = append(o.keys, k)
			o.vals[k] = v
		}
		_, err := d.Token()
		return o, err
	case json.Delim('['):
		var list []any
		for d.More() {
			v, err := decodeOrdered(d, depth+1)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		_, err := d.Token()
		if list == nil {
			list = []any{}
		}
		return list, err
	}
	return t, nil
}

func (c *compiler) compile(v any, at string, depth int) (*Schema, error) {
	if depth >= MaxDepth {
		return nil, fmt.Errorf("%s: nested deeper than %d", at, MaxDepth)
	}
	o, ok := v.(*object)
	if !ok {
		return nil, fmt.Errorf("%s: a schema must be an object", at)
	}
	m := o.vals
	for _, k := range o.keys {
		switch k {
		case "type", "properties", "required", "additionalProperties", "items", "prefixItems", "uniqueItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
			"minItems", "maxItems", "minLength", "maxLength", "nullable", "pattern", "multipleOf",
			"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum":
		default:
			if !annotations[k] {
				return nil, fmt.Errorf("%s: keyword %q is not supported (supported: type, properties, required, additionalProperties, items, prefixItems, uniqueItems (of strings and numbers), minItems, maxItems, minLength, maxLength, pattern, minimum / maximum and their exclusive forms on integers and numbers, multipleOf on integers, nullable, enum, const, anyOf, oneOf, allOf of one schema, $ref; format constrains date, time, date-time, uuid, ipv4 and email; other annotations are ignored)", at, k)
			}
		}
	}
	if r, ok := m["$ref"]; ok {
		if len(o.keys) > 1 {
			for _, k := range o.keys {
				if k != "$ref" && !annotations[k] {
					return nil, fmt.Errorf("%s: $ref with %q beside it", at, k)
				}
			}
		}
		ref, _ := r.(string)
		return c.ref(ref, at, depth)
	}
	if all, ok := m["allOf"]; ok { // one schema (older pydantic wraps a $ref so): that schema
		list, isList := all.([]any)
		if !isList || len(list) != 1 {
			return nil, fmt.Errorf("%s.allOf: only a list of one schema is supported", at)
		}
		for _, k := range o.keys {
			if k != "allOf" && !annotations[k] {
				return nil, fmt.Errorf("%s: allOf with %q beside it", at, k)
			}
		}
		return c.compile(list[0], at+".allOf[0]", depth+1)
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, ok := m[k]; ok {
			for _, x := range []string{"type", "properties", "items", "enum", "const"} {
				if _, both := m[x]; both {
					return nil, fmt.Errorf("%s: %s with %q beside it", at, k, x)
				}
			}
			return c.union(alts, at+"."+k, depth)
		}
	}
	s := &Schema{}
	if t, ok := m["type"]; ok {
		names, ok := t.([]any)
		if !ok {
			names = []any{t}
		}
		for _, n := range names {
			name, _ := n.(string)
			k, ok := kindNames[name]
			if !ok {
				return nil, fmt.Errorf("%s.type: %v is not a JSON Schema type", at, n)
			}
			s.kinds |= k
		}
		if s.kinds&kObject != 0 && s.kinds != kObject|s.kinds&kNull {
			return nil, fmt.Errorf("%s.type: an object can only be unioned with null here (anyOf takes more)", at)
		}
		if s.kinds&kArray != 0 && s.kinds != kArray|s.kinds&kNull {
			return nil, fmt.Errorf("%s.type: an array can only be unioned with null here (anyOf takes more)", at)
		}
	}
	if m["nullable"] == true && s.kinds != 0 { // OpenAPI's nullable: null too
		s.kinds |= kNull
	}
	if e, ok := m["enum"]; ok {
		list, ok := e.([]any)
		if !ok || len(list) == 0 || len(list) > maxEnum {
			return nil, fmt.Errorf("%s.enum: must be a list of 1 to %d values", at, maxEnum)
		}
		for i, x := range list {
			b, err := literal(x)
			if err != nil {
				return nil, fmt.Errorf("%s.enum[%d]: %v", at, i, err)
			}
			s.enum = append(s.enum, b)
		}
	}
	if cv, ok := m["const"]; ok {
		if s.enum != nil {
			return nil, fmt.Errorf("%s: enum and const together", at)
		}
		b, err := literal(cv)
		if err != nil {
			return nil, fmt.Errorf("%s.const: %v", at, err)
		}
		s.enum = [][]byte{b}
	}
	if s.enum != nil {
		if s.kinds&(kObject|kArray) != 0 {
			return nil, fmt.Errorf("%s: enum / const of an object or array type", at)
		}
		s.kinds = 0
		return s, nil
	}
	if s.kinds == 0 {
		return nil, fmt.Errorf("%s: needs \"type\" (or enum / const, anyOf, $ref)", at)
	}
	if s.kinds&kObject != 0 {
		if err := c.object(s, m, at, depth); err != nil {
			return nil, err
		}
	} else if _, ok := m["properties"]; ok {
		return nil, fmt.Errorf("%s.properties: only for type object", at)
	}
	if err := s.intBounds(m, at); err != nil {
		return nil, err
	}
	s.maxN = -1
	for _, b := range []struct {
		key  string
		kind uint8
		dst  *int
	}{{"minItems", kArray, &s.minN}, {"maxItems", kArray, &s.maxN}, {"minLength", kString, &s.minN}, {"maxLength", kString, &s.maxN}} {
		v, ok := m[b.key]
		if !ok {
			continue
		}
		if s.kinds&b.kind == 0 || s.kinds&(kArray|kString) == kArray|kString {
			return nil, fmt.Errorf("%s.%s: only for type %s (alone)", at, b.key, map[uint8]string{kArray: "array", kString: "string"}[b.kind])
		}
		num, _ := v.(json.Number)
		n, err := num.Int64()
		if err != nil || n < 0 || n > 1<<20 {
			return nil, fmt.Errorf("%s.%s: must be an integer in [0, %d]", at, b.key, 1<<20)
		}
		*b.dst = int(n)
	}
	if err := s.stringRegex(m, at); err != nil {
		return nil, err
	}
	if s.maxN >= 0 && s.minN > s.maxN {
		return nil, fmt.Errorf("%s: the minimum %d is above the maximum %d", at, s.minN, s.maxN)
	}
	if s.kinds&kArray != 0 {
		if pi, ok := m["prefixItems"]; ok { // a tuple: item i of prefixItems[i], then of items (if any)
			list, isList := pi.([]any)
			if !isList || len(list) == 0 || len(list) > maxEnum {
				return nil, fmt.Errorf("%s.prefixItems: must be a list of 1 to %d schemas", at, maxEnum)
			}
			for i, x := range list {
				sub, err := c.compile(x, fmt.Sprintf("%s.prefixItems[%d]", at, i), depth+1)
				if err != nil {
					return nil, err
				}
				s.prefix = append(s.prefix, sub)
			}
		}
		it, ok := m["items"]
		switch {
		case ok && it == false && s.prefix != nil: // no items past the tuple's
		case ok:
			var err error
			if s.items, err = c.compile(it, at+".items", depth+1); err != nil {
				return nil, err
			}
		case s.prefix == nil:
			return nil, fmt.Errorf("%s.items: an array needs an item schema", at)
		}
		if u, _ := m["uniqueItems"].(bool); u {
			if _, unknown := c.unknown[s.items]; unknown || s.prefix != nil || s.items == nil || s.items.enum != nil || s.items.alts != nil ||
				s.items.kinds&^(kString|kInteger|kNumber) != 0 {
				return nil, fmt.Errorf("%s.uniqueItems: supported on arrays whose items are strings, integers or numbers", at)
			}
			s.unique = true
		}
		if s.items == nil && s.minN > len(s.prefix) {
			return nil, fmt.Errorf("%s: minItems %d with %d prefixItems and no items", at, s.minN, len(s.prefix))
		}
	} else {
		for _, k := range []string{"items", "prefixItems", "uniqueItems"} {
			if _, ok := m[k]; ok {
				return nil, fmt.Errorf("%s.%s: only for type array", at, k)
			}
		}
	}
	return s, nil
}

// itemAt is array item i's schema (nil: no item i may come).
func (s *Schema) itemAt(i int) *Schema {
	if i < len(s.prefix) {
		return s.prefix[i]
	}
	return s.items
}

// stringRegex compiles a string schema's pattern (in full: a leading ^
// and trailing $ change nothing), else its format's regex when it has a
// known one.
func (s *Schema) stringRegex(m map[string]any, at string) error {
	src := ""
	if p, ok := m["pattern"]; ok {
		ps, isStr := p.(string)
		if !isStr || s.kinds&kString == 0 {
			return fmt.Errorf("%s.pattern: a regular expression (a string), only for type string", at)
		}
		src = ps
	} else if f, ok := m["format"].(string); ok && formatRegex[f] != "" && s.kinds&kString != 0 {
		src = formatRegex[f]
	}
	if src == "" {
		return nil
	}
	re, err := CompileRegex(src)
	if err != nil {
		return fmt.Errorf("%s.pattern: %v", at, err)
	}
	s.re = re
	return nil
}

// ref compiles a local reference into $defs or definitions. A reference
// met again while its definition compiles (a recursive schema: a tree, a
// linked list, a JSON-like value) gets a placeholder that the compiled
// definition fills in. A definition with a plain type gets one made from
// that type, which the schemas around it may look at before it is filled
// (a union of it and null); one without (a union itself) gets an empty
// placeholder, which may sit in items, properties or maps, not be looked
// at (be an alternative of a union) before it is filled.
func (c *compiler) ref(ref, at string, depth int) (*Schema, error) {
	if s, ok := c.done[ref]; ok {
		return s, nil
	}
	for _, d := range c.defs {
		name, ok := strings.CutPrefix(ref, d.prefix)
		if !ok {
			continue
		}
		v, ok := d.o.vals[name]
		if !ok {
			break
		}
		if ph, ok := c.resolving[ref]; ok {
			c.cyclic[ph] = ref
			return ph, nil
		}
		ph := shape(v)
		known := ph != nil
		if !known {
			ph = &Schema{}
			c.unknown[ph] = ref
		}
		c.resolving[ref] = ph
		s, err := c.compile(v, ref, depth+1)
		delete(c.resolving, ref)
		delete(c.unknown, ph)
		if err != nil {
			return nil, err
		}
		if _, used := c.cyclic[ph]; used && known && (!bytes.Equal(firstBytes(ph), firstBytes(s)) || plainObject(ph) != plainObject(s)) {
			return nil, fmt.Errorf("%s: $ref %q: its definition compiles to another shape than its type says", at, ref)
		}
		*ph = *s
		c.done[ref] = ph
		return ph, nil
	}
	return nil, fmt.Errorf("%s: $ref %q is not a local #/$defs/… or #/definitions/… entry", at, ref)
}

// shape is the placeholder of a definition that may refer to itself: a
// schema with its kinds, and for an object whether it is a map or any
// object (what firstBytes and plainObject read) — nil when the definition
// has no plain type.
func shape(v any) *Schema {
	o, ok := v.(*object)
	if !ok {
		return nil
	}
	for _, k := range []string{"$ref", "allOf", "anyOf", "oneOf", "enum", "const"} {
		if _, ok := o.vals[k]; ok {
			return nil
		}
	}
	t, ok := o.vals["type"]
	if !ok {
		return nil
	}
	names, ok := t.([]any)
	if !ok {
		names = []any{t}
	}
	s := &Schema{}
	for _, n := range names {
		name, _ := n.(string)
		s.kinds |= kindNames[name]
	}
	if o.vals["nullable"] == true {
		s.kinds |= kNull
	}
	if s.kinds&kObject != 0 {
		ap := o.vals["additionalProperties"]
		if _, isSchema := ap.(*object); isSchema {
			s.mapV = &Schema{}
		} else if _, has := o.vals["properties"]; !has {
			s.any = ap != false
		}
	}
	return s
}

// finite reports whether every schema within root is matched by some
// finite JSON value: a recursive schema must leave a way out (an optional
// property, an empty array, a null alternative), or a model that enters it
// could never finish.
func finite(root *Schema) bool {
	var all []*Schema
	seen := map[*Schema]bool{}
	var walk func(s *Schema)
	walk = func(s *Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		all = append(all, s)
		for _, p := range s.props {
			walk(p.s)
		}
		for _, x := range append(append(append([]*Schema{s.items, s.mapV}, s.prefix...), s.alts...), s.objs...) {
			walk(x)
		}
	}
	walk(root)
	fin := map[*Schema]bool{}
	ok := func(s *Schema) bool {
		switch {
		case s.enum != nil || s.kinds&(kString|kNumber|kInteger|kBoolean|kNull) != 0:
			return true
		case s.pick != nil:
			for _, a := range append(slices.Clone(s.alts), s.objs...) {
				if fin[a] {
					return true
				}
			}
			return false
		case s.kinds&kArray != 0:
			for i := range s.minN {
				if it := s.itemAt(i); it == nil || !fin[it] {
					return false
				}
			}
			return true
		case s.kinds&kObject != 0:
			if s.any || s.mapV != nil {
				return true
			}
			for _, p := range s.props {
				if !p.opt && !fin[p.s] {
					return false
				}
			}
			return true
		}
		return false
	}
	for changed := true; changed; {
		changed = false
		for _, s := range all {
			if !fin[s] && ok(s) {
				fin[s], changed = true, true
			}
		}
	}
	for _, s := range all {
		if !fin[s] {
			return false
		}
	}
	return true
}

// union compiles anyOf / oneOf: alternatives whose values start with
// different bytes, so the first byte picks one (a nested union is merged).
func (c *compiler) union(v any, at string, depth int) (*Schema, error) {
	list, ok := v.([]any)
	if !ok || len(list) == 0 {
		return nil, fmt.Errorf("%s: must be a list of schemas", at)
	}
	u := &Schema{pick: new([256]int8)}
	for b := range u.pick {
		u.pick[b] = -1
	}
	var objs []*Schema // alternatives that are objects with properties: told apart as the text goes on
	for i, x := range list {
		a, err := c.compile(x, fmt.Sprintf("%s[%d]", at, i), depth+1)
		if err != nil {
			return nil, err
		}
		if ref, ok := c.unknown[a]; ok {
			return nil, fmt.Errorf("%s[%d]: $ref %q is an alternative of a union inside its own definition (not supported: give the definition a plain type)", at, i, ref)
		}
		alts := []*Schema{a}
		if a.pick != nil { // a nested union: merged
			alts = append(slices.Clone(a.alts), a.objs...)
		}
		for _, a := range alts {
			added := false
			for _, b := range firstBytes(a) {
				if b == '{' && plainObject(a) {
					if !slices.Contains(objs, a) {
						objs = append(objs, a)
					}
					continue
				}
				if u.pick[b] >= 0 {
					return nil, fmt.Errorf("%s[%d]: two alternatives can start with %q (they must differ in type, or be objects with properties)", at, i, b)
				}
				if !added {
					u.alts, added = append(u.alts, a), true
				}
				u.pick[b] = int8(len(u.alts) - 1)
			}
		}
		if len(u.alts)+len(objs) > 127 {
			return nil, fmt.Errorf("%s: more than 127 alternatives", at)
		}
	}
	switch {
	case len(objs) == 1 && u.pick['{'] >= 0:
		return nil, fmt.Errorf("%s: two alternatives can start with '{' (an object with properties and a map or any object)", at)
	case len(objs) == 1: // one object: an ordinary alternative
		if !slices.Contains(u.alts, objs[0]) {
			u.alts = append(u.alts, objs[0])
		}
		u.pick['{'] = int8(slices.Index(u.alts, objs[0]))
	case len(objs) > 1:
		if u.pick['{'] >= 0 {
			return nil, fmt.Errorf("%s: objects with properties beside a map or any object", at)
		}
		u.pick['{'], u.objs = objUnion, objs
	}
	if len(u.alts) == 1 && u.objs == nil {
		return u.alts[0], nil
	}
	return u, nil
}

// objUnion in a union's pick table: the value is one of its objects
// (Schema.objs), all read side by side until the object closes.
const objUnion = -2

// plainObject reports whether a is an object with listed properties (a
// union's objects are told apart by them), not a map or any object.
func plainObject(a *Schema) bool {
	return a.kinds&kObject != 0 && !a.any && a.mapV == nil && a.enum == nil
}

// firstBytes lists the bytes a value of s (not a union) can start with.
func firstBytes(s *Schema) []byte {
	if s.enum != nil {
		var out []byte
		for _, e := range s.enum {
			if !bytes.Contains(out, e[:1]) {
				out = append(out, e[0])
			}
		}
		return out
	}
	var out []byte
	if s.kinds&kObject != 0 {
		out = append(out, '{')
	}
	if s.kinds&kArray != 0 {
		out = append(out, '[')
	}
	if s.kinds&kString != 0 {
		out = append(out, '"')
	}
	if s.kinds&(kNumber|kInteger) != 0 {
		out = append(out, "-0123456789"...)
	}
	if s.kinds&kBoolean != 0 {
		out = append(out, 't', 'f')
	}
	if s.kinds&kNull != 0 {
		out = append(out, 'n')
	}
	return out
}

// object reads properties, required and additionalProperties into s.
func (c *compiler) object(s *Schema, m map[string]any, at string, depth int) error {
	ap, hasAP := m["additionalProperties"]
	props, _ := m["properties"].(*object)
	if _, ok := m["properties"]; ok && props == nil {
		return fmt.Errorf("%s.properties: must be an object", at)
	}
	if apo, ok := ap.(*object); ok { // a map: any keys, values of one schema
		if props != nil || m["required"] != nil {
			return fmt.Errorf("%s: additionalProperties as a schema only without properties (a map)", at)
		}
		var err error
		s.mapV, err = c.compile(apo, at+".additionalProperties", depth+1)
		return err
	}
	if hasAP && ap != false && ap != true {
		return fmt.Errorf("%s.additionalProperties: must be true, false or a schema", at)
	}
	if props == nil {
		// No properties: any object, unless additional ones are refused
		// ({} then). With properties, only those are generated (a valid
		// subset of what additionalProperties: true allows).
		s.any = ap != false
		props = &object{vals: map[string]any{}}
	}
	req := map[string]bool{}
	if r, ok := m["required"]; ok {
		list, ok := r.([]any)
		if !ok {
			return fmt.Errorf("%s.required: must be a list of names", at)
		}
		for _, x := range list {
			name, ok := x.(string)
			if _, isProp := props.vals[name]; !ok || !isProp {
				return fmt.Errorf("%s.required: %v is not a property", at, x)
			}
			req[name] = true
		}
	}
	run := 0
	for _, name := range props.keys { // generated in the order the schema writes them
		ps, err := c.compile(props.vals[name], at+".properties."+name, depth+1)
		if err != nil {
			return err
		}
		key, _ := json.Marshal(name)
		s.props = append(s.props, prop{key: key, s: ps, opt: !req[name]})
		if run++; req[name] {
			run = 0
		} else if run > maxOptRun {
			return fmt.Errorf("%s.properties: more than %d optional properties in a row", at, maxOptRun)
		}
	}
	return nil
}

// literal encodes an enum / const value (a string, number, boolean or null).
func literal(x any) ([]byte, error) {
	switch x := x.(type) {
	case string, bool, nil:
		return json.Marshal(x)
	case json.Number:
		return []byte(x.String()), nil
	}
	return nil, fmt.Errorf("%v: only strings, numbers, booleans and null", x)
}

// hasKind reports whether kinds allows k.
func hasKind(kinds, k uint8) bool { return kinds&k != 0 }

// intBounds reads minimum, maximum, exclusiveMinimum and exclusiveMaximum
// (JSON Schema 2019 on: numbers) of an integer schema into ilo / ihi.
func (s *Schema) intBounds(m map[string]any, at string) error {
	s.ilo, s.ihi = math.MinInt64, math.MaxInt64
	if _, ok := m["multipleOf"]; ok && s.kinds&^kNull != kInteger {
		return fmt.Errorf("%s.multipleOf: supported on integers only", at)
	}
	if s.kinds&^kNull == kNumber {
		return s.numberBounds(m, at)
	}
	for _, k := range []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} {
		v, ok := m[k]
		if !ok {
			continue
		}
		if s.kinds&^kNull != kInteger {
			return fmt.Errorf("%s.%s: bounds are supported on integers and numbers alone (with null)", at, k)
		}
		num, _ := v.(json.Number)
		f, err := num.Float64()
		if err != nil || math.Abs(f) > 1e18 {
			return fmt.Errorf("%s.%s: must be a number within ±1e18", at, k)
		}
		switch k {
		case "minimum":
			s.ilo = max(s.ilo, int64(math.Ceil(f)))
		case "exclusiveMinimum":
			s.ilo = max(s.ilo, int64(math.Floor(f))+1)
		case "maximum":
			s.ihi = min(s.ihi, int64(math.Floor(f)))
		case "exclusiveMaximum":
			s.ihi = min(s.ihi, int64(math.Ceil(f))-1)
		}
	}
	if v, ok := m["multipleOf"]; ok {
		num, _ := v.(json.Number)
		n, err := num.Int64()
		if s.kinds&^kNull != kInteger || err != nil || n < 1 || n > 1e15 {
			return fmt.Errorf("%s.multipleOf: supported on integers, as an integer in [1, 1e15]", at)
		}
		s.mult = n
	}
	if !s.hasMultiple(s.ilo, s.ihi) {
		return fmt.Errorf("%s: no integer lies within the bounds", at)
	}
	return nil
}

// bounded reports whether an integer schema has bounds.
func (s *Schema) bounded() bool {
	return s.ilo != math.MinInt64 || s.ihi != math.MaxInt64 || s.mult > 1
}

// hasMultiple reports whether [a, b] holds a multiple of s.mult (any
// integer when mult ≤ 1).
func (s *Schema) hasMultiple(a, b int64) bool {
	if a > b {
		return false
	}
	if s.mult <= 1 {
		return true
	}
	first := a / s.mult * s.mult // toward zero
	if first < a {
		first += s.mult
	}
	return first <= b
}

// intFeasible reports whether an integer whose decimal form starts with
// the prefix (neg: a minus sign; v: the value of digits digits, 0 for none)
// can lie in [ilo, ihi] — exact (no more digits) when done.
// numBounds are a number's minimum and maximum (±Inf: none) and whether
// each is exclusive.
type numBounds struct {
	lo, hi     float64
	loEx, hiEx bool
}

// numberBounds reads a number's bounds. Bounded numbers are generated
// without an exponent and with at most maxNumDigits digits, so that every
// prefix's reachable values are an interval numFeasible can test.
func (s *Schema) numberBounds(m map[string]any, at string) error {
	b := numBounds{lo: math.Inf(-1), hi: math.Inf(1)}
	any := false
	for _, k := range []string{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} {
		v, ok := m[k]
		if !ok {
			continue
		}
		num, _ := v.(json.Number)
		f, err := num.Float64()
		if err != nil || math.Abs(f) > 1e15 {
			return fmt.Errorf("%s.%s: must be a number within ±1e15", at, k)
		}
		any = true
		switch k {
		case "minimum":
			if f > b.lo || (f == b.lo && b.loEx) {
				b.lo, b.loEx = f, false
			}
		case "exclusiveMinimum":
			if f >= b.lo {
				b.lo, b.loEx = f, true
			}
		case "maximum":
			if f < b.hi || (f == b.hi && b.hiEx) {
				b.hi, b.hiEx = f, false
			}
		case "exclusiveMaximum":
			if f <= b.hi {
				b.hi, b.hiEx = f, true
			}
		}
	}
	if !any {
		return nil
	}
	if b.lo > b.hi || (b.lo == b.hi && (b.loEx || b.hiEx)) {
		return fmt.Errorf("%s: no number lies within the bounds", at)
	}
	s.nb = &b
	return nil
}

// maxNumDigits is the most digits a bounded number may have.
const maxNumDigits = 15

// meets reports whether the values between x0 and x1 (each end open or
// closed) include one within the bounds.
func (b *numBounds) meets(x0, x1 float64, open0, open1 bool) bool {
	lo, loOpen := x0, open0
	if b.lo > lo || (b.lo == lo && b.loEx) {
		lo, loOpen = b.lo, b.loEx
	}
	hi, hiOpen := x1, open1
	if b.hi < hi || (b.hi == hi && b.hiEx) {
		hi, hiOpen = b.hi, b.hiEx
	}
	return lo < hi || (lo == hi && !loOpen && !hiOpen)
}

// numFeasible reports whether a number that starts with the digits read so
// far — sign neg, integer part p (k digits), then, after a dot, fraction
// f (kf digits, f < 1) — can end within the bounds; done: it ends here.
func (b *numBounds) numFeasible(neg bool, p float64, k int, dot bool, f float64, kf int, done bool) bool {
	// mag reports whether magnitudes in [a, z) are reachable in range.
	mag := func(a, z float64) bool {
		if neg {
			return b.meets(-z, -a, true, false)
		}
		return b.meets(a, z, false, true)
	}
	switch {
	case done:
		v := p + f
		if neg {
			v = -v
		}
		return k > 0 && (!dot || kf > 0) && b.meets(v, v, false, false)
	case k == 0: // a sign alone
		return mag(0, math.Inf(1))
	case dot:
		v := p + f
		return mag(v, v+math.Pow(10, -float64(kf)))
	case p == 0: // "0" cannot take more integer digits
		return mag(0, 1)
	}
	for m, scale := 0, 1.0; m+k <= maxNumDigits; m, scale = m+1, scale*10 {
		if mag(p*scale, (p+1)*scale) {
			return true
		}
	}
	return false
}

func (s *Schema) intFeasible(neg bool, v int64, digits int, done bool) bool {
	if done {
		if neg {
			v = -v
		}
		return digits > 0 && v >= s.ilo && v <= s.ihi && (s.mult <= 1 || v%s.mult == 0)
	}
	if digits == 0 { // a sign alone: any negative number in range?
		return neg && s.hasMultiple(s.ilo, min(s.ihi, -1))
	}
	if v == 0 { // "0" or "-0" cannot grow
		return s.ilo <= 0 && s.ihi >= 0
	}
	// Completions: v·10^j + r, 0 ≤ r < 10^j, for j = 0, 1, … (within int64).
	lo, span := v, int64(1)
	for j := 0; j <= 18 && lo <= math.MaxInt64/10; j++ {
		a, b := lo, lo+span-1
		if neg {
			a, b = -b, -a
		}
		if s.hasMultiple(max(a, s.ilo), min(b, s.ihi)) {
			return true
		}
		if (!neg && a > s.ihi) || (neg && b < s.ilo) {
			return false // growing only moves further out
		}
		lo, span = lo*10, span*10
	}
	return false
}
