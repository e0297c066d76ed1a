package kernels

import (
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/tensor"
)

// The benchmarks time device work with CUDA events around b.N launches
// (after a warm-up) and report rates against the H200's ceilings: about
// 4.3 TB/s for a device copy (bytes read plus written) and 770-790 TFLOP/s
// for a large bf16 matrix product (KINDS.md). Inputs are random, never zero,
// and rotate over enough copies that the working set is several times the
// 60 MB L2. Run them on the GPU machine: scripts/device.sh.

// rotBytes is the smallest working set the GEMM benchmark rotates through.
const rotBytes = 512 << 20

var (
	noiseOnce sync.Once
	noise     []uint16 // random bf16, shared by the benchmarks' uploads
)

// randomBF16 returns n random bf16 values (a shared buffer: do not modify).
func randomBF16(n int) []uint16 {
	noiseOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		noise = make([]uint16, 14336*4096)
		for i := range noise {
			noise[i] = tensor.F32ToBF16(float32(2*r.Float64() - 1))
		}
	})
	for len(noise) < n {
		noise = append(noise, noise...)
	}
	return noise[:n]
}

// timeLaunches records events around b.N calls of launch(i) on stream s after
// warm warm-up calls, and returns the mean device milliseconds per call. It
// also reports "issue-us/op", the host time to issue one call: when that
// approaches the device time, the loop measures launch overhead, not the GPU.
func timeLaunches(b *testing.B, d *Device, s *Stream, warm int, launch func(i int) error) (float64, error) {
	for i := range warm {
		if err := launch(i); err != nil {
			return 0, err
		}
	}
	b.ResetTimer()
	ms, issue, err := timeCalls(d, s, 0, b.N, launch)
	b.StopTimer()
	if err == nil {
		b.ReportMetric(issue, "issue-us/op")
	}
	return ms, err
}

// timeCalls is timeLaunches without a testing.B: n calls after warm ones,
// the mean device milliseconds and host issue microseconds per call.
func timeCalls(d *Device, s *Stream, warm, n int, launch func(i int) error) (ms, issueUs float64, err error) {
	for i := range warm {
		if err := launch(i); err != nil {
			return 0, 0, err
		}
	}
	e0, err := d.NewEvent()
	if err != nil {
		return 0, 0, err
	}
	defer e0.Destroy()
	e1, err := d.NewEvent()
	if err != nil {
		return 0, 0, err
	}
	defer e1.Destroy()
	if err := s.Sync(d); err != nil {
		return 0, 0, err
	}
	if err := e0.Record(s); err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if err := launch(i); err != nil {
			return 0, 0, err
		}
	}
	issueUs = float64(time.Since(t0).Nanoseconds()) / 1e3 / float64(n)
	if err := e1.Record(s); err != nil {
		return 0, 0, err
	}
	if err := e1.Sync(); err != nil {
		return 0, 0, err
	}
	el, err := Elapsed(e0, e1)
	return float64(el) / float64(n), issueUs, err
}

// gemmShapesText lists the GEMM shapes (the models' projections); the
// PyTorch baseline reads the same file.
//
//go:embed gemm_shapes.txt
var gemmShapesText string

// gemmShapes are the shapes of gemm_shapes.txt.
var gemmShapes = func() (out []struct{ m, n, k int }) {
	for _, line := range strings.Split(gemmShapesText, "\n") {
		var m, n, k int
		if strings.HasPrefix(line, "#") {
			continue
		}
		if c, _ := fmt.Sscan(line, &m, &n, &k); c == 3 {
			out = append(out, struct{ m, n, k int }{m, n, k})
		}
	}
	return out
}()

func BenchmarkGemmBF16(b *testing.B) {
	g := testGPU(b)
	for _, sh := range gemmShapes {
		b.Run(fmt.Sprintf("M=%d_N=%d_K=%d", sh.m, sh.n, sh.k), func(b *testing.B) {
			m, n, k := sh.m, sh.n, sh.k
			aBytes, bBytes, cBytes := int64(2*m*k), int64(2*n*k), int64(2*m*n)
			sets := int((rotBytes + aBytes + bBytes - 1) / (aBytes + bBytes))
			sets = max(1, min(sets, 16))
			err := g.Do(func(d *Device) error {
				ar := &arena{d: d}
				type set struct{ a, b, c *Buffer }
				ss := make([]set, sets)
				for i := range ss {
					ss[i] = set{put(ar, randomBF16(m*k)), put(ar, randomBF16(n*k)), ar.alloc(cBytes)}
				}
				if ar.err != nil {
					return ar.free()
				}
				ms, err := timeLaunches(b, d, nil, 2*sets, func(i int) error {
					s := ss[i%sets]
					return d.Gemm(nil, s.c, BF16, s.a, s.b, m, n, k)
				})
				ar.check(err)
				if ar.err == nil {
					flop := 2 * float64(m) * float64(n) * float64(k)
					b.ReportMetric(flop/(ms*1e-3)/1e12, "TFLOP/s")
					b.ReportMetric(float64(aBytes+bBytes+cBytes)/(ms*1e-3)/1e9, "GB/s")
					b.ReportMetric(ms*1e3, "us/gemm")
				}
				return ar.free()
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkCopyD2D measures device-to-device copy bandwidth (bytes read
// plus written), the memory ceiling.
func BenchmarkCopyD2D(b *testing.B) {
	g := testGPU(b)
	const bytes = 1 << 30
	err := g.Do(func(d *Device) error {
		ar := &arena{d: d}
		src, dst := put(ar, randomBF16(bytes/2)), ar.alloc(bytes)
		if ar.err != nil {
			return ar.free()
		}
		ms, err := timeLaunches(b, d, nil, 3, func(int) error { return d.CopyAsync(nil, dst, src, bytes) })
		ar.check(err)
		if ar.err == nil {
			b.ReportMetric(2*bytes/(ms*1e-3)/1e9, "GB/s")
			b.ReportMetric(ms*1e3, "us/copy")
		}
		return ar.free()
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkOps measures the memory-bound ops' bandwidth (bytes each must
// read and write once) on prefill-sized inputs well past the L2.
func BenchmarkOps(b *testing.B) {
	g := testGPU(b)
	const t, hidden, inter, heads, headDim = 16384, 4096, 14336, 32, 128
	b.Run("RMSNorm_16384x4096", func(b *testing.B) {
		benchOp(b, g, int64(2*2*t*hidden), func(ar *arena) func() error {
			x, w, out := put(ar, randomBF16(t*hidden)), put(ar, randomBF16(hidden)), ar.alloc(2*t*hidden)
			return func() error { return ar.d.RMSNorm(nil, out, x, w, t, hidden, hidden, 1e-6) }
		})
	})
	b.Run("AddRMSNorm_16384x4096", func(b *testing.B) {
		benchOp(b, g, int64(4*2*t*hidden), func(ar *arena) func() error {
			r, x := put(ar, randomBF16(t*hidden)), put(ar, randomBF16(t*hidden))
			w, out := put(ar, randomBF16(hidden)), ar.alloc(2*t*hidden)
			return func() error { return ar.d.AddRMSNorm(nil, r, x, w, out, t, hidden, 1e-6) }
		})
	})
	b.Run("SwiGLU_4096x14336", func(b *testing.B) {
		const rows = 4096
		benchOp(b, g, int64(3*2*rows*inter), func(ar *arena) func() error {
			in, out := put(ar, randomBF16(2*rows*inter)), ar.alloc(2*rows*inter)
			return func() error { return ar.d.SwiGLU(nil, out, in, rows, inter) }
		})
	})
	b.Run("RoPE_16384x32x128", func(b *testing.B) {
		benchOp(b, g, int64(2*2*t*heads*headDim), func(ar *arena) func() error {
			pos := make([]int32, t)
			for i := range pos {
				pos[i] = int32(i)
			}
			inv := make([]float32, headDim/2)
			for i := range inv {
				inv[i] = 1 / float32(i+1)
			}
			x, p, f := put(ar, randomBF16(t*heads*headDim)), put(ar, pos), put(ar, inv)
			return func() error { return ar.d.RoPE(nil, x, p, t, heads, headDim, headDim, RoPENeoX, f, 1) }
		})
	})
}

// benchOp times the launch that setup returns; bytes is what one launch must move.
func benchOp(b *testing.B, g *GPU, bytes int64, setup func(ar *arena) func() error) {
	err := g.Do(func(d *Device) error {
		ar := &arena{d: d}
		launch := setup(ar)
		if ar.err != nil {
			return ar.free()
		}
		ms, err := timeLaunches(b, d, nil, 3, func(int) error { return launch() })
		ar.check(err)
		if ar.err == nil {
			b.ReportMetric(float64(bytes)/(ms*1e-3)/1e9, "GB/s")
			b.ReportMetric(ms*1e3, "us/op")
		}
		return ar.free()
	})
	if err != nil {
		b.Fatal(err)
	}
}
