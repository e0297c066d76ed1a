package safetensors

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// newRNG is a fresh random source for each test run; the seed is logged so
// a failure can be reproduced.
func newRNG(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// randTensor makes a tensor of random contents. Floats are drawn as values
// and encoded (F32, BF16) or as random finite bit patterns (F16); integers
// and bytes as random bits.
func randTensor(rng *rand.Rand, name string, dt tensor.DType, shape []int) *tensor.Host {
	n := tensor.NumElements(shape)
	b := make([]byte, n*DTypeBits(dt)/8)
	if DTypeBits(dt) < 8 { // sub-byte: any bits will do
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return &tensor.Host{Name: name, DType: dt, Shape: shape, Data: b}
	}
	size := DTypeBits(dt) / 8
	for i := 0; i < n; i++ {
		switch dt {
		case tensor.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(rng.NormFloat64())))
		case tensor.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], tensor.F32ToBF16(float32(rng.NormFloat64())))
		case tensor.F16:
			h := uint16(rng.Uint32())
			if h&0x7c00 == 0x7c00 { // keep it finite
				h &^= 0x4000
			}
			binary.LittleEndian.PutUint16(b[2*i:], h)
		case tensor.Bool:
			b[i] = byte(rng.IntN(2))
		default:
			for j := 0; j < size; j++ {
				b[i*size+j] = byte(rng.Uint32())
			}
		}
	}
	return &tensor.Host{Name: name, DType: dt, Shape: shape, Data: b}
}

// randShape is a random shape of 0 to 3 dimensions of size 1 to 7.
func randShape(rng *rand.Rand) []int {
	s := make([]int, rng.IntN(4))
	for i := range s {
		s[i] = 1 + rng.IntN(7)
	}
	return s
}

// rawFile assembles a file from a header (taken as is) and data bytes.
func rawFile(header string, data []byte) []byte {
	b := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(b, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

// writeRaw writes bytes to a new file named name in dir and returns its path.
func writeRaw(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// checkErr fails unless err is non-nil and mentions every want.
func checkErr(t *testing.T, err error, wants ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one mentioning %q", wants)
	}
	for _, w := range wants {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

// sameTensor fails unless got equals want in name, dtype, shape and bytes.
func sameTensor(t *testing.T, got, want *tensor.Host) {
	t.Helper()
	if got.Name != want.Name || got.DType != want.DType || fmt.Sprint(got.Shape) != fmt.Sprint(want.Shape) {
		t.Fatalf("tensor %q %s %v, want %q %s %v", got.Name, got.DType, got.Shape, want.Name, want.DType, want.Shape)
	}
	if string(got.Data) != string(want.Data) {
		t.Fatalf("tensor %q: data differs", want.Name)
	}
}
