// Command mkserve is the MoE inference server and its tools.
//
//	mkserve serve    [--config FILE] [--model DIR] [--http-addr A] [--grpc-addr A] ...
//	mkserve logits   --model DIR --ids 3,17,42 [--ep R]
//	mkserve generate --model DIR --prompt TEXT --max-tokens N [--ep R]
//	mkserve tokenize --tokenizer FILE | --model DIR   (text on stdin)
//	mkserve bench moe --hidden H --intermediate I --experts E --topk K --routing softmax|grouped --tokens 1,16,... [--ranks R] [--path fused|grouped] [--shared-experts N] [--json]
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/mkserve/mkserve/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// command is one subcommand: it returns an error for the one-line message.
type command struct {
	name, summary string
	run           func(args []string, stdin io.Reader, stdout io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "serve the OpenAI-compatible HTTP API, gRPC and /metrics", cmdServe},
		{"worker", "run a worker rank of a world of processes serving one model (serve --world-size)", cmdWorker},
		{"logits", "print float32 logits of every position as JSON", cmdLogits},
		{"generate", "greedy-decode a prompt and print the text", cmdGenerate},
		{"run-batch", "run an OpenAI batch file (JSONL requests in, JSONL responses out) offline, with serve's settings", cmdRunBatch},
		{"chat", "chat in the terminal with a running server, or --model DIR served in process (each stdin line a turn; the reply streams)", cmdChat},
		{"tokenize", "print the token ids of stdin as JSON", cmdTokenize},
		{"inspect", "print a checkpoint's parameters and the memory it takes served (cpu weight forms, KV cache a token), from its headers alone", cmdInspect},
		{"bench", "benchmarks: serve (load test of a running server), model (whole-model prefill/decode), attention, moe, ring (GPU kernels)", cmdBench},
		{"version", "print the build: module version, revision, commit time, Go version", cmdVersion},
	}
}

// cmdVersion prints the build information (GET /version serves the same).
func cmdVersion(args []string, _ io.Reader, stdout io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("version takes no arguments, got %q", args)
	}
	_, err := fmt.Fprintln(stdout, version.Get())
	return err
}
