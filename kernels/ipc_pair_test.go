package kernels

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// The two-process machinery of the rank-local multi-process tests
// (TestMoEFusedIPC, TestRingIPC): this test binary re-executes itself as
// rank 1 running one child test, with a test case as JSON in an environment
// variable and testDeviceEnv naming its GPU (one process owns one GPU); the
// two processes talk over a pair of pipes, one line at a time.

// lineIO is one side of the pipe protocol: a line out, a line in.
type lineIO struct {
	in  *bufio.Reader
	out io.Writer
}

func (p lineIO) swap(msg string) (string, error) {
	if _, err := fmt.Fprintln(p.out, msg); err != nil {
		return "", fmt.Errorf("writing %q to the peer: %w", msg, err)
	}
	s, err := p.in.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading from the peer (after %q): %w", msg, err)
	}
	return strings.TrimSpace(s), nil
}

// runIPCPair starts this binary's childTest as rank 1 on GPU childDevice
// with payload's JSON in envName, then runs rank0 (this process's rank 0)
// with the pipe to it. The child's log is printed however rank0 ends (a
// t.Fatal in it included), after the child has exited; a child failure
// fails t.
func runIPCPair(t *testing.T, childTest, envName string, payload any, childDevice int, rank0 func(peer lineIO)) {
	t.Helper()
	js, err := json.Marshal(payload)
	if err != nil {
		t.Fatal(err)
	}
	toChildR, toChildW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	fromChildR, fromChildW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^"+childTest+"$", "-test.v")
	cmd.Env = append(os.Environ(), envName+"="+string(js), fmt.Sprintf("%s=%d", testDeviceEnv, childDevice))
	cmd.ExtraFiles = []*os.File{toChildR, fromChildW} // fds 3 and 4 in the child
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	toChildR.Close()
	fromChildW.Close()
	defer func() {
		toChildW.Close()
		err := cmd.Wait()
		fromChildR.Close()
		t.Logf("child (rank 1, device %d):\n%s", childDevice, log.String())
		if err != nil {
			t.Errorf("child process: %v", err)
		}
	}()
	rank0(lineIO{bufio.NewReader(fromChildR), toChildW})
}

// ipcChild is the child's side of runIPCPair: it decodes envName's JSON
// into payload and returns the pipe to the parent (closed at the test's
// end); it skips the test when envName is unset (run on its own).
func ipcChild(t *testing.T, envName string, payload any) lineIO {
	t.Helper()
	js := os.Getenv(envName)
	if js == "" {
		t.Skipf("a child of a two-process test (%s unset); run by its parent", envName)
	}
	if err := json.Unmarshal([]byte(js), payload); err != nil {
		t.Fatal(err)
	}
	in, out := os.NewFile(3, "from-parent"), os.NewFile(4, "to-parent")
	t.Cleanup(func() {
		in.Close()
		out.Close()
	})
	return lineIO{bufio.NewReader(in), out}
}

// swapIPC exports mine (a whole allocation), swaps IPC handles with the
// peer and maps the peer's allocation of peerBytes; nil after an error
// (recorded in a).
func swapIPC(a *arena, peer lineIO, mine *Buffer, peerBytes int64) *Buffer {
	if a.err != nil {
		return nil
	}
	h, err := a.d.IPCHandle(mine)
	if a.check(err); a.err != nil {
		return nil
	}
	hs, err := peer.swap(h.String())
	if a.check(err); a.err != nil {
		return nil
	}
	ph, err := ParseIPCHandle(hs)
	if a.check(err); a.err != nil {
		return nil
	}
	m, err := a.d.OpenIPC(ph, peerBytes)
	a.check(err)
	return m
}

// closeIPC ends a pair's run: "done" is swapped, then mapped (the peer's
// memory, may be nil) is unmapped, then "closed" is swapped, so that no
// process unmaps or frees memory the other may still write.
func closeIPC(t *testing.T, a *arena, peer lineIO, mapped *Buffer) {
	t.Helper()
	if _, err := peer.swap("done"); err != nil {
		t.Error(err)
	}
	if mapped != nil {
		a.check(mapped.Free())
	}
	if _, err := peer.swap("closed"); err != nil {
		t.Error(err)
	}
}
