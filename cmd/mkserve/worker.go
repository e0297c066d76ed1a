package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/dist"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/transport"
)

// worldJoinTimeout bounds how long the processes of a world wait for each
// other at start.
var worldJoinTimeout = 5 * time.Minute

// cmdWorker runs one worker rank of a world of processes serving one model
// (`mkserve serve --world-size R --coordinator HOST:PORT` is rank 0): it
// loads the same checkpoint, keeps its share of every MoE layer's experts,
// and mirrors rank 0's steps until rank 0 stops it. SIGINT/SIGTERM stop it
// early (rank 0's next step then fails with an error).
func cmdWorker(args []string, _ io.Reader, stdout io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runWorker(ctx, args, stdout)
}

func runWorker(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("worker")
	model := fs.String("model", "", "the checkpoint directory rank 0 serves")
	backendName := fs.String("backend", "cpu", "compute backend (cpu; a world on cuda needs CUDA IPC, not yet)")
	size := fs.Int("world-size", 0, "processes in the world (rank 0 included)")
	rank := fs.Int("rank", 0, "this worker's rank, 1 … world-size−1")
	coord := fs.String("coordinator", "", "rank 0's host:port")
	listen := fs.String("listen", "127.0.0.1:0", "this rank's own host:port for the other ranks")
	advertise := fs.String("advertise", "", "the address the other ranks dial (default: the listener's)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *model == "":
		return fmt.Errorf("--model is required")
	case *backendName != "cpu":
		return fmt.Errorf("--backend %s: a world of processes runs on the cpu backend for now", *backendName)
	case *size < 2 || *rank < 1 || *rank >= *size:
		return fmt.Errorf("--rank %d of --world-size %d: a worker is rank 1 … world-size−1 of a world of at least 2", *rank, *size)
	case *coord == "":
		return fmt.Errorf("--coordinator is required (rank 0's host:port)")
	}
	comm, err := transport.JoinGRPC(ctx, transport.GRPCConfig{Rank: *rank, Size: *size, Coordinator: *coord,
		Listen: *listen, Advertise: *advertise, JoinTimeout: worldJoinTimeout})
	if err != nil {
		return err
	}
	defer comm.Close()
	be := cpu.New(cpu.Options{EPComm: comm})
	l, err := models.Load(*model, be, models.LoadOptions{Progress: io.Discard})
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Fprintf(stdout, "worker %d of %d: %s loaded, following rank 0 at %s\n", *rank, *size, *model, *coord)
	if err := dist.Work(ctx, comm, l.Model, be); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker %d of %d: stopped by rank 0\n", *rank, *size)
	return nil
}
