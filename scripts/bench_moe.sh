#!/usr/bin/env bash
# scripts/bench_moe.sh MKSERVE — `mkserve bench moe` (router + routing +
# grouped expert GEMMs + combine) on the DeepSeek-V3, Qwen3-30B-A3B and
# Mixtral-8x7B layer shapes, then the PyTorch per-expert loop with the
# matmul and copy ceilings (scripts/bench_moe_torch.py), then that loop over
# 1 and 8 emulated expert-parallel ranks on the Qwen3-30B-A3B shape
# (baseline (b) of the fused path). Run by scripts/device.sh.
set -uo pipefail
MK=${1:-.dev/mkserve}
T=1,16,64,256,1024,4096,16384
rc=0
echo "MOE deepseek_v3"
"$MK" bench moe --hidden 7168 --intermediate 2048 --experts 256 --topk 8 --routing grouped --tokens $T --ranks 1 --json || rc=1
echo "MOE qwen3_30b_a3b"
"$MK" bench moe --hidden 2048 --intermediate 768 --experts 128 --topk 8 --routing softmax --tokens $T --ranks 1 --json || rc=1
echo "MOE mixtral_8x7b"
"$MK" bench moe --hidden 4096 --intermediate 14336 --experts 8 --topk 2 --routing softmax --tokens $T --ranks 1 --json || rc=1
PYTHONUNBUFFERED=1 python3 scripts/bench_moe_torch.py || rc=1
# Baseline (b) of the fused path over emulated expert-parallel ranks (issue
# #5): the same layer in eager PyTorch over R ranks on this GPU, the
# all-to-all as copies (torch moe_ep / moe_ep_check lines; docs/PERF.md).
PYTHONUNBUFFERED=1 python3 scripts/bench_moe_torch.py --shapes qwen3_30b_a3b --ranks 1,8 --tokens 1,16,256,1024,4096 || rc=1
exit $rc
