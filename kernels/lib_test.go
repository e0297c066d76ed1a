package kernels

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"unsafe"
)

// TestGoLayout pins the Go mirror of mk_device_info_t to the offsets written
// in mkernel.h (x86-64 / arm64 C layout), without the library.
func TestGoLayout(t *testing.T) {
	want := map[string]uintptr{
		"name": 0, "device": 256, "sm_count": 260, "cc_major": 264, "cc_minor": 268,
		"total_mem": 272, "free_mem": 280, "l2_bytes": 288, "smem_per_block_optin": 296,
		"driver_version": 304, "runtime_version": 308,
	}
	if len(deviceInfoFields) != len(want) {
		t.Fatalf("%d fields in the Go table, %d in the header", len(deviceInfoFields), len(want))
	}
	for _, f := range deviceInfoFields {
		if w, ok := want[f.name]; !ok || f.off != w {
			t.Errorf("field %s at %d, header says %d (known %v)", f.name, f.off, w, ok)
		}
	}
	if s := unsafe.Sizeof(deviceInfoC{}); s != 312 {
		t.Errorf("mk_device_info_t mirror is %d bytes, header says 312", s)
	}
}

// TestABILayout checks the Go struct layouts against the library's own
// sizeof/offsetof (loading the library only; no GPU needed).
func TestABILayout(t *testing.T) {
	l := testLib(t)
	if v := l.abiVersion(); v != abiVersion {
		t.Fatalf("library ABI %d, package %d", v, abiVersion)
	}
	if got := l.abiLayout(structDeviceInfo, fieldSize); got != int64(unsafe.Sizeof(deviceInfoC{})) {
		t.Errorf("sizeof(mk_device_info_t) = %d in C, %d in Go", got, unsafe.Sizeof(deviceInfoC{}))
	}
	for _, f := range deviceInfoFields {
		if got := l.abiLayout(structDeviceInfo, f.id); got != int64(f.off) {
			t.Errorf("mk_device_info_t.%s at %d in C, %d in Go", f.name, got, f.off)
		}
	}
	if got := l.abiLayout(99, 0); got != -1 {
		t.Errorf("unknown struct id gave %d, want -1", got)
	}
}

func TestLibraryPathMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nowhere", LibraryName)
	t.Setenv(LibraryEnv, p)
	_, err := LibraryPath()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), LibraryEnv) {
		t.Fatalf("LibraryPath with a missing %s: %v, want ErrUnavailable naming the path", LibraryEnv, err)
	}
}

func TestLoadLibraryNotELF(t *testing.T) {
	p := filepath.Join(t.TempDir(), LibraryName)
	if err := os.WriteFile(p, []byte("not a shared object\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := loadLibrary(p)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), p) {
		t.Fatalf("loadLibrary of a text file: %v, want ErrUnavailable naming %s", err, p)
	}
}

func TestDeviceOutsideDo(t *testing.T) {
	d := &Device{}
	if _, err := d.Malloc(16); err == nil || !strings.Contains(err.Error(), "outside GPU.Do") {
		t.Fatalf("Malloc on an inactive Device: %v", err)
	}
	if err := d.Gemm(nil, nil, BF16, nil, nil, 1, 1, 1); err == nil {
		t.Fatal("Gemm on an inactive Device succeeded")
	}
}

func TestDeviceInfo(t *testing.T) {
	g := testGPU(t)
	in := g.Info()
	t.Logf("%+v", in)
	if in.Name == "" || in.SMs <= 0 || in.TotalMem == 0 || in.CCMajor <= 0 || in.Runtime <= 0 || in.Driver <= 0 {
		t.Fatalf("implausible device info %+v", in)
	}
}

// TestErrors checks the error paths: Go-side validation naming the tensor,
// the library's own argument checks and CUDA failures through mk_last_error,
// and the one-thread rule.
func TestErrors(t *testing.T) {
	g := testGPU(t)
	err := g.Do(func(d *Device) error {
		small, err := d.Malloc(16)
		if err != nil {
			return err
		}
		defer small.Free()
		if err := d.Gemm(nil, small, BF16, small, small, 4, 4, 4); err == nil || !strings.Contains(err.Error(), "A holds 16 bytes") {
			t.Errorf("Gemm on a short A: %v", err)
		}
		if err := d.RMSNorm(nil, small, small, small, 1, 6, 4, 1e-6); err == nil || !strings.Contains(err.Error(), "multiple of group") {
			t.Errorf("RMSNorm with cols %% group != 0: %v", err)
		}
		// Bypass the Go checks: the library validates too, and says why.
		rc := d.lib.rmsnorm(0, small.Ptr(), small.Ptr(), small.Ptr(), 1, 4, 4, math.Float32bits(float32(math.NaN())))
		var e *Error
		if err := d.lib.check("mk_rmsnorm_bf16", rc); !errors.As(err, &e) || e.Code != codeArg || !strings.Contains(e.Msg, "eps") {
			t.Errorf("library rmsnorm with NaN eps: %v", err)
		}
		rc = d.lib.rope(0, small.Ptr(), small.Ptr(), 1, 1, 4, 3, 0, small.Ptr(), math.Float32bits(1))
		if err := d.lib.check("mk_rope_bf16", rc); !errors.As(err, &e) || e.Code != codeArg || !strings.Contains(e.Msg, "rot_dim") {
			t.Errorf("library rope with odd rot_dim: %v", err)
		}
		if _, err := d.Malloc(1 << 52); !errors.As(err, &e) || e.Code != codeCUDA || !strings.Contains(e.Msg, "cudaMalloc") {
			t.Errorf("Malloc(4 PiB): %v, want a CUDA error naming cudaMalloc", err)
		}
		// The device still works after a failed allocation.
		if err := Upload(d, small, []float32{1, 2, 3, 4}); err != nil {
			t.Errorf("Upload after a failed Malloc: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A call from any thread but the owner's is refused with a clear text.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	l := testLib(t)
	var p uint64
	rc := l.malloc(16, &p)
	if err := l.check("mk_malloc", rc); err == nil || !strings.Contains(err.Error(), "other than the one") {
		t.Errorf("mk_malloc from another thread: %v", err)
	}
	if err := g.Do(func(*Device) error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("panic inside Do: %v", err)
	}
	// The GPU goroutine survives a panic.
	if err := g.Do(func(d *Device) error { return d.Sync() }); err != nil {
		t.Errorf("Do after a panic: %v", err)
	}
}

// TestStreamsEventsPinned round-trips random bytes through pinned memory and
// two device buffers with asynchronous copies on a stream, timed by events.
func TestStreamsEventsPinned(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	const n = 3<<20 + 5
	err := g.Do(func(d *Device) error {
		a := &arena{d: d}
		src, err := d.AllocPinned(n)
		if err != nil {
			return err
		}
		defer src.Free()
		dst, err := d.AllocPinned(n)
		if err != nil {
			return err
		}
		defer dst.Free()
		in := src.Bytes()
		for i := range in {
			in[i] = byte(r.Uint32())
		}
		clear(dst.Bytes())
		s, err := d.NewStream()
		if err != nil {
			return err
		}
		defer s.Destroy()
		e0, err := d.NewEvent()
		if err != nil {
			return err
		}
		defer e0.Destroy()
		e1, err := d.NewEvent()
		if err != nil {
			return err
		}
		defer e1.Destroy()
		b1, b2 := a.alloc(n), a.alloc(n)
		if a.err != nil {
			return a.free()
		}
		a.check(e0.Record(s))
		a.check(d.UploadAsync(s, b1, src, n))
		a.check(d.CopyAsync(s, b2, b1, n))
		a.check(d.DownloadAsync(s, dst, b2, n))
		a.check(e1.Record(s))
		a.check(s.Sync(d))
		a.check(e1.Sync())
		if a.err == nil {
			ms, err := Elapsed(e0, e1)
			a.check(err)
			if err == nil && !(ms >= 0) {
				t.Errorf("elapsed %v ms", ms)
			}
			t.Logf("3 MiB up, copy, down: %.3f ms", ms)
		}
		if a.err == nil && !bytes.Equal(in, dst.Bytes()) {
			t.Error("bytes differ after the round trip")
		}
		if err := d.UploadAsync(s, b1, src, n+1); err == nil {
			t.Error("UploadAsync past the pinned buffer's end succeeded")
		}
		return a.free()
	})
	if err != nil {
		t.Fatal(err)
	}
}
