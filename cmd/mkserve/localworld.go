package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/mkserve/mkserve/config"
)

// localWorkers are the `mkserve worker` processes `mkserve serve
// --world-size R` starts itself when no --coordinator is given: ranks
// 1..R−1 on this machine (one GPU each on cuda), joining rank 0 on a free
// loopback port.
type localWorkers struct {
	cmds   []*exec.Cmd
	done   chan struct{} // closed when every process has exited
	failed chan error    // the first worker that exited with an error
}

// startLocalWorkers picks a loopback coordinator address (set in cfg) and
// starts R−1 workers with rank 0's model and profile. Their output goes to
// logOut, each line prefixed with its rank. They die with this process
// (Pdeathsig on Linux) and stop when rank 0 stops them or the world breaks.
func startLocalWorkers(cfg *config.Config, logOut io.Writer, log *zap.Logger) (*localWorkers, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("world: a loopback port for the coordinator: %w", err)
	}
	cfg.Coordinator = l.Addr().String()
	l.Close()
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("world: this executable's path, to start the workers: %w", err)
	}
	model, err := filepath.Abs(cfg.Model)
	if err != nil {
		return nil, err
	}
	w := &localWorkers{done: make(chan struct{}), failed: make(chan error, 1)}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for r := 1; r < cfg.WorldSize; r++ {
		args := []string{"worker", "--model", model, "--backend", cfg.Backend, "--precision", cfg.Precision,
			"--moe-path", cfg.MoEPath, "--cpu-weights", cfg.CPUWeights, "--cuda-weights", cfg.CUDAWeights, "--kv-cache-dtype", cfg.KVCacheDtype, "--world-transport", cfg.WorldTransport, "--world-size", strconv.Itoa(cfg.WorldSize), "--rank", strconv.Itoa(r),
			"--coordinator", cfg.Coordinator}
		cmd := exec.Command(exe, args...)
		// A test binary re-run as a worker acts as mkserve (TestMain); the
		// real binary ignores it.
		cmd.Env = append(os.Environ(), worldChildEnvName+"=1")
		cmd.SysProcAttr = childProcAttr()
		lw := &prefixWriter{w: logOut, mu: &mu, prefix: fmt.Sprintf("worker %d: ", r)}
		cmd.Stdout, cmd.Stderr = lw, lw
		if err := cmd.Start(); err != nil {
			w.kill()
			return nil, fmt.Errorf("world: starting worker %d: %w", r, err)
		}
		log.Info("started a worker", zap.Int("rank", r), zap.Int("pid", cmd.Process.Pid))
		w.cmds = append(w.cmds, cmd)
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait() // returns once the output is copied
			lw.Flush()
			if err != nil {
				log.Warn("a worker exited", zap.Int("rank", r), zap.Error(err))
				select {
				case w.failed <- fmt.Errorf("worker %d exited: %v (its last lines: %s)", r, err, lw.Last()):
				default:
				}
			}
		}()
	}
	go func() { wg.Wait(); close(w.done) }()
	return w, nil
}

// watch cancels the world's bootstrap with the error of the first worker
// that exits before stop is closed (instead of waiting out the join timeout).
func (w *localWorkers) watch(cancel context.CancelCauseFunc, stop <-chan struct{}) {
	go func() {
		select {
		case err := <-w.failed:
			cancel(err)
		case <-stop:
		}
	}()
}

// wait gives the workers d to exit (after rank 0 stopped them), then kills them.
func (w *localWorkers) wait(d time.Duration) {
	select {
	case <-w.done:
	case <-time.After(d):
		w.kill()
		<-w.done
	}
}

func (w *localWorkers) kill() {
	for _, c := range w.cmds {
		if c.Process != nil {
			c.Process.Kill()
		}
	}
}

// worldChildEnvName is the variable under which a test binary acts as mkserve.
const worldChildEnvName = "MKSERVE_TEST_AS_MKSERVE"
