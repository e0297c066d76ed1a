package kernels

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/tensor"
)

// RequireEnv makes the tests fail, instead of skipping, when the library or
// GPU is missing (scripts/device.sh sets it on the GPU machine).
const requireEnv = "MKSERVE_REQUIRE_GPU"

var (
	gpuOnce sync.Once
	testG   *GPU
	testErr error
)

// testGPU opens device 0 once per test binary, or skips when this machine
// cannot run the CUDA backend.
// The tests that launch R rank-local kernels on R streams of this process
// need every kernel loaded before the first launch: with CUDA's lazy module
// loading, a launch of a kernel not loaded yet can wait for the running
// kernels, and those spin until the new one arrives (the fused MoE streams
// test timed out whenever it was the process's first GPU work; with eager
// loading it passed in 3 of 3 fresh processes on the H200). The server keeps
// lazy loading (eager costs 1.5 s at start: serve ready in 2.67 s against
// 1.25 s), since it never runs two ranks in one process.
func init() {
	if os.Getenv("CUDA_MODULE_LOADING") == "" {
		os.Setenv("CUDA_MODULE_LOADING", "EAGER")
	}
}

// testDeviceEnv names the device ordinal testGPU opens (default 0): a
// child process of a multi-process test sets it, since one process owns one GPU.
const testDeviceEnv = "MKSERVE_TEST_DEVICE"

func testGPU(tb testing.TB) *GPU {
	tb.Helper()
	gpuOnce.Do(func() {
		ord := 0
		if v := os.Getenv(testDeviceEnv); v != "" {
			if ord, testErr = strconv.Atoi(v); testErr != nil {
				testErr = fmt.Errorf("%s=%q: %w", testDeviceEnv, v, testErr)
				return
			}
		}
		testG, testErr = Open(ord)
	})
	if testErr != nil {
		if errors.Is(testErr, ErrUnavailable) && os.Getenv(requireEnv) != "1" {
			tb.Skipf("skipping: no CUDA backend on this machine (%s=1 fails instead): %v", requireEnv, testErr)
		}
		tb.Fatalf("opening the GPU: %v", testErr)
	}
	return testG
}

// testLib loads the library without touching the GPU, or skips.
func testLib(tb testing.TB) *lib {
	tb.Helper()
	l, err := library()
	if err != nil {
		if errors.Is(err, ErrUnavailable) && os.Getenv(requireEnv) != "1" {
			tb.Skipf("skipping: %v", err)
		}
		tb.Fatalf("loading the library: %v", err)
	}
	return l
}

// newRNG draws a fresh seed per test and logs it.
func newRNG(tb testing.TB) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	tb.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// randBF16 draws n normal values times scale, rounded to bf16: the bits and
// their exact float32 values.
func randBF16(r *rand.Rand, n int, scale float64) ([]uint16, []float32) {
	bits := make([]uint16, n)
	vals := make([]float32, n)
	for i := range bits {
		bits[i] = tensor.F32ToBF16(float32(r.NormFloat64() * scale))
		vals[i] = tensor.BF16ToF32(bits[i])
	}
	return bits, vals
}

// bf16Fill is n copies of bit pattern v (poison before an op runs).
func bf16Fill(n int, v uint16) []uint16 {
	s := make([]uint16, n)
	for i := range s {
		s[i] = v
	}
	return s
}

const bf16NaN = 0x7fc0

func bf16ToF32s(b []uint16) []float32 {
	f := make([]float32, len(b))
	for i, v := range b {
		f[i] = tensor.BF16ToF32(v)
	}
	return f
}

// checkClose fails unless got matches want to relative L2 error tol; a NaN
// in got where want has none (an unwritten, poisoned element) always fails.
func checkClose(tb testing.TB, name string, got []float32, want []float64, tol float64) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Errorf("%s: %d values, want %d", name, len(got), len(want))
		return
	}
	var num, den float64
	for i := range got {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			if !math.IsNaN(want[i]) {
				tb.Errorf("%s: element %d is %v, want %v (unwritten or overflowed)", name, i, g, want[i])
				return
			}
			continue
		}
		num += (g - want[i]) * (g - want[i])
		den += want[i] * want[i]
	}
	rel := math.Sqrt(num / math.Max(den, 1e-300))
	if !(rel <= tol) {
		tb.Errorf("%s: relative L2 error %.3g > %.3g", name, rel, tol)
		return
	}
	tb.Logf("%s: relative L2 error %.3g", name, rel)
}

// arena allocates test buffers inside one GPU.Do, keeps the first error and
// frees everything at the end; calls after an error are no-ops.
type arena struct {
	d    *Device
	bufs []*Buffer
	err  error
}

func (a *arena) alloc(bytes int64) *Buffer {
	if a.err != nil {
		return nil
	}
	b, err := a.d.Malloc(bytes)
	if err != nil {
		a.err = err
		return nil
	}
	a.bufs = append(a.bufs, b)
	return b
}

// put allocates a buffer holding src.
func put[T Elem](a *arena, src []T) *Buffer {
	b := a.alloc(max(byteLen(src), 1))
	if b != nil {
		a.check(Upload(a.d, b, src))
	}
	return b
}

// get downloads n elements of b.
func get[T Elem](a *arena, b *Buffer, n int) []T {
	out := make([]T, n)
	if a.err == nil {
		a.check(Download(a.d, out, b))
	}
	return out
}

func (a *arena) check(err error) {
	if a.err == nil && err != nil {
		a.err = err
	}
}

func (a *arena) free() error {
	for _, b := range a.bufs {
		a.check(b.Free())
	}
	return a.err
}

// onGPU runs f with an arena inside GPU.Do and fails the test on any error.
func onGPU(tb testing.TB, g *GPU, f func(a *arena)) {
	tb.Helper()
	err := g.Do(func(d *Device) error {
		a := &arena{d: d}
		f(a)
		if a.err == nil {
			a.check(d.Sync())
		}
		return a.free()
	})
	if err != nil {
		tb.Fatal(err)
	}
}
