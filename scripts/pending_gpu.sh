#!/usr/bin/env bash
# scripts/pending_gpu.sh — work the thirty-sixth pass wrote after its device
# time ran out, to run first in the next pass. Carry .dev/device.tar.xz
# (make device-bins) and this script; about 6 minutes.
#
# The walking grid of the decode tiles' expert GEMMs (moe_gemm_walk_kernel,
# opt-in: MK_MOE_WALK=1) with items taken in runs of consecutive numbers
# (MK_MOE_WALK_RUN=R, one atomic a run) and, with MK_MOE_WALK_FIT=1, the
# grid sized so that every CTA's share is ⌈items / slots⌉ items.
# Written before: under ncu, equal static runs of 3 (DeepSeek-V3's GEMM2,
# 299 CTAs) and 4 (Mixtral's GEMM1, 224 CTAs) read 3.74 and 3.80 TB/s
# against 3.34 and 3.60 with one CTA per item, but in graph replays the
# static runs lost to start skew under programmatic launch, and dynamic
# single items kept the old rates. Runs taken dynamically should keep
# both: expected DeepSeek-V3's one-token layer 0.199 → ~0.192 ms (86.5 % of
# HBM on its experts' bytes) and Mixtral's 0.196 → ~0.189 ms (88 %), with
# `run3fit` the likeliest; Qwen3 at one token unchanged (fewer items than
# slots); 256 tokens on DeepSeek-V3 (28 672 items) must not lose as the
# static runs did (+25 %). Make the best variant the default only if it is
# level or faster everywhere, layers and decode steps.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -iE "error" "$OUT/build.log" | head -30; exit 1; }
echo "built t=${SECONDS}s"
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1 PATH="$PATH:/usr/local/cuda/bin"
for v in "" "MK_MOE_WALK_RUN=3" "MK_MOE_WALK_RUN=4 MK_MOE_WALK_FIT=1"; do
	# shellcheck disable=SC2086
	(cd kernels && env $v timeout 200 ../.dev/kernels.test -test.v -test.count=1 -test.run '^TestMoEWalk$' >"$OUT/walk_test.log" 2>&1)
	echo "TestMoEWalk [$v] rc=$? t=${SECONDS}s"; grep -E "^\s*(--- FAIL|FAIL|ok)|differ|panic" "$OUT/walk_test.log" | head -6
done
(cd kernels && MK_MOE_WALK=1 MK_MOE_WALK_RUN=3 MK_MOE_WALK_FIT=1 timeout 200 ../.dev/kernels.test -test.count=1 -test.run '^Test(MoEExperts|MoERouteExperts)$' >"$OUT/moe_walk_on.log" 2>&1)
echo "MoE tests with the walk on (runs of 3, fit) rc=$? t=${SECONDS}s"; grep -E "^(--- FAIL|FAIL|ok)|panic" "$OUT/moe_walk_on.log" | head -12
declare -A F
F[deepseek_v3]="--hidden 7168 --intermediate 2048 --experts 256 --topk 8 --routing grouped"
F[mixtral_8x7b]="--hidden 4096 --intermediate 14336 --experts 8 --topk 2 --routing softmax"
for s in deepseek_v3 mixtral_8x7b; do
	for v in "MK_MOE_WALK=0" "MK_MOE_WALK=1 MK_MOE_WALK_RUN=3 MK_MOE_WALK_FIT=1"; do
		# shellcheck disable=SC2086
		env $v timeout 100 ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum \
			.dev/mkserve bench moe --path grouped ${F[$s]} --tokens 1 --iters 1 --graph=false --check-rows 0 >"$OUT/ncu_$s.csv" 2>"$OUT/ncu_$s.err"
		echo "== ncu $s 1 token [$v] rc=$? (GEMM1, GEMM2, combine)"; python3 scripts/ncu_kernels.py "$OUT/ncu_$s.csv" 3 || tail -3 "$OUT/ncu_$s.err"
	done
done
echo "== grouped layers t=${SECONDS}s"
VARIANTS="base:MK_MOE_WALK=0 run3:MK_MOE_WALK=1,MK_MOE_WALK_RUN=3 run3fit:MK_MOE_WALK=1,MK_MOE_WALK_RUN=3,MK_MOE_WALK_FIT=1 run4fit:MK_MOE_WALK=1,MK_MOE_WALK_RUN=4,MK_MOE_WALK_FIT=1" \
	PATHS=grouped TOKENS=1,4,16,256 ROUNDS=2 ITERS=20 timeout 280 bash scripts/ab_moe.sh 2>&1 | tail -14
echo "== decode steps t=${SECONDS}s"
VARIANTS="base:MK_MOE_WALK=0 run3fit:MK_MOE_WALK=1,MK_MOE_WALK_RUN=3,MK_MOE_WALK_FIT=1" BATCH=1,8 STEPS=30 ROUNDS=2 \
	timeout 200 bash scripts/ab_model.sh 2>&1 | tail -8
echo "done t=${SECONDS}s"
