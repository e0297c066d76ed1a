package chat

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// jsonValue decodes JSON into a template value keeping object key order
// (Python dicts keep insertion order; tojson must reproduce it). Integers
// stay integers, numbers with a fraction or exponent become floats.
func jsonValue(data []byte) (jinja.Value, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := d.Token(); err != io.EOF {
		return jinja.Undefined(), fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(d *json.Decoder) (jinja.Value, error) {
	tok, err := d.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(t)
	case json.Delim:
		switch t {
		case '[':
			var items []jinja.Value
			for d.More() {
				v, err := decodeValue(d)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			if _, err := d.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return jinja.NewList(items), nil
		case '{':
			out := jinja.NewDict()
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				v, err := decodeValue(d)
				if err != nil {
					return jinja.Undefined(), err
				}
				out.AsDict().Set(kt.(string), v)
			}
			if _, err := d.Token(); err != nil {
				return jinja.Undefined(), err
			}
			return out, nil
		}
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v", tok)
}

func numberValue(n json.Number) (jinja.Value, error) {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := n.Int64(); err == nil {
			return jinja.NewInt(i), nil
		}
		return jinja.Undefined(), fmt.Errorf("integer %s does not fit in 64 bits", s)
	}
	f, err := n.Float64()
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("number %s: %w", s, err)
	}
	return jinja.NewFloat(f), nil
}

// goValue converts a Go value into a template value: nil, bool, string,
// integers, floats, json.RawMessage (decoded with key order kept),
// jinja.Value, []any, []string and map[string]any (keys sorted).
func goValue(v any) (jinja.Value, error) {
	switch x := v.(type) {
	case nil:
		return jinja.None(), nil
	case jinja.Value:
		return x, nil
	case json.RawMessage:
		return jsonValue(x)
	case bool:
		return jinja.NewBool(x), nil
	case string:
		return jinja.NewString(x), nil
	case int:
		return jinja.NewInt(int64(x)), nil
	case int32:
		return jinja.NewInt(int64(x)), nil
	case int64:
		return jinja.NewInt(x), nil
	case float32:
		return jinja.NewFloat(float64(x)), nil
	case float64:
		return jinja.NewFloat(x), nil
	case []string:
		items := make([]jinja.Value, len(x))
		for i, s := range x {
			items[i] = jinja.NewString(s)
		}
		return jinja.NewList(items), nil
	case []any:
		items := make([]jinja.Value, len(x))
		for i, it := range x {
			var err error
			if items[i], err = goValue(it); err != nil {
				return jinja.Undefined(), err
			}
		}
		return jinja.NewList(items), nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := jinja.NewDict()
		for _, k := range keys {
			it, err := goValue(x[k])
			if err != nil {
				return jinja.Undefined(), err
			}
			out.AsDict().Set(k, it)
		}
		return out, nil
	}
	return jinja.Undefined(), fmt.Errorf("unsupported value of type %T", v)
}

// pyStr renders a value as Jinja2 prints it: Python's str().
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	}
	var sb strings.Builder
	pyRepr(&sb, v)
	return sb.String()
}

// pyRepr writes Python's repr() of a value (str() for non-strings).
func pyRepr(sb *strings.Builder, v jinja.Value) {
	switch {
	case v.IsUndefined():
		// Jinja2 prints an undefined value inside a container as its repr;
		// None is the closest printable stand-in.
		sb.WriteString("None")
	case v.IsNone():
		sb.WriteString("None")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("True")
		} else {
			sb.WriteString("False")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyFloat(v.AsFloat(), false))
	case v.IsString():
		pyStringRepr(sb, v.AsString())
	case v.IsList():
		sb.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				sb.WriteString(", ")
			}
			pyRepr(sb, it)
		}
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		sb.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				sb.WriteString(", ")
			}
			pyStringRepr(sb, k)
			sb.WriteString(": ")
			pyRepr(sb, d.Data[k])
		}
		sb.WriteByte('}')
	default:
		sb.WriteString(v.String())
	}
}

// pyStringRepr writes Python's repr of a string.
func pyStringRepr(sb *strings.Builder, s string) {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	sb.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == ' ' || (r < utf8.RuneSelf && r > 0x20 && r < 0x7f) || (r >= 0x80 && unicode.IsPrint(r)):
			sb.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(sb, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(sb, `\u%04x`, r)
		default:
			fmt.Fprintf(sb, `\U%08x`, r)
		}
	}
	sb.WriteByte(q)
}

// pyFloat formats f as Python's repr (json selects the same except for
// the names of non-finite values).
func pyFloat(f float64, forJSON bool) string {
	switch {
	case math.IsNaN(f):
		if forJSON {
			return "NaN"
		}
		return "nan"
	case math.IsInf(f, 1):
		if forJSON {
			return "Infinity"
		}
		return "inf"
	case math.IsInf(f, -1):
		if forJSON {
			return "-Infinity"
		}
		return "-inf"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // shortest round-trip digits
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// jsonOptions are the keyword arguments of transformers' tojson filter.
type jsonOptions struct {
	ensureASCII bool
	indent      string // "" = compact
	hasIndent   bool
	itemSep     string
	keySep      string
	sortKeys    bool
}

// pyJSON writes v as Python's json.dumps would with the given options.
func pyJSON(sb *strings.Builder, v jinja.Value, o *jsonOptions, level int) error {
	newline := func(l int) {
		sb.WriteByte('\n')
		for i := 0; i < l; i++ {
			sb.WriteString(o.indent)
		}
	}
	switch {
	case v.IsUndefined():
		return fmt.Errorf("tojson: Undefined is not JSON serializable")
	case v.IsCallable():
		return fmt.Errorf("tojson: a function is not JSON serializable")
	case v.IsNone():
		sb.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyFloat(v.AsFloat(), true))
	case v.IsString():
		jsonString(sb, v.AsString(), o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			if o.hasIndent {
				newline(level + 1)
			}
			if err := pyJSON(sb, it, o, level+1); err != nil {
				return err
			}
		}
		if o.hasIndent {
			newline(level)
		}
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			sb.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			if o.hasIndent {
				newline(level + 1)
			}
			jsonString(sb, k, o.ensureASCII)
			sb.WriteString(o.keySep)
			if err := pyJSON(sb, d.Data[k], o, level+1); err != nil {
				return err
			}
		}
		if o.hasIndent {
			newline(level)
		}
		sb.WriteByte('}')
	default:
		return fmt.Errorf("tojson: cannot serialize %s", v.String())
	}
	return nil
}

// jsonString writes s as a JSON string the way Python's json module does.
func jsonString(sb *strings.Builder, s string, ensureASCII bool) {
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(sb, `\u%04x`, r)
			case ensureASCII && r >= 0x7f:
				if r >= 0x10000 {
					r1, r2 := utf16Pair(r)
					fmt.Fprintf(sb, `\u%04x\u%04x`, r1, r2)
				} else {
					fmt.Fprintf(sb, `\u%04x`, r)
				}
			default:
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xD800 + (r>>10)&0x3FF, 0xDC00 + r&0x3FF
}
