package linalg

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// fp4 are the E2M1 magnitudes (MXFP4's elements).
var fp4 = []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6}

// randMXFP4 is [N, K] values as an MXFP4 checkpoint holds them: E2M1
// values with random signs, each group of 32 times 2^e for a random e.
func randMXFP4(r *rand.Rand, N, K int) []float32 {
	v := make([]float32, N*K)
	for g := 0; g < N*K; g += Q8Group {
		s := float32(math.Ldexp(1, r.IntN(24)-16))
		for i := g; i < g+Q8Group; i++ {
			v[i] = fp4[r.IntN(len(fp4))] * s
			if r.IntN(2) == 0 {
				v[i] = -v[i]
			}
		}
	}
	return v
}

// TestQuantizeQ8: MXFP4's values and small integers times a power of two
// are held exactly (dequantized bit for bit); random values are not, and
// each is within absmax/254 of its group (plus float32 rounding).
func TestQuantizeQ8(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	const N, K = 5, 96
	check := func(name string, v []float32, wantExact bool) {
		t.Helper()
		q := make([]byte, N*Q8RowBytes(K))
		exact := QuantizeQ8(q, v, N, K)
		if exact != wantExact {
			t.Errorf("%s: exact %v, want %v", name, exact, wantExact)
		}
		got := make([]float32, N*K)
		DequantQ8(got, q, N, K)
		for g := 0; g < N*K; g += Q8Group {
			amax := float32(0)
			for _, x := range v[g : g+Q8Group] {
				amax = max(amax, float32(math.Abs(float64(x))))
			}
			for i := g; i < g+Q8Group; i++ {
				if wantExact && math.Float32bits(got[i]) != math.Float32bits(v[i]) && !(got[i] == 0 && v[i] == 0) {
					t.Fatalf("%s: value %d: %g back as %g", name, i, v[i], got[i])
				}
				if d := math.Abs(float64(got[i] - v[i])); d > float64(amax)/254*(1+1e-5) {
					t.Fatalf("%s: value %d: %g back as %g (group absmax %g)", name, i, v[i], got[i], amax)
				}
			}
		}
	}
	check("mxfp4", randMXFP4(r, N, K), true)
	ints := make([]float32, N*K)
	for i := range ints {
		ints[i] = float32(r.IntN(255)-127) * 0x1p-20
	}
	check("int8 × 2^-20", ints, true)
	for i := range ints {
		ints[i] = float32(r.IntN(255)-127) * 0x1p-140 // subnormal: the scale's inverse is past float32's range
	}
	check("int8 × 2^-140", ints, true)
	check("zeros", make([]float32, N*K), true)
	check("random", randSlice(r, N*K), false)
	// One value too many bits (255 = 11111111₂): the group falls back to absmax.
	wide := randMXFP4(r, N, K)
	wide[40] = 255 * 0x1p-4
	check("one wide value", wide, false)

	// QuantizeQ8BF16 and Q8ExactBF16 agree with QuantizeQ8 on bf16 values.
	v := randMXFP4(r, N, K)
	bf := make([]uint16, len(v))
	for i, x := range v {
		bf[i] = uint16(math.Float32bits(x) >> 16) // exact: E2M1 × 2^e has 2 significant bits
	}
	q1, q2 := make([]byte, N*Q8RowBytes(K)), make([]byte, N*Q8RowBytes(K))
	if !QuantizeQ8(q1, v, N, K) || !QuantizeQ8BF16(q2, bf, N, K) || !Q8ExactBF16(bf, N, K) {
		t.Error("bf16 MXFP4 values: not exact")
	}
	if string(q1) != string(q2) {
		t.Error("QuantizeQ8BF16 differs from QuantizeQ8 on the same values")
	}
	rb, _ := randBF16(r, N*K)
	if Q8ExactBF16(rb, N, K) {
		t.Error("random bf16 values reported exact")
	}
}

// TestMatMulTQ8SameBits: MatMulTQ8 equals MatMulT on the dequantized b bit
// for bit, on both kernel paths, at GEMV, small-M (dot, K blocked and not)
// and packed shapes, one and several goroutines, without writing past
// dst.
func TestMatMulTQ8SameBits(t *testing.T) {
	shapes := []struct{ M, N, K int }{
		{1, 1, 32}, {1, 7, 64}, {1, 301, 1120}, {1, 2048, 512}, {1, 97, 4096},
		{2, 257, 1024}, {3, 50, 32}, {4, 130, 2880}, {5, 130, 1056}, {9, 768, 512}, {15, 61, 64},
		{16, 29, 96}, {37, 200, 1216}, {64, 20, 256}, {100, 3, 32}, {130, 515, 256},
		{256, 20, 128},
	}
	for _, p := range paths() {
		for _, procs := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/procs=%d", p.name, procs), func(t *testing.T) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
				withPath(t, p.asm, func() {
					r := rand.New(rand.NewPCG(22, uint64(procs)))
					for _, s := range shapes {
						a := randSlice(r, s.M*s.K)
						q := make([]byte, s.N*Q8RowBytes(s.K))
						QuantizeQ8(q, randSlice(r, s.N*s.K), s.N, s.K)
						bf := make([]float32, s.N*s.K)
						DequantQ8(bf, q, s.N, s.K)
						want := make([]float32, s.M*s.N)
						MatMulT(want, a, bf, s.M, s.N, s.K)
						got := randSlice(r, s.M*s.N+3) // overwritten, plus a guard tail
						guard := append([]float32(nil), got[s.M*s.N:]...)
						MatMulTQ8(got, a, q, s.M, s.N, s.K)
						for i, w := range want {
							if math.Float32bits(got[i]) != math.Float32bits(w) {
								t.Fatalf("M=%d N=%d K=%d: dst[%d,%d] = %g, MatMulT on the dequantized b %g", s.M, s.N, s.K, i/s.N, i%s.N, got[i], w)
							}
						}
						for i, g := range guard {
							if got[s.M*s.N+i] != g {
								t.Fatalf("M=%d N=%d K=%d: wrote past dst[M*N] at +%d", s.M, s.N, s.K, i)
							}
						}
					}
				})
			})
		}
	}
}

// TestMatMulTQ8Panics: K not a multiple of the group, or b too short.
func TestMatMulTQ8Panics(t *testing.T) {
	for _, c := range []struct {
		name    string
		N, K    int
		qBytes  int
		aValues int
	}{
		{"K not a multiple of 32", 2, 40, 2 * 45, 40},
		{"b short", 3, 32, 2 * 36, 32},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("no panic")
				}
			}()
			MatMulTQ8(make([]float32, c.N), make([]float32, c.aValues), make([]byte, c.qBytes), 1, c.N, c.K)
		})
	}
}

// TestWeightsQ8: a Weights value holding Q8 counts its values, cuts
// whole-matrix blocks and multiplies like MatMulTQ8.
func TestWeightsQ8(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	const E, N, K = 3, 6, 64
	q := make([]byte, E*N*Q8RowBytes(K))
	QuantizeQ8(q, randSlice(r, E*N*K), E*N, K)
	w := Weights{Q8: q}
	if w.Len() != E*N*K {
		t.Fatalf("Len %d, want %d", w.Len(), E*N*K)
	}
	a := randSlice(r, 2*K)
	for e := range E {
		got, want := make([]float32, 2*N), make([]float32, 2*N)
		w.Block(e, N*K).MulT(got, a, 2, N, K)
		MatMulTQ8(want, a, q[e*N*Q8RowBytes(K):], 2, N, K)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("expert %d: %v, want %v", e, got, want)
			}
		}
	}
}

// BenchmarkMatMulTQ8 times decode-sized products (M rows of a) against a
// weight matrix [N, K] held as bf16, as Q8 and as FP4: the gpt-oss expert
// and Mixtral down-projection shapes.
func BenchmarkMatMulTQ8(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range []struct{ N, K int }{{5760, 2880}, {4096, 14336}} {
		bf, f := randBF16(r, s.N*s.K)
		q := make([]byte, s.N*Q8RowBytes(s.K))
		QuantizeQ8(q, f, s.N, s.K)
		f4 := make([]byte, s.N*FP4RowBytes(s.K))
		QuantizeFP4BF16(f4, toBF16Bits(randMXFP4(r, s.N, s.K)), s.N, s.K)
		for _, M := range []int{1, 4, 16} {
			a := randSlice(r, M*s.K)
			dst := make([]float32, M*s.N)
			for _, c := range []struct {
				name  string
				bytes int
				f     func()
			}{
				{"bf16", 2 * s.N * s.K, func() { MatMulTBF16(dst, a, bf, M, s.N, s.K) }},
				{"q8", len(q), func() { MatMulTQ8(dst, a, q, M, s.N, s.K) }},
				{"fp4", len(f4), func() { MatMulTFP4(dst, a, f4, M, s.N, s.K) }},
			} {
				b.Run(fmt.Sprintf("N=%d/K=%d/M=%d/%s", s.N, s.K, M, c.name), func(b *testing.B) {
					for b.Loop() {
						c.f()
					}
					b.ReportMetric(float64(c.bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkQuantizeQ8BF16 times converting a bf16 matrix to Q8 (as the
// CPU backend does at load with cpu_weights q8): random values (absmax
// groups) and MXFP4 values (exact groups).
func BenchmarkQuantizeQ8BF16(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	const N, K = 1024, 2048
	rb, _ := randBF16(r, N*K)
	mx := randMXFP4(r, N, K)
	mb := make([]uint16, len(mx))
	for i, v := range mx {
		mb[i] = uint16(math.Float32bits(v) >> 16)
	}
	q := make([]byte, N*Q8RowBytes(K))
	for _, c := range []struct {
		name string
		src  []uint16
	}{{"random", rb}, {"mxfp4", mb}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				QuantizeQ8BF16(q, c.src, N, K)
			}
			b.ReportMetric(float64(N*K)*float64(b.N)/b.Elapsed().Seconds()/1e6, "Mvalues/s")
		})
	}
}

// BenchmarkMatMulTQ8Experts times decode-sized products against 48
// different expert-sized matrices in turn (Qwen3-30B-A3B's gate-up [1536,
// 2048] and down [2048, 768]), so that each streams from DRAM as a decode
// step's experts do, held as bf16, as Q8 and as FP4.
func BenchmarkMatMulTQ8Experts(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	const n = 48
	for _, s := range []struct{ N, K int }{{1536, 2048}, {2048, 768}} {
		var bfs [][]uint16
		var qs, fs [][]byte
		for range n {
			bf, f := randBF16(r, s.N*s.K)
			q := make([]byte, s.N*Q8RowBytes(s.K))
			QuantizeQ8(q, f, s.N, s.K)
			f4 := make([]byte, s.N*FP4RowBytes(s.K))
			QuantizeFP4BF16(f4, toBF16Bits(randMXFP4(r, s.N, s.K)), s.N, s.K)
			bfs, qs, fs = append(bfs, bf), append(qs, q), append(fs, f4)
		}
		for _, M := range []int{1, 2} {
			a := randSlice(r, M*s.K)
			dst := make([]float32, M*s.N)
			for _, c := range []struct {
				name  string
				bytes int
				f     func(i int)
			}{
				{"bf16", 2 * s.N * s.K, func(i int) { MatMulTBF16(dst, a, bfs[i%n], M, s.N, s.K) }},
				{"q8", len(qs[0]), func(i int) { MatMulTQ8(dst, a, qs[i%n], M, s.N, s.K) }},
				{"fp4", len(fs[0]), func(i int) { MatMulTFP4(dst, a, fs[i%n], M, s.N, s.K) }},
			} {
				b.Run(fmt.Sprintf("N=%d/K=%d/M=%d/%s", s.N, s.K, M, c.name), func(b *testing.B) {
					i := 0
					for b.Loop() {
						c.f(i)
						i++
					}
					b.ReportMetric(float64(c.bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// FuzzQuantizeGroups: for any 32 values, Q8 reads each finite one back
// within 1/254 of the group's largest (exactly when it reports the group
// exact), and FP4 either refuses the group or reads every value back
// exactly; neither panics on infinities or NaNs.
func FuzzQuantizeGroups(f *testing.F) {
	f.Add(make([]byte, 128))
	seed := make([]byte, 128)
	for i := range seed {
		seed[i] = byte(i * 37)
	}
	f.Add(seed)
	f.Add([]byte{0, 0, 0x80, 0x7f, 0, 0, 0xc0, 0x7f, 0, 0, 0, 0x3f}) // +Inf, NaN, 0.5
	f.Fuzz(func(t *testing.T, raw []byte) {
		var v [Q8Group]float32
		var b [Q8Group]uint16
		for i := range v {
			var u uint32
			for k := range 4 {
				if j := 4*i + k; j < len(raw) {
					u |= uint32(raw[j]) << (8 * k)
				}
			}
			b[i] = uint16(u >> 16)
			v[i] = math.Float32frombits(uint32(b[i]) << 16) // bf16 values, so FP4 sees the same ones
		}
		q := make([]byte, Q8RowBytes(Q8Group))
		exact := QuantizeQ8(q, v[:], 1, Q8Group)
		got := make([]float32, Q8Group)
		DequantQ8(got, q, 1, Q8Group)
		amax, finite := float32(0), true
		for _, x := range v {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				finite = false
			}
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		for i, x := range v {
			if exact && got[i] != x && !(got[i] == 0 && x == 0) {
				t.Fatalf("exact group: %g back as %g", x, got[i])
			}
			// (plus the rounding of the scale itself where it is subnormal: 127·2^-149)
			if finite && math.Abs(float64(got[i]-x)) > float64(amax)/254*(1+1e-5)+0x1p-142 {
				t.Fatalf("%g back as %g (group largest %g)", x, got[i], amax)
			}
		}
		f4 := make([]byte, FP4RowBytes(Q8Group))
		if QuantizeFP4BF16(f4, b[:], 1, Q8Group) {
			DequantFP4(got, f4, 1, Q8Group)
			for i, x := range v {
				if got[i] != x && !(got[i] == 0 && x == 0) {
					t.Fatalf("FP4 took the group: %g back as %g", x, got[i])
				}
			}
		}
	})
}
