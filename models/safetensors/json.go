package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// member is one key and its undecoded value, in the order of the object.
type member struct {
	key string
	val json.RawMessage
}

// errNotObject reports a JSON value that is valid but not an object.
var errNotObject = errors.New("not a JSON object")

// dupKeyError reports a key that appears twice in one object.
type dupKeyError struct{ key string }

func (e *dupKeyError) Error() string { return fmt.Sprintf("duplicate key %q", e.key) }

// decodeObject splits one JSON object into its members, in order. Duplicate
// keys, trailing non-space bytes and non-objects are errors (encoding/json
// would silently keep the last duplicate).
func decodeObject(raw []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonErr(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errNotObject
	}
	var out []member
	seen := make(map[string]struct{})
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, jsonErr(err)
		}
		key, ok := tok.(string)
		if !ok { // cannot happen in a well-formed object; be safe anyway
			return nil, fmt.Errorf("object key %v is not a string", tok)
		}
		if _, dup := seen[key]; dup {
			return nil, &dupKeyError{key}
		}
		seen[key] = struct{}{}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("value of %q: %w", key, jsonErr(err))
		}
		out = append(out, member{key, v})
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, jsonErr(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return nil, errors.New("trailing data after the JSON object")
		}
		return nil, jsonErr(err)
	}
	return out, nil
}

// jsonErr turns decoder errors into a "not valid JSON" message.
func jsonErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return errors.New("not valid JSON: unexpected end")
	}
	return fmt.Errorf("not valid JSON: %v", err)
}

// isNull reports whether raw is the JSON literal null.
func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// decodeString decodes a JSON string (and only a string).
func decodeString(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return "", fmt.Errorf("%s is not a string", brief(raw))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", jsonErr(err)
	}
	return s, nil
}

// decodeStringMap decodes an object whose values are all strings.
func decodeStringMap(raw json.RawMessage) (map[string]string, error) {
	ms, err := decodeObject(raw)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(ms))
	for _, m := range ms {
		s, err := decodeString(m.val)
		if err != nil {
			return nil, fmt.Errorf("value of %q: %w", m.key, err)
		}
		out[m.key] = s
	}
	return out, nil
}

// decodeInts decodes an array of JSON integers (no fractions, exponents or
// quoted numbers). Negative values are returned as they are.
func decodeInts(raw json.RawMessage) ([]int64, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		return nil, fmt.Errorf("%s is not an array", brief(raw))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, jsonErr(err)
	}
	out := make([]int64, len(elems))
	for i, e := range elems {
		s := string(bytes.TrimSpace(e))
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || !plainInt(s) {
			return nil, fmt.Errorf("element %d (%s) is not an integer in range", i, brief(e))
		}
		out[i] = v
	}
	return out, nil
}

// plainInt reports whether s is written as a JSON integer: an optional minus
// sign and digits without a leading zero (strconv also accepts "+1", "0x1f"
// with base 0 and "1_0", none of which are JSON).
func plainInt(s string) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// brief quotes at most 40 bytes of raw JSON for an error message.
func brief(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 40 {
		return strconv.Quote(string(raw[:40])) + "…"
	}
	return strconv.Quote(string(raw))
}
