package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

const personSchema = `{
  "type": "object",
  "title": "a person",
  "properties": {
    "name": {"type": "string", "description": "full name"},
    "age": {"type": "integer"},
    "height": {"type": ["number", "null"]},
    "role": {"enum": ["admin", "user", "a"]},
    "level": {"enum": [1, 12, true, null]},
    "tags": {"type": "array", "items": {"type": "string"}},
    "address": {"type": ["object", "null"], "properties": {"city": {"type": "string"}, "zip": {"const": "75001"}},
                "required": ["city", "zip"], "additionalProperties": false},
    "ok": {"type": "boolean"},
    "empty": {"type": "object", "additionalProperties": false},
    "meta": {"type": "object"}
  },
  "required": ["name", "age", "height", "role", "level", "tags", "address", "ok", "empty", "meta"],
  "additionalProperties": false
}`

func mustSchema(t testing.TB, s string) *Schema {
	t.Helper()
	c, err := CompileSchema([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// feedSchema runs text through a fresh validator byte by byte: bytes
// accepted and whether the text is complete.
func feedSchema(s *Schema, text string) (int, bool) {
	j := NewSchemaJSON(s)
	for i := 0; i < len(text); i++ {
		if !j.Advance([]byte{text[i]}) {
			return i, false
		}
	}
	return len(text), j.Complete()
}

// checkText feeds text to a validator of s byte by byte and checks how many
// bytes it took (accepted; -1: all) and whether the text is then complete
// (and, if so, valid JSON).
func checkText(t *testing.T, s *Schema, text string, accepted int, complete bool) {
	t.Helper()
	if accepted < 0 {
		accepted = len(text)
	}
	n, ok := feedSchema(s, text)
	if n != accepted || ok != complete {
		t.Errorf("%q: accepted %d bytes (complete %v), want %d (complete %v)", text, n, ok, accepted, complete)
	}
	if ok && !json.Valid([]byte(text)) {
		t.Errorf("%q accepted as complete; encoding/json rejects it", text)
	}
}

func TestCompileSchemaErrors(t *testing.T) {
	for _, c := range []struct{ schema, want string }{
		{`{"type": "array", "items": {"type": "string"}}`, "top level"},
		{`{"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}, "required": ["a"]}`, `multipleOf: supported on integers`},
		{`{"type": "object", "properties": {"a": {"anyOf": []}}, "required": ["a"]}`, "list of schemas"},
		{`{"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "number"}]}}}`, "start with"},
		{`{"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}, {"enum": ["x", 1]}]}}}`, "start with"},
		{`{"type": "object", "properties": {"a": {"anyOf": [{"type": "string"}], "type": "string"}}}`, "beside"},
		{`{"type": "object", "properties": {"a": {"$ref": "#/$defs/T"}}, "$defs": {"T": {"type": "object", "properties": {"t": {"$ref": "#/$defs/T"}}, "required": ["t"]}}}`, "no finite value"},
		{`{"type": "object", "properties": {"a": {"$ref": "#/$defs/T"}}, "$defs": {"T": {"type": "object", "properties": {"t": {"type": "array", "items": {"$ref": "#/$defs/T"}, "minItems": 1}}, "required": ["t"]}}}`, "no finite value"},
		{`{"type": "object", "properties": {"a": {"$ref": "#/$defs/V"}}, "$defs": {"V": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/V"}]}}}`, "alternative of a union inside its own definition"},
		{`{"type": "object", "properties": {"a": {"$ref": "#/$defs/U"}}, "$defs": {"T": {"type": "string"}}}`, "not a local"},
		{`{"type": "object", "properties": {"a": {"$ref": "http://x/y"}}}`, "not a local"},
		{`{"type": "object", "properties": {"a": {"$ref": "#/$defs/T", "type": "string"}}, "$defs": {"T": {"type": "string"}}}`, "beside"},
		{`{"type": "object", "additionalProperties": 3}`, "additionalProperties"},
		{`{"type": "object", "properties": {"a": {"type": "strin"}}, "required": ["a"]}`, "not a JSON Schema type"},
		{`{"type": "object", "properties": {"a": {"type": "array"}}, "required": ["a"]}`, "item schema"},
		{`{"type": "object", "properties": {"a": {"enum": [{"x": 1}]}}, "required": ["a"]}`, "only strings, numbers"},
		{`{"type": "object", "properties": {"a": {}}, "required": ["a"]}`, "needs \"type\""},
		{`{"type": "object", "required": ["b"]}`, "not a property"},
		{`{"type": "object"} {}`, "more than one"},
		{`{"type": "object", "type": "object"}`, "twice"},
		{`[1]`, "must be an object"},
		{`{"type": ["object", "string"]}`, "only be unioned with null"},
	} {
		_, err := CompileSchema([]byte(c.schema))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.schema, err, c.want)
		}
	}
}

func TestSchemaJSONTexts(t *testing.T) {
	s := mustSchema(t, personSchema)
	good := `{"name": "Zoë \"Z\"", "age": -42, "height": 1.75e0, "role": "a", "level": 12, "tags": ["x", ""], ` +
		`"address": {"city": "Paris", "zip": "75001"}, "ok": false, "empty": {}, "meta": {"k": [1, {"z": null}], "": "x"}}`
	cases := []struct {
		name     string
		text     string
		accepted int // -1: all
		complete bool
	}{
		{"good", good, -1, true},
		{"nulls and pretty", "{\n  \"name\": \"\",\n  \"age\": 0,\n  \"height\": null,\n  \"role\": \"admin\",\n  \"level\": null,\n  \"tags\": [],\n  \"address\": null,\n  \"ok\": true,\n  \"empty\": { },\n  \"meta\": {}\n}\n", -1, true},
		{"meta not an object", strings.Replace(good, `"meta": {"k"`, `"meta": ["k"`, 1), strings.Index(good, `"meta": {`) + 8, false},
		{"meta bad inside", strings.Replace(good, `[1, {"z": null}]`, `[1, {"z": nul}]`, 1), strings.Index(good, `nul`) + 3, false},
		{"level 1 then comma", strings.Replace(good, `"level": 12`, `"level": 1`, 1), -1, true},
		{"prefix", good[:40], -1, false},
		{"keys out of order", `{"age": 1`, 2, false},
		{"unknown key", `{"nome": 1`, 3, false},
		{"integer with fraction", `{"name": "", "age": 1.5`, 21, false},
		{"integer with exponent", `{"name": "", "age": 1e3`, 21, false},
		{"string for integer", `{"name": "", "age": "1"`, 20, false},
		{"bad enum", `{"name": "", "age": 1, "height": 1, "role": "b"`, 45, false},
		{"enum prefix only", `{"name": "", "age": 1, "height": 1, "role": "ad"`, 47, false},
		{"bad const", strings.Replace(good, `"75001"`, `"75002"`, 1), strings.Index(good, `"75001"`) + 5, false},
		{"missing property", `{"name": "", "age": 1}`, 21, false},
		{"space before object", ` {}`, 0, false},
		{"trailing garbage", good + ` x`, len(good) + 1, false},
		{"trailing comma in array", strings.Replace(good, `["x", ""]`, `["x", ]`, 1), strings.Index(good, `["x", ""]`) + 6, false},
		{"number for string item", strings.Replace(good, `["x", ""]`, `["x", 1]`, 1), strings.Index(good, `["x", ""]`) + 6, false},
		{"property in empty object", strings.Replace(good, `"empty": {}`, `"empty": {"a": 1}`, 1), strings.Index(good, `"empty": {}`) + 10, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkText(t, s, c.text, c.accepted, c.complete) })
	}
}

// TestSchemaJSONGenerated checks random instances of the person schema
// (random values, random whitespace, split into random tokens): each is
// accepted whole and complete; and each with one byte changed is either
// refused somewhere or still an instance (checked by matches).
func TestSchemaJSONGenerated(t *testing.T) {
	s := mustSchema(t, personSchema)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		text := instance(r, s, 0)
		j := NewSchemaJSON(s)
		for k := 0; k < len(text); {
			n := 1 + r.IntN(6)
			end := min(k+n, len(text))
			if !j.Advance([]byte(text[k:end])) {
				t.Fatalf("instance %d %q: bytes [%d, %d) refused", i, text, k, end)
			}
			k = end
		}
		if !j.Complete() {
			t.Fatalf("instance %d %q: not complete", i, text)
		}
		// One byte changed.
		b := []byte(text)
		p := r.IntN(len(b))
		b[p] = " {}[],:\"0a-.en\\"[r.IntN(15)]
		n, complete := feedSchema(s, string(b))
		if n == len(b) && complete {
			var v any
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			ov, err := decodeOrdered(d, 0)
			_ = v
			if err != nil || !matches(s, ov) {
				t.Fatalf("instance %d changed at %d: %q accepted whole but is not an instance (%v)", i, p, b, err)
			}
		}
	}
}

// instance writes a random JSON text matching s.
func instance(r *rand.Rand, s *Schema, depth int) string {
	ws := func() string { return []string{"", " ", "\n  ", "\t"}[r.IntN(4)] }
	deep := depth > 6 // (a recursive schema: head for the shortest way out)
	if s.pick != nil {
		all := append(slices.Clone(s.alts), s.objs...)
		if deep {
			for _, a := range all {
				if a.kinds&(kObject|kArray) == 0 {
					return instance(r, a, depth)
				}
			}
		}
		return instance(r, all[r.IntN(len(all))], depth)
	}
	if s.enum != nil {
		return string(s.enum[r.IntN(len(s.enum))])
	}
	var kinds []uint8
	for _, k := range []uint8{kObject, kArray, kString, kNumber, kInteger, kBoolean, kNull} {
		if s.kinds&k != 0 && !(deep && k&(kObject|kArray) != 0 && s.kinds&^(kObject|kArray) != 0) {
			kinds = append(kinds, k)
		}
	}
	switch kinds[r.IntN(len(kinds))] {
	case kObject:
		if s.mapV != nil {
			n := r.IntN(3)
			parts := make([]string, n)
			for i := range parts {
				k, _ := json.Marshal([]string{"a", "b c", "ü", ""}[r.IntN(4)] + strconv.Itoa(i))
				parts[i] = string(k) + ":" + ws() + instance(r, s.mapV, depth+1)
			}
			return "{" + strings.Join(parts, ", ") + "}"
		}
		if s.any {
			return []string{"{}", `{"k": [1, "x"]}`, "{ \"a\" : { } }"}[r.IntN(3)]
		}
		var sb strings.Builder
		sb.WriteString("{" + ws())
		n := 0
		for _, p := range s.props {
			if p.opt && (deep || r.IntN(2) == 0) {
				continue
			}
			if n > 0 {
				sb.WriteString("," + ws())
			}
			n++
			sb.WriteString(string(p.key) + ws() + ":" + ws() + instance(r, p.s, depth+1) + ws())
		}
		if n == 0 {
			return "{" + ws() + "}"
		}
		sb.WriteString("}")
		return sb.String()
	case kArray:
		n := r.IntN(4)
		if deep {
			n = s.minN
		}
		if n == 0 {
			return "[" + ws() + "]"
		}
		var parts []string
		for i := range n {
			if s.itemAt(i) == nil {
				break
			}
			parts = append(parts, instance(r, s.itemAt(i), depth+1))
		}
		return "[" + ws() + strings.Join(parts, ","+ws()) + "]"
	case kString:
		b, _ := json.Marshal([]string{"", "a b", "Zoë", "line\nbreak", "q\"uote", "☃🙂"}[r.IntN(6)])
		return string(b)
	case kNumber:
		if s.kinds&kInteger != 0 && r.IntN(2) == 0 {
			return strconv.Itoa(r.IntN(2000) - 1000)
		}
		return []string{"0", "-1.5", "3e10", "2.25E-3", "-0.0", "17"}[r.IntN(6)]
	case kInteger:
		return strconv.Itoa(r.IntN(2000) - 1000)
	case kBoolean:
		return []string{"true", "false"}[r.IntN(2)]
	}
	return "null"
}

// matches checks a decoded value (decodeOrdered) against s, properties in
// order: the reference the validator is checked against.
func matches(s *Schema, v any) bool {
	if s.pick != nil {
		for _, a := range append(slices.Clone(s.alts), s.objs...) {
			if matches(a, v) {
				return true
			}
		}
		return false
	}
	if s.enum != nil {
		b, err := literal(v)
		if err != nil {
			return false
		}
		for _, e := range s.enum {
			if bytes.Equal(b, e) {
				return true
			}
		}
		return false
	}
	switch v := v.(type) {
	case *object:
		if s.kinds&kObject == 0 {
			return false
		}
		if s.any {
			return true
		}
		if s.mapV != nil {
			for _, k := range v.keys {
				if !matches(s.mapV, v.vals[k]) {
					return false
				}
			}
			return true
		}
		k := 0 // the keys must be the properties in order, optional ones maybe left out
		for _, p := range s.props {
			if k < len(v.keys) && keyEqual(v.keys[k], p.key) {
				if !matches(p.s, v.vals[v.keys[k]]) {
					return false
				}
				k++
			} else if !p.opt {
				return false
			}
		}
		return k == len(v.keys)
	case []any:
		if s.kinds&kArray == 0 || len(v) < s.minN || (s.maxN >= 0 && len(v) > s.maxN) {
			return false
		}
		seen := map[string]bool{}
		for i, x := range v {
			it := s.itemAt(i)
			if it == nil || !matches(it, x) {
				return false
			}
			if s.unique {
				b, _ := json.Marshal(x) // (items are strings or numbers: their text)
				if seen[string(b)] {
					return false
				}
				seen[string(b)] = true
			}
		}
		return true
	case string:
		if s.kinds&kString == 0 {
			return false
		}
		n := utf8.RuneCountInString(v)
		if n < s.minN || (s.maxN >= 0 && n > s.maxN) {
			return false
		}
		return s.re == nil || regexp.MustCompile(`^(?:`+strings.TrimSuffix(strings.TrimPrefix(s.re.String(), "^"), "$")+`)$`).MatchString(v)
	case json.Number:
		if s.kinds&kNumber != 0 {
			f, err := v.Float64()
			if b := s.nb; b != nil && (err != nil || !b.meets(f, f, false, false)) {
				return false
			}
			return true
		}
		n, err := strconv.ParseInt(v.String(), 10, 64)
		return s.kinds&kInteger != 0 && err == nil && n >= s.ilo && n <= s.ihi && (s.mult <= 1 || n%s.mult == 0)
	case bool:
		return s.kinds&kBoolean != 0
	case nil:
		return s.kinds&kNull != 0
	}
	return false
}

func keyEqual(k string, enc []byte) bool {
	var name string
	return json.Unmarshal(enc, &name) == nil && name == k
}

// FuzzSchemaJSON: any text the validator takes whole and complete is valid
// JSON that matches the person schema.
func FuzzSchemaJSON(f *testing.F) {
	fuzzSchema(f, personSchema, 3, `{"name": "x"`)
}

// fuzzSchema fuzzes a validator of schema: seeded with random instances and
// extra texts, any text it takes whole and complete must be valid JSON that
// matches the schema (the reference matcher).
func fuzzSchema(f *testing.F, schema string, seed uint64, extra ...string) {
	s := mustSchema(f, schema)
	r := rand.New(rand.NewPCG(seed, seed+1))
	for range 8 {
		f.Add(instance(r, s, 0))
	}
	for _, x := range extra {
		f.Add(x)
	}
	f.Fuzz(func(t *testing.T, text string) {
		n, complete := feedSchema(s, text)
		if n != len(text) || !complete {
			return
		}
		d := json.NewDecoder(strings.NewReader(text))
		d.UseNumber()
		v, err := decodeOrdered(d, 0)
		if err != nil || !json.Valid([]byte(text)) || !matches(s, v) {
			t.Fatalf("%q accepted as complete but is not an instance (%v)", text, err)
		}
	})
}

// pydanticSchema is what pydantic v2 writes for a model with an optional
// field, a nested model by $ref and a literal union.
const pydanticSchema = `{
  "$defs": {
    "Address": {"properties": {"city": {"title": "City", "type": "string"},
                               "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Zip"}},
                "required": ["city"], "title": "Address", "type": "object"}
  },
  "properties": {
    "name": {"title": "Name", "type": "string"},
    "nickname": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "title": "Nickname"},
    "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null},
    "home": {"$ref": "#/$defs/Address"},
    "past": {"items": {"$ref": "#/$defs/Address"}, "type": "array", "default": []},
    "kind": {"anyOf": [{"enum": ["a", "b"]}, {"type": "integer"}, {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}]},
    "note": {"type": "string"},
    "attrs": {"additionalProperties": {"type": "integer"}, "title": "Attrs", "type": "object"}
  },
  "required": ["name", "home", "kind"],
  "title": "Person",
  "type": "object"
}`

func TestSchemaPydantic(t *testing.T) {
	s := mustSchema(t, pydanticSchema)
	for _, c := range []struct {
		text     string
		accepted int // -1: all
		complete bool
	}{
		{`{"name": "x", "home": {"city": "P"}, "kind": "a"}`, -1, true},
		{`{"name": "x", "nickname": null, "age": 3, "home": {"city": "P", "zip": "1"}, "past": [{"city": "Q", "zip": null}], "kind": 7, "note": ""}`, -1, true},
		{`{"name": "x", "home": {"city": "P"}, "kind": {"x": true}}`, -1, true},
		{`{"name": "x", "age": null, "home": {"city": "P"}, "kind": "b", "past": []}`, 64, false}, // past after kind: out of order
		{`{"name": "x", "kind": "a"}`, 15, false},                                                 // home is required before kind
		{`{"name": "x", "home": {"zip": "1"}}`, 24, false},                                        // city is required
		{`{"name": "x", "home": {"city": "P"}, "kind": "c"}`, 46, false},
		{`{"name": "x", "home": {"city": "P"}, "kind": 1.5}`, 46, false},
		{`{"name": "x", "home": {"city": "P"}}`, 35, false},
		{`{"n`, -1, false},
		{`{"nic`, 3, false}, // "name" is required first
	} {
		checkText(t, s, c.text, c.accepted, c.complete)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for i := range 300 {
		text := instance(r, s, 0)
		if n, ok := feedSchema(s, text); n != len(text) || !ok {
			t.Fatalf("instance %d %q: accepted %d bytes, complete %v", i, text, n, ok)
		}
	}
}

// FuzzSchemaPydantic: any text taken whole and complete matches the schema.
func FuzzSchemaPydantic(f *testing.F) {
	fuzzSchema(f, pydanticSchema, 7)
}

// featureSchema uses the keywords added in the thirtieth pass: a union of
// objects, a tuple, uniqueItems, number bounds, multipleOf and pattern.
const featureSchema = `{"type": "object", "properties": {
	"pet": {"anyOf": [{"type": "object", "properties": {"k": {"const": "cat"}, "n": {"type": "integer", "multipleOf": 3, "minimum": -9, "maximum": 30}}, "required": ["k", "n"]},
		{"type": "object", "properties": {"k": {"const": "dog"}, "w": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5}}, "required": ["k"]},
		{"type": "null"}]},
	"pair": {"type": "array", "prefixItems": [{"type": "string", "pattern": "[a-c]+-\\d"}, {"type": "boolean"}], "items": false},
	"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true, "maxItems": 3},
	"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true}},
	"required": ["pet", "pair", "tags", "ids"]}`

func FuzzSchemaFeatures(f *testing.F) {
	fuzzSchema(f, featureSchema, 11, `{"pet": {"k": "cat", "n": 27}, "pair": ["ab-1", true], "tags": ["a", "b"], "ids": [1, 2, 3]}`,
		`{"pet": {"k": "dog", "w": 2.5}, "pair": ["c-0"], "tags": [], "ids": []}`, `{"pet": null, "pair": [], "tags": ["x"], "ids": [10, 1]}`)
}

func TestWrapped(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {"name": {"const": "get_weather"},
		"arguments": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
		"required": ["name", "arguments"]}`)
	pre, suf := []byte("<tool_call>\n"), []byte("\n</tool_call>")
	good := "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
	r := rand.New(rand.NewPCG(9, 10))
	for range 200 {
		w := NewWrapped(pre, s, suf)
		for k := 0; k < len(good); {
			end := min(k+1+r.IntN(8), len(good))
			if w.Complete() {
				t.Fatalf("complete before byte %d", k)
			}
			if !w.Advance([]byte(good[k:end])) {
				t.Fatalf("bytes [%d, %d) %q refused", k, end, good[k:end])
			}
			k = end
		}
		if !w.Complete() {
			t.Fatal("not complete after the suffix")
		}
		if w.Accept([]byte("\n")) || w.Accept([]byte("x")) {
			t.Fatal("bytes accepted after the suffix")
		}
	}
	for _, c := range []struct {
		text string
		n    int // bytes accepted one by one
	}{
		{"<tool_cal>", 9},
		{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\"}} \n</tool_call>", 63},
		{"<tool_call>\n{\"name\": \"get_time\"", 26},
		{"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}", 50},
	} {
		w := NewWrapped(pre, s, suf)
		n := 0
		for n < len(c.text) && w.Advance([]byte{c.text[n]}) {
			n++
		}
		if n != c.n {
			t.Errorf("%q: accepted %d bytes, want %d", c.text, n, c.n)
		}
	}
}

func TestSchemaBounds(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {"tags": {"type": "array", "minItems": 1, "maxItems": 2,
		"items": {"type": "string", "minLength": 1, "maxLength": 3}}}, "required": ["tags"]}`)
	for _, c := range []struct {
		text     string
		accepted int
		complete bool
	}{
		{`{"tags": ["ab", "c"]}`, -1, true},
		{`{"tags": ["é\u00e9x"]}`, -1, true},
		{`{"tags": ["\n\t"]}`, -1, true},
		{`{"tags": []}`, 10, false},
		{`{"tags": ["a", "b", "c"]}`, 18, false},
		{`{"tags": [""]}`, 11, false},
		{`{"tags": ["abcd"]}`, 14, false},
		{`{"tags": ["ab☃x"]}`, 16, false},
	} {
		checkText(t, s, c.text, c.accepted, c.complete)
	}
	for _, bad := range []string{
		`{"type": "object", "properties": {"a": {"type": "string", "minItems": 1}}}`,
		`{"type": "object", "properties": {"a": {"type": "array", "items": {"type": "string"}, "minItems": 3, "maxItems": 2}}}`,
		`{"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}`,
		`{"type": "object", "properties": {"a": {"type": "string", "maxLength": 1.5}}}`,
	} {
		if _, err := CompileSchema([]byte(bad)); err == nil {
			t.Errorf("%s compiled", bad)
		}
	}
}

func TestSchemaMap(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {"scores": {"type": "object", "additionalProperties": {"type": "integer"}},
		"empty": {"type": "object", "additionalProperties": {"type": "string"}}}, "required": ["scores", "empty"]}`)
	for _, c := range []struct {
		text     string
		accepted int
		complete bool
	}{
		{`{"scores": {"alice": 3, "bob": -1, "Zoë \"z\"": 0}, "empty": {}}`, -1, true},
		{`{"scores": {}, "empty": {"k": "v"}}`, -1, true},
		{`{"scores": {"a": 1.5}}`, 18, false},
		{`{"scores": {"a": "x"}}`, 17, false},
		{`{"scores": {a: 1}}`, 12, false},
		{`{"scores": {"a" 1}}`, 16, false},
		{`{"scores": {"a": 1,}}`, 19, false},
		{`{"scores": {"a": 1, "a": 2}}`, 22, false}, // a key twice: refused at its closing quote
		{`{"scores": {"a": 1, "ab": 2}, "empty": {}}`, -1, true},
	} {
		checkText(t, s, c.text, c.accepted, c.complete)
	}
	if _, err := CompileSchema([]byte(`{"type": "object", "properties": {"a": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": {"type": "string"}}}}`)); err == nil {
		t.Error("properties beside a map schema compiled")
	}
}

func TestSchemaAnnotations(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {"site": {"type": "string", "format": "hostname", "readOnly": true},
		"n": {"type": "integer", "nullable": true}}, "required": ["site", "n"]}`)
	checkText(t, s, `{"site": "not a host, still a string", "n": null}`, -1, true)
	checkText(t, s, `{"site": "x", "n": 3}`, -1, true)
	checkText(t, s, `{"site": 1`, 9, false)
}

// TestSchemaPattern: pattern and the known formats constrain a string's
// characters in full — raw, escaped or \u-written — and refuse at the
// first character that cannot lead to a match; the string must close on
// a match. Bad patterns are refused at compile time naming the keyword.
func TestSchemaPattern(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {
		"id": {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
		"when": {"type": "string", "format": "date-time"},
		"day": {"type": ["string", "null"], "format": "date"},
		"u": {"type": "string", "format": "uuid"},
		"q": {"type": "string", "pattern": "a\"b|é+|\\\\n"},
		"nl": {"type": "string", "pattern": "a\nb"}},
		"required": ["id", "when", "day", "u", "q"]}`)
	good := `{"id": "AB-123", "when": "2024-02-29T13:05:09.5+01:00", "day": "2024-12-31", "u": "123e4567-e89b-12d3-a456-426614174000", "q": "a\"b"}`
	cases := []struct {
		name     string
		text     string
		accepted int // -1: all
		complete bool
	}{
		{"good", good, -1, true},
		{"null day", strings.Replace(good, `"2024-12-31"`, `null`, 1), -1, true},
		{"é raw", strings.Replace(good, `"a\"b"`, `"éé"`, 1), -1, true},
		{"escaped newline", strings.Replace(good, `}`, `, "nl": "a\nb"}`, 1), -1, true},
		{"newline by \\u", strings.Replace(good, `}`, `, "nl": "a\u000ab"}`, 1), -1, true},
		{"a letter by \\u", `{"id": "\u0041`, 8, false},
		{"é by \\u", strings.Replace(good, `"a\"b"`, `"é\u00e9"`, 1), strings.Index(good, `"a\"b"`) + 3, false},
		{"escaped slash", strings.Replace(good, `}`, `, "nl": "a\/`, 1), len(good) + 10, false},
		{"backslash n", strings.Replace(good, `"a\"b"`, `"\\n"`, 1), -1, true},
		{"lower case id", `{"id": "aB`, 8, false},
		{"id too short", `{"id": "AB-12"`, 13, false},
		{"id too long", `{"id": "AB-1234`, 14, false},
		{"escaped digit where - must come", `{"id": "AB\u003`, 10, false},
		{"month 13", strings.Replace(good, `2024-12-31`, `2024-13-31`, 1), strings.Index(good, `2024-12-31`) + 6, false},
		{"no zone", strings.Replace(good, `09.5+01:00"`, `09.5"`, 1), strings.Index(good, `09.5+01:00"`) + 4, false},
		{"uuid letter", strings.Replace(good, `123e4567`, `123g4567`, 1), strings.Index(good, `123e4567`) + 3, false},
		{"surrogate escape", strings.Replace(good, `"a\"b"`, `"\ud83d\ude00"`, 1), strings.Index(good, `"a\"b"`) + 2, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkText(t, s, c.text, c.accepted, c.complete) })
	}
	for _, bad := range []string{`{"type": "string", "pattern": "("}`, `{"type": "integer", "pattern": "1"}`, `{"type": "string", "pattern": 3}`} {
		if _, err := CompileSchema([]byte(`{"type": "object", "properties": {"a": ` + bad + `}}`)); err == nil || !strings.Contains(err.Error(), "pattern") {
			t.Errorf("%s: %v, want an error naming pattern", bad, err)
		}
	}
}

func TestSchemaIntBounds(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 120},
		"t": {"type": ["integer", "null"], "exclusiveMinimum": -5, "exclusiveMaximum": 0}}, "required": ["age", "t"]}`)
	for _, c := range []struct {
		text     string
		accepted int
		complete bool
	}{
		{`{"age": 18, "t": -1}`, -1, true},
		{`{"age": 120, "t": -4}`, -1, true},
		{`{"age": 99, "t": null}`, -1, true},
		{`{"age": 121`, 10, false}, // 12 can still become 120; 121 cannot fit
		{`{"age": 9,`, 9, false},   // 9 could grow into 90–99, but it ends at 9
		{`{"age": 0`, 8, false},
		{`{"age": -`, 8, false},
		{`{"age": 50, "t": 0`, 17, false},
		{`{"age": 50, "t": -5`, 18, false},
		{`{"age": 1200`, 11, false},
	} {
		checkText(t, s, c.text, c.accepted, c.complete)
	}
	for _, bad := range []string{
		`{"type": "object", "properties": {"a": {"type": ["number", "string"], "minimum": 1}}}`,
		`{"type": "object", "properties": {"a": {"type": "integer", "minimum": 5, "maximum": 4}}}`,
		`{"type": "object", "properties": {"a": {"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}}}`,
		`{"type": "object", "properties": {"a": {"type": "integer", "maximum": 1e30}}}`,
	} {
		if _, err := CompileSchema([]byte(bad)); err == nil {
			t.Errorf("%s compiled", bad)
		}
	}
}

// TestIntFeasibleExhaustive checks intFeasible against brute force over
// every prefix of every integer in a window, for a few ranges.
func TestIntFeasibleExhaustive(t *testing.T) {
	for _, r := range [][2]int64{{18, 120}, {-42, -7}, {-3, 3}, {0, 0}, {5, 1500}, {-300, 299}} {
		s := &Schema{kinds: kInteger, ilo: r[0], ihi: r[1]}
		for x := int64(-3000); x <= 3000; x++ {
			str := strconv.FormatInt(x, 10)
			for k := 1; k <= len(str); k++ {
				p := str[:k]
				neg := strings.HasPrefix(p, "-")
				digits := strings.TrimPrefix(p, "-")
				v, _ := strconv.ParseInt("0"+digits, 10, 64)
				got := s.intFeasible(neg, v, len(digits), false)
				want := false // some integer in range whose text starts with p
				for y := r[0]; y <= r[1]; y++ {
					if strings.HasPrefix(strconv.FormatInt(y, 10), p) {
						want = true
						break
					}
				}
				if got != want {
					t.Fatalf("range %v, prefix %q: feasible %v, want %v", r, p, got, want)
				}
			}
		}
	}
}

// TestSchemaNumberBounds checks bounded numbers against brute force: every
// JSON number of up to 5 characters (no exponent) is accepted whole and
// complete exactly when it lies within the bounds, and every prefix of up
// to 4 characters the grammar accepts extends, by at most 3 more
// characters, to a number that does.
func TestSchemaNumberBounds(t *testing.T) {
	type bound struct {
		schema string
		in     func(v float64) bool
	}
	for _, b := range []bound{
		{`"minimum": 0, "maximum": 1`, func(v float64) bool { return v >= 0 && v <= 1 }},
		{`"exclusiveMinimum": 0, "maximum": 10`, func(v float64) bool { return v > 0 && v <= 10 }},
		{`"minimum": -2.5, "exclusiveMaximum": 3.75`, func(v float64) bool { return v >= -2.5 && v < 3.75 }},
		{`"minimum": 100`, func(v float64) bool { return v >= 100 }},
		{`"exclusiveMaximum": -1`, func(v float64) bool { return v < -1 }},
		{`"minimum": 0.25, "maximum": 0.25`, func(v float64) bool { return v == 0.25 }},
	} {
		s := mustSchema(t, `{"type": "object", "properties": {"x": {"type": ["number", "null"], `+b.schema+`}}, "required": ["x"]}`)
		const alphabet = "-0123456789."
		valid := func(n string) bool {
			var v float64
			return json.Unmarshal([]byte(n), &v) == nil && b.in(v)
		}
		var walk func(n string)
		walk = func(n string) {
			g := s.New()
			acc := g.Advance([]byte(`{"x": ` + n))
			whole := acc && g.Advance([]byte("}")) && g.Complete()
			if whole != valid(n) {
				t.Fatalf("%s: %q accepted whole %v, in range %v", b.schema, n, whole, valid(n))
			}
			if acc && len(n) <= 4 {
				var extends func(p string, more int) bool
				extends = func(p string, more int) bool {
					if valid(p) {
						return true
					}
					for _, c := range alphabet {
						if more > 0 && extends(p+string(c), more-1) {
							return true
						}
					}
					return false
				}
				if !extends(n, 3) {
					t.Fatalf("%s: prefix %q accepted, but no number 3 characters longer at most is in range", b.schema, n)
				}
			}
			if len(n) < 5 {
				for _, c := range alphabet {
					walk(n + string(c))
				}
			}
		}
		for _, c := range alphabet {
			walk(string(c))
		}
	}
	for _, bad := range []string{`"minimum": 2, "maximum": 1`, `"exclusiveMinimum": 1, "maximum": 1`, `"minimum": 1e16`} {
		if _, err := CompileSchema([]byte(`{"type": "object", "properties": {"x": {"type": "number", ` + bad + `}}}`)); err == nil {
			t.Errorf("%s compiled", bad)
		}
	}
}

// TestSchemaAllOfOne: allOf of a single schema (with annotations beside
// it) is that schema; longer lists and other keywords beside it are refused.
func TestSchemaAllOfOne(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
		"properties": {"p": {"allOf": [{"$ref": "#/$defs/P"}], "description": "a point"}}, "required": ["p"]}`)
	checkText(t, s, `{"p": {"x": 3}}`, -1, true)
	checkText(t, s, `{"p": {"y": 3}}`, 8, false)
	for _, bad := range []string{`{"allOf": [{"type": "integer"}, {"type": "integer"}]}`, `{"allOf": [{"type": "integer"}], "type": "integer"}`, `{"allOf": {"type": "integer"}}`} {
		if _, err := CompileSchema([]byte(`{"type": "object", "properties": {"a": ` + bad + `}}`)); err == nil || !strings.Contains(err.Error(), "allOf") {
			t.Errorf("%s: %v, want an error naming allOf", bad, err)
		}
	}
}

// TestSchemaTuple: prefixItems give the first items' schemas (pydantic's
// Tuple[int, str]); past them, items' schema or (none, or items false) no
// more items.
func TestSchemaTuple(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {
		"pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2, "maxItems": 2},
		"head": {"type": "array", "prefixItems": [{"type": "boolean"}], "items": {"type": "null"}},
		"opt": {"type": "array", "prefixItems": [{"type": "integer"}], "items": false}},
		"required": ["pair", "head", "opt"]}`)
	for _, c := range []struct {
		name, text string
		accepted   int
		complete   bool
	}{
		{"good", `{"pair": [1, "a"], "head": [true, null, null], "opt": []}`, -1, true},
		{"tuple head only", `{"pair": [1, "a"], "head": [false], "opt": [7]}`, -1, true},
		{"second item of the wrong type", `{"pair": [1, 2`, 13, false},
		{"a third pair item", `{"pair": [1, "a",`, 16, false},
		{"pair too short", `{"pair": [1]`, 11, false},
		{"extra after items false", `{"pair": [1, "a"], "head": [true], "opt": [1,`, 44, false},
		{"head's items", `{"pair": [1, "a"], "head": [true, 1`, 34, false},
	} {
		t.Run(c.name, func(t *testing.T) { checkText(t, s, c.text, c.accepted, c.complete) })
	}
	for _, bad := range []string{`{"type": "array", "prefixItems": []}`, `{"type": "string", "prefixItems": [{"type": "null"}]}`,
		`{"type": "array", "prefixItems": [{"type": "null"}], "minItems": 2}`} {
		if _, err := CompileSchema([]byte(`{"type": "object", "properties": {"a": ` + bad + `}}`)); err == nil {
			t.Errorf("%s compiled", bad)
		}
	}
}

// TestSchemaUniqueItems: uniqueItems arrays of strings and numbers refuse
// an item they already hold (compared as written) where it would end, so
// the item must go on instead; other item types are refused at compile.
func TestSchemaUniqueItems(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
		"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": true}, "any": {"type": "array", "items": {"type": "string"}, "uniqueItems": false}},
		"required": ["tags", "ids", "any"]}`)
	for _, c := range []struct {
		name, text string
		accepted   int
		complete   bool
	}{
		{"distinct", `{"tags": ["a", "b", "ab"], "ids": [1, 12, 2], "any": ["x", "x"]}`, -1, true},
		{"a string twice", `{"tags": ["a", "b", "a"`, 22, false},
		{"a string twice goes on", `{"tags": ["a", "b", "ab"], "ids": [], "any": []}`, -1, true},
		{"an integer twice", `{"tags": [], "ids": [7, 7,`, 25, false},
		{"an integer twice at the end", `{"tags": [], "ids": [7, 7]`, 25, false},
	} {
		t.Run(c.name, func(t *testing.T) { checkText(t, s, c.text, c.accepted, c.complete) })
	}
	for _, bad := range []string{`{"type": "array", "items": {"type": "object", "properties": {}}, "uniqueItems": true}`,
		`{"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": true}`, `{"type": "string", "uniqueItems": true}`} {
		if _, err := CompileSchema([]byte(`{"type": "object", "properties": {"a": ` + bad + `}}`)); err == nil || !strings.Contains(err.Error(), "uniqueItems") {
			t.Errorf("%s: %v, want an error naming uniqueItems", bad, err)
		}
	}
}

// TestSchemaObjectUnion: anyOf / oneOf of objects with properties (a
// pydantic Union of models, discriminated or not) reads the object against
// every alternative side by side, keeps those that still match and ends
// the value when the object closes; nested unions and nullable objects
// merge; whitespace keeps its nesting limits inside.
func TestSchemaObjectUnion(t *testing.T) {
	s := mustSchema(t, `{"type": "object", "$defs": {
		"Cat": {"type": "object", "properties": {"pet_type": {"const": "cat"}, "meows": {"type": "integer"}}, "required": ["pet_type", "meows"]},
		"Dog": {"type": "object", "properties": {"pet_type": {"const": "dog"}, "barks": {"type": "number"}}, "required": ["pet_type", "barks"]},
		"Lizard": {"type": "object", "properties": {"pet_type": {"const": "lizard"}}, "required": ["pet_type"]}},
		"properties": {
			"pet": {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"$ref": "#/$defs/Lizard"}], "discriminator": {"propertyName": "pet_type"}},
			"pets": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"anyOf": [{"$ref": "#/$defs/Dog"}, {"type": "null"}]}]}},
			"n": {"type": "integer"}},
		"required": ["pet", "pets", "n"]}`)
	good := `{"pet": {"pet_type": "dog", "barks": 2.5}, "pets": [{"pet_type": "cat", "meows": 3}, null, {"pet_type": "dog", "barks": 1}], "n": 1}`
	for _, c := range []struct {
		name, text string
		accepted   int
		complete   bool
	}{
		{"good", good, -1, true},
		{"lizard", strings.Replace(good, `{"pet_type": "dog", "barks": 2.5}`, `{"pet_type": "lizard"}`, 1), -1, true},
		{"pretty", "{\n  \"pet\": {\n    \"pet_type\": \"cat\",\n    \"meows\": 1\n  },\n  \"pets\": [],\n  \"n\": 0\n}", -1, true},
		{"unknown tag", `{"pet": {"pet_type": "cow"`, 23, false},
		{"cat with barks", `{"pet": {"pet_type": "cat", "barks"`, 29, false},
		{"lizard with more", `{"pet": {"pet_type": "lizard", "meows"`, 29, false},
		{"dog without barks", `{"pet": {"pet_type": "dog"}`, 26, false},
	} {
		t.Run(c.name, func(t *testing.T) { checkText(t, s, c.text, c.accepted, c.complete) })
	}
	if _, err := CompileSchema([]byte(`{"type": "object", "properties": {"a": {"anyOf": [{"type": "object", "properties": {"x": {"type": "null"}}},
		{"type": "object", "additionalProperties": {"type": "null"}}]}}}`)); err == nil {
		t.Error("a union of an object and a map compiled")
	}
}

// TestSchemaMultipleOf: integers with multipleOf, alone and with bounds,
// checked against brute force: every integer of up to 4 characters is
// accepted whole exactly when it is a multiple within the bounds, and
// every accepted prefix of up to 3 characters extends, by at most 3 more
// digits, to one.
func TestSchemaMultipleOf(t *testing.T) {
	for _, c := range []struct {
		schema string
		in     func(v int64) bool
	}{
		{`"multipleOf": 5`, func(v int64) bool { return v%5 == 0 }},
		{`"multipleOf": 7, "minimum": 10, "maximum": 60`, func(v int64) bool { return v%7 == 0 && v >= 10 && v <= 60 }},
		{`"multipleOf": 25, "minimum": -60, "exclusiveMaximum": 0`, func(v int64) bool { return v%25 == 0 && v >= -60 && v < 0 }},
	} {
		s := mustSchema(t, `{"type": "object", "properties": {"x": {"type": "integer", `+c.schema+`}}, "required": ["x"]}`)
		valid := func(n string) bool {
			v, err := strconv.ParseInt(n, 10, 64)
			d := strings.TrimPrefix(n, "-")
			return err == nil && d != "" && (d == "0" || d[0] != '0') && c.in(v) // JSON: -?(0|[1-9][0-9]*)
		}
		var walk func(n string)
		walk = func(n string) {
			g := s.New()
			acc := g.Advance([]byte(`{"x": ` + n))
			whole := acc && g.Advance([]byte("}")) && g.Complete()
			if whole != valid(n) {
				t.Fatalf("%s: %q accepted whole %v, valid %v", c.schema, n, whole, valid(n))
			}
			if acc && len(n) <= 3 {
				ok := valid(n)
				for d := 0; d < 1000 && !ok; d++ {
					for _, w := range []string{fmt.Sprint(d), fmt.Sprintf("%02d", d), fmt.Sprintf("%03d", d)} {
						ok = ok || (len(w) <= 3 && valid(n+w))
					}
				}
				if !ok {
					t.Fatalf("%s: prefix %q accepted, but no valid integer extends it by 3 digits", c.schema, n)
				}
			}
			if len(n) < 4 {
				for _, ch := range "-0123456789" {
					walk(n + string(ch))
				}
			}
		}
		for _, ch := range "-0123456789" {
			walk(string(ch))
		}
	}
}

// TestSchemaRootUnion: a top-level anyOf of objects (a forced call of one
// of several tools) takes exactly one of them; a top-level union with a
// non-object alternative is refused.
func TestSchemaRootUnion(t *testing.T) {
	s := mustSchema(t, `{"anyOf": [
		{"type": "object", "properties": {"name": {"const": "a"}, "arguments": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}, "required": ["name", "arguments"]},
		{"type": "object", "properties": {"name": {"const": "b"}, "arguments": {"type": "object", "properties": {}}}, "required": ["name", "arguments"]}]}`)
	checkText(t, s, `{"name": "a", "arguments": {"x": 1}}`, -1, true)
	checkText(t, s, `{"name": "b", "arguments": {}}`, -1, true)
	checkText(t, s, `{"name": "b", "arguments": {"x"`, 28, false)
	checkText(t, s, `{"name": "c"`, 10, false)
	checkText(t, s, ` {}`, 0, false)
	if _, err := CompileSchema([]byte(`{"anyOf": [{"type": "object", "properties": {"a": {"type": "null"}}}, {"type": "integer"}]}`)); err == nil {
		t.Error("a top-level union with an integer compiled")
	}
}

// treeSchema is what pydantic writes for recursive models: a tree whose
// nodes hold a list of nodes, and a linked list through an optional field.
const treeSchema = `{
  "$defs": {
    "Node": {"properties": {"name": {"type": "string"}, "children": {"items": {"$ref": "#/$defs/Node"}, "type": "array"},
             "next": {"anyOf": [{"$ref": "#/$defs/Link"}, {"type": "null"}]}},
             "required": ["name", "children"], "title": "Node", "type": "object"},
    "Link": {"properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/Link"}, {"type": "null"}]}},
             "required": ["v", "next"], "type": "object"}
  },
  "$ref": "#/$defs/Node"
}`

// TestSchemaRecursive: recursive $refs (a tree, a linked list, two
// definitions through each other) validate nested texts to any depth the
// validator allows, and refuse what the definitions do not take.
func TestSchemaRecursive(t *testing.T) {
	s := mustSchema(t, treeSchema)
	for _, c := range []struct {
		text     string
		accepted int // -1: all
		complete bool
	}{
		{`{"name": "a", "children": []}`, -1, true},
		{`{"name": "a", "children": [{"name": "b", "children": []}, {"name": "c", "children": [{"name": "d", "children": [], "next": null}]}]}`, -1, true},
		{`{"name": "a", "children": [], "next": {"v": 1, "next": {"v": 2, "next": null}}}`, -1, true},
		{`{"name": "a", "children": [{"name": "b"}]}`, len(`{"name": "a", "children": [{"name": "b"`), false},
		{`{"name": "a", "children": [], "next": {"v": 1, "next": {"name": "x"`, len(`{"name": "a", "children": [], "next": {"v": 1, "next": {"`), false},
		{`{"name": "a", "children": [], "next": {"v": 1}}`, len(`{"name": "a", "children": [], "next": {"v": 1`), false},
	} {
		want := c.accepted
		if want < 0 {
			want = len(c.text)
		}
		checkText(t, s, c.text, want, c.complete)
	}
	// Two definitions through each other.
	m := mustSchema(t, `{"$defs": {"A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
		"B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}, "n": {"type": "integer"}}, "required": ["n"]}},
		"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}`)
	checkText(t, m, `{"a": {"b": {"a": {"b": {"n": 2}}, "n": 1}}}`, len(`{"a": {"b": {"a": {"b": {"n": 2}}, "n": 1}}}`), true)
	checkText(t, m, `{"a": {"b": {"a": {"n": 1`, len(`{"a": {"b": {"a": {"`), false)
	// A JSON-like value: a union whose alternatives hold it (pydantic's
	// recursive type aliases).
	jv := mustSchema(t, `{"$defs": {"JSON": {"anyOf": [{"type": "object", "additionalProperties": {"$ref": "#/$defs/JSON"}},
		{"type": "array", "items": {"$ref": "#/$defs/JSON"}}, {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"}]}},
		"type": "object", "properties": {"v": {"$ref": "#/$defs/JSON"}}, "required": ["v"]}`)
	ok := `{"v": {"a": [1, "x", {"b": null, "c": [true, []]}], "d": {}}}`
	checkText(t, jv, ok, len(ok), true)
	checkText(t, jv, `{"v": [1, }`, len(`{"v": [1, `), false)
	// As deep as the validator nests: then the list must close.
	deep := strings.Repeat(`{"v": 1, "next": `, 40) + "null" + strings.Repeat("}", 40)
	text := `{"name": "a", "children": [], "next": ` + deep + `}`
	checkText(t, s, text, len(text), true)
	r := rand.New(rand.NewPCG(21, 22))
	for range 200 {
		text := instance(r, s, 0)
		if n, ok := feedSchema(s, text); n != len(text) || !ok {
			t.Fatalf("instance %q: %d bytes taken, complete %v", text, n, ok)
		}
	}
}

func FuzzSchemaRecursive(f *testing.F) {
	fuzzSchema(f, treeSchema, 9, `{"name": "x", "children": [{"name": "y", "children": []`)
}

// TestSchemaRecursiveDepthLimit: past MaxDepth a recursive list can no
// longer open another object, but null still closes it: the way out stays.
func TestSchemaRecursiveDepthLimit(t *testing.T) {
	s := mustSchema(t, treeSchema)
	j := NewSchemaJSON(s)
	if !j.Advance([]byte(`{"name": "a", "children": [], "next": `)) {
		t.Fatal("prefix refused")
	}
	depth := 0
	for ; depth < 2*MaxDepth && j.Accept([]byte(`{"v": 1, "next": `)); depth++ {
		j.Advance([]byte(`{"v": 1, "next": `))
	}
	if depth >= 2*MaxDepth || depth < MaxDepth/2 {
		t.Fatalf("nested %d objects", depth)
	}
	if !j.Advance([]byte("null"+strings.Repeat("}", depth)+"}")) || !j.Complete() {
		t.Errorf("at depth %d, null and the closing braces refused", depth)
	}
}

// unionSchema nests unions of objects: discriminated pets in a list, a
// union inside a union's object, and objects that share their first keys.
const unionSchema = `{"type": "object", "$defs": {
	"Cat": {"type": "object", "properties": {"t": {"const": "cat"}, "name": {"type": "string"}, "toy": {"$ref": "#/$defs/Toy"}}, "required": ["t", "name"]},
	"Dog": {"type": "object", "properties": {"t": {"const": "dog"}, "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["t", "name"]},
	"Toy": {"anyOf": [{"type": "object", "properties": {"ball": {"type": "integer"}}, "required": ["ball"]},
		{"type": "object", "properties": {"bone": {"type": "boolean"}, "size": {"enum": ["s", "m"]}}, "required": ["bone"]}]},
	"Named": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name"]}},
	"properties": {
		"pets": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"$ref": "#/$defs/Named"}]}},
		"best": {"anyOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}, {"type": "null"}]}},
	"required": ["pets", "best"]}`

// TestSchemaUnionsGenerated: random instances of nested unions are taken
// whole and complete in random pieces, and a text with one byte changed
// that is still taken whole matches the schema (the reference matcher) —
// through unions that collapse to their one matching object as they read.
func TestSchemaUnionsGenerated(t *testing.T) {
	s := mustSchema(t, unionSchema)
	r := rand.New(rand.NewPCG(31, 32))
	for i := range 1500 {
		text := instance(r, s, 0)
		j := NewSchemaJSON(s)
		for k := 0; k < len(text); {
			end := min(k+1+r.IntN(6), len(text))
			if !j.Advance([]byte(text[k:end])) {
				t.Fatalf("instance %d %q: bytes [%d, %d) refused", i, text, k, end)
			}
			k = end
		}
		if !j.Complete() {
			t.Fatalf("instance %d %q: not complete", i, text)
		}
		b := []byte(text)
		b[r.IntN(len(b))] = " {}[],:\"0an-.etd"[r.IntN(16)]
		if n, complete := feedSchema(s, string(b)); n == len(b) && complete {
			d := json.NewDecoder(bytes.NewReader(b))
			d.UseNumber()
			ov, err := decodeOrdered(d, 0)
			if err != nil || !matches(s, ov) {
				t.Fatalf("instance %d changed: %q accepted whole but is not an instance (%v)", i, b, err)
			}
		}
	}
}

func FuzzSchemaUnions(f *testing.F) {
	fuzzSchema(f, unionSchema, 13, `{"pets": [{"t": "cat", "name": "Tom", "toy": {"bone": true, "size": "m"}}, {"name": "x"}], "best": null}`)
}
