package cuda

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/tensor"
)

var (
	shared    *Backend
	sharedErr error
	sharedMu  sync.Mutex
)

// gpuBackend returns the test backend, skipping (or failing with
// MKSERVE_REQUIRE_GPU=1) when there is no GPU or libmkernel.so.
func gpuBackend(t testing.TB) *Backend {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil && sharedErr == nil {
		shared, sharedErr = New(Options{})
	}
	if sharedErr != nil {
		if errors.Is(sharedErr, kernels.ErrUnavailable) && os.Getenv("MKSERVE_REQUIRE_GPU") != "1" {
			t.Skipf("no GPU here: %v", sharedErr)
		}
		t.Fatal(sharedErr)
	}
	return shared
}

// gen makes host tensors from a seeded stream, so that two backends built
// with the same seed get the same data. BF16 tensors are bf16 by nature;
// with round, F32 tensors are rounded to bf16 too, so that the fast mode's
// bf16-rounded GEMM inputs equal the CPU's float32 ones.
type gen struct {
	r     *rand.Rand
	round bool
}

func newGen(seed uint64, round bool) *gen {
	return &gen{rand.New(rand.NewPCG(seed, 0x5eed)), round}
}

func bf16Round(v float32) float32 {
	b := math.Float32bits(v)
	b += 0x7fff + (b>>16)&1
	return math.Float32frombits(b &^ 0xffff)
}

func (g *gen) vals(n int, s float32, round bool) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = (g.r.Float32()*2 - 1) * s
		if round {
			v[i] = bf16Round(v[i])
		}
	}
	return v
}

// f32 is an F32 host tensor of random values in [-s, s) (bf16-exact with g.round).
func (g *gen) f32(s float32, shape ...int) *tensor.Host {
	return tensor.FromFloat32("t", shape, g.vals(tensor.NumElements(shape), s, g.round))
}

// bf16 is a BF16 host tensor of random values in [-s, s).
func (g *gen) bf16(s float32, shape ...int) *tensor.Host {
	v := g.vals(tensor.NumElements(shape), s, true)
	data := make([]byte, 2*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint16(data[2*i:], uint16(math.Float32bits(x)>>16))
	}
	return &tensor.Host{Name: "t", DType: tensor.BF16, Shape: shape, Data: data}
}

// W uploads h to be or fails.
func W(t testing.TB, be backend.Backend, h *tensor.Host) backend.Tensor {
	t.Helper()
	w, err := be.Weight(h)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// relL2 is ‖got − want‖ / ‖want‖; NaN anywhere gives +Inf.
func relL2(got, want []float32) float64 {
	if len(got) != len(want) {
		return math.Inf(1)
	}
	var num, den float64
	for i := range want {
		if math.IsNaN(float64(got[i])) || math.IsNaN(float64(want[i])) {
			return math.Inf(1)
		}
		d := float64(got[i]) - float64(want[i])
		num += d * d
		den += float64(want[i]) * float64(want[i])
	}
	if den == 0 {
		if num == 0 {
			return 0
		}
		return math.Inf(1)
	}
	return math.Sqrt(num / den)
}
