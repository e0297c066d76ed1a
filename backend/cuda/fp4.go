package cuda

import (
	"fmt"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/tensor"
)

// FP4 expert weights: an MXFP4 checkpoint's experts (gpt-oss) are held as
// FP4 — handed over as the checkpoint's blocks (WeightMXFP4,
// kernels.RepackMXFP4) or packed from bf16 on upload (kernels.PackFP4):
// exact, 4.25 bits a value instead of 16 — so that gpt-oss-120b's ~115
// billion expert parameters take ~61 GB of an H200 rather than ~229. The
// fast profile's MoE layers run them through kernels.MoEExpertsRun's FP4
// paths (kernels.FP4Path); the exact profile's host path dequantizes one
// expert at a time (moeHost). Anything else that needs such a weight's
// values (ToHost, a layer with one projection in FP4) gets a bf16 copy
// made once (fp4Values).

// Weight forms (Options.Weights).
const (
	WeightsAuto   = "auto"
	WeightsStored = "stored"
	WeightsFP4    = "fp4"
)

// parseWeights checks Options.Weights ("" is WeightsAuto).
func parseWeights(s string) (string, error) {
	switch s {
	case "", WeightsAuto:
		return WeightsAuto, nil
	case WeightsStored, WeightsFP4:
		return s, nil
	}
	return "", fmt.Errorf("cuda: weights %q is not known (auto, stored or fp4)", s)
}

// expertMatrix reports whether a checkpoint tensor name is a layer's
// stacked expert gate/up or down projection (not a bias).
func expertMatrix(name string) bool {
	return strings.Contains(name, "experts.") &&
		(strings.HasSuffix(name, "gate_up_proj") || strings.HasSuffix(name, "down_proj"))
}

// fp4AutoShare is the share of the GPU's memory above which WeightsAuto
// holds an MXFP4 checkpoint's experts as FP4: gpt-oss-120b's 229 GB of bf16
// experts, not gpt-oss-20b's 38 GB (whose bf16 experts run faster from
// eight tokens a step: docs/PERF.md, "FP4 experts on the H200").
const fp4AutoShare = 0.6

// PlanExperts implements backend.ExpertPlanner: under WeightsAuto, an
// MXFP4 checkpoint whose experts (this backend's share of them) would take
// more than fp4AutoShare of the GPU's memory in bf16 has them held as FP4.
func (be *Backend) PlanExperts(p backend.ExpertPlan) {
	bytes := p.BF16Bytes
	if lo, hi := be.ExpertShard(max(p.E, 1)); p.E > 0 && hi-lo < p.E {
		bytes = bytes / int64(p.E) * int64(hi-lo)
	}
	be.fp4Auto.Store(p.Quant == "mxfp4" && float64(bytes) > fp4AutoShare*float64(be.g.Info().TotalMem))
}

// fp4Weight uploads h as FP4 when the backend holds experts so (Weights
// fp4, or auto with PlanExperts's verdict), h is a 2-D bf16 expert matrix
// and FP4 holds it exactly; (nil, nil) otherwise.
func (be *Backend) fp4Weight(h *tensor.Host, shape []int) (*store, error) {
	if !be.WantFP4() || h.DType != tensor.BF16 ||
		len(shape) != 2 || shape[1]%kernels.FP4BlockValues != 0 || !expertMatrix(h.Name) {
		return nil, nil
	}
	n, k := shape[0], shape[1]
	if n == 0 || len(h.Data) < 2*n*k {
		return nil, nil
	}
	data := h.Data
	if uintptr(unsafe.Pointer(&data[0]))%2 != 0 { // (a mapped file's odd offset)
		data = append([]byte(nil), data[:2*n*k]...)
	}
	bits := unsafe.Slice((*uint16)(unsafe.Pointer(&data[0])), n*k)
	codes, scales, ok := kernels.PackFP4(bits, n, k)
	if !ok {
		return nil, nil
	}
	return be.uploadFP4(h.Name, n, k, codes, scales)
}

// uploadFP4 makes the store of an FP4 weight [n, k] from its codes and
// scales.
func (be *Backend) uploadFP4(name string, n, k int, codes, scales []byte) (*store, error) {
	be.fp4Held.Add(1)
	st := &store{n: n * k, weight: true, fp4: &kernels.FP4{N: n, K: k}}
	err := be.g.Do(func(d *kernels.Device) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%v", r)
			}
		}()
		st.fp4.Codes = upload(be, d, codes)
		st.fp4.Scales = upload(be, d, scales)
		return nil
	})
	if err != nil {
		be.alloc.put(st.fp4.Codes)
		be.alloc.put(st.fp4.Scales)
		return nil, fmt.Errorf("cuda: weight %q: %w", name, err)
	}
	be.held[2].Add(int64(len(codes) + len(scales)))
	return st, nil
}

// WeightBytes reports the device memory of the weights made so far, by
// form (an FP4 group: 16 code bytes and an E8M0 byte).
func (be *Backend) WeightBytes() backend.WeightBytes {
	return backend.WeightBytes{F32: be.held[0].Load(), BF16: be.held[1].Load(), FP4: be.held[2].Load(), FP4Group: 17}
}

// moeFP4Calls counts MoE layers run on FP4 experts (tests).
var moeFP4Calls atomic.Int64

// FP4Weights is how many weights this backend holds as FP4.
func (be *Backend) FP4Weights() int { return int(be.fp4Held.Load()) }

// isFP4 reports whether t is a weight held as FP4 (and nothing else yet).
func isFP4(t *Tensor) bool { return t != nil && t.st.fp4 != nil && t.st.bf16 == nil }

// fp4Values gives an FP4 weight a bf16 copy of its values (exact), kept
// with it from then on, for the ops that read weights as bf16; on the GPU
// goroutine.
func (be *Backend) fp4Values(d *kernels.Device, t *Tensor) {
	if t.st.fp4 == nil || t.st.bf16 != nil {
		return
	}
	be.graphGuard("a bf16 copy of an FP4 weight")
	b := be.alloc.get(d, int64(t.st.n)*2)
	must("FP4 weight", d.FP4DequantBF16(nil, b, t.st.fp4))
	be.attach(t, &t.st.bf16, b)
}

// WantFP4 implements backend.FP4Loader: Weights fp4, or auto where
// PlanExperts found the bf16 experts too large.
func (be *Backend) WantFP4() bool {
	return be.weights == WeightsFP4 || (be.weights == WeightsAuto && be.fp4Auto.Load())
}

// WeightMXFP4 implements backend.FP4Loader: the MXFP4 matrix [n, k]
// repacked into the kernels' FP4 (kernels.RepackMXFP4: no bf16 on the
// way) and uploaded; where that form cannot take it (k not a multiple of
// 64, a scale outside 1 … 240) its bf16 values go through Weight.
func (be *Backend) WeightMXFP4(name string, blocks, scales []byte, n, k int) (backend.Tensor, error) {
	g := n * k / 32
	if n <= 0 || k <= 0 || k%32 != 0 || len(blocks) != g*16 || len(scales) != g {
		return nil, fmt.Errorf("cuda: weight %s: MXFP4 [%d, %d] with %d block and %d scale bytes", name, n, k, len(blocks), len(scales))
	}
	codes, sc, ok := kernels.RepackMXFP4(blocks, scales, n, k)
	if !ok {
		bits := kernels.DecodeMXFP4(blocks, scales, n, k)
		return be.Weight(&tensor.Host{Name: name, DType: tensor.BF16, Shape: []int{n, k},
			Data: unsafe.Slice((*byte)(unsafe.Pointer(&bits[0])), 2*len(bits))})
	}
	st, err := be.uploadFP4(name, n, k, codes, sc)
	if err != nil {
		return nil, err
	}
	return be.wrap([]int{n, k}, st), nil
}
