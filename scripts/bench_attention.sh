#!/usr/bin/env bash
# scripts/bench_attention.sh MKSERVE — prefill flash attention (the CLI
# contract of the CUDA-backend issue) and its PyTorch baseline, SDPA with the
# flash and cuDNN backends, on the same shapes, one after the other. Run by
# scripts/device.sh (step attention).
set -uo pipefail
MK=${1:-.dev/mkserve}
SHAPE=(--seq 1024,4096,16384 --heads 32 --kv-heads 8 --head-dim 128 --causal)
rc=0
"$MK" bench attention "${SHAPE[@]}" --json || rc=1
"$MK" bench attention --seq 4096 --heads 16 --kv-heads 16 --head-dim 192 --v-head-dim 128 --causal --json || rc=1 # MLA dims
PYTHONUNBUFFERED=1 python3 scripts/bench_attention_torch.py "${SHAPE[@]}" --json || rc=1
exit $rc
