#!/usr/bin/env bash
# scripts/bench_serve_gpu.sh MKSERVE [PRECISION] — `mkserve bench serve`
# against `mkserve serve --backend cuda --precision PRECISION` (default
# exact; fast runs decode steps as CUDA graphs) on the default model, with
# the settings of the CPU run in docs/PERF.md (64 prompts at concurrency 16,
# 32 at 1; 64 random input words, 64 output tokens). Run by scripts/device.sh.
# WORLD=R (R ≥ 2) serves with a world of R processes: rank 0 and R−1
# `mkserve worker` processes, one per GPU (rank % GPUs), every MoE layer's
# experts split among them; WORLD_TRANSPORT=nccl sums their MoE outputs with
# NCCL instead of the IPC all-reduce kernel. SERVE_ARGS adds flags to the
# server (e.g. --sync-steps: overlapped decode off), BENCH_ARGS to both
# load runs (e.g. --temperature 0.6 --top-k 20: the requests' sampling).
set -uo pipefail
MK=${1:-.dev/mkserve}
PREC=${2:-exact}
WORLD=${WORLD:-1}
WT=${WORLD_TRANSPORT:-ipc}
read -r -a extra <<<"${SERVE_ARGS:-}"
read -r -a bargs <<<"${BENCH_ARGS:-}"
echo "SERVE precision $PREC world $WORLD transport $WT ${SERVE_ARGS:-}"
world=()
wpids=()
if [ "$WORLD" -gt 1 ]; then
	world=(--world-size "$WORLD" --coordinator 127.0.0.1:29511 --world-transport "$WT")
	for r in $(seq 1 $((WORLD - 1))); do
		"$MK" worker --backend cuda --precision "$PREC" --model models/default "${world[@]}" --rank "$r" &
		wpids+=($!)
	done
fi
"$MK" serve --backend cuda --precision "$PREC" --http-addr 127.0.0.1:8199 --grpc-addr 127.0.0.1:50199 --log-level warn "${world[@]}" "${extra[@]}" &
pid=$!
trap 'kill $pid "${wpids[@]}" 2>/dev/null; wait $pid "${wpids[@]}" 2>/dev/null' EXIT
healthy() { python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8199/health", timeout=2)' 2>/dev/null; }
for _ in $(seq 1 120); do
	healthy && break
	kill -0 $pid 2>/dev/null || { echo "bench_serve_gpu: the server exited"; exit 1; }
	sleep 0.5
done
healthy || { echo "bench_serve_gpu: not ready after 60 s"; exit 1; }
rc=0
echo "SERVE concurrency 16"
"$MK" bench serve --base-url http://127.0.0.1:8199 --num-prompts 64 --max-concurrency 16 \
	--random-input-len 64 --random-output-len 64 --seed 1 --json "${bargs[@]}" || rc=1
echo "SERVE concurrency 1"
"$MK" bench serve --base-url http://127.0.0.1:8199 --num-prompts 32 --max-concurrency 1 \
	--random-input-len 64 --random-output-len 64 --seed 2 --json "${bargs[@]}" || rc=1
exit $rc
