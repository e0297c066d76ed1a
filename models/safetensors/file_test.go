package safetensors

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"unsafe"

	"github.com/mkserve/mkserve/tensor"
)

func TestRoundTrip(t *testing.T) {
	rng := newRNG(t)
	dtypes := []tensor.DType{tensor.F32, tensor.F16, tensor.BF16, tensor.I64, tensor.U8, tensor.Bool, tensor.I32}
	var ts []*tensor.Host
	for i := 0; i < 40; i++ {
		dt := dtypes[rng.IntN(len(dtypes))]
		ts = append(ts, randTensor(rng, "model.layers."+string(rune('a'+i%26))+"."+string(dt)+"."+strconv.Itoa(i), dt, randShape(rng)))
	}
	ts = append(ts,
		randTensor(rng, "empty", tensor.F32, []int{0, 3}), // zero elements
		randTensor(rng, "scalar", tensor.I64, []int{}),
	)
	md := map[string]string{"format": "pt", "note": "ünïcode \"quoted\""}
	path := filepath.Join(t.TempDir(), "model.safetensors")
	if err := Write(path, ts, md); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if !f.Mapped() {
		t.Error("file was not memory-mapped")
	}
	var want []string
	for _, x := range ts {
		want = append(want, x.Name)
	}
	sort.Strings(want)
	if got := f.Names(); !slices.Equal(got, want) {
		t.Fatalf("names %v, want %v", got, want)
	}
	if len(f.Metadata) != 2 || f.Metadata["note"] != md["note"] || f.Metadata["format"] != "pt" {
		t.Fatalf("metadata %v, want %v", f.Metadata, md)
	}
	var total int64
	for _, x := range ts {
		got, ok := f.Tensor(x.Name)
		if !ok {
			t.Fatalf("tensor %q missing", x.Name)
		}
		sameTensor(t, got, x)
		total += int64(len(x.Data))
		if len(got.Data) == 0 {
			continue
		}
		// Zero-copy: the view points into the mapping, capped at its end,
		// and aligned to its element size (the writer pads the header).
		p := uintptr(unsafe.Pointer(&got.Data[0]))
		lo := uintptr(unsafe.Pointer(&f.buf[0]))
		if p < lo || p+uintptr(len(got.Data)) > lo+uintptr(len(f.buf)) {
			t.Fatalf("tensor %q is not a view into the mapping", x.Name)
		}
		if cap(got.Data) != len(got.Data) {
			t.Fatalf("tensor %q: cap %d > len %d lets append write into the mapping", x.Name, cap(got.Data), len(got.Data))
		}
		if size := DTypeBits(x.DType) / 8; p%uintptr(size) != 0 {
			t.Fatalf("tensor %q (%s) at address %#x is not %d-aligned", x.Name, x.DType, p, size)
		}
	}
	if f.DataBytes() != total {
		t.Fatalf("DataBytes %d, want %d", f.DataBytes(), total)
	}
	// F32 values survive exactly, through tensor's own conversion.
	src := make([]float32, 24)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
	}
	p2 := filepath.Join(t.TempDir(), "f.safetensors")
	if err := Write(p2, []*tensor.Host{tensor.FromFloat32("x", []int{4, 6}, src)}, nil); err != nil {
		t.Fatal(err)
	}
	g, err := Open(p2)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	x, _ := g.Tensor("x")
	vals, err := x.Float32()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(vals, src) {
		t.Fatalf("F32 values %v, want %v", vals, src)
	}
	if g.Metadata != nil {
		t.Fatalf("metadata %v, want nil", g.Metadata)
	}
}

// TestReferenceLayout checks byte for byte against files laid out as the
// reference serializer (huggingface/safetensors) writes them: same key
// order, compact JSON, header padded with spaces to 8 bytes, tensors sorted
// by descending alignment then name.
func TestReferenceLayout(t *testing.T) {
	le := func(vs ...float32) []byte {
		b := make([]byte, 4*len(vs))
		for i, v := range vs {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
		}
		return b
	}
	cases := []struct {
		name    string
		tensors []*tensor.Host
		md      map[string]string
		want    []byte
	}{
		{"one tensor", []*tensor.Host{tensor.FromFloat32("attn.0", []int{1, 2, 3}, []float32{0, 1, 2, 3, 4, 5})}, nil,
			rawFile(`{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`, le(0, 1, 2, 3, 4, 5))},
		{"padded", []*tensor.Host{tensor.FromFloat32("attn0", []int{1, 1, 2, 3}, []float32{0, 1, 2, 3, 4, 5})}, nil,
			rawFile(`{"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}}       `, le(0, 1, 2, 3, 4, 5))},
		{"empty", nil, nil, rawFile(`{}      `, nil)},
		{"unescaped html", []*tensor.Host{{Name: "a<b>&c\"é", DType: tensor.U8, Shape: []int{}, Data: []byte{5}}}, nil,
			rawFile(`{"a<b>&c\"é":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}   `, []byte{5})},
		{"metadata only", nil, map[string]string{"framework": "pt"}, rawFile(`{"__metadata__":{"framework":"pt"}}     `, nil)},
		{"order", []*tensor.Host{
			{Name: "b", DType: tensor.U8, Shape: []int{1}, Data: []byte{7}},
			{Name: "a", DType: tensor.U8, Shape: []int{1}, Data: []byte{9}},
			{Name: "z", DType: tensor.F16, Shape: []int{1}, Data: []byte{1, 2}},
		}, nil, rawFile(`{"z":{"dtype":"F16","shape":[1],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[1],"data_offsets":[2,3]},"b":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}}  `, []byte{1, 2, 9, 7})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "x.safetensors")
			if err := Write(path, c.tensors, c.md); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != string(c.want) {
				t.Fatalf("wrote\n%q\nwant\n%q", got, c.want)
			}
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, x := range c.tensors {
				y, ok := f.Tensor(x.Name)
				if !ok {
					t.Fatalf("tensor %q missing", x.Name)
				}
				sameTensor(t, y, x)
			}
		})
	}
}

// TestUnpaddedAndReordered reads files a writer might produce other than
// ours: tensors listed out of offset order, unknown fields, whitespace,
// sub-byte F4 and an unaligned data section.
func TestUnpaddedAndReordered(t *testing.T) {
	rng := newRNG(t)
	a := randTensor(rng, "a", tensor.BF16, []int{3})
	b := randTensor(rng, "b", tensor.F32, []int{2})
	c := randTensor(rng, "c", tensor.F4, []int{2, 3}) // 6 nibbles = 3 bytes
	header := ` { "c" : {"data_offsets":[14,17],"shape":[2,3],"dtype":"F4","extra":[1,{"x":null}]},
		"b":{"dtype":"F32","shape":[2],"data_offsets":[6,14]}, "__metadata__": null,
		"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]} } ` // 1 trailing space: unaligned
	data := append(append(append([]byte{}, a.Data...), b.Data...), c.Data...)
	path := writeRaw(t, t.TempDir(), "x.safetensors", rawFile(header, data))
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, want := range []*tensor.Host{a, b, c} {
		got, ok := f.Tensor(want.Name)
		if !ok {
			t.Fatalf("tensor %q missing", want.Name)
		}
		sameTensor(t, got, want)
	}
	if f.Metadata != nil {
		t.Fatalf("null __metadata__ gave %v", f.Metadata)
	}
	if dt, shape, ok := f.Info("c"); !ok || dt != tensor.F4 || !slices.Equal(shape, []int{2, 3}) {
		t.Fatalf("Info(c) = %s %v %v", dt, shape, ok)
	}
}

// TestMalformed checks that each kind of bad file is refused with an error
// naming the file, the tensor at fault and what is wrong.
func TestMalformed(t *testing.T) {
	f32 := func(name string, shape string, b, e int) string {
		return `"` + name + `":{"dtype":"F32","shape":` + shape + `,"data_offsets":[` + strconv.Itoa(b) + `,` + strconv.Itoa(e) + `]}`
	}
	hdrLen := func(n uint64, rest []byte) []byte {
		b := make([]byte, 8)
		binary.LittleEndian.PutUint64(b, n)
		return append(b, rest...)
	}
	data8 := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	cases := []struct {
		name   string
		file   []byte
		tensor string // tensor the error must name ("" for none)
		want   []string
	}{
		{"short file", []byte{1, 0, 0}, "", []string{"3 bytes", "shorter than the 8-byte"}},
		{"empty file", nil, "", []string{"0 bytes", "shorter"}},
		{"header past end", hdrLen(100, []byte(`{}`)), "", []string{"header length 100", "past the end of the 10-byte file"}},
		{"header huge", hdrLen(1<<40, []byte(`{}`)), "", []string{"header length 1099511627776", "exceeds the 100000000-byte limit"}},
		{"header max uint64", hdrLen(math.MaxUint64, []byte(`{}`)), "", []string{"exceeds"}},
		{"not json", rawFile(`{"w":{"dtype":`, nil), "w", []string{"not valid JSON", "unexpected end"}},
		{"not json garbage", rawFile(`hello`, nil), "", []string{"not valid JSON"}},
		{"not object array", rawFile(`[1,2]`, nil), "", []string{"header is not a JSON object"}},
		{"not object string", rawFile(`"w"`, nil), "", []string{"header is not a JSON object"}},
		{"trailing data", rawFile(`{} {}`, nil), "", []string{"trailing data"}},
		{"invalid utf8", rawFile("{\"w\xff\":1}", nil), "", []string{"not valid UTF-8"}},
		{"metadata not map", rawFile(`{"__metadata__":"x"}`, nil), "", []string{"__metadata__ is not a map of strings"}},
		{"metadata number value", rawFile(`{"__metadata__":{"epochs":3}}`, nil), "", []string{"__metadata__", `"epochs"`, "not a string"}},
		{"metadata nested", rawFile(`{"__metadata__":{"a":{"b":"c"}}}`, nil), "", []string{"__metadata__", `"a"`}},
		{"entry not object", rawFile(`{"w":[1]}`, nil), "w", []string{"not an object"}},
		{"missing dtype", rawFile(`{"w":{"shape":[2],"data_offsets":[0,8]}}`, data8), "w", []string{`missing "dtype"`}},
		{"missing shape", rawFile(`{"w":{"dtype":"F32","data_offsets":[0,8]}}`, data8), "w", []string{`missing "shape"`}},
		{"missing offsets", rawFile(`{"w":{"dtype":"F32","shape":[2]}}`, data8), "w", []string{`missing "data_offsets"`}},
		{"dtype not string", rawFile(`{"w":{"dtype":32,"shape":[2],"data_offsets":[0,8]}}`, data8), "w", []string{"dtype", "not a string"}},
		{"unknown dtype", rawFile(`{"w":{"dtype":"F128","shape":[2],"data_offsets":[0,8]}}`, data8), "w", []string{`unknown dtype "F128"`}},
		{"lowercase dtype", rawFile(`{"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}`, data8), "w", []string{`unknown dtype "f32"`}},
		{"negative dim", rawFile(`{`+f32("w", "[-2,1]", 0, 8)+`}`, data8), "w", []string{"negative dimension -2"}},
		{"fractional dim", rawFile(`{`+f32("w", "[2.0]", 0, 8)+`}`, data8), "w", []string{"shape", "not an integer"}},
		{"quoted dim", rawFile(`{`+f32("w", `["2"]`, 0, 8)+`}`, data8), "w", []string{"shape", "not an integer"}},
		{"exponent dim", rawFile(`{`+f32("w", `[2e0]`, 0, 8)+`}`, data8), "w", []string{"shape", "not an integer"}},
		{"shape not array", rawFile(`{`+f32("w", `2`, 0, 8)+`}`, data8), "w", []string{"shape", "not an array"}},
		{"dim too large", rawFile(`{`+f32("w", `[99999999999999999999]`, 0, 8)+`}`, data8), "w", []string{"shape", "not an integer in range"}},
		{"shape overflow", rawFile(`{`+f32("w", `[4611686018427387904,4611686018427387904]`, 0, 8)+`}`, data8), "w", []string{"overflows"}},
		{"one offset", rawFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[8]}}`, data8), "w", []string{"want two integers"}},
		{"three offsets", rawFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}}`, data8), "w", []string{"want two integers"}},
		{"descending offsets", rawFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}`, data8), "w", []string{"[8, 0]", "not two ascending"}},
		{"negative offset", rawFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}`, data8), "w", []string{"not two ascending non-negative"}},
		{"string offset", rawFile(`{"w":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}}`, data8), "w", []string{"data_offsets", "not an integer"}},
		{"offsets past data", rawFile(`{`+f32("w", "[4]", 0, 16)+`}`, data8), "w", []string{"[0, 16]", "run past the 8-byte data section"}},
		{"length mismatch", rawFile(`{`+f32("w", "[3]", 0, 8)+`}`, data8), "w", []string{"hold 8 bytes", "shape [3] of F32 needs 12"}},
		{"sub-byte partial", rawFile(`{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}`, []byte{1, 2}), "w", []string{"12 bits", "not a whole number of bytes"}},
		{"overlap", rawFile(`{`+f32("a", "[2]", 0, 8)+`,`+f32("b", "[1]", 4, 8)+`}`, data8), "", []string{`tensor "b" at [4, 8] overlaps tensor "a"`}},
		{"same offsets", rawFile(`{`+f32("a", "[2]", 0, 8)+`,`+f32("b", "[2]", 0, 8)+`}`, data8), "", []string{"overlaps"}},
		{"hole between", rawFile(`{`+f32("a", "[1]", 0, 4)+`,`+f32("b", "[1]", 8, 12)+`}`, append(data8, 9, 9, 9, 9)), "", []string{"hole", "[4, 8)", `"a"`, `"b"`}},
		{"hole at start", rawFile(`{`+f32("b", "[1]", 4, 8)+`}`, data8), "", []string{"hole", "[0, 4)", "start of the data section"}},
		{"trailing bytes", rawFile(`{`+f32("a", "[1]", 0, 4)+`}`, data8), "", []string{"cover only 4", "[4, 8) belong to no tensor"}},
		{"no tensors but data", rawFile(`{}`, data8), "", []string{"cover only 0"}},
		{"duplicate name", rawFile(`{`+f32("w", "[1]", 0, 4)+`,`+f32("w", "[1]", 4, 8)+`}`, data8), "w", []string{"appears twice"}},
		{"duplicate field", rawFile(`{"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}}`, data8[:4]), "w", []string{`duplicate key "dtype"`}},
		{"duplicate metadata", rawFile(`{"__metadata__":{},"__metadata__":{}}`, nil), "", []string{"__metadata__ appears twice"}},
	}
	dir := t.TempDir()
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := writeRaw(t, dir, "case"+strconv.Itoa(i)+".safetensors", c.file)
			f, err := Open(path)
			if err == nil {
				f.Close()
			}
			wants := append([]string{path}, c.want...)
			if c.tensor != "" {
				wants = append(wants, `tensor "`+c.tensor+`"`)
			}
			checkErr(t, err, wants...)
		})
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(filepath.Join(dir, "nope.safetensors"))
	checkErr(t, err, "nope.safetensors", "no such file")
	_, err = Open(dir)
	checkErr(t, err, dir, "not a regular file")
}

func TestHeapFallbackMatchesMapping(t *testing.T) {
	rng := newRNG(t)
	ts := []*tensor.Host{randTensor(rng, "a", tensor.BF16, []int{5, 3}), randTensor(rng, "b", tensor.I64, []int{4})}
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := Write(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := fd.Stat()
	buf, err := readAll(fd, int(st.Size()))
	fd.Close()
	if err != nil {
		t.Fatal(err)
	}
	f, err := parse(path, buf)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, x := range ts {
		y, _ := f.Tensor(x.Name)
		sameTensor(t, y, x)
	}
}

func TestCloseAndConcurrentReads(t *testing.T) {
	rng := newRNG(t)
	var ts []*tensor.Host
	for i := 0; i < 20; i++ {
		ts = append(ts, randTensor(rng, "t"+strconv.Itoa(i), tensor.F32, []int{1 + rng.IntN(50)}))
	}
	path := filepath.Join(t.TempDir(), "x.safetensors")
	if err := Write(path, ts, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 8*len(ts))
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, x := range ts {
				y, ok := f.Tensor(x.Name)
				if !ok || string(y.Data) != string(x.Data) {
					errs <- x.Name
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for name := range errs {
		t.Errorf("concurrent read of %q failed", name)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, ok := f.Tensor("t0"); ok {
		t.Fatal("Tensor after Close returned a view")
	}
	if len(f.Names()) != 0 || f.CheckFloat() != nil {
		t.Fatal("a closed file still lists tensors")
	}
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	good := func() *tensor.Host {
		return &tensor.Host{Name: "a", DType: tensor.F32, Shape: []int{2}, Data: make([]byte, 8)}
	}
	cases := []struct {
		name string
		ts   []*tensor.Host
		want string
	}{
		{"nil tensor", []*tensor.Host{nil}, "nil"},
		{"empty name", []*tensor.Host{{DType: tensor.F32, Shape: []int{0}}}, "invalid name"},
		{"reserved name", []*tensor.Host{{Name: "__metadata__", DType: tensor.F32, Shape: []int{0}}}, "invalid name"},
		{"duplicate", []*tensor.Host{good(), good()}, `"a": name given twice`},
		{"unknown dtype", []*tensor.Host{{Name: "a", DType: "Q4", Shape: []int{1}, Data: []byte{1}}}, `unknown dtype "Q4"`},
		{"negative dim", []*tensor.Host{{Name: "a", DType: tensor.U8, Shape: []int{-1}}}, "negative"},
		{"short data", []*tensor.Host{{Name: "a", DType: tensor.F32, Shape: []int{3}, Data: make([]byte, 8)}}, "8 bytes of data"},
		{"sub-byte partial", []*tensor.Host{{Name: "a", DType: tensor.F4, Shape: []int{3}, Data: make([]byte, 2)}}, "not a whole number of bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, "x.safetensors")
			checkErr(t, Write(path, c.ts, nil), path, c.want)
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Fatal("a failed Write left a file behind")
			}
		})
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 0 {
		t.Fatalf("temporary files left: %v", ents)
	}
}
