package safetensors

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/mkserve/mkserve/tensor"
)

// Write stores tensors in a new .safetensors file at path (replacing it
// atomically through a temporary file in the same directory). Tensors are
// laid out by descending element width, then by name, after a header padded
// with spaces to a multiple of 8 bytes, so every tensor is aligned to its
// element size, as the reference writer does. metadata may be nil. Names
// must be unique, non-empty and not "__metadata__"; each tensor's Data must
// hold exactly product(Shape) elements of its DType.
func Write(path string, tensors []*tensor.Host, metadata map[string]string) error {
	header, order, err := encodeHeader(tensors, metadata)
	if err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(header)))
	if _, err := tmp.Write(n[:]); err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	if _, err := tmp.Write(header); err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	for _, t := range order {
		if _, err := tmp.Write(t.Data); err != nil {
			return fmt.Errorf("safetensors: writing %s: tensor %q: %w", path, t.Name, err)
		}
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("safetensors: writing %s: %w", path, err)
	}
	ok = true
	return nil
}

// encodeHeader checks the tensors and returns the padded JSON header and
// the tensors in data order.
func encodeHeader(tensors []*tensor.Host, metadata map[string]string) ([]byte, []*tensor.Host, error) {
	seen := make(map[string]bool, len(tensors))
	for i, t := range tensors {
		if t == nil {
			return nil, nil, fmt.Errorf("tensor %d is nil", i)
		}
		if t.Name == "" || t.Name == metadataKey {
			return nil, nil, fmt.Errorf("tensor %d: invalid name %q", i, t.Name)
		}
		if seen[t.Name] {
			return nil, nil, fmt.Errorf("tensor %q: name given twice", t.Name)
		}
		seen[t.Name] = true
		if _, ok := dtypeBits[t.DType]; !ok {
			return nil, nil, fmt.Errorf("tensor %q: unknown dtype %q", t.Name, t.DType)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, nil, fmt.Errorf("tensor %q: shape %v has a negative dimension", t.Name, t.Shape)
			}
		}
		want, err := byteSize(t.Shape, t.DType)
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %v", t.Name, err)
		}
		if uint64(len(t.Data)) != want {
			return nil, nil, fmt.Errorf("tensor %q: %d bytes of data, but shape %v of %s needs %d", t.Name, len(t.Data), t.Shape, t.DType, want)
		}
	}
	order := slices.Clone(tensors)
	slices.SortStableFunc(order, func(a, b *tensor.Host) int {
		if c := cmp.Compare(dtypeBits[b.DType], dtypeBits[a.DType]); c != 0 {
			return c
		}
		return cmp.Compare(a.Name, b.Name)
	})
	var h bytes.Buffer
	h.WriteByte('{')
	if metadata != nil {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		h.WriteString(`"__metadata__":{`)
		for i, k := range keys {
			if i > 0 {
				h.WriteByte(',')
			}
			writeJSONString(&h, k)
			h.WriteByte(':')
			writeJSONString(&h, metadata[k])
		}
		h.WriteByte('}')
	}
	off := 0
	for i, t := range order {
		if i > 0 || metadata != nil {
			h.WriteByte(',')
		}
		writeJSONString(&h, t.Name)
		h.WriteString(`:{"dtype":`)
		writeJSONString(&h, string(t.DType))
		h.WriteString(`,"shape":[`)
		for j, d := range t.Shape {
			if j > 0 {
				h.WriteByte(',')
			}
			fmt.Fprint(&h, d)
		}
		fmt.Fprintf(&h, `],"data_offsets":[%d,%d]}`, off, off+len(t.Data))
		off += len(t.Data)
	}
	h.WriteByte('}')
	for h.Len()%8 != 0 {
		h.WriteByte(' ')
	}
	if h.Len() > MaxHeaderBytes {
		return nil, nil, fmt.Errorf("header of %d bytes exceeds the %d-byte limit", h.Len(), MaxHeaderBytes)
	}
	return h.Bytes(), order, nil
}

// writeJSONString appends s as a JSON string, without encoding/json's
// escaping of <, > and & (the reference writer leaves them as they are).
// Invalid UTF-8 is replaced by U+FFFD, so the header is always valid UTF-8.
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)           // encoding a string cannot fail
	b.Truncate(b.Len() - 1) // Encode's newline
}
