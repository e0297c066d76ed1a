#!/usr/bin/env bash
# scripts/pending_gpu.sh — what the twenty-fifth pass wrote after its device
# time ran out (docs/PERF.md, "GPU, twenty-fifth pass", last section).
# Delete or rewrite it once its results are in PERF.md. On the GPU machine,
# from the repository root, with .dev/device.tar.xz carried (make
# device-bins), one device call (~4–5 minutes):
#   1. build .dev/libmkernel.so;
#   2. TestFlashAttention with MK_FLASH_WG=2 (flash_wg<D, true>: the
#      producer's pool rows looked up once into shared memory, 40 / 232
#      registers, P alternating between two register arrays so that ptxas
#      no longer serialises the wgmmas — warning C7513 on the shipped
#      kernel; and head dims 64, windows and sinks: every d-64 and d-128
#      case of the test then runs on it);
#   3. bench attention, causal and non-causal, shipped (MK_FLASH_WG=1, the
#      default) against MK_FLASH_WG=2, two rounds, and the mma.sync kernel
#      (MK_FLASH_WG=0) once; torch SDPA for the same shapes;
#   4. bench ring 16k R = 2 / 4 (its single_rank_ms is flash_wg);
#   5. whole-model prefill of 8192 tokens (scripts/ab_model.sh PREFILL)
#      with the mma.sync kernel, flash_wg and flash_wg<true>: what the
#      attention kernels move end to end (never measured).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" .dev/logs/build.log | head -30; exit 1; }
grep -E "C7513" .dev/logs/build.log | grep -o "flash_wg[^']*" | head -4
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
echo "== TestFlashAttention, MK_FLASH_WG=2"
MK_FLASH_WG=2 timeout 90 .dev/kernels.test -test.count=1 -test.v -test.run '^TestFlashAttention$' >"$OUT/flash_v2.log" 2>&1
echo "rc=$? pass $(grep -c -- '--- PASS' "$OUT/flash_v2.log") fail $(grep -c -- '--- FAIL' "$OUT/flash_v2.log")"
grep -E -- '--- FAIL|panic' "$OUT/flash_v2.log" | head -10
echo "== bench attention (t=${SECONDS}s): TFLOP/s at 1k / 4k / 16k"
C="--seq 1024,4096,16384 --heads 32 --kv-heads 8 --head-dim 128"
for r in 1 2; do
	for v in 1 2 0; do
		[ "$v" = 0 ] && [ "$r" = 2 ] && continue
		for mode in --causal ""; do
			echo -n "MK_FLASH_WG=$v r$r ${mode:-non-causal}: "
			# shellcheck disable=SC2086
			MK_FLASH_WG=$v timeout 60 .dev/mkserve bench attention $C $mode --json 2>&1 | grep -oE '"tflops":[^,}]*' | paste -sd' '
		done
	done
done
echo "== gpt-oss's shape (64 / 8 heads, d 64, sinks are not in bench attention), 4k / 16k, window 0 and 128"
for v in 1 2; do
	for w in 0 128; do
		echo -n "MK_FLASH_WG=$v window $w: "
		MK_FLASH_WG=$v timeout 60 .dev/mkserve bench attention --seq 4096,16384 --heads 64 --kv-heads 8 --head-dim 64 \
			--causal --window "$w" --json 2>&1 | grep -oE '"tflops":[^,}]*' | paste -sd' '
	done
done
echo "== torch SDPA (t=${SECONDS}s)"
# shellcheck disable=SC2086
PYTHONUNBUFFERED=1 timeout 120 python3 scripts/bench_attention_torch.py $C --causal --json 2>&1 | grep -oE '"(backend|seq|tflops)":[^,}]*' | paste -sd' '
echo "== bench ring 16k (t=${SECONDS}s)"
for v in 1 2; do
	echo -n "MK_FLASH_WG=$v: "
	MK_FLASH_WG=$v timeout 60 .dev/mkserve bench ring --seq 16384 --ranks 2,4 --heads 32 --kv-heads 8 --head-dim 128 --causal --json 2>&1 |
		grep -oE '"(ranks|ms|single_rank_ms|separate_ms)":[^,}]*' | paste -sd' '
done
echo "== prefill 8192 tokens, MK_FLASH_WG=0 / 1 / 2 (t=${SECONDS}s)"
CONFIGS="qwen3-30b-a3b-8l mixtral-8x7b-4l" PREFILL=8192 STEPS=10 ROUNDS=2 \
	VARIANTS="wg:MK_FLASH_WG=1 mma:MK_FLASH_WG=0 wg2:MK_FLASH_WG=2" \
	timeout $((560 - SECONDS)) bash scripts/ab_model.sh 2>&1 | tail -8
echo "done t=${SECONDS}s"
