package cuda

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/mkserve/mkserve/kernels"
)

// StepStampsEnv names the environment variable that, set to 1, makes every
// captured decode step write the GPU's clock after each backend op
// (kernels.Device.Stamp: a one-warp kernel in the chain, so the step runs
// a little slower), for StepStamps: where a step's time goes on the GPU,
// op by op, as the graph runs it (programmatic launches overlapping), which
// a profiler that serialises kernels does not show. Set to 2 it stamps
// after every kernel the library launches on its programmatic path
// instead (kernels.Device.KStampBegin), named by the kernel.
const StepStampsEnv = "MKSERVE_STEP_STAMPS"

var stampsMode = sync.OnceValue(func() int {
	switch os.Getenv(StepStampsEnv) {
	case "1":
		return 1
	case "2":
		return 2
	}
	return 0
})

// stampsOn reports whether captured steps are stamped (either way).
var stampsOn = func() bool { return stampsMode() != 0 }

// Stamping reports whether captured steps are stamped (StepStampsEnv set
// to 1 or 2), so that StepStamps has something to read.
func (be *Backend) Stamping() bool { return stampsOn() }

// kernelStamps reports whether the stamps follow kernels, not ops.
var kernelStamps = func() bool { return stampsMode() == 2 }

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
	if kernelStamps() {
		return d.KStampBegin(be.st.buf)
	}
	be.st.ops = append(be.st.ops, "")
	return d.Stamp(be.st.buf, 0)
}

// stampEnd ends a capture's kernel stamps (inside GPU.Do, before the
// capture ends): their names become the capture's ops.
func (be *Backend) stampEnd(d *kernels.Device) error {
	if !stampsOn() || !kernelStamps() || be.st.buf == nil {
		return nil
	}
	names, err := d.KStampNames()
	for i, n := range names {
		names[i] = shortName(n)
	}
	be.st.ops = names
	return errors.Join(err, d.KStampBegin(nil))
}

// shortName is the function name in a kernel's mangled name (the last of
// its nested names, template arguments and parameters dropped:
// "_ZN12_GLOBAL__N_115rmsnorm_f32_regILi0ELi2EEEvPf" → "rmsnorm_f32_reg");
// other names are returned as they are.
func shortName(m string) string {
	if !strings.HasPrefix(m, "_Z") {
		return m
	}
	s := strings.TrimPrefix(strings.TrimPrefix(m, "_Z"), "N")
	last := ""
	for len(s) > 0 && s[0] >= '0' && s[0] <= '9' {
		n := 0
		for len(s) > 0 && s[0] >= '0' && s[0] <= '9' {
			n = n*10 + int(s[0]-'0')
			s = s[1:]
		}
		if n > len(s) {
			return m
		}
		last, s = s[:n], s[n:]
	}
	if last == "" {
		return m
	}
	return last
}

// stamped is f followed by a stamp naming op, while a stamped capture runs.
func (be *Backend) stamped(op string, f func(d *kernels.Device) error) func(d *kernels.Device) error {
	if !stampsOn() || kernelStamps() || be.st.buf == nil {
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
		return nil, fmt.Errorf("cuda: StepStamps: %s=1 or 2 is not set", StepStampsEnv)
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
