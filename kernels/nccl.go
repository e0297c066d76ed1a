package kernels

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/mkserve/mkserve/transport"
)

// NCCL, the fallback and baseline transport (nccl.cu, mk_nccl.h):
// libmkernel dlopen()s libnccl.so.2 at run time (it never links against
// it), so everything else works where NCCL is absent. Go has no cgo here
// and purego cannot pass ncclUniqueId (a 128-byte struct) by value: the C
// shim takes it by pointer.

// NCCLLibraryEnv names the environment variable holding libnccl.so.2's path.
const NCCLLibraryEnv = "MKSERVE_NCCL_LIB"

// NCCLUniqueIDBytes is the size of an ncclUniqueId.
const NCCLUniqueIDBytes = 128

// ErrNCCLUnavailable is wrapped by every error that means "this machine has
// no usable NCCL": no libnccl.so.2 found, or one that does not load.
var ErrNCCLUnavailable = errors.New("NCCL unavailable")

// Status codes of mk_nccl.h.
const (
	codeNCCL   = 6
	codeNoNCCL = 7
)

// ncclLibNames are the file names looked for in each search directory.
var ncclLibNames = []string{"libnccl.so.2", "libnccl.so"}

// NCCLLibraryPath returns where libnccl.so.2 is: $MKSERVE_NCCL_LIB when set
// (the file must exist), else the first of NCCLSearchDirs holding it (the
// pip wheel nvidia-nccl-cu* installs it under site-packages/nvidia/nccl/lib),
// else, when python3 is on PATH, a directory nvidia/nccl/lib under one of
// its sys.path entries. The error wraps ErrNCCLUnavailable and says where it
// looked.
func NCCLLibraryPath() (string, error) {
	p, err := findNCCL(os.Getenv(NCCLLibraryEnv), NCCLSearchDirs())
	if err == nil || os.Getenv(NCCLLibraryEnv) != "" {
		return p, err
	}
	if dirs := pythonNCCLDirs(); len(dirs) > 0 {
		if q, qerr := findNCCL("", dirs); qerr == nil {
			return q, nil
		}
		return "", fmt.Errorf("%w (nor in python3's %s)", err, strings.Join(dirs, ", "))
	}
	return "", err
}

// findNCCL is NCCLLibraryPath's search: env (a path, or "") first, then the
// library names in each of dirs in order.
func findNCCL(env string, dirs []string) (string, error) {
	if env != "" {
		st, err := os.Stat(env)
		if err != nil {
			return "", fmt.Errorf("kernels: %w: %s=%q: %v", ErrNCCLUnavailable, NCCLLibraryEnv, env, err)
		}
		if st.IsDir() {
			return "", fmt.Errorf("kernels: %w: %s=%q is a directory, want the library file", ErrNCCLUnavailable,
				NCCLLibraryEnv, env)
		}
		return env, nil
	}
	for _, d := range dirs {
		for _, n := range ncclLibNames {
			p := filepath.Join(d, n)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p, nil
			}
		}
	}
	return "", fmt.Errorf("kernels: %w: %s is unset and no %s in %s (pip install nvidia-nccl-cu13, or set %s)",
		ErrNCCLUnavailable, NCCLLibraryEnv, ncclLibNames[0], strings.Join(dirs, ", "), NCCLLibraryEnv)
}

// NCCLSearchDirs lists the directories NCCLLibraryPath searches after
// $MKSERVE_NCCL_LIB, in order: nvidia/nccl/lib under the python3
// site-packages and dist-packages directories of $VIRTUAL_ENV, $CONDA_PREFIX,
// ~/.local, /usr/local, /usr and /opt/conda (those that exist), then
// /usr/lib/x86_64-linux-gnu, /usr/lib/aarch64-linux-gnu, /usr/lib64 and
// /usr/local/cuda/lib64.
func NCCLSearchDirs() []string {
	var prefixes []string
	for _, e := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if v := os.Getenv(e); v != "" {
			prefixes = append(prefixes, v)
		}
	}
	if h, err := os.UserHomeDir(); err == nil {
		prefixes = append(prefixes, filepath.Join(h, ".local"))
	}
	prefixes = append(prefixes, "/usr/local", "/usr", "/opt/conda")
	var dirs []string
	seen := map[string]bool{}
	add := func(d string) {
		if !seen[d] {
			seen[d] = true
			dirs = append(dirs, d)
		}
	}
	for _, p := range prefixes {
		for _, pkgs := range []string{"site-packages", "dist-packages"} {
			m, _ := filepath.Glob(filepath.Join(p, "lib", "python3*", pkgs, "nvidia", "nccl", "lib"))
			for _, d := range m {
				add(d)
			}
		}
	}
	if m, _ := filepath.Glob("/usr/lib/python3/dist-packages/nvidia/nccl/lib"); len(m) > 0 {
		add(m[0])
	}
	for _, d := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
		"/usr/local/cuda/lib64"} {
		add(d)
	}
	return dirs
}

// pythonNCCLDirs asks python3 (when on PATH; 10 s at most) for its sys.path
// and returns the nvidia/nccl/lib directories under it that exist.
func pythonNCCLDirs() []string {
	py, err := exec.LookPath("python3")
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "-c", "import sys; print('\\n'.join(sys.path))").Output()
	if err != nil {
		return nil
	}
	var dirs []string
	for _, e := range strings.Split(string(out), "\n") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		d := filepath.Join(e, "nvidia", "nccl", "lib")
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

// ncclNVLSEnv is set to 0 (when unset) before any communicator is made.
const ncclNVLSEnv = "NCCL_NVLS_ENABLE"

// ncclNVLSOff sets NCCL_NVLS_ENABLE=0 unless the environment already has
// it. purego's runtime shim forwards os.Setenv to the C environment NCCL
// reads; mk_nccl_comm_init sets it there too, as a guard.
func ncclNVLSOff() error {
	if _, ok := os.LookupEnv(ncclNVLSEnv); ok {
		return nil
	}
	return os.Setenv(ncclNVLSEnv, "0")
}

var (
	ncclOpen         func(path string) int32
	ncclVersion      func(v *int32) int32
	ncclUniqueID     func(id unsafe.Pointer) int32
	ncclCommInit     func(rank, size int32, id unsafe.Pointer, comm *uint64) int32
	ncclCommCheck    func(comm uint64) int32
	ncclCommDestroy  func(comm uint64) int32
	ncclCommAbort    func(comm uint64) int32
	ncclAllReduceF32 func(comm, send, recv, count, stream uint64) int32
	ncclAllGather    func(comm, send, recv, bytes, stream uint64) int32
	ncclAllToAllV    func(comm, send uint64, sendCounts, sendOffsets *int64, recv uint64, recvCounts,
		recvOffsets *int64, elemBytes int64, stream uint64) int32
)

func init() {
	registerSymbols(
		symbol{"mk_nccl_open", &ncclOpen},
		symbol{"mk_nccl_version", &ncclVersion},
		symbol{"mk_nccl_unique_id", &ncclUniqueID},
		symbol{"mk_nccl_comm_init", &ncclCommInit},
		symbol{"mk_nccl_comm_check", &ncclCommCheck},
		symbol{"mk_nccl_comm_destroy", &ncclCommDestroy},
		symbol{"mk_nccl_comm_abort", &ncclCommAbort},
		symbol{"mk_nccl_all_reduce_f32_sum", &ncclAllReduceF32},
		symbol{"mk_nccl_all_gather", &ncclAllGather},
		symbol{"mk_nccl_all_to_all_v", &ncclAllToAllV},
	)
}

// NCCLUniqueID names one communicator: rank 0 makes it, every rank joins with it.
type NCCLUniqueID [NCCLUniqueIDBytes]byte

// OpenNCCL loads the NCCL library (NCCLLibraryPath) into libmkernel, once
// per process, and returns its version code (e.g. 22805 for 2.28.5). Call
// it inside GPU.Do. It first sets NCCL_NVLS_ENABLE=0 when unset (NVLink
// multicast stays off). Errors meaning NCCL is missing wrap
// ErrNCCLUnavailable.
func (d *Device) OpenNCCL() (version int, err error) {
	if err := d.ready("OpenNCCL"); err != nil {
		return 0, err
	}
	if err := ncclNVLSOff(); err != nil {
		return 0, fmt.Errorf("kernels: setting %s=0: %w", ncclNVLSEnv, err)
	}
	p, err := NCCLLibraryPath()
	if err != nil {
		return 0, err
	}
	if err := d.lib.check("mk_nccl_open", ncclOpen(p)); err != nil {
		return 0, err
	}
	var v int32
	if err := d.lib.check("mk_nccl_version", ncclVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// NCCLUniqueID makes a fresh communicator id (after OpenNCCL).
func (d *Device) NCCLUniqueID() (NCCLUniqueID, error) {
	var id NCCLUniqueID
	if err := d.ready("NCCLUniqueID"); err != nil {
		return id, err
	}
	err := d.lib.check("mk_nccl_unique_id", ncclUniqueID(unsafe.Pointer(&id[0])))
	return id, err
}

// NCCLComm is one rank's NCCL communicator on its GPU. The collectives
// enqueue on a stream inside GPU.Do, as the ops do; every rank must make
// the same collectives in the same order. NVLink multicast (NVLS) is off:
// NCCL_NVLS_ENABLE=0 is set in the process environment before the
// communicator is made, unless the environment already sets it (these
// machines never call cuMulticastCreate).
type NCCLComm struct {
	g          *GPU
	h          uint64
	rank, size int
	version    int
}

// JoinNCCL makes this rank's communicator from id inside GPU.Do (after
// OpenNCCL): it blocks until all size ranks have joined. Usually
// NewNCCLComm does this; JoinNCCL is for callers that share the id
// themselves. Close and Abort run through g.Do.
func (d *Device) JoinNCCL(g *GPU, rank, size int, id NCCLUniqueID) (*NCCLComm, error) {
	if err := d.ready("JoinNCCL"); err != nil {
		return nil, err
	}
	if g == nil || g.dev != d {
		return nil, errors.New("kernels: JoinNCCL: g must be the GPU whose Do runs this call")
	}
	if size < 1 || rank < 0 || rank >= size || size > 1<<20 {
		return nil, fmt.Errorf("kernels: JoinNCCL: rank %d of %d", rank, size)
	}
	if err := ncclNVLSOff(); err != nil {
		return nil, fmt.Errorf("kernels: setting %s=0: %w", ncclNVLSEnv, err)
	}
	var v int32
	if err := d.lib.check("mk_nccl_version", ncclVersion(&v)); err != nil {
		return nil, err
	}
	var h uint64
	if err := d.lib.check("mk_nccl_comm_init", ncclCommInit(int32(rank), int32(size), unsafe.Pointer(&id[0]), &h)); err != nil {
		return nil, err
	}
	return &NCCLComm{g: g, h: h, rank: rank, size: size, version: int(v)}, nil
}

// NewNCCLComm makes this rank's NCCL communicator over the world of c:
// every rank calls it. Each loads NCCL (OpenNCCL); rank 0 makes the unique
// id; the ranks share it (and whether each could load NCCL, so that one
// rank's failure ends every rank's call instead of a hang) with
// transport.AllGatherBytes over c, the world's existing bootstrap (gRPC
// between processes); then each joins (JoinNCCL, blocking until all have).
// ctx bounds the exchange, not the NCCL join. Sets NCCL_NVLS_ENABLE=0 when
// unset: NVLink multicast stays off on these machines.
func NewNCCLComm(ctx context.Context, g *GPU, c transport.Comm) (*NCCLComm, error) {
	if g == nil || c == nil {
		return nil, errors.New("kernels: NewNCCLComm: nil GPU or Comm")
	}
	rank, size := c.Rank(), c.Size()
	if err := ncclNVLSOff(); err != nil {
		return nil, fmt.Errorf("kernels: setting %s=0: %w", ncclNVLSEnv, err)
	}
	var id NCCLUniqueID
	local := g.Do(func(d *Device) error {
		if _, err := d.OpenNCCL(); err != nil {
			return err
		}
		if rank == 0 {
			var err error
			id, err = d.NCCLUniqueID()
			return err
		}
		return nil
	})
	// [ok u32][id 128 bytes]: every rank sends the same length.
	msg := make([]byte, 4+NCCLUniqueIDBytes)
	if local == nil {
		msg[0] = 1
		copy(msg[4:], id[:])
	}
	all, err := transport.AllGatherBytes(ctx, c, msg)
	if local != nil {
		return nil, fmt.Errorf("kernels: NewNCCLComm: rank %d of %d: %w", rank, size, local)
	}
	if err != nil {
		return nil, fmt.Errorf("kernels: NewNCCLComm: rank %d of %d: sharing the NCCL id: %w", rank, size, err)
	}
	for r, m := range all {
		if m[0] != 1 {
			return nil, fmt.Errorf("kernels: NewNCCLComm: rank %d of %d: rank %d could not load NCCL or make the id (see its log)",
				rank, size, r)
		}
	}
	copy(id[:], all[0][4:])
	var nc *NCCLComm
	err = g.Do(func(d *Device) error {
		var err error
		nc, err = d.JoinNCCL(g, rank, size, id)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("kernels: NewNCCLComm: rank %d of %d: %w", rank, size, err)
	}
	return nc, nil
}

// Rank is this rank's index.
func (c *NCCLComm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *NCCLComm) Size() int { return c.size }

// Version is the loaded NCCL's version code (e.g. 22805).
func (c *NCCLComm) Version() int { return c.version }

// use checks that c is live and d may call into the library now.
func (c *NCCLComm) use(d *Device, what string) error {
	if err := d.ready(what); err != nil {
		return err
	}
	if c == nil || c.h == 0 {
		return fmt.Errorf("kernels: %s on a closed or nil NCCLComm", what)
	}
	if c.g == nil || c.g.dev != d {
		return fmt.Errorf("kernels: %s with another GPU's Device than the communicator's", what)
	}
	return d.graphRefusal(what)
}

// AllReduceSumF32 sums count float32 values of send over all ranks into
// recv on every rank (recv may be send), on stream s.
//
//	send [count] f32, recv [count] f32
func (c *NCCLComm) AllReduceSumF32(d *Device, s *Stream, send, recv *Buffer, count int) error {
	if err := c.use(d, "NCCLComm.AllReduceSumF32"); err != nil {
		return err
	}
	if count < 0 {
		return fmt.Errorf("kernels: NCCLComm.AllReduceSumF32: count %d", count)
	}
	if count == 0 {
		return nil
	}
	if err := send.fits("AllReduceSumF32 send", 4*int64(count)); err != nil {
		return err
	}
	if err := recv.fits("AllReduceSumF32 recv", 4*int64(count)); err != nil {
		return err
	}
	return d.lib.check("mk_nccl_all_reduce_f32_sum", ncclAllReduceF32(c.h, send.ptr, recv.ptr, uint64(count), s.handle()))
}

// AllGather copies every rank's first bytes of send into recv in rank
// order, on every rank, on stream s.
//
//	send [bytes], recv [Size, bytes]
func (c *NCCLComm) AllGather(d *Device, s *Stream, send, recv *Buffer, bytes int64) error {
	if err := c.use(d, "NCCLComm.AllGather"); err != nil {
		return err
	}
	if bytes < 0 {
		return fmt.Errorf("kernels: NCCLComm.AllGather: %d bytes", bytes)
	}
	if bytes == 0 {
		return nil
	}
	if err := send.fits("AllGather send", bytes); err != nil {
		return err
	}
	if err := recv.fits("AllGather recv", bytes*int64(c.size)); err != nil {
		return err
	}
	return d.lib.check("mk_nccl_all_gather", ncclAllGather(c.h, send.ptr, recv.ptr, uint64(bytes), s.handle()))
}

// AllToAllV exchanges rows of rowBytes bytes, on stream s: send holds
// sendRows[0] rows for rank 0, then sendRows[1] rows for rank 1, ...
// (packed in rank order); recv gets recvRows[0] rows from rank 0, then
// recvRows[1] from rank 1, ... The counts must agree between ranks:
// recvRows[p] here = sendRows[this rank] on rank p (exchange them first
// when the receiver does not know them; a mismatch can hang NCCL). Zero
// rows are fine; a nil send or recv is allowed when its counts are all 0.
//
//	send [Σ sendRows, rowBytes], recv [Σ recvRows, rowBytes]
func (c *NCCLComm) AllToAllV(d *Device, s *Stream, send *Buffer, sendRows []int, recv *Buffer, recvRows []int,
	rowBytes int64) error {
	if err := c.use(d, "NCCLComm.AllToAllV"); err != nil {
		return err
	}
	sc, so, sTotal, err := ncclRowPlan("send", sendRows, c.size, rowBytes)
	if err != nil {
		return err
	}
	rc, ro, rTotal, err := ncclRowPlan("recv", recvRows, c.size, rowBytes)
	if err != nil {
		return err
	}
	if sendRows[c.rank] != recvRows[c.rank] {
		return fmt.Errorf("kernels: NCCLComm.AllToAllV: rank %d sends itself %d rows and receives %d",
			c.rank, sendRows[c.rank], recvRows[c.rank])
	}
	var sp, rp uint64
	if sTotal > 0 {
		if err := send.fits("AllToAllV send", sTotal*rowBytes); err != nil {
			return err
		}
		sp = send.ptr
	}
	if rTotal > 0 {
		if err := recv.fits("AllToAllV recv", rTotal*rowBytes); err != nil {
			return err
		}
		rp = recv.ptr
	}
	err = d.lib.check("mk_nccl_all_to_all_v", ncclAllToAllV(c.h, sp, &sc[0], &so[0], rp, &rc[0], &ro[0], rowBytes, s.handle()))
	runtime.KeepAlive(sc)
	runtime.KeepAlive(so)
	runtime.KeepAlive(rc)
	runtime.KeepAlive(ro)
	return err
}

// ncclRowPlan checks one side's row counts and returns them with their
// offsets (prefix sums, in rows) as int64, and their total.
func ncclRowPlan(side string, rows []int, size int, rowBytes int64) (counts, offsets []int64, total int64, err error) {
	if rowBytes <= 0 {
		return nil, nil, 0, fmt.Errorf("kernels: NCCLComm.AllToAllV: row of %d bytes", rowBytes)
	}
	if len(rows) != size {
		return nil, nil, 0, fmt.Errorf("kernels: NCCLComm.AllToAllV: %d %s counts for %d ranks", len(rows), side, size)
	}
	counts, offsets = make([]int64, size), make([]int64, size)
	const maxBytes = 1 << 62
	for p, n := range rows {
		if n < 0 {
			return nil, nil, 0, fmt.Errorf("kernels: NCCLComm.AllToAllV: %s count %d for rank %d", side, n, p)
		}
		if int64(n) > (maxBytes/rowBytes)-total {
			return nil, nil, 0, fmt.Errorf("kernels: NCCLComm.AllToAllV: %s rows overflow", side)
		}
		counts[p], offsets[p] = int64(n), total
		total += int64(n)
	}
	return counts, offsets, total, nil
}

// Check returns the communicator's asynchronous error (a failed peer, a
// network error), if any, without waiting. Inside GPU.Do.
func (c *NCCLComm) Check(d *Device) error {
	if err := c.use(d, "NCCLComm.Check"); err != nil {
		return err
	}
	return d.lib.check("mk_nccl_comm_check", ncclCommCheck(c.h))
}

// Close finalizes and destroys the communicator through GPU.Do (so not
// from inside a Do); every rank closes its own. Closing twice is a no-op.
func (c *NCCLComm) Close() error { return c.end("mk_nccl_comm_destroy", ncclCommDestroy) }

// Abort stops the communicator's work and frees it, through GPU.Do: for a
// world where a rank failed (Close would wait for it). Then Close is a no-op.
func (c *NCCLComm) Abort() error { return c.end("mk_nccl_comm_abort", ncclCommAbort) }

func (c *NCCLComm) end(fn string, call func(uint64) int32) error {
	if c == nil || c.h == 0 {
		return nil
	}
	return c.g.Do(func(d *Device) error {
		if c.h == 0 {
			return nil
		}
		err := d.lib.check(fn, call(c.h))
		c.h = 0 // gone either way: destroy aborts on a failed finalize
		return err
	})
}
