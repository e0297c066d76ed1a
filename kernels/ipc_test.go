package kernels

import (
	"math"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Environment of TestIPCChild, set by TestIPCTwoProcesses.
const (
	ipcHandleEnv = "MKSERVE_TEST_IPC_HANDLE"
	ipcCountEnv  = "MKSERVE_TEST_IPC_N"
)

// TestIPCTwoProcesses: a second process (this test binary, running
// TestIPCChild) maps a buffer this process allocated through its IPC
// handle, reads the random values in it and writes their double back with
// a kernel; this process then sees the doubles. Both processes share the
// one GPU, as two ranks would before the multi-GPU run.
func TestIPCTwoProcesses(t *testing.T) {
	g := testGPU(t)
	rng := newRNG(t)
	const n = 1<<16 + 3
	x := make([]float32, n)
	for i := range x {
		x[i] = rng.Float32()*2 - 1
	}
	var b *Buffer
	var h IPCHandle
	if err := g.Do(func(d *Device) (err error) {
		if b, err = d.Malloc(4 * n); err != nil {
			return err
		}
		if err = Upload(d, b, x); err != nil {
			return err
		}
		h, err = d.IPCHandle(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer g.Do(func(d *Device) error { return b.Free() })
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIPCChild$", "-test.v")
	cmd.Env = append(os.Environ(), ipcHandleEnv+"="+h.String(), ipcCountEnv+"="+strconv.Itoa(n))
	out, err := cmd.CombinedOutput()
	t.Logf("child:\n%s", out)
	if err != nil {
		t.Fatalf("child process: %v", err)
	}
	got := make([]float32, n)
	if err := g.Do(func(d *Device) error { return Download(d, got, b) }); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != 2*x[i] {
			t.Fatalf("element %d: %v after the child, want %v", i, got[i], 2*x[i])
		}
	}
	// A handle of a View, and garbage handles, are refused.
	if err := g.Do(func(d *Device) error {
		v, _ := b.View(0, 16)
		if _, err := d.IPCHandle(v); err == nil {
			t.Error("IPCHandle of a view succeeded")
		}
		if _, err := d.OpenIPC(IPCHandle{}, 16); err == nil {
			t.Error("OpenIPC of a zero handle succeeded")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestIPCChild is the second process of TestIPCTwoProcesses (skipped when
// run on its own).
func TestIPCChild(t *testing.T) {
	hs := os.Getenv(ipcHandleEnv)
	if hs == "" {
		t.Skip("the child of TestIPCTwoProcesses; run by it")
	}
	h, err := ParseIPCHandle(hs)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(os.Getenv(ipcCountEnv))
	if err != nil {
		t.Fatal(err)
	}
	g := testGPU(t)
	if err := g.Do(func(d *Device) error {
		b, err := d.OpenIPC(h, int64(4*n))
		if err != nil {
			return err
		}
		defer b.Free()
		v := make([]float32, n)
		if err := Download(d, v, b); err != nil {
			return err
		}
		var sum float64
		for _, x := range v {
			if math.IsNaN(float64(x)) || x < -1 || x > 1 {
				t.Errorf("child read %v: not the parent's values in [-1, 1)", x)
				break
			}
			sum += math.Abs(float64(x))
		}
		t.Logf("child mapped %d floats, mean |x| %.3f", n, sum/float64(n))
		if err := d.AddF32(nil, b, b, b, n); err != nil {
			return err
		}
		return d.Sync()
	}); err != nil {
		t.Fatal(err)
	}
}

// TestIPCHandleText: String and ParseIPCHandle round-trip; bad text fails.
func TestIPCHandleText(t *testing.T) {
	var h IPCHandle
	for i := range h {
		h[i] = byte(i * 7)
	}
	got, err := ParseIPCHandle(h.String())
	if err != nil || got != h {
		t.Fatalf("round trip: %v %v", got, err)
	}
	for _, bad := range []string{"", "zz", h.String()[:10]} {
		if _, err := ParseIPCHandle(bad); err == nil {
			t.Errorf("ParseIPCHandle(%q) succeeded", bad)
		}
	}
}
