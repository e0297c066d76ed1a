package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mkserve/mkserve/transport"
)

// A world benchmark runs one process per rank on one machine (one GPU
// each): the process the user starts is rank 0; it starts ranks 1..R-1 as
// copies of its own executable with the same command line plus
// --world-rank r --coordinator HOST:PORT, and all of them join with
// transport.JoinGRPC (rank 0 is the coordinator, on 127.0.0.1). The
// children's stdout and stderr go to rank 0's log (worldLog), each line
// prefixed with its rank. A rank that fails fails the world: a child's
// failure cancels rank 0's context (and its exit status and last lines
// become rank 0's error), rank 0's failure kills the children, and every
// exchange between ranks has a timeout. `bench moe --world` uses it; so
// can `bench ring --world`.

// worldLog receives the children's output (rank 0's stderr).
var worldLog io.Writer = os.Stderr

// worldFlags are the flags of a world benchmark.
type worldFlags struct {
	size    int           // --world: processes (0: no world)
	rank    int           // --world-rank: set by rank 0 for its children
	coord   string        // --coordinator: rank 0's host:port, set for the children
	timeout time.Duration // --world-timeout: bound on each exchange between ranks
}

// register adds the world flags to fs.
func (w *worldFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&w.size, "world", 0, "run over this many processes, one per GPU (device = rank mod GPUs); rank 0 starts the others")
	fs.IntVar(&w.rank, "world-rank", 0, "internal: this process's rank (set by rank 0 for the processes it starts)")
	fs.StringVar(&w.coord, "coordinator", "", "internal: rank 0's host:port (set by rank 0 for the processes it starts)")
	fs.DurationVar(&w.timeout, "world-timeout", 3*time.Minute, "bound on each exchange between the ranks (a rank that does not arrive fails the run)")
}

// check validates the flags after parsing, for a world of at most maxSize.
func (w *worldFlags) check(maxSize int) error {
	switch {
	case w.size == 0 && (w.rank != 0 || w.coord != ""):
		return fmt.Errorf("--world-rank and --coordinator need --world")
	case w.size != 0 && (w.size < 2 || w.size > maxSize):
		return fmt.Errorf("--world %d: want 2..%d processes", w.size, maxSize)
	case w.rank < 0 || (w.size > 0 && w.rank >= w.size):
		return fmt.Errorf("--world-rank %d outside 0..%d", w.rank, w.size-1)
	case w.rank > 0 && w.coord == "":
		return fmt.Errorf("--world-rank %d needs --coordinator", w.rank)
	case w.rank == 0 && w.coord != "":
		return fmt.Errorf("--coordinator is for ranks above 0 (rank 0 is the coordinator)")
	case w.timeout <= 0:
		return fmt.Errorf("--world-timeout must be positive")
	}
	return nil
}

// world is one rank's view of a running world.
type world struct {
	comm    *transport.GRPCComm
	rank    int
	size    int
	timeout time.Duration // per exchange
}

// worldExitTimeout bounds how long rank 0 waits for its children to
// finish and exit after its own part succeeded.
var worldExitTimeout = time.Minute

// The end of a world: the transport cannot tell a peer that left from one
// that failed, so no process leaves before every rank has finished its
// last exchange. Each child reports "done" on a control pipe (its fd 3)
// after its body and the closing barrier, then waits for its stdin to
// close; rank 0 closes the children's stdin once all have reported, and
// closes its own transport once they have exited. A child whose stdin
// closes early (rank 0 died) stops.
const worldDone = "done"

// runWorld runs body on this process's rank of the world w describes.
// argv is the command line (without the program name) that started rank 0:
// the children get it plus their --world-rank and --coordinator.
func runWorld(ctx context.Context, w worldFlags, argv []string, body func(ctx context.Context, wd *world) error) error {
	if w.size < 2 {
		return fmt.Errorf("a world needs 2 or more processes, got %d", w.size)
	}
	if w.rank > 0 {
		return runWorldChild(ctx, w, body)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("world: picking the coordinator's port: %w", err)
	}
	coord := l.Addr().String()
	l.Close()
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("world: own executable: %w", err)
	}
	// kill ends the children when rank 0 gives up.
	kctx, kill := context.WithCancel(context.Background())
	defer kill()
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, w.size-1)
	dones := make(chan int, w.size-1)
	var stdins []io.WriteCloser
	closeStdins := func() {
		for _, s := range stdins {
			s.Close()
		}
	}
	defer closeStdins()
	var logMu sync.Mutex
	for r := 1; r < w.size; r++ {
		args := append(append([]string(nil), argv...), "--world-rank", strconv.Itoa(r), "--coordinator", coord)
		cmd := exec.CommandContext(kctx, exe, args...)
		lw := &prefixWriter{w: worldLog, mu: &logMu, prefix: fmt.Sprintf("rank %d: ", r)}
		cmd.Stdout, cmd.Stderr = lw, lw
		cmd.WaitDelay = 5 * time.Second
		cmd.SysProcAttr = childProcAttr()
		in, err := cmd.StdinPipe()
		if err != nil {
			return fmt.Errorf("world: rank %d's stdin: %w", r, err)
		}
		ctlR, ctlW, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("world: rank %d's control pipe: %w", r, err)
		}
		cmd.ExtraFiles = []*os.File{ctlW} // fd 3 in the child
		if err := cmd.Start(); err != nil {
			ctlR.Close()
			ctlW.Close()
			kill()
			return fmt.Errorf("world: starting rank %d (%s): %w", r, exe, err)
		}
		ctlW.Close()
		stdins = append(stdins, in)
		go func() {
			defer ctlR.Close()
			line, _ := bufio.NewReader(ctlR).ReadString('\n')
			if strings.TrimSpace(line) == worldDone {
				dones <- r
			}
		}()
		go func() {
			err := cmd.Wait()
			lw.Flush()
			if err != nil {
				err = fmt.Errorf("rank %d: %v (its last output: %s)", r, err, lw.Last())
				cancel(err)
			}
			exits <- exit{r, err}
		}()
	}
	// waitExits collects the exits of the n children that have not exited
	// yet, for at most d; then it kills the rest. It returns the children's
	// failures, those that are not the consequence of another's first.
	exited := 0
	waitExits := func(d time.Duration) error {
		timer := time.NewTimer(d)
		defer timer.Stop()
		var first, after []error
		for exited < w.size-1 {
			select {
			case e := <-exits:
				exited++
				if e.err == nil {
					continue
				}
				if m := e.err.Error(); strings.Contains(m, "aborted by rank") || strings.Contains(m, "signal: killed") {
					after = append(after, e.err)
				} else {
					first = append(first, e.err)
				}
			case <-timer.C:
				kill()
				first = append(first, fmt.Errorf("world: %d of %d ranks had not exited after %v (killed)", w.size-1-exited, w.size-1, d))
				timer.Reset(time.Hour)
			}
		}
		if len(first) == 0 {
			first = after
		}
		return errors.Join(first...)
	}
	fail := func(err error) error {
		closeStdins()
		cerr := waitExits(5 * time.Second)
		if cerr != nil {
			return fmt.Errorf("world of %d failed: %v; rank 0: %v", w.size, cerr, err)
		}
		return fmt.Errorf("world of %d failed: rank 0: %w", w.size, err)
	}
	comm, err := transport.JoinGRPC(ctx, transport.GRPCConfig{Rank: 0, Size: w.size, Coordinator: coord, JoinTimeout: w.timeout})
	if err != nil {
		return fail(err)
	}
	wd := &world{comm: comm, rank: 0, size: w.size, timeout: w.timeout}
	if err := body(ctx, wd); err != nil {
		comm.Close()
		return fail(err)
	}
	if err := wd.barrier(ctx, "world end"); err != nil {
		comm.Close()
		return fail(err)
	}
	timer := time.NewTimer(worldExitTimeout)
	defer timer.Stop()
	for n := 1; n < w.size; n++ {
		select {
		case <-dones:
		case <-ctx.Done():
			comm.Close()
			return fail(fmt.Errorf("waiting for the ranks to finish: %w", context.Cause(ctx)))
		case <-timer.C:
			comm.Close()
			return fail(fmt.Errorf("%d ranks did not report their end within %v", w.size-n, worldExitTimeout))
		}
	}
	closeStdins()
	err = waitExits(worldExitTimeout)
	comm.Close()
	if err != nil {
		return fmt.Errorf("world of %d: %w", w.size, err)
	}
	return nil
}

// runWorldChild is ranks 1..R-1: join, run body, the closing barrier,
// then the end handshake (see worldDone). On success the child leaves
// without closing its transport (rank 0 closes first); on a failure Close
// tells the peers at once.
func runWorldChild(ctx context.Context, w worldFlags, body func(ctx context.Context, wd *world) error) error {
	ctl := os.NewFile(3, "world-control")
	if ctl == nil {
		return fmt.Errorf("rank %d: no control pipe (fd 3): a world's ranks above 0 are started by rank 0", w.rank)
	}
	defer ctl.Close()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	parentGone := make(chan struct{})
	go func() { // rank 0 closes the stdin at the end, or dies
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(parentGone)
		cancel(fmt.Errorf("rank 0 ended (stdin closed)"))
	}()
	comm, err := transport.JoinGRPC(ctx, transport.GRPCConfig{Rank: w.rank, Size: w.size, Coordinator: w.coord,
		Listen: "127.0.0.1:0", JoinTimeout: w.timeout})
	if err != nil {
		return fmt.Errorf("rank %d: %w", w.rank, err)
	}
	wd := &world{comm: comm, rank: w.rank, size: w.size, timeout: w.timeout}
	err = body(ctx, wd)
	if err == nil {
		err = wd.barrier(ctx, "world end")
	}
	if err != nil {
		comm.Close()
		return fmt.Errorf("rank %d: %w", w.rank, err)
	}
	if _, err := fmt.Fprintln(ctl, worldDone); err != nil {
		return fmt.Errorf("rank %d: reporting the end: %w", w.rank, err)
	}
	select {
	case <-parentGone:
		return nil
	case <-time.After(worldExitTimeout):
		return fmt.Errorf("rank %d: rank 0 did not end the world within %v", w.rank, worldExitTimeout)
	}
}

// gather sends b to every rank and returns what each rank sent, indexed by
// rank; the lengths may differ. Bounded by the world's timeout.
func (wd *world) gather(ctx context.Context, b []byte) ([][]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, wd.timeout)
	defer cancel()
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	lens, err := transport.AllGatherBytes(ctx, wd.comm, n[:])
	if err != nil {
		return nil, fmt.Errorf("world: rank %d: gathering lengths: %w", wd.rank, err)
	}
	most := 0
	for _, l := range lens {
		most = max(most, int(binary.LittleEndian.Uint32(l)))
	}
	padded := make([]byte, (most+3)/4*4)
	copy(padded, b)
	all, err := transport.AllGatherBytes(ctx, wd.comm, padded)
	if err != nil {
		return nil, fmt.Errorf("world: rank %d: gathering: %w", wd.rank, err)
	}
	for r := range all {
		all[r] = all[r][:binary.LittleEndian.Uint32(lens[r])]
	}
	return all, nil
}

// barrier returns once every rank has reached the barrier named tag; a
// rank at a different barrier is an error.
func (wd *world) barrier(ctx context.Context, tag string) error {
	all, err := wd.gather(ctx, []byte(tag))
	if err != nil {
		return fmt.Errorf("barrier %q: %w", tag, err)
	}
	for r, t := range all {
		if string(t) != tag {
			return fmt.Errorf("world: rank %d is at barrier %q, rank %d at %q", r, t, wd.rank, tag)
		}
	}
	return nil
}

// prefixWriter writes whole lines to w under mu, each with prefix, and
// keeps the last few for error messages.
type prefixWriter struct {
	w      io.Writer
	mu     *sync.Mutex
	prefix string
	part   []byte
	last   []string
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.part = append(p.part, b...)
	for {
		i := bytes.IndexByte(p.part, '\n')
		if i < 0 {
			break
		}
		p.line(string(p.part[:i]))
		p.part = p.part[i+1:]
	}
	return len(b), nil
}

func (p *prefixWriter) line(s string) {
	s = strings.TrimRight(s, "\r")
	p.mu.Lock()
	fmt.Fprintf(p.w, "%s%s\n", p.prefix, s)
	p.mu.Unlock()
	if strings.TrimSpace(s) != "" {
		p.last = append(p.last, s)
		if len(p.last) > 3 {
			p.last = p.last[1:]
		}
	}
}

// Flush writes a last line without a newline.
func (p *prefixWriter) Flush() {
	if len(p.part) > 0 {
		p.line(string(p.part))
		p.part = nil
	}
}

// Last is the last non-empty lines, joined (call after Flush).
func (p *prefixWriter) Last() string {
	if len(p.last) == 0 {
		return "none"
	}
	return strings.Join(p.last, " | ")
}
