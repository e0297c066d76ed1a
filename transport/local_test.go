package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"
)

// payload is what rank src sends rank dst in exchange round: a random
// length (0 included) of values that encode all three plus a random salt.
func payload(r *rand.Rand, round, src, dst int) []float32 {
	n := r.IntN(6)
	if r.IntN(4) == 0 {
		n = 0
	}
	p := make([]float32, n)
	for i := range p {
		p[i] = float32(round*1_000_000+src*1000+dst) + float32(i)/16
	}
	return p
}

func TestLocalAllToAllV(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, R := range []int{1, 2, 3, 5, 8} {
		t.Run(fmt.Sprintf("R%d", R), func(t *testing.T) {
			const rounds = 25
			comms := NewLocalWorld(R)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, R)
			for rank := range R {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[rank] = exchangeRounds(ctx, comms[rank], rank, R, rounds, seed)
				}()
			}
			wg.Wait()
			for rank, err := range errs {
				if err != nil {
					t.Fatalf("rank %d: %v", rank, err)
				}
			}
		})
	}
}

// exchangeRounds runs rounds exchanges on c and checks every value received.
func exchangeRounds(ctx context.Context, c Comm, rank, R, rounds int, seed uint64) error {
	r := rand.New(rand.NewPCG(seed, uint64(rank)))
	if c.Rank() != rank || c.Size() != R {
		return fmt.Errorf("Rank, Size = %d, %d, want %d, %d", c.Rank(), c.Size(), rank, R)
	}
	for round := range rounds {
		send := make([][]float32, R)
		for d := range R {
			send[d] = payload(r, round, rank, d)
		}
		if r.IntN(3) == 0 { // ranks drift apart
			time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
		}
		recv, err := c.AllToAllV(ctx, send)
		if err != nil {
			return err
		}
		// The sender may scribble over its buffers at once.
		for d := range send {
			for i := range send[d] {
				send[d][i] = -1
			}
		}
		if len(recv) != R {
			return fmt.Errorf("round %d: %d recv buffers", round, len(recv))
		}
		for s := range R {
			for i, v := range recv[s] {
				if want := float32(round*1_000_000+s*1000+rank) + float32(i)/16; v != want {
					return fmt.Errorf("round %d: from rank %d value %d = %v, want %v", round, s, i, v, want)
				}
			}
		}
	}
	return nil
}

// Lengths are checked too: every rank records what it sent, and after the
// world finishes each receiver's lengths must match.
func TestLocalAllToAllVLengths(t *testing.T) {
	const R, rounds = 4, 10
	comms := NewLocalWorld(R)
	got := make([][][]int, R) // [dst][round][src] length received
	want := make([][][]int, R)
	for i := range R {
		got[i] = make([][]int, rounds)
		want[i] = make([][]int, rounds)
		for j := range rounds {
			got[i][j] = make([]int, R)
			want[i][j] = make([]int, R)
		}
	}
	lens := make([][][]int, rounds) // [round][src][dst], drawn up front
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for j := range rounds {
		lens[j] = make([][]int, R)
		for s := range R {
			lens[j][s] = make([]int, R)
			for d := range R {
				lens[j][s][d] = r.IntN(50)
				want[d][j][s] = lens[j][s][d]
			}
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, R)
	for rank := range R {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range rounds {
				send := make([][]float32, R)
				for d := range R {
					send[d] = make([]float32, lens[j][rank][d])
				}
				recv, err := comms[rank].AllToAllV(context.Background(), send)
				if err != nil {
					errs[rank] = err
					return
				}
				for s := range R {
					got[rank][j][s] = len(recv[s])
				}
			}
		}()
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", rank, err)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("received lengths %v, want %v", got, want)
	}
}

// A rank that never arrives must turn into an error on the others within
// their deadline, and the world stays aborted afterwards.
func TestLocalMissingRank(t *testing.T) {
	const R = 3
	comms := NewLocalWorld(R)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, R)
	for rank := range R - 1 { // rank 2 never calls
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[rank] = comms[rank].AllToAllV(ctx, [][]float32{{1}, {2}, {3}})
		}()
	}
	wg.Wait()
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %v to give up", el)
	}
	sawDeadline := false
	for rank := range R - 1 {
		if errs[rank] == nil {
			t.Fatalf("rank %d: no error with rank 2 missing", rank)
		}
		if errors.Is(errs[rank], context.DeadlineExceeded) && strings.Contains(errs[rank].Error(), "waiting for rank 2") {
			sawDeadline = true
		}
	}
	if !sawDeadline {
		t.Fatalf("no error names the missing rank: %v", errs)
	}
	// Late arrival and any later call fail at once.
	for rank := range R {
		_, err := comms[rank].AllToAllV(context.Background(), make([][]float32, R))
		if !errors.Is(err, ErrAborted) {
			t.Fatalf("rank %d after abort: %v, want ErrAborted", rank, err)
		}
	}
}

func TestLocalBadCalls(t *testing.T) {
	t.Run("wrong number of buffers", func(t *testing.T) {
		comms := NewLocalWorld(2)
		_, err := comms[0].AllToAllV(context.Background(), make([][]float32, 3))
		if err == nil || !strings.Contains(err.Error(), "3 send buffers") {
			t.Fatalf("err = %v", err)
		}
		if _, err := comms[1].AllToAllV(context.Background(), make([][]float32, 2)); !errors.Is(err, ErrAborted) {
			t.Fatalf("peer after abort: %v, want ErrAborted", err)
		}
	})
	t.Run("concurrent calls on one rank", func(t *testing.T) {
		comms := NewLocalWorld(2)
		c := comms[0].(*localComm)
		done := make(chan error)
		go func() {
			_, err := c.AllToAllV(context.Background(), make([][]float32, 2))
			done <- err
		}()
		for !c.busy.Load() {
			time.Sleep(time.Millisecond)
		}
		_, err := c.AllToAllV(context.Background(), make([][]float32, 2))
		if err == nil || !strings.Contains(err.Error(), "concurrently") {
			t.Fatalf("second call: %v", err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, ErrAborted) {
				t.Fatalf("first call: %v, want ErrAborted", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("first call still blocked after abort")
		}
	})
	t.Run("empty world", func(t *testing.T) {
		if w := NewLocalWorld(0); w != nil {
			t.Fatalf("NewLocalWorld(0) = %v", w)
		}
	})
}

func BenchmarkLocalAllToAllV(b *testing.B) {
	const R, n = 4, 64 * 1024 // 256 KiB to each peer
	comms := NewLocalWorld(R)
	bufs := make([][][]float32, R)
	for r := range R {
		bufs[r] = make([][]float32, R)
		for d := range R {
			bufs[r][d] = make([]float32, n)
		}
	}
	b.SetBytes(int64(R * R * n * 4))
	b.ResetTimer()
	var wg sync.WaitGroup
	for r := range R {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < b.N; i++ {
				if _, err := comms[r].AllToAllV(context.Background(), bufs[r]); err != nil {
					panic(err)
				}
			}
		}()
	}
	wg.Wait()
}
