package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
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
    "empty": {"type": "object"}
  },
  "required": ["name", "age", "height", "role", "level", "tags", "address", "ok", "empty"],
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

func TestCompileSchemaErrors(t *testing.T) {
	for _, c := range []struct{ schema, want string }{
		{`{"type": "array", "items": {"type": "string"}}`, "top level"},
		{`{"type": "object", "properties": {"a": {"type": "string"}}}`, "every property must be required"},
		{`{"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}, "required": ["a"]}`, `"pattern"`},
		{`{"type": "object", "properties": {"a": {"anyOf": []}}, "required": ["a"]}`, `"anyOf"`},
		{`{"type": "object", "additionalProperties": true}`, "additionalProperties"},
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
		`"address": {"city": "Paris", "zip": "75001"}, "ok": false, "empty": {}}`
	cases := []struct {
		name     string
		text     string
		accepted int // -1: all
		complete bool
	}{
		{"good", good, -1, true},
		{"nulls and pretty", "{\n  \"name\": \"\",\n  \"age\": 0,\n  \"height\": null,\n  \"role\": \"admin\",\n  \"level\": null,\n  \"tags\": [],\n  \"address\": null,\n  \"ok\": true,\n  \"empty\": { }\n}\n", -1, true},
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
		t.Run(c.name, func(t *testing.T) {
			want := c.accepted
			if want < 0 {
				want = len(c.text)
			}
			n, complete := feedSchema(s, c.text)
			if n != want || complete != c.complete {
				t.Fatalf("%q: accepted %d bytes (complete %v), want %d (complete %v)", c.text, n, complete, want, c.complete)
			}
			if complete && !json.Valid([]byte(c.text)) {
				t.Fatalf("%q accepted as complete; encoding/json rejects it", c.text)
			}
		})
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
	if s.enum != nil {
		return string(s.enum[r.IntN(len(s.enum))])
	}
	var kinds []uint8
	for _, k := range []uint8{kObject, kArray, kString, kNumber, kInteger, kBoolean, kNull} {
		if s.kinds&k != 0 {
			kinds = append(kinds, k)
		}
	}
	switch kinds[r.IntN(len(kinds))] {
	case kObject:
		var sb strings.Builder
		sb.WriteString("{" + ws())
		for i, p := range s.props {
			if i > 0 {
				sb.WriteString("," + ws())
			}
			sb.WriteString(string(p.key) + ws() + ":" + ws() + instance(r, p.s, depth+1) + ws())
		}
		sb.WriteString("}")
		return sb.String()
	case kArray:
		n := r.IntN(4)
		if n == 0 {
			return "[" + ws() + "]"
		}
		parts := make([]string, n)
		for i := range parts {
			parts[i] = instance(r, s.items, depth+1)
		}
		return "[" + ws() + strings.Join(parts, ","+ws()) + ws() + "]"
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
		if s.kinds&kObject == 0 || len(v.keys) != len(s.props) {
			return false
		}
		for i, p := range s.props {
			if fmt.Sprintf("%q", v.keys[i]) != string(p.key) && !keyEqual(v.keys[i], p.key) {
				return false
			}
			if !matches(p.s, v.vals[v.keys[i]]) {
				return false
			}
		}
		return true
	case []any:
		if s.kinds&kArray == 0 {
			return false
		}
		for _, x := range v {
			if !matches(s.items, x) {
				return false
			}
		}
		return true
	case string:
		return s.kinds&kString != 0
	case json.Number:
		if s.kinds&kNumber != 0 {
			return true
		}
		_, err := strconv.ParseInt(v.String(), 10, 64)
		return s.kinds&kInteger != 0 && err == nil
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
	s := mustSchema(f, personSchema)
	r := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		f.Add(instance(r, s, 0))
	}
	f.Add(`{"name": "x"`)
	f.Fuzz(func(t *testing.T, text string) {
		n, complete := feedSchema(s, text)
		if n != len(text) || !complete {
			return
		}
		d := json.NewDecoder(strings.NewReader(text))
		d.UseNumber()
		v, err := decodeOrdered(d, 0)
		if err != nil || !json.Valid([]byte(text)) {
			t.Fatalf("%q accepted as complete but is not JSON: %v", text, err)
		}
		if !matches(s, v) {
			t.Fatalf("%q accepted as complete but does not match the schema", text)
		}
	})
}
