package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// worldChildEnv makes this test binary act as mkserve (TestMain runs the
// command line instead of the tests): the children a world starts are
// copies of the running executable, here the test binary.
const worldChildEnv = worldChildEnvName

// workerExitEnv makes this binary, acting as `mkserve worker`, exit at once
// with status 3 (a worker that dies before the world forms).
const workerExitEnv = "MKSERVE_TEST_WORKER_EXIT"

func TestMain(m *testing.M) {
	if os.Getenv(worldChildEnv) == "1" {
		if os.Getenv(workerExitEnv) != "" && len(os.Args) > 1 && os.Args[1] == "worker" {
			fmt.Fprintln(os.Stderr, "worker: exiting on purpose (TestServeWorldLocalWorkerDies)")
			os.Exit(3)
		}
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func init() { benches["worldtest"] = benchWorldTest }

// benchWorldTest is a world benchmark without a GPU, for the tests: each
// rank says hello on its stdout, the ranks gather their ranks squared, and
// rank 0 prints them. --fail-rank makes a rank's body fail after the
// first exchange, --exit-rank makes a process exit before joining,
// --hang-rank makes a rank wait forever before its first exchange.
func benchWorldTest(args []string, stdout io.Writer) error {
	fs := newFlags("bench worldtest")
	var w worldFlags
	w.register(fs)
	failRank := fs.Int("fail-rank", -1, "")
	exitRank := fs.Int("exit-rank", -1, "")
	hangRank := fs.Int("hang-rank", -1, "")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := w.check(8); err != nil {
		return err
	}
	if w.size == 0 {
		return fmt.Errorf("bench worldtest needs --world")
	}
	if w.rank == *exitRank {
		os.Exit(3)
	}
	return runWorld(context.Background(), w, append([]string{"bench", "worldtest"}, args...),
		func(ctx context.Context, wd *world) error {
			fmt.Fprintf(stdout, "hello from rank %d of %d\n", wd.rank, wd.size)
			if wd.rank == *hangRank {
				<-ctx.Done()
				return ctx.Err()
			}
			if err := wd.barrier(ctx, "start"); err != nil {
				return err
			}
			if wd.rank == *failRank {
				return fmt.Errorf("injected failure")
			}
			all, err := wd.gather(ctx, bytes.Repeat([]byte{byte(wd.rank)}, wd.rank*wd.rank))
			if err != nil {
				return err
			}
			if err := wd.barrier(ctx, "end"); err != nil {
				return err
			}
			if wd.rank == 0 {
				var lens []string
				for _, b := range all {
					lens = append(lens, fmt.Sprint(len(b)))
				}
				fmt.Fprintf(stdout, "gathered %s\n", strings.Join(lens, ","))
			}
			return nil
		})
}

// syncBuffer is a bytes.Buffer safe for the children's log writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestWorld (CPU): rank 0 starts the other ranks as copies of its own
// executable (this test binary, through TestMain), they join over gRPC on
// 127.0.0.1 and exchange; the children's output reaches rank 0's log
// prefixed with their rank; a child that fails, a child that exits before
// joining, a rank 0 that fails and a rank that hangs all end the run with
// an error naming the rank, quickly, and leave no process behind.
func TestWorld(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Setenv(worldChildEnv, "1")
	oldLog, oldExit := worldLog, worldExitTimeout
	t.Cleanup(func() { worldLog, worldExitTimeout = oldLog, oldExit })
	worldExitTimeout = 20 * time.Second
	cases := []struct {
		name   string
		args   []string
		ok     bool
		errHas []string
		within time.Duration
	}{
		{"three_ranks", []string{"--world", "3"}, true, nil, 30 * time.Second},
		{"child_fails", []string{"--world", "3", "--fail-rank", "2"}, false, []string{"rank 2", "injected failure"}, 30 * time.Second},
		{"child_exits_before_join", []string{"--world", "3", "--exit-rank", "1"}, false, []string{"rank 1", "exit status 3"}, 30 * time.Second},
		{"rank0_fails", []string{"--world", "2", "--fail-rank", "0"}, false, []string{"rank 0", "injected failure"}, 30 * time.Second},
		{"child_hangs", []string{"--world", "2", "--hang-rank", "1", "--world-timeout", "2s"}, false, []string{"barrier \"start\""}, 30 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var log syncBuffer
			worldLog = &log
			var out, errb bytes.Buffer
			start := time.Now()
			rc := run(append([]string{"bench", "worldtest"}, c.args...), strings.NewReader(""), &out, &errb)
			took := time.Since(start)
			t.Logf("rc %d after %v\nstdout:\n%sstderr:\n%slog:\n%s", rc, took, out.String(), errb.String(), log.String())
			if took > c.within {
				t.Errorf("took %v, want under %v", took, c.within)
			}
			if c.ok {
				if rc != 0 {
					t.Fatalf("rc %d: %s", rc, errb.String())
				}
				if !strings.Contains(out.String(), "hello from rank 0 of 3") || !strings.Contains(out.String(), "gathered 0,1,4") {
					t.Errorf("stdout %q: want rank 0's hello and the gathered lengths 0,1,4", out.String())
				}
				for r := 1; r < 3; r++ {
					if want := fmt.Sprintf("rank %d: hello from rank %d of 3", r, r); !strings.Contains(log.String(), want) {
						t.Errorf("log lacks %q", want)
					}
				}
				return
			}
			if rc == 0 {
				t.Fatalf("rc 0, want a failure")
			}
			msg := errb.String()
			if strings.Count(strings.TrimSpace(msg), "\n") != 0 {
				t.Errorf("stderr %q: want one line", msg)
			}
			for _, s := range c.errHas {
				if !strings.Contains(msg, s) {
					t.Errorf("stderr %q lacks %q", msg, s)
				}
			}
		})
	}
}

// TestWorldFlags (CPU): the world flags' errors.
func TestWorldFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--world", "1"}, "--world 1"},
		{[]string{"--world", "9"}, "--world 9"},
		{[]string{"--world-rank", "1"}, "need --world"},
		{[]string{"--world", "2", "--world-rank", "2", "--coordinator", "x:1"}, "outside"},
		{[]string{"--world", "2", "--world-rank", "1"}, "needs --coordinator"},
		{[]string{"--world", "2", "--coordinator", "x:1"}, "rank 0 is the coordinator"},
		{[]string{"--world", "2", "--world-timeout", "0s"}, "--world-timeout"},
	} {
		fs := newFlags("t")
		var w worldFlags
		w.register(fs)
		err := fs.Parse(c.args)
		if err == nil {
			err = w.check(8)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error containing %q", c.args, err, c.want)
		}
	}
}
