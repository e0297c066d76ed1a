package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/mkserve/mkserve/backend/cuda"
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
	backendName := fs.String("backend", "cpu", "compute backend (cpu or cuda: as rank 0's; on cuda this rank opens GPU rank % GPUs)")
	precision := fs.String("precision", "exact", "the cuda backend's precision profile (exact or fast): as rank 0's")
	moePath := fs.String("moe-path", "", "the cuda backend's MoE path (grouped; empty reads MKSERVE_MOE_PATH): as rank 0's")
	worldTransport := fs.String("world-transport", "ipc", "cuda: how the ranks sum their MoE outputs, ipc or nccl: as rank 0's")
	cpuWeights := fs.String("cpu-weights", "auto", "cpu: how matrices are held (auto, stored or q8): as rank 0's")
	cudaWeights := fs.String("cuda-weights", "auto", "cuda: how an MXFP4 checkpoint's experts are held (auto, stored or fp4): as rank 0's")
	kvDtype := fs.String("kv-cache-dtype", "auto", "cpu: the KV cache's element type (auto or bf16): as rank 0's")
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
	case *backendName != "cpu" && *backendName != "cuda":
		return fmt.Errorf("--backend %s: a world of processes runs on the cpu or cuda backend", *backendName)
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
	spec := backendSpec{name: *backendName, ep: 1, precision: *precision, moePath: *moePath, cpuWeights: *cpuWeights, cudaWeights: *cudaWeights,
		kvDtype: *kvDtype, world: comm, worldTransport: *worldTransport}
	if err := worldAgree(ctx, comm, worldProfile(spec)); err != nil {
		return err
	}
	be, err := newBackend(spec)
	if err != nil {
		return err
	}
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

// worldProfile is what every rank of a world must agree on: the ranks are
// replicas whose arithmetic must match bit for bit, or they would route
// the same token to different experts.
func worldProfile(s backendSpec) string {
	if s.name == "cpu" {
		w, kv := s.cpuWeights, s.kvDtype
		if w == "" {
			w = "auto"
		}
		if kv == "" {
			kv = "auto"
		}
		return "backend cpu, weights " + w + ", kv cache " + kv
	}
	precision, moePath, worldTransport := s.precision, s.moePath, s.worldTransport
	if precision == "" {
		precision = "exact"
	}
	if moePath == "" {
		moePath = os.Getenv(cuda.MoEPathEnv)
	}
	if moePath == "" {
		moePath = "grouped" // cuda's default
	}
	if worldTransport == "" {
		worldTransport = "ipc"
	}
	weights := s.cudaWeights
	if weights == "" {
		weights = "auto"
	}
	return fmt.Sprintf("backend %s, precision %s, moe path %q, world transport %s, weights %s", s.name, precision, moePath, worldTransport, weights)
}

// worldAgree checks, with every rank of the world, that all have the same
// profile; the error names the first rank that differs.
func worldAgree(ctx context.Context, comm transport.Comm, profile string) error {
	ctx, cancel := context.WithTimeout(ctx, worldJoinTimeout)
	defer cancel()
	// Every rank sends the same length (the exchange wants it), zero-padded.
	const size = 256
	if len(profile) > size {
		return fmt.Errorf("world profile %q longer than %d bytes", profile, size)
	}
	msg := make([]byte, size)
	copy(msg, profile)
	all, err := transport.AllGatherBytes(ctx, comm, msg)
	if err != nil {
		return fmt.Errorf("rank %d: exchanging the world's profile: %w", comm.Rank(), err)
	}
	for r, b := range all {
		if p := strings.TrimRight(string(b), "\x00"); p != profile {
			return fmt.Errorf("rank %d runs %s, rank %d runs %s: every rank of a world must run the same backend, precision and MoE path",
				comm.Rank(), profile, r, p)
		}
	}
	return nil
}
