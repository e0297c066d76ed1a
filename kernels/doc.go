// Package kernels is the Go side of the CUDA boundary: it loads
// libmkernel.so (kernels/*.cu, built by nvcc on the GPU machine) with purego,
// checks its ABI version and struct layouts, and exposes typed calls for
// device memory, streams, events and the ops (GEMM, RMSNorm, embedding,
// SwiGLU, RoPE, conversions).
//
// No cgo: the package builds with CGO_ENABLED=0 and CGO_ENABLED=1 alike.
//
// One goroutine owns the GPU. Open starts it, locked to its OS thread, and
// runs mk_init there; every later call into the library happens inside
// GPU.Do, on that goroutine, through the *Device it passes:
//
//	g, err := kernels.Open(0)
//	if err != nil { ... } // errors.Is(err, kernels.ErrUnavailable): no library, driver or GPU
//	defer g.Close()
//	err = g.Do(func(d *kernels.Device) error {
//		a, err := d.Malloc(m * k * 2)
//		...
//		return d.Gemm(nil, c, kernels.BF16, a, b, m, n, k)
//	})
//
// Tensors are row-major; bf16 tensors are bfloat16 bit patterns (uint16).
package kernels
