package cuda

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/mkserve/mkserve/kernels"
)

// StepStampsEnv names the environment variable that, set to 1, makes every
// captured decode step write the GPU's clock after each backend op
// (kernels.Device.Stamp: a one-warp kernel in the chain, so the step runs
// a little slower), for StepStamps: where a step's time goes on the GPU,
// op by op, as the graph runs it (programmatic launches overlapping), which
// a profiler that serialises kernels does not show.
const StepStampsEnv = "MKSERVE_STEP_STAMPS"

var stampsOn = sync.OnceValue(func() bool { return os.Getenv(StepStampsEnv) == "1" })

// maxStamps bounds the stamps of one step.
const maxStamps = 1 << 14

// stamps is a Backend's clock stamps.
type stamps struct {
	buf  *kernels.Buffer // [maxStamps] uint64
	ops  []string        // the capture running: the op before each stamp ("" for the step's start)
	last *stepGraph      // the graph launched last
}

// OpStamp is one op of a stamped step: its name and the GPU time from the
// stamp before it to the stamp after it (its kernels' share of the step's
// critical path, plus one stamp kernel's latency).
type OpStamp struct {
	Op string
	NS int64
}

// stampStart readies the stamps of a capture that is starting (inside
// GPU.Do, after BeginCapture): the first stamp marks the step's start.
func (be *Backend) stampStart(d *kernels.Device) error {
	be.st.ops = nil
	if !stampsOn() {
		return nil
	}
	if be.st.buf == nil {
		b, err := d.Malloc(8 * maxStamps)
		if err != nil {
			return err
		}
		be.st.buf = b
	}
	be.st.ops = append(be.st.ops, "")
	return d.Stamp(be.st.buf, 0)
}

// stamped is f followed by a stamp naming op, while a stamped capture runs.
func (be *Backend) stamped(op string, f func(d *kernels.Device) error) func(d *kernels.Device) error {
	if !stampsOn() || be.st.buf == nil {
		return f
	}
	return func(d *kernels.Device) error {
		if err := f(d); err != nil {
			return err
		}
		if len(be.st.ops) >= maxStamps {
			return nil
		}
		be.st.ops = append(be.st.ops, op)
		return d.Stamp(be.st.buf, len(be.st.ops)-1)
	}
}

// StepStamps waits for the GPU and returns the ops of the graph launched
// last with their GPU times, in order (StepStampsEnv must have been set
// when it was captured).
func (be *Backend) StepStamps() ([]OpStamp, error) {
	if !stampsOn() {
		return nil, fmt.Errorf("cuda: StepStamps: %s=1 is not set", StepStampsEnv)
	}
	var ops []string
	var ts []uint64
	if err := be.g.Do(func(d *kernels.Device) error {
		g := be.st.last
		if g == nil || len(g.stampOps) < 2 {
			return errors.New("cuda: StepStamps: no stamped graph has been launched")
		}
		ops, ts = g.stampOps, make([]uint64, len(g.stampOps))
		if err := d.Sync(); err != nil {
			return err
		}
		return kernels.Download(d, ts, be.st.buf)
	}); err != nil {
		return nil, err
	}
	out := make([]OpStamp, 0, len(ts)-1)
	for i := 1; i < len(ts); i++ {
		out = append(out, OpStamp{Op: ops[i], NS: int64(ts[i] - ts[i-1])})
	}
	return out, nil
}
