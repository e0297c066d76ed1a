#!/usr/bin/env bash
# scripts/ncu_step.sh [CONFIG] [BATCH] — the GPU time of every kernel of one
# decode step under ncu, summed per kernel name for the last forward pass
# (scripts/ncu_step.py), with µs per layer. On the GPU machine, after
# `MK_MODE=none bash scripts/device.sh` (the library and .dev/mkserve):
#   bash scripts/ncu_step.sh configs/shapes/qwen3-30b-a3b-8l 1
# Eager steps (--graphs=false: one launch per kernel, the graph's kernels
# one by one), clocks and caches as the application leaves them; GRAPHS=1
# profiles the captured graphs' kernel nodes instead (`--graph-profiling
# node`: the kernels a served decode step runs, which at small batches
# differ from the eager ones, e.g. the fused MoE kernel). The report and
# its CSV stay in $OUT (default .dev/out). BYTES=1 also collects each
# kernel's DRAM reads (dram__bytes_read.sum), printed as MB per call and GB/s.
# CTX sets the context (default 1024).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CFG=${1:-configs/shapes/qwen3-30b-a3b-8l}
B=${2:-1}
CTX=${CTX:-1024}  # the context of every sequence
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
NCU=$(command -v ncu) || { echo "ncu_step.sh: ncu not found on PATH"; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
GFLAGS=(--graphs=false)
NFLAGS=()
if [ "${GRAPHS:-0}" = 1 ]; then GFLAGS=(--graphs=true); NFLAGS=(--graph-profiling node); fi
MET=gpu__time_duration.sum
[ "${BYTES:-0}" = 1 ] && MET=$MET,dram__bytes_read.sum
"$NCU" --clock-control none --cache-control none "${NFLAGS[@]}" --metrics "$MET" -f -o "$OUT/step" \
	.dev/mkserve bench model --config "$CFG" --batch "$B" --context "$CTX" --prefill 0 --steps 1 "${GFLAGS[@]}" \
	>"$OUT/ncu_run.log" 2>&1 || { echo "ncu_step.sh: the profiled run failed:"; tail -20 "$OUT/ncu_run.log"; exit 1; }
"$NCU" --import "$OUT/step.ncu-rep" --csv --page raw >"$OUT/step.csv" || exit 1
layers=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['num_hidden_layers'])" "$CFG/config.json")
python3 scripts/ncu_step.py "$OUT/step.csv" --layers "$layers"
