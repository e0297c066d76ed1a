package kernels

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// CPU tests of the NCCL binding: the library search, and the argument
// checks that run before any call into libmkernel.

func TestFindNCCL(t *testing.T) {
	root := t.TempDir()
	mk := func(rel string) string {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a2 := mk("a/libnccl.so.2")
	b2 := mk("b/libnccl.so.2")
	cPlain := mk("c/libnccl.so")
	empty := filepath.Join(root, "empty")
	if err := os.MkdirAll(filepath.Join(root, "dirnamed/libnccl.so.2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(empty, 0o755); err != nil {
		t.Fatal(err)
	}
	d := func(n string) string { return filepath.Join(root, n) }
	cases := []struct {
		name    string
		env     string
		dirs    []string
		want    string
		errWant string // a substring of the error; "" means success
	}{
		{name: "env_file", env: a2, dirs: []string{d("b")}, want: a2},
		{name: "env_missing", env: d("nowhere/libnccl.so.2"), dirs: []string{d("b")}, errWant: NCCLLibraryEnv},
		{name: "env_directory", env: d("a"), errWant: "is a directory"},
		{name: "first_dir_wins", dirs: []string{d("a"), d("b")}, want: a2},
		{name: "skips_empty_and_missing", dirs: []string{empty, d("missing"), d("b")}, want: b2},
		{name: "plain_so_name", dirs: []string{empty, d("c")}, want: cPlain},
		{name: "a_directory_is_not_the_library", dirs: []string{d("dirnamed"), d("c")}, want: cPlain},
		{name: "none", dirs: []string{empty, d("missing")}, errWant: empty},
		{name: "no_dirs", errWant: "no libnccl.so.2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := findNCCL(c.env, c.dirs)
			if c.errWant == "" {
				if err != nil || got != c.want {
					t.Fatalf("findNCCL = %q, %v; want %q", got, err, c.want)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrNCCLUnavailable) || !strings.Contains(err.Error(), c.errWant) {
				t.Fatalf("findNCCL = %q, %v; want an ErrNCCLUnavailable error containing %q", got, err, c.errWant)
			}
			if errors.Is(err, ErrUnavailable) {
				t.Errorf("a missing NCCL must not read as a missing CUDA backend: %v", err)
			}
		})
	}
}

// TestNCCLSearchDirs: the wheel directory under $VIRTUAL_ENV comes first,
// the system directories last, each once.
func TestNCCLSearchDirs(t *testing.T) {
	venv := t.TempDir()
	wheel := filepath.Join(venv, "lib", "python3.12", "site-packages", "nvidia", "nccl", "lib")
	if err := os.MkdirAll(wheel, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("VIRTUAL_ENV", venv)
	t.Setenv("CONDA_PREFIX", venv) // the same prefix twice: listed once
	dirs := NCCLSearchDirs()
	if len(dirs) == 0 || dirs[0] != wheel {
		t.Fatalf("NCCLSearchDirs = %v, want %s first", dirs, wheel)
	}
	for _, sys := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64"} {
		if !slices.Contains(dirs, sys) {
			t.Errorf("NCCLSearchDirs = %v lacks %s", dirs, sys)
		}
	}
	if i, j := slices.Index(dirs, "/usr/lib/x86_64-linux-gnu"), slices.Index(dirs, "/usr/local/cuda/lib64"); i > j {
		t.Errorf("NCCLSearchDirs = %v: /usr/lib/x86_64-linux-gnu after /usr/local/cuda/lib64", dirs)
	}
	seen := map[string]bool{}
	for _, d := range dirs {
		if seen[d] {
			t.Errorf("NCCLSearchDirs lists %s twice: %v", d, dirs)
		}
		seen[d] = true
	}
	// The search finds the wheel's library through these directories.
	lib := filepath.Join(wheel, "libnccl.so.2")
	if err := os.WriteFile(lib, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(NCCLLibraryEnv, "")
	if p, err := NCCLLibraryPath(); err != nil || p != lib {
		t.Errorf("NCCLLibraryPath = %q, %v; want %s", p, err, lib)
	}
}

func TestNCCLLibraryPathEnvMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "libnccl.so.2")
	t.Setenv(NCCLLibraryEnv, p)
	_, err := NCCLLibraryPath()
	if !errors.Is(err, ErrNCCLUnavailable) || !strings.Contains(err.Error(), p) {
		t.Fatalf("NCCLLibraryPath with a missing %s: %v, want ErrNCCLUnavailable naming %s", NCCLLibraryEnv, err, p)
	}
}

func TestNCCLErrorCodes(t *testing.T) {
	no := &Error{Func: "mk_nccl_open", Code: codeNoNCCL, Msg: "dlopen failed"}
	if !errors.Is(no, ErrNCCLUnavailable) || errors.Is(no, ErrUnavailable) {
		t.Errorf("%v: Is(ErrNCCLUnavailable) %v, Is(ErrUnavailable) %v; want true, false", no,
			errors.Is(no, ErrNCCLUnavailable), errors.Is(no, ErrUnavailable))
	}
	bad := &Error{Func: "mk_nccl_all_to_all_v", Code: codeNCCL, Msg: "unhandled cuda error"}
	if errors.Is(bad, ErrNCCLUnavailable) || !strings.Contains(bad.Error(), "NCCL error") {
		t.Errorf("%v: an NCCL failure is not 'unavailable' and names NCCL", bad)
	}
}

func TestNCCLNVLSOff(t *testing.T) {
	t.Setenv(ncclNVLSEnv, "1")
	if err := ncclNVLSOff(); err != nil || os.Getenv(ncclNVLSEnv) != "1" {
		t.Errorf("a user's %s=1 was overwritten (%v)", ncclNVLSEnv, err)
	}
	os.Unsetenv(ncclNVLSEnv) // t.Setenv restores it afterwards
	if err := ncclNVLSOff(); err != nil || os.Getenv(ncclNVLSEnv) != "0" {
		t.Errorf("unset %s: got %q (%v), want 0", ncclNVLSEnv, os.Getenv(ncclNVLSEnv), err)
	}
}

func TestNCCLRowPlan(t *testing.T) {
	counts, offs, total, err := ncclRowPlan("send", []int{3, 0, 5, 1}, 4, 12)
	if err != nil || total != 9 || !slices.Equal(counts, []int64{3, 0, 5, 1}) || !slices.Equal(offs, []int64{0, 3, 3, 8}) {
		t.Errorf("ncclRowPlan = %v %v %d %v", counts, offs, total, err)
	}
	for _, c := range []struct {
		name     string
		rows     []int
		size     int
		rowBytes int64
		want     string
	}{
		{"short", []int{1}, 2, 4, "1 send counts for 2 ranks"},
		{"negative", []int{1, -2}, 2, 4, "count -2 for rank 1"},
		{"zero_row_bytes", []int{1, 2}, 2, 0, "row of 0 bytes"},
		{"overflow", []int{math.MaxInt / 2, math.MaxInt / 2}, 2, 8, "overflow"},
	} {
		if _, _, _, err := ncclRowPlan("send", c.rows, c.size, c.rowBytes); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// TestNCCLCommArgs: the checks NCCLComm's methods make before calling into
// the library (a Device that is marked active but has no library: a call
// that got through would panic).
func TestNCCLCommArgs(t *testing.T) {
	d := &Device{active: true}
	other := &Device{active: true}
	live := &NCCLComm{g: &GPU{dev: d}, h: 1, rank: 1, size: 2}
	buf := func(n int64) *Buffer { return &Buffer{d: d, ptr: 0x1000, bytes: n} }
	cases := []struct {
		name string
		call func() error
		want string
	}{
		{"outside_do", func() error { return live.AllReduceSumF32(&Device{}, nil, buf(8), buf(8), 2) }, "outside GPU.Do"},
		{"nil_comm", func() error { return (*NCCLComm)(nil).AllGather(d, nil, buf(8), buf(16), 8) }, "closed or nil"},
		{"closed_comm", func() error { return (&NCCLComm{g: &GPU{dev: d}}).Check(d) }, "closed or nil"},
		{"other_device", func() error { return live.AllReduceSumF32(other, nil, buf(8), buf(8), 2) }, "another GPU"},
		{"reduce_negative", func() error { return live.AllReduceSumF32(d, nil, buf(8), buf(8), -1) }, "count -1"},
		{"reduce_small_send", func() error { return live.AllReduceSumF32(d, nil, buf(4), buf(8), 2) }, "send holds 4 bytes"},
		{"reduce_small_recv", func() error { return live.AllReduceSumF32(d, nil, buf(8), buf(4), 2) }, "recv holds 4 bytes"},
		{"reduce_nil_recv", func() error { return live.AllReduceSumF32(d, nil, buf(8), nil, 2) }, "nil or freed"},
		{"gather_small_recv", func() error { return live.AllGather(d, nil, buf(8), buf(12), 8) }, "recv holds 12 bytes"},
		{"gather_negative", func() error { return live.AllGather(d, nil, buf(8), buf(16), -8) }, "-8 bytes"},
		{"a2a_counts_len", func() error { return live.AllToAllV(d, nil, buf(64), []int{1}, buf(64), []int{1, 1}, 4) }, "1 send counts for 2 ranks"},
		{"a2a_recv_negative", func() error { return live.AllToAllV(d, nil, buf(64), []int{1, 1}, buf(64), []int{-1, 1}, 4) }, "recv count -1"},
		{"a2a_self_mismatch", func() error { return live.AllToAllV(d, nil, buf(64), []int{1, 2}, buf(64), []int{1, 3}, 4) }, "sends itself 2 rows and receives 3"},
		{"a2a_small_send", func() error { return live.AllToAllV(d, nil, buf(8), []int{2, 1}, buf(64), []int{0, 1}, 4) }, "send holds 8 bytes, 12 needed"},
		{"a2a_small_recv", func() error { return live.AllToAllV(d, nil, buf(64), []int{2, 1}, buf(8), []int{5, 1}, 4) }, "recv holds 8 bytes, 24 needed"},
		{"a2a_nil_send_with_rows", func() error { return live.AllToAllV(d, nil, nil, []int{1, 0}, buf(8), []int{0, 0}, 4) }, "nil or freed"},
		{"a2a_row_bytes", func() error { return live.AllToAllV(d, nil, buf(8), []int{1, 0}, buf(8), []int{0, 0}, 0) }, "row of 0 bytes"},
		{"join_bad_rank", func() error { _, err := d.JoinNCCL(&GPU{dev: d}, 2, 2, NCCLUniqueID{}); return err }, "rank 2 of 2"},
		{"join_other_gpu", func() error { _, err := d.JoinNCCL(&GPU{dev: other}, 0, 2, NCCLUniqueID{}); return err }, "must be the GPU"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if err := c.call(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
		})
	}
	// Nothing to move is not an error and makes no call.
	if err := live.AllReduceSumF32(d, nil, nil, nil, 0); err != nil {
		t.Errorf("an empty all-reduce: %v", err)
	}
	if err := live.AllGather(d, nil, nil, nil, 0); err != nil {
		t.Errorf("an empty all-gather: %v", err)
	}
	// Closing a closed communicator is a no-op (no GPU.Do).
	if err := (&NCCLComm{}).Close(); err != nil {
		t.Errorf("Close of a closed NCCLComm: %v", err)
	}
}
