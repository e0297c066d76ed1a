package kernels

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// abiVersion is the MK_ABI_VERSION this package was written against.
const abiVersion = 29

// LibraryEnv names the environment variable holding libmkernel.so's path.
const LibraryEnv = "MKSERVE_KERNEL_LIB"

// LibraryName is the library's file name, looked for next to the executable
// when LibraryEnv is unset.
const LibraryName = "libmkernel.so"

// ErrUnavailable is wrapped by every error that means "this machine cannot
// run the CUDA backend": no libmkernel.so, a library whose CUDA dependencies
// are missing, no NVIDIA driver, or no CUDA device.
var ErrUnavailable = errors.New("CUDA backend unavailable")

// Status codes of libmkernel (mkernel.h).
const (
	codeOK       = 0
	codeArg      = 1
	codeCUDA     = 2
	codeCUBLAS   = 3
	codeNoDevice = 4
	codeNotInit  = 5
)

// Error is a failed libmkernel call: the function, its status code and the
// library's text for it (mk_last_error).
type Error struct {
	Func string
	Code int32
	Msg  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("kernels: %s failed (%s): %s", e.Func, codeName(e.Code), e.Msg)
}

// Is lets errors.Is(err, ErrUnavailable) match a no-device error, and
// errors.Is(err, ErrNCCLUnavailable) an NCCL library that did not load.
func (e *Error) Is(target error) bool {
	return target == ErrUnavailable && e.Code == codeNoDevice || target == ErrNCCLUnavailable && e.Code == codeNoNCCL
}

func codeName(c int32) string {
	switch c {
	case codeArg:
		return "bad argument"
	case codeCUDA:
		return "CUDA error"
	case codeCUBLAS:
		return "cuBLAS error"
	case codeNoDevice:
		return "no device"
	case codeNotInit:
		return "not initialised"
	case codeNCCL:
		return "NCCL error"
	case codeNoNCCL:
		return "NCCL not loaded"
	}
	return fmt.Sprintf("code %d", c)
}

// deviceInfoC mirrors mk_device_info_t; its layout is checked against the
// library's mk_abi_layout when the library loads.
type deviceInfoC struct {
	Name              [256]byte
	Device            int32
	SMCount           int32
	CCMajor           int32
	CCMinor           int32
	TotalMem          uint64
	FreeMem           uint64
	L2Bytes           uint64
	SmemPerBlockOptin uint64
	DriverVersion     int32
	RuntimeVersion    int32
}

// Struct and field ids of mk_abi_layout (mkernel.h).
const (
	structDeviceInfo = 0
	fieldSize        = -1
)

// layoutField is one field whose offset must agree between Go and C.
type layoutField struct {
	id   int32
	name string
	off  uintptr
}

// deviceInfoFields lists mk_device_info_t's fields in MK_DI_* id order.
var deviceInfoFields = func() []layoutField {
	var v deviceInfoC
	return []layoutField{
		{0, "name", unsafe.Offsetof(v.Name)},
		{1, "device", unsafe.Offsetof(v.Device)},
		{2, "sm_count", unsafe.Offsetof(v.SMCount)},
		{3, "cc_major", unsafe.Offsetof(v.CCMajor)},
		{4, "cc_minor", unsafe.Offsetof(v.CCMinor)},
		{5, "total_mem", unsafe.Offsetof(v.TotalMem)},
		{6, "free_mem", unsafe.Offsetof(v.FreeMem)},
		{7, "l2_bytes", unsafe.Offsetof(v.L2Bytes)},
		{8, "smem_per_block_optin", unsafe.Offsetof(v.SmemPerBlockOptin)},
		{9, "driver_version", unsafe.Offsetof(v.DriverVersion)},
		{10, "runtime_version", unsafe.Offsetof(v.RuntimeVersion)},
	}
}()

// lib holds libmkernel's functions, bound with purego.
type lib struct {
	path string

	abiVersion  func() int32
	lastError   func() string
	abiLayout   func(structID, fieldID int32) int64
	deviceCount func(n *int32) int32
	init        func(device int32) int32
	deviceInfo  func(info *deviceInfoC) int32
	deviceSync  func() int32
	anyThread   func(on int32) int32

	malloc    func(bytes uint64, dptr *uint64) int32
	free      func(dptr uint64) int32
	h2d       func(dst uint64, src unsafe.Pointer, bytes uint64) int32
	d2h       func(dst unsafe.Pointer, src uint64, bytes uint64) int32
	d2d       func(dst, src, bytes uint64) int32
	h2dAsync  func(dst uint64, src unsafe.Pointer, bytes, stream uint64) int32
	d2hAsync  func(dst unsafe.Pointer, src, bytes, stream uint64) int32
	d2dAsync  func(dst, src, bytes, stream uint64) int32
	hostAlloc func(bytes uint64, hptr *unsafe.Pointer) int32
	hostFree  func(hptr unsafe.Pointer) int32

	streamCreate  func(s *uint64) int32
	streamDestroy func(s uint64) int32
	streamSync    func(s uint64) int32
	eventCreate   func(e *uint64) int32
	eventDestroy  func(e uint64) int32
	eventRecord   func(e, s uint64) int32
	eventSync     func(e uint64) int32
	eventQuery    func(e uint64, done *int32) int32
	eventElapsed  func(start, end uint64, msBits *uint32) int32

	gemm       func(s, a, b, c uint64, cDType int32, m, n, k int64, acc int32) int32
	gemmF32    func(s, a, b, c uint64, m, n, k int64, acc int32) int32
	gemmStats  func(lt, fallback *uint64) int32
	rmsnorm    func(s, out, x, w uint64, rows, cols, group int64, eps uint32) int32
	addRMSNorm func(s, resid, x, w, out uint64, rows, cols int64, eps uint32) int32
	embedding  func(s, out, table, ids uint64, n, hidden, vocab int64) int32
	swiglu     func(s, out, in uint64, t, i int64) int32
	swigluOSS  func(s, out, in uint64, t, i int64, alpha, limit uint32, interleaved int32) int32
	rope       func(s, x, pos uint64, t, heads, headDim, rotDim int64, style int32, invFreq uint64, attn uint32) int32
	f32ToBF16  func(s, dst, src uint64, n int64) int32
	bf16ToF32  func(s, dst, src uint64, n int64) int32

	// float32-activation ops (f32ops.cu)
	rmsnormF32    func(s, out, x, w uint64, rows, cols, group int64, eps uint32) int32
	addRMSNormF32 func(s, sum, out, x, r, w uint64, rows, cols int64, eps uint32, outb uint64) int32
	splitBF16     func(s, hi, lo, x uint64, n int64) int32
	addF32        func(s, out, a, b uint64, n int64) int32
	fillF32       func(s, out uint64, n int64, v uint32) int32
	clampF32      func(s, out, x uint64, n int64, limit uint32) int32
	biasAddF32    func(s, x, bias uint64, rows, cols int64) int32
	swigluF32     func(s, out, in uint64, t, i int64, kind int32, alpha, limit uint32) int32
	ropeF32       func(s, x, pos uint64, t, heads, headDim, rotDim int64, style int32, invFreq uint64, attn uint32) int32
	normRopeF32   func(s, out, x, w uint64, heads int64, out2, x2, w2 uint64, heads2 int64, pos uint64, t, headDim, rotDim int64, style int32, invFreq uint64, attn, eps uint32, flags int32, outBF16 uint64) int32
	copyColsF32   func(s, dst uint64, dld, doff, dhs int64, src uint64, sld, soff, shs, rows, heads, width int64) int32
	copyColsBF16  func(s, dst uint64, dld, doff, dhs int64, src uint64, sld, soff, shs, rows, heads, width int64) int32
	gatherRowsF32 func(s, dst, src uint64, srcDType int32, idx uint64, n, cols, srcRows int64) int32
	gatherFeedF32 func(s, dst, src uint64, srcDType int32, idx, picks uint64, pickStride, pickRows, n, cols, srcRows int64) int32
	scatterAddF32 func(s, out, src, idx, w uint64, n, cols int64) int32
	gatedAddF32   func(s, out, x, gate uint64, rows, cols int64) int32
	kvWriteF32    func(s, pk, pv, k, v, slots uint64, n, kw, vw int64) int32
	attentionF32  func(s, out, q, pk, pv, rows, pos, table, blocks uint64, n int64, heads, kvHeads, headDim, vHeadDim, blockSize int32, scale uint32, window int32, sinks uint64) int32
}

// symbol pairs a C symbol with the Go function variable it binds.
type symbol struct {
	name string
	fn   any
}

// extraSymbols holds the symbols of the op families that live in their own
// files (flash.go, decode.go, ...): each registers its bindings from init
// with registerSymbols, into package-level function variables, bound once
// when the library loads.
var extraSymbols []symbol

// registerSymbols adds symbols to bind when libmkernel loads. Call it from init.
func registerSymbols(s ...symbol) { extraSymbols = append(extraSymbols, s...) }

// symbols pairs each C symbol with the field it binds, then the registered ones.
func (l *lib) symbols() []symbol {
	return append([]symbol{
		{"mk_abi_version", &l.abiVersion},
		{"mk_last_error", &l.lastError},
		{"mk_abi_layout", &l.abiLayout},
		{"mk_device_count", &l.deviceCount},
		{"mk_init", &l.init},
		{"mk_device_info", &l.deviceInfo},
		{"mk_device_sync", &l.deviceSync},
		{"mk_set_any_thread", &l.anyThread},
		{"mk_malloc", &l.malloc},
		{"mk_free", &l.free},
		{"mk_memcpy_h2d", &l.h2d},
		{"mk_memcpy_d2h", &l.d2h},
		{"mk_memcpy_d2d", &l.d2d},
		{"mk_memcpy_h2d_async", &l.h2dAsync},
		{"mk_memcpy_d2h_async", &l.d2hAsync},
		{"mk_memcpy_d2d_async", &l.d2dAsync},
		{"mk_host_alloc_pinned", &l.hostAlloc},
		{"mk_host_free_pinned", &l.hostFree},
		{"mk_stream_create", &l.streamCreate},
		{"mk_stream_destroy", &l.streamDestroy},
		{"mk_stream_sync", &l.streamSync},
		{"mk_event_create", &l.eventCreate},
		{"mk_event_destroy", &l.eventDestroy},
		{"mk_event_record", &l.eventRecord},
		{"mk_event_sync", &l.eventSync},
		{"mk_event_query", &l.eventQuery},
		{"mk_event_elapsed", &l.eventElapsed},
		{"mk_gemm_bf16", &l.gemm},
		{"mk_gemm_f32", &l.gemmF32},
		{"mk_gemm_stats", &l.gemmStats},
		{"mk_rmsnorm_bf16", &l.rmsnorm},
		{"mk_add_rmsnorm_bf16", &l.addRMSNorm},
		{"mk_embedding_bf16", &l.embedding},
		{"mk_swiglu_bf16", &l.swiglu},
		{"mk_swiglu_oss_bf16", &l.swigluOSS},
		{"mk_rope_bf16", &l.rope},
		{"mk_convert_f32_to_bf16", &l.f32ToBF16},
		{"mk_convert_bf16_to_f32", &l.bf16ToF32},
		{"mk_rmsnorm_f32", &l.rmsnormF32},
		{"mk_add_rmsnorm_f32", &l.addRMSNormF32},
		{"mk_split_bf16", &l.splitBF16},
		{"mk_add_f32", &l.addF32},
		{"mk_fill_f32", &l.fillF32},
		{"mk_clamp_f32", &l.clampF32},
		{"mk_bias_add_f32", &l.biasAddF32},
		{"mk_swiglu_f32", &l.swigluF32},
		{"mk_rope_f32", &l.ropeF32},
		{"mk_norm_rope_f32", &l.normRopeF32},
		{"mk_copy_cols_f32", &l.copyColsF32},
		{"mk_copy_cols_bf16", &l.copyColsBF16},
		{"mk_gather_rows_f32", &l.gatherRowsF32},
		{"mk_gather_rows_feed_f32", &l.gatherFeedF32},
		{"mk_scatter_add_rows_f32", &l.scatterAddF32},
		{"mk_gated_add_f32", &l.gatedAddF32},
		{"mk_kv_write_f32", &l.kvWriteF32},
		{"mk_attention_f32", &l.attentionF32},
	}, extraSymbols...)
}

// LibraryPath returns where libmkernel.so is: $MKSERVE_KERNEL_LIB when set
// (the file must exist), else next to the running executable. The error
// wraps ErrUnavailable and says where it looked.
func LibraryPath() (string, error) {
	if p := os.Getenv(LibraryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("kernels: %w: %s=%q: %v", ErrUnavailable, LibraryEnv, p, err)
		}
		return p, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("kernels: %w: %s is unset and the executable's path is unknown: %v",
			ErrUnavailable, LibraryEnv, err)
	}
	p := filepath.Join(filepath.Dir(exe), LibraryName)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("kernels: %w: no %s: %s is unset and %s does not exist "+
			"(build it with `make kernels` on a machine with nvcc)", ErrUnavailable, LibraryName, LibraryEnv, p)
	}
	return p, nil
}

// loadLibrary dlopens path, binds every symbol and checks the ABI version
// and struct layouts. It does not touch the GPU.
func loadLibrary(path string) (*lib, error) {
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("kernels: %w: loading %s: %v (libmkernel needs the cuBLAS libraries "+
			"of the CUDA toolkit it was built with)", ErrUnavailable, path, err)
	}
	l := &lib{path: path}
	for _, s := range l.symbols() {
		addr, err := purego.Dlsym(h, s.name)
		if err != nil || addr == 0 {
			return nil, fmt.Errorf("kernels: %s has no symbol %s: built from other sources than this binary's (%v)",
				path, s.name, err)
		}
		purego.RegisterFunc(s.fn, addr)
	}
	if v := l.abiVersion(); v != abiVersion {
		return nil, fmt.Errorf("kernels: %s has ABI version %d, this binary needs %d: rebuild the library "+
			"from this checkout", path, v, abiVersion)
	}
	if err := l.checkLayouts(); err != nil {
		return nil, err
	}
	return l, nil
}

// checkLayouts compares every shared struct's size and field offsets.
func (l *lib) checkLayouts() error {
	if got, want := l.abiLayout(structDeviceInfo, fieldSize), int64(unsafe.Sizeof(deviceInfoC{})); got != want {
		return fmt.Errorf("kernels: %s: mk_device_info_t is %d bytes in C, %d in Go", l.path, got, want)
	}
	for _, f := range deviceInfoFields {
		if got := l.abiLayout(structDeviceInfo, f.id); got != int64(f.off) {
			return fmt.Errorf("kernels: %s: mk_device_info_t.%s at offset %d in C, %d in Go", l.path, f.name, got, f.off)
		}
	}
	return nil
}

// check turns a status code into an *Error carrying mk_last_error's text.
// It must run on the thread that made the call (the text is per thread).
func (l *lib) check(fn string, rc int32) error {
	if rc == codeOK {
		return nil
	}
	return &Error{Func: fn, Code: rc, Msg: l.lastError()}
}

var (
	loadOnce sync.Once
	loaded   *lib
	loadErr  error
)

// library loads libmkernel.so once per process.
func library() (*lib, error) {
	loadOnce.Do(func() {
		p, err := LibraryPath()
		if err != nil {
			loadErr = err
			return
		}
		loaded, loadErr = loadLibrary(p)
	})
	return loaded, loadErr
}
