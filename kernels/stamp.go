package kernels

import "fmt"

var stamp func(buf uint64, idx int32) int32

func init() {
	registerSymbols(symbol{"mk_stamp", &stamp})
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
