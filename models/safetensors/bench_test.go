package safetensors

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/mkserve/mkserve/tensor"
)

// benchFile writes a file shaped like one shard of a large MoE checkpoint:
// n small BF16 tensors with long, expert-style names.
func benchFile(b *testing.B, n int) (string, []string) {
	b.Helper()
	rng := newRNG(b)
	ts := make([]*tensor.Host, n)
	names := make([]string, n)
	for i := range ts {
		names[i] = fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s.weight", i/384, (i/3)%128, []string{"gate_proj", "up_proj", "down_proj"}[i%3])
		ts[i] = randTensor(rng, names[i], tensor.BF16, []int{4, 8})
	}
	path := filepath.Join(b.TempDir(), "model.safetensors")
	if err := Write(path, ts, map[string]string{"format": "pt"}); err != nil {
		b.Fatal(err)
	}
	return path, names
}

// BenchmarkOpen measures opening (mapping and validating the header of) a
// file with many tensors.
func BenchmarkOpen(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			path, _ := benchFile(b, n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, err := Open(path)
				if err != nil {
					b.Fatal(err)
				}
				f.Close()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/tensor")
		})
	}
}

// BenchmarkTensor measures looking up one tensor view.
func BenchmarkTensor(b *testing.B) {
	path, names := benchFile(b, 5000)
	f, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok := f.Tensor(names[i%len(names)]); !ok {
			b.Fatal("missing")
		}
	}
}
