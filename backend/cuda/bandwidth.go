package cuda

import (
	"fmt"
	"slices"

	"github.com/mkserve/mkserve/kernels"
)

// CopyBandwidth measures device memory bandwidth as a device-to-device copy
// of bytes: (bytes read + bytes written) ÷ time, the median of 10 copies
// timed with CUDA events after one warm-up, in GB/s. It is the ceiling the
// memory-bound benchmarks compare against.
func (be *Backend) CopyBandwidth(bytes int64) (float64, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("cuda: CopyBandwidth: bytes = %d", bytes)
	}
	var gbps float64
	err := be.g.Do(func(d *kernels.Device) error {
		src, err := d.Malloc(bytes)
		if err != nil {
			return err
		}
		defer src.Free()
		dst, err := d.Malloc(bytes)
		if err != nil {
			return err
		}
		defer dst.Free()
		start, err := d.NewEvent()
		if err != nil {
			return err
		}
		defer start.Destroy()
		end, err := d.NewEvent()
		if err != nil {
			return err
		}
		defer end.Destroy()
		var ms []float64
		for i := 0; i <= 10; i++ {
			if err := start.Record(nil); err != nil {
				return err
			}
			if err := d.CopyAsync(nil, dst, src, bytes); err != nil {
				return err
			}
			if err := end.Record(nil); err != nil {
				return err
			}
			if err := end.Sync(); err != nil {
				return err
			}
			t, err := kernels.Elapsed(start, end)
			if err != nil {
				return err
			}
			if i > 0 {
				ms = append(ms, float64(t))
			}
		}
		slices.Sort(ms)
		gbps = 2 * float64(bytes) / (ms[len(ms)/2] * 1e-3) / 1e9
		return nil
	})
	return gbps, err
}
