// Package safetensors reads Hugging Face checkpoint weights: single
// .safetensors files and sharded model directories, memory-mapped read-only
// so that tensors are zero-copy views into the page cache.
//
// File format: an 8-byte little-endian header length N, N bytes of JSON
// (an object mapping tensor names to {"dtype", "shape", "data_offsets"}, plus
// an optional "__metadata__" string map; may be padded with spaces), then the
// data section. Offsets are relative to the start of the data section. Files
// are validated as the reference implementation (huggingface/safetensors)
// does: header at most 100 MB, valid UTF-8 JSON, every tensor's byte length
// equal to its element count times its dtype size, and the tensors covering
// the data section exactly, with no overlap and no hole. Duplicate names are
// refused as well.
package safetensors

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"os"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/mkserve/mkserve/tensor"
)

// MaxHeaderBytes is the largest JSON header accepted, as in the reference
// implementation.
const MaxHeaderBytes = 100_000_000

// metadataKey is the reserved header key holding the free-form string map.
const metadataKey = "__metadata__"

// entry locates one tensor in the data section.
type entry struct {
	dtype      tensor.DType
	shape      []int
	begin, end int // byte offsets in the data section
}

// File is one memory-mapped .safetensors file. Tensors returned by Tensor
// alias the mapping and must not be used after Close; nor may the file be
// truncated while mapped (reading a vanished page kills the process). Tensor,
// Names and Info are safe for concurrent use; Close must not race with them.
type File struct {
	// Path is the file name given to Open.
	Path string
	// Metadata is the header's "__metadata__" map (nil when absent).
	Metadata map[string]string

	buf     []byte // the whole file: a mapping, or a heap copy
	mapped  bool   // buf is a mapping to munmap
	data    []byte // the data section, within buf
	entries map[string]entry
	names   []string // sorted
}

// Open maps a .safetensors file and validates its header. Every error names
// the file, and the tensor where one is at fault.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	defer fd.Close() // a mapping outlives its descriptor
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("safetensors: %s: not a regular file", path)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("safetensors: %s: file is %d bytes, shorter than the 8-byte header length", path, size)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("safetensors: %s: file of %d bytes is too large for this platform", path, size)
	}
	buf, mapped, err := mapFile(fd, int(size))
	if err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", path, err)
	}
	f, err := parse(path, buf)
	if err != nil {
		if mapped {
			unmap(buf)
		}
		return nil, err
	}
	f.mapped = mapped
	return f, nil
}

// readAll reads exactly size bytes from the start of f.
func readAll(f *os.File, size int) ([]byte, error) {
	b := make([]byte, size)
	if _, err := io.ReadFull(io.NewSectionReader(f, 0, int64(size)), b); err != nil {
		return nil, err
	}
	return b, nil
}

// fileError is an error about the file at path (and tensor name, if any).
func fileError(path, name, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if name != "" {
		return fmt.Errorf("safetensors: %s: tensor %q: %s", path, name, msg)
	}
	return fmt.Errorf("safetensors: %s: %s", path, msg)
}

// parse validates the file bytes buf and indexes its tensors; it never
// keeps a copy of the data (views alias buf).
func parse(path string, buf []byte) (*File, error) {
	if len(buf) < 8 {
		return nil, fileError(path, "", "file is %d bytes, shorter than the 8-byte header length", len(buf))
	}
	n := binary.LittleEndian.Uint64(buf)
	if n > MaxHeaderBytes {
		return nil, fileError(path, "", "header length %d exceeds the %d-byte limit", n, MaxHeaderBytes)
	}
	if n > uint64(len(buf)-8) {
		return nil, fileError(path, "", "header length %d runs past the end of the %d-byte file", n, len(buf))
	}
	header := buf[8 : 8+n]
	if !utf8.Valid(header) {
		return nil, fileError(path, "", "header is not valid UTF-8")
	}
	f := &File{
		Path:    path,
		buf:     buf,
		data:    buf[8+n:],
		entries: make(map[string]entry),
	}
	dataLen := uint64(len(f.data))
	sawMetadata := false
	sc := &scanner{b: header}
	err := sc.object(func(key string) error {
		if key == metadataKey {
			if sawMetadata {
				return &dupKeyError{key}
			}
			sawMetadata = true
			if sc.null() {
				return nil
			}
			md, err := sc.stringMap()
			if err != nil {
				return fmt.Errorf("%s is not a map of strings to strings: %v", metadataKey, err)
			}
			f.Metadata = md
			return nil
		}
		if _, dup := f.entries[key]; dup {
			return &dupKeyError{key}
		}
		e, err := sc.entry(dataLen)
		if err != nil {
			return &tensorError{key, err}
		}
		f.entries[key] = e
		f.names = append(f.names, key)
		return nil
	})
	if err == nil {
		err = sc.end()
	}
	var dup *dupKeyError
	var te *tensorError
	switch {
	case err == nil:
	case errors.Is(err, errNotObject):
		return nil, fileError(path, "", "header is not a JSON object")
	case errors.As(err, &dup) && dup.key == metadataKey:
		return nil, fileError(path, "", "%s appears twice in the header", metadataKey)
	case errors.As(err, &dup):
		return nil, fileError(path, dup.key, "name appears twice in the header")
	case errors.As(err, &te):
		return nil, fileError(path, te.name, "%v", te.err)
	default:
		return nil, fileError(path, "", "header: %v", err)
	}
	if err := checkCoverage(f.entries, f.names, dataLen); err != nil {
		return nil, fileError(path, "", "%v", err)
	}
	sort.Strings(f.names)
	return f, nil
}

// tensorError is an error in the header entry of one tensor.
type tensorError struct {
	name string
	err  error
}

func (e *tensorError) Error() string { return fmt.Sprintf("tensor %q: %v", e.name, e.err) }

// entry reads and checks one tensor's header entry against a data section
// of dataLen bytes.
func (s *scanner) entry(dataLen uint64) (entry, error) {
	var ds string
	var dims, offs []int64
	var have [3]bool
	start := s.i
	err := s.object(func(key string) error {
		var err error
		field := -1
		switch key {
		case "dtype":
			field = 0
		case "shape":
			field = 1
		case "data_offsets":
			field = 2
		default: // unknown fields are ignored, as by the reference
			return s.skip(1)
		}
		if have[field] {
			return &dupKeyError{key}
		}
		have[field] = true
		switch field {
		case 0:
			if ds, err = s.stringValue(); err != nil {
				err = fmt.Errorf("dtype: %w", err)
			}
		case 1:
			if dims, err = s.ints(); err != nil {
				err = fmt.Errorf("shape: %w", err)
			}
		case 2:
			if offs, err = s.ints(); err != nil {
				err = fmt.Errorf("data_offsets: %w", err)
			}
		}
		return err
	})
	if errors.Is(err, errNotObject) {
		return entry{}, fmt.Errorf("header entry %s is not an object", quoted(s.b[start:s.i]))
	}
	if err != nil {
		return entry{}, err
	}
	switch {
	case !have[0]:
		return entry{}, errors.New(`missing "dtype"`)
	case !have[1]:
		return entry{}, errors.New(`missing "shape"`)
	case !have[2]:
		return entry{}, errors.New(`missing "data_offsets"`)
	}
	return checkEntry(ds, dims, offs, dataLen)
}

// checkEntry validates a decoded header entry.
func checkEntry(ds string, dims, offs []int64, dataLen uint64) (entry, error) {
	dt := tensor.DType(ds)
	if _, ok := dtypeBits[dt]; !ok {
		return entry{}, fmt.Errorf("unknown dtype %q", ds)
	}
	shape := make([]int, len(dims))
	for i, d := range dims {
		if d < 0 {
			return entry{}, fmt.Errorf("shape %v has negative dimension %d", dims, d)
		}
		if int64(int(d)) != d {
			return entry{}, fmt.Errorf("shape %v: dimension %d too large", dims, d)
		}
		shape[i] = int(d)
	}
	if len(offs) != 2 {
		return entry{}, fmt.Errorf("data_offsets %v: want two integers [begin, end]", offs)
	}
	begin, end := offs[0], offs[1]
	if begin < 0 || end < begin {
		return entry{}, fmt.Errorf("data_offsets [%d, %d] are not two ascending non-negative integers", begin, end)
	}
	if uint64(end) > dataLen {
		return entry{}, fmt.Errorf("data_offsets [%d, %d] run past the %d-byte data section", begin, end, dataLen)
	}
	want, err := byteSize(shape, dt)
	if err != nil {
		return entry{}, err
	}
	if uint64(end-begin) != want {
		return entry{}, fmt.Errorf("data_offsets [%d, %d] hold %d bytes, but shape %v of %s needs %d", begin, end, end-begin, dims, dt, want)
	}
	return entry{dtype: dt, shape: shape, begin: int(begin), end: int(end)}, nil
}

// byteSize is the number of bytes of a tensor of the given shape (no
// negative dimensions) and known dtype, refusing overflow and sub-byte
// element counts that do not fill whole bytes.
func byteSize(shape []int, dt tensor.DType) (uint64, error) {
	count := uint64(1)
	overflow := false
	for _, d := range shape {
		hi, lo := bits.Mul64(count, uint64(d))
		overflow = overflow || hi != 0
		count = lo
	}
	hi, nbits := bits.Mul64(count, dtypeBits[dt])
	if overflow || hi != 0 {
		return 0, fmt.Errorf("shape %v of %s overflows", shape, dt)
	}
	if nbits%8 != 0 {
		return 0, fmt.Errorf("shape %v of %s is %d bits, not a whole number of bytes", shape, dt, nbits)
	}
	return nbits / 8, nil
}

// checkCoverage requires the tensors to tile the data section exactly: in
// offset order each begins where the previous ended, and the last ends at
// the end of the section (the reference implementation's rule).
func checkCoverage(entries map[string]entry, names []string, dataLen uint64) error {
	type span struct {
		name       string
		begin, end int
	}
	order := make([]span, len(names))
	for i, name := range names {
		e := entries[name]
		order[i] = span{name, e.begin, e.end}
	}
	slices.SortFunc(order, func(a, b span) int {
		if c := cmp.Compare(a.begin, b.begin); c != 0 {
			return c
		}
		if c := cmp.Compare(a.end, b.end); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	pos, prev := 0, ""
	for _, e := range order {
		name := e.name
		switch {
		case e.begin < pos:
			return fmt.Errorf("tensor %q at [%d, %d] overlaps tensor %q ending at %d", name, e.begin, e.end, prev, pos)
		case e.begin > pos:
			after := "the start of the data section"
			if prev != "" {
				after = fmt.Sprintf("tensor %q", prev)
			}
			return fmt.Errorf("hole in the data section: bytes [%d, %d) between %s and tensor %q belong to no tensor", pos, e.begin, after, name)
		}
		pos, prev = e.end, name
	}
	if uint64(pos) != dataLen {
		return fmt.Errorf("data section is %d bytes but the tensors cover only %d: bytes [%d, %d) belong to no tensor", dataLen, pos, pos, dataLen)
	}
	return nil
}

// Names lists the tensor names, sorted (none once closed).
func (f *File) Names() []string { return slices.Clone(f.names) }

// Len is the number of tensors.
func (f *File) Len() int { return len(f.names) }

// DataBytes is the size of the data section (the sum of all tensors' bytes).
func (f *File) DataBytes() int64 { return int64(len(f.data)) }

// Mapped reports whether the file is memory-mapped (false when mmap failed
// and the file was read into memory instead).
func (f *File) Mapped() bool { return f.mapped }

// Info is a tensor's dtype and shape without its data.
func (f *File) Info(name string) (dtype tensor.DType, shape []int, ok bool) {
	e, ok := f.entries[name]
	if !ok {
		return "", nil, false
	}
	return e.dtype, slices.Clone(e.shape), true
}

// Tensor returns the named tensor as a view into the file: Data aliases the
// mapping (read-only: writing to a mapped page faults) and is valid until
// Close. Shape
// is a fresh copy. ok is false for an unknown name or a closed file.
func (f *File) Tensor(name string) (*tensor.Host, bool) {
	e, ok := f.entries[name]
	if !ok || f.data == nil {
		return nil, false
	}
	return &tensor.Host{
		Name:  name,
		DType: e.dtype,
		Shape: slices.Clone(e.shape),
		Data:  f.data[e.begin:e.end:e.end], // capped: append cannot write into the mapping
	}, true
}

// Close releases the mapping. Tensors obtained from the file must not be
// used afterwards. Closing twice is a no-op.
func (f *File) Close() error {
	buf, mapped := f.buf, f.mapped
	f.buf, f.data, f.entries, f.names, f.mapped = nil, nil, nil, nil, false
	if mapped && buf != nil {
		if err := unmap(buf); err != nil {
			return fmt.Errorf("safetensors: %s: munmap: %w", f.Path, err)
		}
	}
	return nil
}
