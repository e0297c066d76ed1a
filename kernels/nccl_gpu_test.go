package kernels

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/mkserve/mkserve/transport"
)

// NCCL between two processes, one GPU each: this test binary re-executes
// itself (TestNCCLChild) as rank 1 on device 1, the parent is rank 0 on
// device 0. They form a gRPC world (transport.JoinGRPC on 127.0.0.1),
// NewNCCLComm shares rank 0's NCCL id over it, and both run the same
// sequence of collectives on random data drawn from the seed the parent
// passes, so each rank computes the expected result of its own side.

// ncclRunEnv carries the JSON of an ncclRun to the child.
const ncclRunEnv = "MKSERVE_TEST_NCCL"

// requireNCCLEnv = 1 makes a missing NCCL fail TestNCCL instead of skipping it.
const requireNCCLEnv = "MKSERVE_REQUIRE_NCCL"

// ncclRun is what both processes share.
type ncclRun struct {
	Coord       string // rank 0's gRPC coordinator address
	Seed        uint64
	ChildDevice int
}

// TestNCCL: all-reduce (sum, f32: exactly the float32 sum of the two
// ranks' values, and within 1e-6 of the float64 sum), all-to-all-v with
// random row counts including zeros (rows bit for bit), and all-gather
// (bit for bit), over two processes on two GPUs; unwritten guard elements
// after each output must stay NaN.
func TestNCCL(t *testing.T) {
	g := testGPU(t)
	ndev, err := DeviceCount()
	if err != nil {
		t.Fatal(err)
	}
	if ndev < 2 {
		t.Skipf("needs 2 GPUs, this machine has %d: NCCL refuses two ranks of one communicator on one GPU "+
			"(ncclInvalidUsage, duplicate GPU)", ndev)
	}
	var ver int
	err = g.Do(func(d *Device) error {
		var err error
		ver, err = d.OpenNCCL()
		return err
	})
	if err != nil {
		if errors.Is(err, ErrNCCLUnavailable) && os.Getenv(requireNCCLEnv) != "1" {
			t.Skipf("skipping: no NCCL on this machine (%s=1 fails instead): %v", requireNCCLEnv, err)
		}
		t.Fatal(err)
	}
	p, _ := NCCLLibraryPath()
	t.Logf("NCCL %d from %s", ver, p)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	run := ncclRun{Coord: l.Addr().String(), Seed: uint64(time.Now().UnixNano()), ChildDevice: 1}
	l.Close()
	t.Logf("seed %d, coordinator %s", run.Seed, run.Coord)
	js, err := json.Marshal(run)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The child's own timeout ends it should this process die without killing it.
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run", "^TestNCCLChild$", "-test.v", "-test.timeout=150s")
	cmd.Env = append(os.Environ(), ncclRunEnv+"="+string(js), fmt.Sprintf("%s=%d", testDeviceEnv, run.ChildDevice))
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// The child's log comes out however this rank ends; a child still
	// running 30 s after this rank ended (waiting in NCCL for a rank that
	// failed) is killed.
	defer func() {
		var err error
		select {
		case err = <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			err = fmt.Errorf("still running 30 s after rank 0 ended, killed (%v)", <-exited)
		}
		t.Logf("child (rank 1, device %d):\n%s", run.ChildDevice, log.String())
		if err != nil {
			t.Errorf("child process: %v", err)
		}
	}()
	runNCCLRank(t, g, run, 0)
}

// TestNCCLChild is rank 1 of TestNCCL (skipped when run on its own).
func TestNCCLChild(t *testing.T) {
	js := os.Getenv(ncclRunEnv)
	if js == "" {
		t.Skip("the child of TestNCCL; run by it")
	}
	var run ncclRun
	if err := json.Unmarshal([]byte(js), &run); err != nil {
		t.Fatal(err)
	}
	g := testGPU(t) // device run.ChildDevice: the parent set testDeviceEnv
	runNCCLRank(t, g, run, 1)
}

// ncclData is rank's random input of one collective (never zero, never
// NaN), the same in both processes.
func ncclData(run ncclRun, tag, rank, n int) []float32 {
	r := rand.New(rand.NewPCG(run.Seed, uint64(tag)<<8|uint64(rank)))
	return randF32(r, n, 1)
}

// ncclA2ACounts draws the all-to-all-v row counts cnt[src][dst] of one
// case: a third of them zero, the rest in [1, maxRows]; zero lists pairs
// forced to zero.
func ncclA2ACounts(run ncclRun, tag, maxRows int, zero [][2]int) [2][2]int {
	r := rand.New(rand.NewPCG(run.Seed, uint64(tag)<<8|0xff))
	var cnt [2][2]int
	for s := range 2 {
		for d := range 2 {
			if maxRows > 0 && r.IntN(3) != 0 {
				cnt[s][d] = 1 + r.IntN(maxRows)
			}
		}
	}
	for _, z := range zero {
		cnt[z[0]][z[1]] = 0
	}
	return cnt
}

// checkExact fails unless got[:len(want)] equals want bit for bit and the
// guard elements after it are still NaN (never written).
func checkExact(t *testing.T, name string, got, want []float32) {
	t.Helper()
	for i, w := range want {
		if math.Float32bits(got[i]) != math.Float32bits(w) {
			t.Errorf("%s: element %d of %d is %v, want %v", name, i, len(want), got[i], w)
			return
		}
	}
	for i := len(want); i < len(got); i++ {
		if !math.IsNaN(float64(got[i])) {
			t.Errorf("%s: guard element %d (after %d) was written: %v", name, i, len(want), got[i])
			return
		}
	}
}

const ncclGuard = 5 // NaN elements after every output

// runNCCLRank is one process's rank me: joins the world and NCCL, runs
// every collective twice (fresh data each round) and checks its side.
func runNCCLRank(t *testing.T, g *GPU, run ncclRun, me int) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	world, err := transport.JoinGRPC(ctx, transport.GRPCConfig{Rank: me, Size: 2, Coordinator: run.Coord,
		JoinTimeout: 45 * time.Second})
	if err != nil {
		t.Fatalf("rank %d: joining the gRPC world: %v", me, err)
	}
	defer world.Close()
	start := time.Now()
	nc, err := NewNCCLComm(ctx, g, world)
	if err != nil {
		t.Fatalf("rank %d: %v", me, err)
	}
	t.Logf("rank %d: NCCL %d communicator in %v (NCCL_NVLS_ENABLE=%q)", me, nc.Version(), time.Since(start),
		os.Getenv(ncclNVLSEnv))
	if nc.Rank() != me || nc.Size() != 2 {
		t.Errorf("communicator rank %d of %d, want %d of 2", nc.Rank(), nc.Size(), me)
	}
	closed := false
	defer func() {
		if !closed { // a failed rank: the peer may never come, so do not wait for it
			if err := nc.Abort(); err != nil {
				t.Errorf("rank %d: Abort: %v", me, err)
			}
		}
	}()

	reduces := []struct {
		name    string
		n       int
		inPlace bool
	}{
		{"n1", 1, false}, {"n4097_in_place", 4097, true}, {"n1M+3", 1<<20 + 3, false}, {"n65536_in_place", 1 << 16, true},
	}
	a2as := []struct {
		name    string
		h       int // floats per row
		maxRows int
		zero    [][2]int
	}{
		{"random_H7", 7, 40, nil},
		{"peer0_to_1_zero_H64", 64, 300, [][2]int{{0, 1}}},
		{"self_zero_H33", 33, 100, [][2]int{{0, 0}, {1, 1}}},
		{"only_self_H16", 16, 50, [][2]int{{0, 1}, {1, 0}}},
		{"all_zero", 8, 0, nil},
		{"large_H1024", 1024, 2000, nil},
		{"H1_many", 1, 100000, nil},
	}
	gathers := []int{1, 1000, 65537}

	tag := 0
	for round := range 2 {
		onGPU(t, g, func(a *arena) {
			s, err := a.d.NewStream()
			a.check(err)
			if s != nil {
				defer s.Destroy()
			}
			// stream picks the created stream for odd tags, the default one for even.
			stream := func() *Stream {
				if tag%2 == 1 {
					return s
				}
				return nil
			}
			for _, c := range reduces {
				tag++
				if a.err != nil {
					return
				}
				name := fmt.Sprintf("round %d all-reduce %s (rank %d)", round, c.name, me)
				x := [2][]float32{ncclData(run, tag, 0, c.n), ncclData(run, tag, 1, c.n)}
				want := make([]float32, c.n)
				ref := make([]float64, c.n)
				for i := range want {
					want[i] = x[0][i] + x[1][i]
					ref[i] = float64(x[0][i]) + float64(x[1][i])
				}
				send := put(a, append(append([]float32(nil), x[me]...), f32Fill(ncclGuard, float32(math.NaN()))...))
				recv := send
				if !c.inPlace {
					recv = put(a, f32Fill(c.n+ncclGuard, float32(math.NaN())))
				}
				st := stream()
				a.check(nc.AllReduceSumF32(a.d, st, send, recv, c.n))
				a.check(st.Sync(a.d))
				got := get[float32](a, recv, c.n+ncclGuard)
				if a.err != nil {
					return
				}
				checkClose(t, name, got[:c.n], ref, 1e-6)
				checkExact(t, name, got, want)
			}
			for _, c := range a2as {
				tag++
				if a.err != nil {
					return
				}
				name := fmt.Sprintf("round %d all-to-all-v %s (rank %d)", round, c.name, me)
				cnt := ncclA2ACounts(run, tag, c.maxRows, c.zero)
				var data [2][]float32
				for p := range 2 {
					data[p] = ncclData(run, tag, p, (cnt[p][0]+cnt[p][1])*c.h)
				}
				// What rank me receives: from each p, the rows p packed for me.
				var want []float32
				for p := range 2 {
					off := 0
					if me == 1 {
						off = cnt[p][0]
					}
					want = append(want, data[p][off*c.h:(off+cnt[p][me])*c.h]...)
				}
				sendRows := []int{cnt[me][0], cnt[me][1]}
				recvRows := []int{cnt[0][me], cnt[1][me]}
				var send, recv *Buffer
				if len(data[me]) > 0 {
					send = put(a, data[me])
				}
				if len(want) > 0 {
					recv = put(a, f32Fill(len(want)+ncclGuard, float32(math.NaN())))
				}
				st := stream()
				a.check(nc.AllToAllV(a.d, st, send, sendRows, recv, recvRows, 4*int64(c.h)))
				a.check(st.Sync(a.d))
				t.Logf("%s: counts [src][dst] %v, %d rows in", name, cnt, len(want)/c.h)
				if recv == nil || a.err != nil {
					continue
				}
				checkExact(t, name, get[float32](a, recv, len(want)+ncclGuard), want)
			}
			for _, n := range gathers {
				tag++
				if a.err != nil {
					return
				}
				name := fmt.Sprintf("round %d all-gather n%d (rank %d)", round, n, me)
				x := [2][]float32{ncclData(run, tag, 0, n), ncclData(run, tag, 1, n)}
				want := append(append([]float32(nil), x[0]...), x[1]...)
				send := put(a, x[me])
				recv := put(a, f32Fill(2*n+ncclGuard, float32(math.NaN())))
				st := stream()
				a.check(nc.AllGather(a.d, st, send, recv, 4*int64(n)))
				a.check(st.Sync(a.d))
				got := get[float32](a, recv, 2*n+ncclGuard)
				if a.err == nil {
					checkExact(t, name, got, want)
				}
			}
			a.check(nc.Check(a.d))
		})
	}
	if err := nc.Close(); err != nil {
		t.Errorf("rank %d: Close: %v", me, err)
	}
	closed = true
	if err := nc.Close(); err != nil {
		t.Errorf("rank %d: a second Close: %v", me, err)
	}
}
