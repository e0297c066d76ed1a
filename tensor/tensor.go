// Package tensor holds the host-side tensor types shared by checkpoint
// loading, the backends and the reference implementations: element types,
// raw host tensors (often views into a memory-mapped file) and conversions.
package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DType is an element type as safetensors names it.
type DType string

// Element types the project knows about. Only F32, F16 and BF16 can be
// computed with today; the others are recognised so that they can be refused
// with a clear error.
const (
	F32    DType = "F32"
	F16    DType = "F16"
	BF16   DType = "BF16"
	F64    DType = "F64"
	I64    DType = "I64"
	I32    DType = "I32"
	I16    DType = "I16"
	I8     DType = "I8"
	U8     DType = "U8"
	Bool   DType = "BOOL"
	F8E4M3 DType = "F8_E4M3"
	F8E5M2 DType = "F8_E5M2"
	F8E8M0 DType = "F8_E8M0"
	F4     DType = "F4"
)

// Size is the number of bytes of one element, or 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case F64, I64:
		return 8
	case F32, I32:
		return 4
	case F16, BF16, I16:
		return 2
	case I8, U8, Bool, F8E4M3, F8E5M2, F8E8M0:
		return 1
	}
	return 0
}

// Float reports whether the type is one the compute path accepts (F32, F16, BF16).
func (d DType) Float() bool { return d == F32 || d == F16 || d == BF16 }

// Host is a tensor in host memory. Data is little-endian and may alias a
// memory-mapped file: treat it as read-only.
type Host struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// NumElements is the product of the shape (1 for a scalar).
func NumElements(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// Len is the number of elements.
func (t *Host) Len() int { return NumElements(t.Shape) }

// Float32 converts the tensor to a new float32 slice.
func (t *Host) Float32() ([]float32, error) {
	out := make([]float32, t.Len())
	if err := t.Float32Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Float32Into converts the tensor into dst, which must have Len elements.
func (t *Host) Float32Into(dst []float32) error {
	n := t.Len()
	if len(dst) != n {
		return fmt.Errorf("tensor %q: destination has %d elements, tensor %d", t.Name, len(dst), n)
	}
	if !t.DType.Float() {
		return fmt.Errorf("tensor %q: dtype %s cannot be converted to float32", t.Name, t.DType)
	}
	if len(t.Data) != n*t.DType.Size() {
		return fmt.Errorf("tensor %q: %d bytes for %d elements of %s", t.Name, len(t.Data), n, t.DType)
	}
	switch t.DType {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
	}
	return nil
}

// FromFloat32 makes an F32 host tensor holding a copy of v.
func FromFloat32(name string, shape []int, v []float32) *Host {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return &Host{Name: name, DType: F32, Shape: append([]int(nil), shape...), Data: b}
}

// BF16ToF32 widens a bfloat16 bit pattern.
func BF16ToF32(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// ToBF16 returns an F32 tensor t rounded to BF16 (nearest even); other
// dtypes come back as they are.
func ToBF16(t *Host) *Host {
	if t.DType != F32 {
		return t
	}
	n := len(t.Data) / 4
	b := make([]byte, 2*n)
	for i := range n {
		binary.LittleEndian.PutUint16(b[2*i:], F32ToBF16(math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))))
	}
	return &Host{Name: t.Name, DType: BF16, Shape: t.Shape, Data: b}
}

// F32ToBF16 rounds to nearest even, keeping NaN a NaN.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

// F16ToF32 widens an IEEE half-precision bit pattern (subnormals, inf, NaN included).
func F16ToF32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h) & 0x3ff
	switch {
	case exp == 0 && mant == 0:
		return math.Float32frombits(sign)
	case exp == 0: // subnormal: normalise
		e := uint32(127 - 15 + 1)
		for mant&0x400 == 0 {
			mant <<= 1
			e--
		}
		mant &= 0x3ff
		return math.Float32frombits(sign | e<<23 | mant<<13)
	case exp == 0x1f:
		return math.Float32frombits(sign | 0xff<<23 | mant<<13)
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
