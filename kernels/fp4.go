package kernels

import (
	"fmt"
	"math"
	"math/bits"
	"sync/atomic"

	"github.com/mkserve/mkserve/internal/par"
)

// FP4 expert weights (moe_fp4.cuh, mk_moe.h): MXFP4's values — E2M1
// nibbles in groups of 32 with a power-of-two (E8M0) scale — held at 4.25
// bits a value on the device. A matrix [N, K] (K a multiple of
// FP4BlockValues) is two arrays:
//
//	codes  [N, K/2] bytes: each row in blocks of 64 values (32 bytes),
//	       ordered inside a block for the tensor cores' A fragments;
//	scales [N, K/32] bytes: group g of a row (values 32g … 32g+31) is
//	       scaled by 2^(scales[g] − 127), 1 ≤ scales[g] ≤ 240.
//
// Inside a block, bytes 8c … 8c+7 (c = 0 … 3) are two little-endian words
// w = 0, 1; word w holds the block's values 16q + 4c + j for q = 2w, 2w+1
// and j = 0 … 3 at nibbles 0: (2w, 0), 1: (2w, 2), 2: (2w+1, 0),
// 3: (2w+1, 2), 4: (2w, 1), 5: (2w, 3), 6: (2w+1, 1), 7: (2w+1, 3). A
// nibble is an E2M1 code: bit 3 the sign, bits 2 … 0 the magnitude 0, ½,
// 1, 1½, 2, 3, 4 or 6.

// FP4BlockValues is the block of values FP4 rows are stored in; K must be
// a multiple of it.
const FP4BlockValues = 64

// fp4GroupValues is the values one scale covers.
const fp4GroupValues = 32

// e2m1 are the E2M1 magnitudes by code (bits 2 … 0).
var e2m1 = [8]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// fp4Scale is the factor 2^(s − 127) of an E8M0 scale s.
func fp4Scale(s byte) float32 { return float32(math.Ldexp(1, int(s)-127)) }

// fp4BF16 is the bf16 bits of E2M1 code nib (bit 3 the sign) times sc
// (exact where the product stays in bf16's range).
func fp4BF16(nib byte, sc float32) uint16 {
	f := e2m1[nib&7] * sc
	if nib&8 != 0 {
		f = -f
	}
	return uint16(math.Float32bits(f) >> 16)
}

// fp4Slot maps value v (0 … 63) of a block to its byte (0 … 31) and the
// nibble's shift within it.
func fp4Slot(v int) (byteIdx, shift int) {
	q, c, j := v/16, v%16/4, v%4
	w := q / 2
	p := map[[2]int]int{{0, 0}: 0, {0, 2}: 1, {1, 0}: 2, {1, 2}: 3, {0, 1}: 4, {0, 3}: 5, {1, 1}: 6, {1, 3}: 7}[[2]int{q % 2, j}]
	return 8*c + 4*w + p/2, 4 * (p % 2)
}

// fp4Slots is fp4Slot of every value of a block.
var fp4Slots = func() (s [FP4BlockValues][2]uint8) {
	for v := range s {
		b, sh := fp4Slot(v)
		s[v] = [2]uint8{uint8(b), uint8(sh)}
	}
	return s
}()

// FP4Sizes are the bytes of an FP4 matrix [n, k]'s codes and scales.
func FP4Sizes(n, k int) (codes, scales int64) {
	return int64(n) * int64(k) / 2, int64(n) * int64(k) / fp4GroupValues
}

// PackFP4 converts the bf16 matrix src [n, k] (the upper halves of
// float32s) to FP4 codes and scales and reports true, or reports false when
// FP4 cannot hold it exactly (a value that is not an E2M1 value times its
// group's power of two, a scale out of range, or k not a multiple of
// FP4BlockValues): an MXFP4 checkpoint's experts convert back without loss.
// Rows are converted on every core.
func PackFP4(src []uint16, n, k int) (codes, scales []byte, ok bool) {
	if n <= 0 || k <= 0 || k%FP4BlockValues != 0 || len(src) < n*k {
		return nil, nil, false
	}
	cb, sb := FP4Sizes(n, k)
	codes, scales = make([]byte, cb), make([]byte, sb)
	// The first row alone first: a plain bf16 matrix fails there at once.
	if !packRow(codes[:k/2], scales[:k/fp4GroupValues], src[:k]) {
		return nil, nil, false
	}
	var bad atomic.Bool
	par.For(n-1, 16, func() func(a, b int) {
		return func(a, b int) {
			for r := a + 1; r < b+1 && !bad.Load(); r++ {
				if !packRow(codes[r*k/2:(r+1)*k/2], scales[r*k/fp4GroupValues:(r+1)*k/fp4GroupValues], src[r*k:(r+1)*k]) {
					bad.Store(true)
				}
			}
		}
	})
	if bad.Load() {
		return nil, nil, false
	}
	return codes, scales, true
}

// fp4Parts maps a bf16 magnitude (bits & 0x7FFF) to its value as m·2^p,
// m odd: p<<8 | m for m = 1 or 3 (the E2M1 mantissas), 0 for zero, and
// fp4Bad for anything FP4 cannot hold (another m, an infinity, a NaN).
var fp4Parts = func() (t [1 << 15]int32) {
	for b := range t {
		e, f := b>>7, b&0x7F
		switch {
		case e == 0xFF:
			t[b] = fp4Bad
			continue
		case e == 0 && f == 0:
			continue
		case e == 0: // subnormal: f·2^-133
			e = 1
		default:
			f |= 0x80
		}
		tz := bits.TrailingZeros32(uint32(f))
		m, p := f>>tz, e-134+tz
		if m != 1 && m != 3 {
			t[b] = fp4Bad
			continue
		}
		t[b] = int32(p)<<8 | int32(m)
	}
	return t
}()

const fp4Bad = int32(0xFF)

// fp4Code is the E2M1 code (sign clear) of m·2^sh, m = 1 or 3, over a
// group scale of 2^s: the doubled E2M1 values 1, 2, 4, 8 (m = 1) and 3,
// 6, 12 (m = 3); 0xFF where sh is out of reach.
var fp4CodeOf = [4][4]byte{1: {1, 2, 4, 6}, 3: {3, 5, 7, 0xFF}}

// packRow packs one row of src into codes and scales; false if FP4 cannot
// hold it. A group's scale is the smallest power of two among its values'
// (writing each as m·2^p, m odd), so that every value is a doubled E2M1
// value times it.
func packRow(codes, scales []byte, src []uint16) bool {
	for blk := 0; blk < len(src)/FP4BlockValues; blk++ {
		var out [32]byte
		for h := 0; h < 2; h++ { // the block's two groups
			g := 2*blk + h
			vals := src[g*fp4GroupValues : (g+1)*fp4GroupValues : (g+1)*fp4GroupValues]
			var parts [fp4GroupValues]int32
			s := int32(math.MaxInt32)
			for i, b := range vals {
				v := fp4Parts[b&0x7FFF]
				if v == fp4Bad {
					return false
				}
				parts[i] = v
				if v != 0 && v>>8 < s {
					s = v >> 8
				}
			}
			if s == math.MaxInt32 { // all zero
				s = -1
			}
			// The doubled values' scale 2^s is E2M1's 2^(s+1): E8M0 s + 128.
			if e := s + 128; e < 1 || e > 240 {
				return false
			}
			scales[g] = byte(s + 128)
			for i, v := range parts {
				if v == 0 {
					continue
				}
				sh := v>>8 - s
				if sh > 3 {
					return false
				}
				c := fp4CodeOf[v&3][sh]
				if c == 0xFF {
					return false
				}
				c |= byte(vals[i]>>12) & 8 // the sign
				sl := &fp4Slots[h*fp4GroupValues+i]
				out[sl[0]] |= c << sl[1]
			}
		}
		copy(codes[blk*32:], out[:])
	}
	return true
}

// RepackMXFP4 converts an MXFP4 matrix [n, k] as checkpoints store it —
// blocks (n·k/32 groups of 16 bytes, element 2i of a group in the low
// nibble of byte i) and E8M0 scales — to this package's FP4 codes and
// scales (the same values; the nibbles reordered within each block of
// 64), and reports false where this form cannot take it (k not a multiple
// of FP4BlockValues, a scale outside 1 … 240).
func RepackMXFP4(blocks, scales []byte, n, k int) (codes, sc []byte, ok bool) {
	if n <= 0 || k <= 0 || k%FP4BlockValues != 0 || len(blocks) < n*k/2 || len(scales) < n*k/fp4GroupValues {
		return nil, nil, false
	}
	g := n * k / fp4GroupValues
	for _, s := range scales[:g] {
		if s < 1 || s > 240 {
			return nil, nil, false
		}
	}
	cb, _ := FP4Sizes(n, k)
	codes = make([]byte, cb)
	par.For(n*k/FP4BlockValues, 1024, func() func(a, b int) {
		return func(a, b int) {
			for blk := a; blk < b; blk++ {
				src, dst := blocks[blk*32:blk*32+32], codes[blk*32:blk*32+32]
				for v := range FP4BlockValues {
					nib := src[v/2] >> (4 * (v % 2)) & 0xF // groups of 32: bytes 0…15, 16…31 of the block
					sl := &fp4Slots[v]
					dst[sl[0]] |= nib << sl[1]
				}
			}
		}
	})
	return codes, append([]byte(nil), scales[:g]...), true
}

// QuantizeMXFP4 is the MXFP4 form (blocks and E8M0 scales, as checkpoints
// store it; DecodeMXFP4's input) of the row-major matrix v [n, k] (k a
// multiple of 32): each group of 32 scaled by the power of two that brings
// its largest magnitude to at most 6, each value rounded to the nearest
// E2M1 value (ties to the lower code). Values MXFP4 holds come back exactly.
func QuantizeMXFP4(v []float32, n, k int) (blocks, scales []byte) {
	g := n * k / fp4GroupValues
	blocks, scales = make([]byte, g*16), make([]byte, g)
	for q := range g {
		grp := v[q*fp4GroupValues : (q+1)*fp4GroupValues]
		amax := 0.0
		for _, x := range grp {
			amax = math.Max(amax, math.Abs(float64(x)))
		}
		s := 0
		if amax > 0 {
			s = int(math.Ceil(math.Log2(amax / 6)))
		}
		scales[q] = byte(s + 127)
		for i, x := range grp {
			y := math.Abs(float64(x)) / math.Ldexp(1, s)
			c := 0
			for j, m := range e2m1 {
				if math.Abs(y-float64(m)) < math.Abs(y-float64(e2m1[c])) {
					c = j
				}
			}
			if x < 0 || math.Signbit(float64(x)) {
				c |= 8
			}
			blocks[q*16+i/2] |= byte(c) << (4 * (i % 2))
		}
	}
	return blocks, scales
}

// DecodeMXFP4 is the bf16 matrix [n, k] (bits) of MXFP4 blocks and scales
// (RepackMXFP4's input): exact where the scale keeps the values in bf16's
// range.
func DecodeMXFP4(blocks, scales []byte, n, k int) []uint16 {
	out := make([]uint16, n*k)
	par.For(n*k/fp4GroupValues, 1024, func() func(a, b int) {
		return func(a, b int) {
			for g := a; g < b; g++ {
				sc := fp4Scale(scales[g])
				for i := range fp4GroupValues {
					out[g*fp4GroupValues+i] = fp4BF16(blocks[g*16+i/2]>>(4*(i%2))&0xF, sc)
				}
			}
		}
	})
	return out
}

// UnpackFP4 is the bf16 matrix [n, k] (bits) of FP4 codes and scales: the
// reference the device's dequantization and tests check against.
func UnpackFP4(codes, scales []byte, n, k int) []uint16 {
	out := make([]uint16, n*k)
	for r := 0; r < n; r++ {
		for v := 0; v < k; v++ {
			s := fp4Slots[v%FP4BlockValues]
			nib := codes[r*k/2+v/FP4BlockValues*32+int(s[0])] >> s[1] & 0xF
			out[r*k+v] = fp4BF16(nib, fp4Scale(scales[r*k/fp4GroupValues+v/fp4GroupValues]))
		}
	}
	return out
}

// FP4 is an FP4 matrix [N, K] on the device.
type FP4 struct {
	Codes  *Buffer // [N, K/2] bytes, 16-byte aligned
	Scales *Buffer // [N, K/32] bytes
	N, K   int
}

// Rows is rows [lo, hi) of m as views of its buffers.
func (m *FP4) Rows(lo, hi int) (*FP4, error) {
	if lo < 0 || hi > m.N || hi <= lo {
		return nil, fmt.Errorf("kernels: rows [%d, %d) of an FP4 matrix of %d", lo, hi, m.N)
	}
	cb, sb := FP4Sizes(1, m.K)
	codes, err := m.Codes.View(int64(lo)*cb, int64(hi-lo)*cb)
	if err != nil {
		return nil, err
	}
	scales, err := m.Scales.View(int64(lo)*sb, int64(hi-lo)*sb)
	if err != nil {
		return nil, err
	}
	return &FP4{Codes: codes, Scales: scales, N: hi - lo, K: m.K}, nil
}

// check reports whether m is a well-formed FP4 matrix of n rows of k.
func (m *FP4) check(op, name string, n, k int) error {
	if m == nil {
		return fmt.Errorf("kernels: %s: nil %s", op, name)
	}
	if m.N != n || m.K != k || k%FP4BlockValues != 0 {
		return fmt.Errorf("kernels: %s: %s is FP4 [%d, %d], want [%d, %d] with K a multiple of %d", op, name, m.N, m.K, n, k, FP4BlockValues)
	}
	cb, sb := FP4Sizes(n, k)
	if err := need(op, name+" codes", m.Codes, cb, 1); err != nil {
		return err
	}
	return need(op, name+" scales", m.Scales, sb, 1)
}

var (
	fp4Dequant      func(s, dst, codes, scales uint64, n, k int64) int32
	moeFP4Path      func(t int64, k, e int32, path *int32) int32
	moeWorkspaceFP4 func(t int64, k, e int32, h, i int64, bytes *uint64) int32
	moeExpertsFP4   func(s, out, x, ids, weights uint64, t int64, k, e int32, h, i int64, guCodes, guScales, gateUpBias,
		dnCodes, dnScales, downBias uint64, act int32, alpha, limit uint32, counts, ws, wsBytes uint64) int32
)

func init() {
	registerSymbols(
		symbol{"mk_fp4_dequant_bf16", &fp4Dequant},
		symbol{"mk_moe_fp4_path", &moeFP4Path},
		symbol{"mk_moe_workspace_fp4", &moeWorkspaceFP4},
		symbol{"mk_moe_experts_fp4", &moeExpertsFP4},
	)
}

// FP4Path is how MoEExpertsRun runs a batch on FP4 experts (mk_moe.h).
type FP4Path int32

// The FP4 paths: two GEMV kernels on the codes (up to 8 tokens, 32
// assignments), the grouped GEMMs decoding each weight tile in shared
// memory (experts of up to 16 rows on average), or the chosen experts
// dequantized to bf16 for the bf16 grouped GEMMs.
const (
	FP4Gemv    FP4Path = 0
	FP4Gemm    FP4Path = 1
	FP4Dequant FP4Path = 2
)

var fp4PathNames = [...]string{FP4Gemv: "gemv", FP4Gemm: "gemm", FP4Dequant: "dequant"}

func (p FP4Path) String() string {
	if p >= 0 && int(p) < len(fp4PathNames) {
		return fp4PathNames[p]
	}
	return fmt.Sprintf("FP4Path(%d)", int32(p))
}

// MoEFP4Path reports the path MoEExpertsRun takes for T tokens of top-K
// over E FP4 experts (MK_FP4_PATH forces one).
func (d *Device) MoEFP4Path(T, K, E int) (FP4Path, error) {
	const op = "MoEFP4Path"
	if err := d.ready(op); err != nil {
		return 0, err
	}
	if err := dims(op, "T", T, "K", K, "E", E); err != nil {
		return 0, err
	}
	var p int32
	err := d.lib.check("mk_moe_fp4_path", moeFP4Path(int64(T), int32(K), int32(E), &p))
	return FP4Path(p), err
}

// FP4DequantBF16 writes the bf16 values of m to dst [m.N, m.K] (exact).
func (d *Device) FP4DequantBF16(s *Stream, dst *Buffer, m *FP4) error {
	const op = "FP4DequantBF16"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if m == nil {
		return fmt.Errorf("kernels: %s: nil matrix", op)
	}
	if err := m.check(op, "m", m.N, m.K); err != nil {
		return err
	}
	if err := need(op, "dst", dst, int64(m.N)*int64(m.K), 2); err != nil {
		return err
	}
	return d.lib.check("mk_fp4_dequant_bf16", fp4Dequant(s.handle(), dst.ptr, m.Codes.ptr, m.Scales.ptr, int64(m.N), int64(m.K)))
}
