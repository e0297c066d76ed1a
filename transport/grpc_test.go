package transport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// freeAddr returns a loopback address with a port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// joinAll joins R ranks of one world on loopback.
func joinAll(t *testing.T, R int) []*GRPCComm { return LoopbackForTest(t, R) }

// TestGRPCAllToAllV runs the same random exchanges as the in-process world
// over gRPC between R ranks bootstrapped through a coordinator.
func TestGRPCAllToAllV(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for _, R := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprintf("R%d", R), func(t *testing.T) {
			comms := joinAll(t, R)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make([]error, R)
			for rank := range R {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[rank] = exchangeRounds(ctx, comms[rank], rank, R, 20, seed)
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

// TestGRPCLargePayload moves 8 MiB per pair in one exchange.
func TestGRPCLargePayload(t *testing.T) {
	comms := joinAll(t, 2)
	big := make([]float32, 2<<20)
	for i := range big {
		big[i] = float32(i % 977)
	}
	var wg sync.WaitGroup
	got := make([][][]float32, 2)
	errs := make([]error, 2)
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			send := [][]float32{nil, nil}
			send[1-rank] = big
			got[rank], errs[rank] = comms[rank].AllToAllV(context.Background(), send)
		}()
	}
	wg.Wait()
	for rank := range 2 {
		if errs[rank] != nil {
			t.Fatal(errs[rank])
		}
		r := got[rank][1-rank]
		if len(r) != len(big) || r[12345] != big[12345] || r[len(r)-1] != big[len(big)-1] {
			t.Fatalf("rank %d received %d values, want %d intact", rank, len(r), len(big))
		}
	}
}

// TestGRPCBootstrapErrors: disagreeing sizes, a rank joining twice, a world
// that never completes, bad ranks.
func TestGRPCBootstrapErrors(t *testing.T) {
	ctx := context.Background()
	if _, err := JoinGRPC(ctx, GRPCConfig{Rank: 2, Size: 2, Coordinator: "127.0.0.1:1"}); err == nil {
		t.Error("rank 2 of 2: no error")
	}
	if _, err := JoinGRPC(ctx, GRPCConfig{Rank: 0, Size: 1}); err == nil {
		t.Error("no coordinator address: no error")
	}

	// Rank 1 of 2 waits for a rank 0 that never comes.
	coord := freeAddr(t)
	start := time.Now()
	_, err := JoinGRPC(ctx, GRPCConfig{Rank: 1, Size: 2, Coordinator: coord, JoinTimeout: 300 * time.Millisecond})
	if err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("missing coordinator: %v after %v", err, time.Since(start))
	}

	// The coordinator (size 3) with a joiner that says size 2.
	coord = freeAddr(t)
	var wg sync.WaitGroup
	var c0 *GRPCComm
	var err0 error
	wg.Add(1)
	go func() {
		defer wg.Done()
		c0, err0 = JoinGRPC(ctx, GRPCConfig{Rank: 0, Size: 3, Coordinator: coord, JoinTimeout: time.Second})
	}()
	_, err = JoinGRPC(ctx, GRPCConfig{Rank: 1, Size: 2, Coordinator: coord, JoinTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "coordinator has 3") {
		t.Errorf("size mismatch: %v, want an error naming the coordinator's 3 ranks", err)
	}
	wg.Wait()
	if err0 == nil {
		c0.Close()
		t.Error("coordinator of an incomplete world: no error")
	}
}

// TestGRPCAbort: when one rank closes, the others' next exchange fails with
// ErrAborted instead of hanging, and every later call fails too.
func TestGRPCAbort(t *testing.T) {
	comms := joinAll(t, 3)
	comms[2].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for rank := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[rank] = comms[rank].AllToAllV(ctx, [][]float32{{1}, {2}, {3}})
		}()
	}
	wg.Wait()
	for rank, err := range errs {
		if !errors.Is(err, ErrAborted) {
			t.Errorf("rank %d: %v, want ErrAborted", rank, err)
		}
		if _, err := comms[rank].AllToAllV(ctx, [][]float32{nil, nil, nil}); !errors.Is(err, ErrAborted) {
			t.Errorf("rank %d after abort: %v, want ErrAborted", rank, err)
		}
	}
	if ctx.Err() != nil {
		t.Error("the exchange waited for the context instead of failing on the abort")
	}
}

// FuzzDecodePut: any bytes either decode to a message that encodes back to
// the same bytes, or are refused; nothing panics.
func FuzzDecodePut(f *testing.F) {
	f.Add(encodePut(1, 7, []float32{1, 2.5, -3}))
	f.Add(encodePut(0, 0, nil))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		src, seq, data, err := decodePut(b)
		if err != nil {
			return
		}
		if src < 0 || src > 1<<32-1 {
			t.Fatalf("source %d out of the u32 range", src)
		}
		if again := encodePut(src, seq, data); string(again) != string(b) {
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	})
}

// BenchmarkGRPCAllToAllV times one exchange between two ranks over loopback
// gRPC: a decode step's broadcast (dist) is one such exchange of a few KB.
func BenchmarkGRPCAllToAllV(b *testing.B) {
	for _, n := range []int{64, 16 << 10} { // floats per peer
		b.Run(fmt.Sprintf("floats=%d", n), func(b *testing.B) {
			comms := LoopbackForTest(b, 2)
			send := [][]float32{nil, make([]float32, n)}
			done := make(chan error, 1)
			go func() {
				empty := make([][]float32, 2)
				for range b.N {
					if _, err := comms[1].AllToAllV(context.Background(), empty); err != nil {
						done <- err
						return
					}
				}
				done <- nil
			}()
			b.ResetTimer()
			for range b.N {
				if _, err := comms[0].AllToAllV(context.Background(), send); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestGRPCLastExchangeThenClose: a rank that finishes an exchange and
// closes at once (dist's leader after its stop message) still delivers its
// part: the peer's exchange returns the data, not the abort that follows.
func TestGRPCLastExchangeThenClose(t *testing.T) {
	for i := range 20 {
		comms := joinAll(t, 2)
		got := make(chan error, 1)
		go func() {
			recv, err := comms[1].AllToAllV(context.Background(), [][]float32{{5}, nil})
			if err == nil && (len(recv[0]) != 1 || recv[0][0] != float32(i)) {
				err = fmt.Errorf("received %v, want [%d]", recv[0], i)
			}
			got <- err
		}()
		if _, err := comms[0].AllToAllV(context.Background(), [][]float32{nil, {float32(i)}}); err != nil {
			t.Fatal(err)
		}
		comms[0].Close()
		if err := <-got; err != nil {
			t.Fatalf("round %d: the peer's exchange: %v", i, err)
		}
	}
}
