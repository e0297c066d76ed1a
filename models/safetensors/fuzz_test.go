package safetensors

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// fuzzSeeds are headers (with the data bytes that go with them) covering
// valid files and each way a header can be wrong.
var fuzzSeeds = []struct {
	header string
	data   []byte
}{
	{`{}`, nil},
	{`{}      `, nil},
	{`{"__metadata__":{"format":"pt"}}`, nil},
	{`{"__metadata__":null,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)},
	{`{"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}}`, make([]byte, 9)},
	{`{"b":{"dtype":"I64","shape":[1],"data_offsets":[4,12]},"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 12)},
	{`{"e":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]},"x":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}}`, make([]byte, 2)},
	{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, make([]byte, 16)},
	{`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)},
	{`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)},
	{`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, make([]byte, 4)},
	{`{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}}`, make([]byte, 4)},
	{`{"a":{"dtype":"X","shape":[1],"data_offsets":[0,4]}}`, make([]byte, 4)},
	{`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}`, make([]byte, 4)},
	{`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, make([]byte, 8)},
	{`{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}`, make([]byte, 4)},
	{`{"a":[1,2,3]}`, nil},
	{`{"__metadata__":{"a":1}}`, nil},
	{`[{"a":1}]`, nil},
	{"{\"\xff\":1}", nil},
	{`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x`, make([]byte, 4)},
	{`{"a\u0000b\ud800":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}`, []byte{7}},
}

// FuzzOpen feeds arbitrary headers and data sections to the parser. It must
// never panic; when it accepts a file, every view must be well-formed, the
// views must tile the data section, and writing the tensors back out must
// give a file that parses to the same tensors.
func FuzzOpen(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s.header), s.data)
	}
	f.Fuzz(func(t *testing.T, header, data []byte) {
		buf := make([]byte, 8, 8+len(header)+len(data))
		binary.LittleEndian.PutUint64(buf, uint64(len(header)))
		buf = append(append(buf, header...), data...)
		checkParse(t, buf)
	})
}

// FuzzOpenRaw is FuzzOpen over whole files, header length included.
func FuzzOpenRaw(f *testing.F) {
	for _, s := range fuzzSeeds[:6] {
		f.Add(rawFile(s.header, s.data))
	}
	f.Add([]byte{1, 2, 3})
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255, '{', '}'})
	f.Add([]byte{3, 0, 0, 0, 0, 0, 0, 0, '{', '}'})
	f.Fuzz(func(t *testing.T, b []byte) { checkParse(t, b) })
}

func checkParse(t *testing.T, buf []byte) {
	const path = "fuzz.safetensors"
	fl, err := parse(path, buf)
	if err != nil {
		if !strings.HasPrefix(err.Error(), "safetensors: "+path+": ") {
			t.Fatalf("error does not name the file: %v", err)
		}
		return
	}
	names := fl.Names()
	if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) || len(names) != len(fl.entries) {
		t.Fatalf("names not sorted and unique: %q", names)
	}
	var total int64
	var views []*tensor.Host
	writable := true
	for _, name := range names {
		x, ok := fl.Tensor(name)
		if !ok {
			t.Fatalf("listed tensor %q missing", name)
		}
		want, err := byteSize(x.Shape, x.DType)
		if err != nil || uint64(len(x.Data)) != want {
			t.Fatalf("tensor %q: %d bytes for %v of %s (%v)", name, len(x.Data), x.Shape, x.DType, err)
		}
		total += int64(len(x.Data))
		views = append(views, x)
		writable = writable && name != ""
	}
	if total != fl.DataBytes() {
		t.Fatalf("tensors hold %d bytes, data section is %d", total, fl.DataBytes())
	}
	if !writable {
		return
	}
	hdr, order, err := encodeHeader(views, fl.Metadata)
	if err != nil {
		t.Fatalf("re-encoding an accepted file: %v", err)
	}
	out := make([]byte, 8, 8+len(hdr)+int(total))
	binary.LittleEndian.PutUint64(out, uint64(len(hdr)))
	out = append(out, hdr...)
	for _, x := range order {
		out = append(out, x.Data...)
	}
	again, err := parse(path, out)
	if err != nil {
		t.Fatalf("re-encoded file refused: %v\nheader %q", err, hdr)
	}
	if !slices.Equal(again.Names(), names) {
		t.Fatalf("names %q after round trip, want %q", again.Names(), names)
	}
	if len(again.Metadata) != len(fl.Metadata) {
		t.Fatalf("metadata %v after round trip, want %v", again.Metadata, fl.Metadata)
	}
	for k, v := range fl.Metadata {
		if again.Metadata[k] != v {
			t.Fatalf("metadata %v after round trip, want %v", again.Metadata, fl.Metadata)
		}
	}
	for _, x := range views {
		y, _ := again.Tensor(x.Name)
		if y.DType != x.DType || !slices.Equal(y.Shape, x.Shape) || string(y.Data) != string(x.Data) {
			t.Fatalf("tensor %q changed in round trip", x.Name)
		}
	}
}
