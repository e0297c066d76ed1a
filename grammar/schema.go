package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Schema is a compiled subset of JSON Schema, the one OpenAI's strict
// structured outputs take: typed objects whose properties are all required
// (and generated in the schema's order, with no others), arrays of one item
// schema, strings, numbers, integers, booleans, null, unions of those types
// ("type": ["string", "null"]) and enum / const values. CompileSchema names
// any other keyword instead of ignoring it.
type Schema struct {
	kinds uint8    // allowed types (kObject…); 0 with enum
	props []prop   // object: every property, in order
	items *Schema  // array: each item
	enum  [][]byte // the allowed values, JSON-encoded (enum / const)
}

type prop struct {
	key []byte // the JSON-encoded name, quotes included
	s   *Schema
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

// maxEnum is the most enum values a schema may list.
const maxEnum = 64

// annotations are keywords that do not constrain the value.
var annotations = map[string]bool{"title": true, "description": true, "$schema": true, "$id": true, "$comment": true,
	"examples": true, "default": true, "strict": true}

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
	s, err := compile(v, "schema", 0)
	if err != nil {
		return nil, err
	}
	if s.kinds != kObject || s.enum != nil {
		return nil, fmt.Errorf("schema: the top level must be {\"type\": \"object\", …}")
	}
	return s, nil
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

func compile(v any, at string, depth int) (*Schema, error) {
	if depth >= MaxDepth {
		return nil, fmt.Errorf("%s: nested deeper than %d", at, MaxDepth)
	}
	o, ok := v.(*object)
	if !ok {
		return nil, fmt.Errorf("%s: a schema must be an object", at)
	}
	m := o.vals
	s := &Schema{}
	for _, k := range o.keys {
		switch k {
		case "type", "properties", "required", "additionalProperties", "items", "enum", "const":
		default:
			if !annotations[k] {
				return nil, fmt.Errorf("%s: keyword %q is not supported (supported: type, properties, required, additionalProperties: false, items, enum, const)", at, k)
			}
		}
	}
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
			return nil, fmt.Errorf("%s.type: an object can only be unioned with null", at)
		}
		if s.kinds&kArray != 0 && s.kinds != kArray|s.kinds&kNull {
			return nil, fmt.Errorf("%s.type: an array can only be unioned with null", at)
		}
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
	if c, ok := m["const"]; ok {
		if s.enum != nil {
			return nil, fmt.Errorf("%s: enum and const together", at)
		}
		b, err := literal(c)
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
		return nil, fmt.Errorf("%s: needs \"type\" (or enum / const)", at)
	}
	if s.kinds&kObject != 0 {
		if err := s.compileObject(m, at, depth); err != nil {
			return nil, err
		}
	} else if _, ok := m["properties"]; ok {
		return nil, fmt.Errorf("%s.properties: only for type object", at)
	}
	if s.kinds&kArray != 0 {
		it, ok := m["items"]
		if !ok {
			return nil, fmt.Errorf("%s.items: an array needs an item schema", at)
		}
		var err error
		if s.items, err = compile(it, at+".items", depth+1); err != nil {
			return nil, err
		}
	} else if _, ok := m["items"]; ok {
		return nil, fmt.Errorf("%s.items: only for type array", at)
	}
	return s, nil
}

// compileObject reads properties, required and additionalProperties.
func (s *Schema) compileObject(m map[string]any, at string, depth int) error {
	if ap, ok := m["additionalProperties"]; ok && ap != false {
		return fmt.Errorf("%s.additionalProperties: only false is supported", at)
	}
	props, _ := m["properties"].(*object)
	if _, ok := m["properties"]; ok && props == nil {
		return fmt.Errorf("%s.properties: must be an object", at)
	}
	if props == nil {
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
	for _, name := range props.keys { // generated in the order the schema writes them
		if !req[name] {
			return fmt.Errorf("%s.required: every property must be required (strict mode); %q is not", at, name)
		}
		c, err := compile(props.vals[name], at+".properties."+name, depth+1)
		if err != nil {
			return err
		}
		key, _ := json.Marshal(name)
		s.props = append(s.props, prop{key: key, s: c})
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
