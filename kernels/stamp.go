package kernels

import (
	"bytes"
	"fmt"
)

var (
	stamp       func(buf uint64, idx int32) int32
	kstampBegin func(buf uint64, cap int32) int32
	kstampCount func() int32
	kstampName  func(i int32, out *byte, cap int32) int32
)

func init() {
	registerSymbols(symbol{"mk_stamp", &stamp}, symbol{"mk_kstamp_begin", &kstampBegin},
		symbol{"mk_kstamp_count", &kstampCount}, symbol{"mk_kstamp_name", &kstampName})
}

// Stamp writes the GPU's clock (ns) to the uint64 idx of buf once the work
// queued before it on stream 0 has finished (a one-warp kernel in the
// chain; while capturing, recorded into the graph): where a step's time
// goes, op by op.
func (d *Device) Stamp(buf *Buffer, idx int) error {
	const op = "Stamp"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if buf == nil || idx < 0 || int64(idx+1)*8 > buf.bytes {
		return fmt.Errorf("kernels: %s: index %d outside the buffer", op, idx)
	}
	return d.lib.check("mk_stamp", stamp(buf.ptr, int32(idx)))
}

// KStampBegin turns kernel stamps on (buf, at most buf's uint64s of them):
// a clock stamp now into word 0, then one after every kernel the library
// launches on its programmatic path, captured into a graph while one is
// being captured; nil turns them off. KStampNames names the kernels.
func (d *Device) KStampBegin(buf *Buffer) error {
	const op = "KStampBegin"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	var p uint64
	var n int32
	if buf != nil {
		p, n = buf.ptr, int32(min(buf.bytes/8, 1<<30))
		if n < 1 {
			return fmt.Errorf("kernels: %s: a buffer of %d bytes holds no stamp", op, buf.bytes)
		}
	}
	return d.lib.check("mk_kstamp_begin", kstampBegin(p, n))
}

// KStampNames is the kernel each stamp since KStampBegin follows, in order
// ("start" for the first).
func (d *Device) KStampNames() ([]string, error) {
	if err := d.ready("KStampNames"); err != nil {
		return nil, err
	}
	n := int(kstampCount())
	out := make([]string, n)
	var b [256]byte
	for i := range out {
		if err := d.lib.check("mk_kstamp_name", kstampName(int32(i), &b[0], int32(len(b)))); err != nil {
			return nil, err
		}
		if j := bytes.IndexByte(b[:], 0); j >= 0 {
			out[i] = string(b[:j])
		}
	}
	return out, nil
}
