package kernels

import (
	"fmt"
	"math"
	"testing"
)

// BenchmarkMoEExperts times route + experts (align, grouped GEMMs, combine)
// for Qwen3-30B-A3B's shape (H 2048, I 768, 128 experts, top-8) with CUDA
// events; reports ms per layer, TFLOP/s and GB/s of touched expert weights
// (every expert counted as touched once T·K ≥ E, a lower bound below).
func BenchmarkMoEExperts(b *testing.B) {
	g := testGPU(b)
	const H, I, E, K = 2048, 768, 128, 8
	for _, T := range []int{1, 64, 1024} {
		b.Run(fmt.Sprintf("qwen3_T=%d", T), func(b *testing.B) {
			r := newRNG(b)
			err := g.Do(func(d *Device) error {
				a := &arena{d: d}
				defer a.free()
				ex := &MoEExperts{E: E, H: H, I: I}
				ex.GateUp, ex.Down = a.alloc(int64(E*2*I*H)*2), a.alloc(int64(E*H*I)*2)
				x, lg := a.alloc(int64(T*H)*2), put(a, randF32(r, T*E, 1))
				ids, w, out := a.alloc(int64(T*K)*4), a.alloc(int64(T*K)*4), a.alloc(int64(T*H)*4)
				if a.err != nil {
					return a.err
				}
				a.check(d.FillRandomBF16(nil, ex.GateUp, int64(E*2*I*H), 1, float32(1/math.Sqrt(H))))
				a.check(d.FillRandomBF16(nil, ex.Down, int64(E*H*I), 2, float32(1/math.Sqrt(I))))
				a.check(d.FillRandomBF16(nil, x, int64(T*H), 3, 1))
				n, _, err := d.MoEWorkspace(T, K, ex)
				a.check(err)
				ws := a.alloc(max(n, 1))
				st, _ := d.NewEvent()
				en, _ := d.NewEvent()
				defer st.Destroy()
				defer en.Destroy()
				if a.err != nil {
					return a.err
				}
				rt := MoERouter{Experts: E, TopK: K, NormTopK: true}
				layer := func() {
					a.check(d.MoERoute(nil, ids, w, lg, nil, T, rt))
					a.check(d.MoEExpertsRun(nil, out, x, ids, w, T, K, ex, nil, ws))
				}
				layer()
				b.ResetTimer()
				a.check(st.Record(nil))
				for range b.N {
					layer()
				}
				a.check(en.Record(nil))
				a.check(en.Sync())
				ms, err := Elapsed(st, en)
				a.check(err)
				b.StopTimer()
				per := float64(ms) / float64(b.N)
				touched := math.Min(float64(E), float64(T*K))
				b.ReportMetric(per, "ms/layer")
				b.ReportMetric(2*3*float64(T*K*H*I)/per/1e9, "TFLOP/s")
				b.ReportMetric(touched*3*H*I*2/per/1e6, "GB/s")
				return a.err
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
