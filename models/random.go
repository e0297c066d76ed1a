package models

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/internal/par"
	"github.com/mkserve/mkserve/tensor"
)

// RandomSource is a TensorSource of random bf16 weights in the shapes a
// config implies, made on demand as the model binds them: benchmarks run
// real model shapes (Mixtral-8x7B, Qwen3-30B-A3B, ...) without a
// checkpoint. Matrices are uniform with standard deviation Std (default
// 0.02, the usual initializer), norm weights 1 ± 1%, other vectors (biases,
// sinks, score corrections) uniform with standard deviation Std. Values are
// a pure function of (Seed, tensor name, index), so two loads agree.
//
// Experts use the fused layout (experts.gate_up_proj [E, 2I, H]) and the
// LM head is present unless the config ties it to the embeddings. Where
// the config's quantization_config is MXFP4 (gpt-oss), the experts hold
// values an MXFP4 checkpoint holds: E2M1 values, each group of 32 along
// the input dimension scaled by one power of two (of RMS ≈ Std).
type RandomSource struct {
	Config *Config
	Seed   uint64
	Std    float32

	mu     sync.Mutex
	names  []string
	shapes map[string][]int
}

// mxfp4Expert reports whether tensor name of shape holds MXFP4 values: a
// fused expert matrix [E, in, out] of a checkpoint quantized with MXFP4.
func (r *RandomSource) mxfp4Expert(name string, shape []int) bool {
	if len(shape) != 3 || shape[1]%32 != 0 ||
		!(strings.HasSuffix(name, "experts.gate_up_proj") || strings.HasSuffix(name, "experts.down_proj")) {
		return false
	}
	q, err := parseQuant(r.Config.Raw)
	return err == nil && q.method == "mxfp4"
}

var _ shapedSource = (*RandomSource)(nil)

// Names lists the tensors made so far.
func (r *RandomSource) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.names)
}

// Shapes returns the shape of every tensor made so far, by name.
func (r *RandomSource) Shapes() map[string][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string][]int, len(r.shapes))
	for n, s := range r.shapes {
		out[n] = slices.Clone(s)
	}
	return out
}

// FileOf names the source in error messages.
func (r *RandomSource) FileOf(string) string { return "random weights" }

// Tensor fails: a random tensor needs the shape the config implies.
func (r *RandomSource) Tensor(name string) (*tensor.Host, error) {
	return nil, fmt.Errorf("random weights: tensor %q requested without a shape", name)
}

// Has answers for the layout RandomSource makes: fused experts (no
// per-expert names), an LM head unless tied.
func (r *RandomSource) Has(name string) bool {
	switch {
	case strings.Contains(name, ".experts.0."):
		return false
	case name == "lm_head.weight":
		return !r.Config.TieWordEmbeddings
	}
	return true
}

// TensorOfShape makes tensor name in the given shape.
func (r *RandomSource) TensorOfShape(name string, shape []int) (*tensor.Host, error) {
	n := 1
	for _, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("random weights: tensor %q: bad shape %v", name, shape)
		}
		n *= d
	}
	std := r.Std
	if std == 0 {
		std = 0.02
	}
	center, half := float32(0), std*float32(math.Sqrt(3)) // uniform [-a, a] has std a/√3
	if len(shape) == 1 && strings.Contains(name, "norm") {
		center, half = 1, 0.01
	}
	seed := r.Seed ^ hashName(name)
	data := make([]byte, 2*n)
	if r.mxfp4Expert(name, shape) {
		// Element (e, k, c) of [E, in, out]: an E2M1 value (code from its
		// hash) times the power of two of its group (e, k/32, c). E2M1's
		// codes have RMS 2.95, so the scales sit around std/2.95.
		out := shape[2]
		base := math.Round(math.Log2(float64(std) / 2.95))
		par.For(n, 1<<16, func() func(lo, hi int) {
			return func(lo, hi int) {
				for i := lo; i < hi; i++ {
					ek, c := i/out, i%out
					group := (ek/32)*out + c // (e·in + k)/32 = e·in/32 + k/32, in a multiple of 32
					scale := math.Ldexp(1, r.mxfp4Exponent(seed, int(base), group))
					code := mix64(seed + uint64(i))
					v := fp4Values[code&15] * float32(scale)
					binary.LittleEndian.PutUint16(data[2*i:], tensor.F32ToBF16(v))
				}
			}
		})
	} else {
		par.For(n, 1<<16, func() func(lo, hi int) {
			return func(lo, hi int) {
				for i := lo; i < hi; i++ {
					u := float32(mix64(seed+uint64(i))>>40) / (1 << 24) // [0, 1)
					binary.LittleEndian.PutUint16(data[2*i:], tensor.F32ToBF16(center+half*(2*u-1)))
				}
			}
		})
	}
	r.made(name, shape)
	return &tensor.Host{Name: name, DType: tensor.BF16, Shape: slices.Clone(shape), Data: data}, nil
}

// made records tensor name of shape as made.
func (r *RandomSource) made(name string, shape []int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.names = append(r.names, name)
	if r.shapes == nil {
		r.shapes = map[string][]int{}
	}
	r.shapes[name] = slices.Clone(shape)
}

// mxfp4Exponent is the power of two of group (e·in/32 + k/32)·out + c of
// an MXFP4 expert tensor name (TensorOfShape's scales).
func (r *RandomSource) mxfp4Exponent(seed uint64, base, group int) int {
	return base + int(mix64(seed^0x5ca1e^uint64(group))%3) - 1
}

// mxfp4Raw makes an MXFP4 expert tensor [E, in, out] (in = 32·G, out =
// rows) as an MXFP4 checkpoint stores it, blocks [E, out, G, 16] and
// scales [E, out, G], holding the values TensorOfShape gives it in bf16
// (mxfp4Source): a backend.FP4Loader then takes it without a bf16 copy.
func (r *RandomSource) mxfp4Raw(name string, E, rows, G int) (blocks, scales *tensor.Host, ok bool, err error) {
	shape := []int{E, 32 * G, rows}
	if E <= 0 || rows <= 0 || G <= 0 || !r.mxfp4Expert(name, shape) {
		return nil, nil, false, nil
	}
	std := r.Std
	if std == 0 {
		std = 0.02
	}
	seed := r.Seed ^ hashName(name)
	base := int(math.Round(math.Log2(float64(std) / 2.95)))
	in, out := 32*G, rows
	b, sc := make([]byte, E*out*G*16), make([]byte, E*out*G)
	par.For(E*out*G, 256, func() func(lo, hi int) {
		return func(lo, hi int) {
			for q := lo; q < hi; q++ { // q = (e·out + c)·G + g
				g, ec := q%G, q/G
				e, c := ec/out, ec%out
				sc[q] = byte(r.mxfp4Exponent(seed, base, (e*in/32+g)*out+c) + 127)
				for k := 0; k < 32; k += 2 {
					i := (e*in+32*g+k)*out + c // element (e, 32g+k, c) of [E, in, out]
					lo4, hi4 := fp4Nibble(mix64(seed+uint64(i))), fp4Nibble(mix64(seed+uint64(i+out)))
					b[q*16+k/2] = lo4 | hi4<<4
				}
			}
		}
	})
	r.made(name, shape)
	return &tensor.Host{Name: name + "_blocks", DType: tensor.U8, Shape: []int{E, out, G, 16}, Data: b},
		&tensor.Host{Name: name + "_scales", DType: tensor.U8, Shape: []int{E, out, G}, Data: sc}, true, nil
}

// fp4Nibble is the E2M1 code of fp4Values[h&15]: the same magnitude index
// and sign bit (fp4Values is ordered as E2M1's codes).
func fp4Nibble(h uint64) byte { return byte(h & 15) }

// hashName is FNV-1a of name, mixed.
func hashName(name string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h = (h ^ uint64(name[i])) * 1099511628211
	}
	return mix64(h)
}

// mix64 is the splitmix64 finalizer.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// LoadRandom builds the model of the config.json in dir (only the config is
// read) with random bf16 weights (RandomSource) on be.
func LoadRandom(dir string, be backend.Backend, seed uint64) (*Loaded, error) {
	cfg, err := LoadConfig(dir)
	if err != nil {
		return nil, err
	}
	if _, ok := families[cfg.Architecture]; !ok {
		return nil, fmt.Errorf("%s/config.json: architecture %q is not supported (supported: %v)", dir, cfg.Architecture, Architectures())
	}
	m, err := Build(cfg, NewWeights(&RandomSource{Config: cfg, Seed: seed}, be), be)
	if err != nil {
		return nil, err
	}
	return &Loaded{Model: m, Config: cfg, Dir: dir}, nil
}
