package kernels

import (
	"encoding/hex"
	"fmt"
	"runtime"
	"unsafe"
)

// CUDA IPC: device memory one process allocates and another maps, the
// peer pointers the fused multi-rank kernels take when their ranks are
// separate processes (one per GPU, or several sharing one GPU).

// IPCHandleBytes is the size of an IPC handle (MK_IPC_HANDLE_BYTES).
const IPCHandleBytes = 64

// IPCHandle names an allocation to other processes.
type IPCHandle [IPCHandleBytes]byte

// String is the handle in hex (for environment variables and logs).
func (h IPCHandle) String() string { return hex.EncodeToString(h[:]) }

// ParseIPCHandle reads a handle's String form.
func ParseIPCHandle(s string) (IPCHandle, error) {
	var h IPCHandle
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != IPCHandleBytes {
		return h, fmt.Errorf("kernels: IPC handle %q: want %d hex bytes", s, IPCHandleBytes)
	}
	copy(h[:], b)
	return h, nil
}

// IPCHandle returns the handle of b, which must be a whole allocation from
// Malloc (not a View, not itself mapped from another process).
func (d *Device) IPCHandle(b *Buffer) (IPCHandle, error) {
	var h IPCHandle
	if err := d.ready("IPCHandle"); err != nil {
		return h, err
	}
	if b == nil || b.ptr == 0 || b.view || b.ipc {
		return h, fmt.Errorf("kernels: IPCHandle: want a live allocation from Malloc")
	}
	err := d.lib.check("mk_ipc_get_handle", ipcGetHandle(b.ptr, unsafe.Pointer(&h[0])))
	return h, err
}

// OpenIPC maps the allocation of bytes bytes another process exported as h.
// Free unmaps it (the exporter keeps it allocated). A process cannot open
// its own handles.
func (d *Device) OpenIPC(h IPCHandle, bytes int64) (*Buffer, error) {
	if err := d.ready("OpenIPC"); err != nil {
		return nil, err
	}
	if d.cap != nil || d.rep != nil {
		return nil, d.graphRefusal("OpenIPC")
	}
	if bytes <= 0 {
		return nil, fmt.Errorf("kernels: OpenIPC of %d bytes", bytes)
	}
	var p uint64
	if err := d.lib.check("mk_ipc_open", ipcOpen(unsafe.Pointer(&h[0]), &p)); err != nil {
		return nil, err
	}
	return &Buffer{d: d, ptr: p, bytes: bytes, ipc: true}, nil
}

var (
	ipcGetHandle func(dptr uint64, handle unsafe.Pointer) int32
	ipcOpen      func(handle unsafe.Pointer, dptr *uint64) int32
	ipcClose     func(dptr uint64) int32
)

func init() {
	registerSymbols(
		symbol{"mk_ipc_get_handle", &ipcGetHandle},
		symbol{"mk_ipc_open", &ipcOpen},
		symbol{"mk_ipc_close", &ipcClose},
	)
}

// DeviceCount is the number of CUDA devices this process sees (the peers a
// test or a launcher can place ranks on).
func DeviceCount() (int, error) {
	l, err := library()
	if err != nil {
		return 0, err
	}
	runtime.LockOSThread() // the library's error text is per thread
	defer runtime.UnlockOSThread()
	var n int32
	if err := l.check("mk_device_count", l.deviceCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}
