#!/usr/bin/env bash
# scripts/pending_gpu.sh — the first device call after the twenty-first
# pass: runs what that pass wrote after its device time ran out
# (docs/PERF.md, "Written after the device time ran out (twenty-first
# pass)"). Delete or rewrite it once its results are in PERF.md. On the GPU
# machine, from the repository root, with .dev/device.tar.xz carried (make
# device-bins):  bash scripts/pending_gpu.sh
#   1. build .dev/libmkernel.so;
#   2. TestMoEExperts (with the new many-items 64-row case), TestMoEFusedLayer
#      and TestSample* (a last tidy of the sampler's slow path);
#   3. the prefill A/B of call 117 again with bench model's 200 ms warm-up:
#      64-row tiles against MK_MOE_W64_MAX=0 at 512 / 768 Qwen3-8l tokens;
#   4. A/B: the paged merge launching its successor (the o GEMV) before it
#      waits (-DMK_MERGE_EARLY, a variant library), decode batch 1 and 32.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
MK_LIB_VARIANTS="mearly:-DMK_MERGE_EARLY=1" MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
echo "== kernels: expert GEMMs, fused layer"
timeout 240 .dev/kernels.test -test.count=1 -test.v -test.run 'TestMoEExperts|TestMoEFusedLayer|TestSample' >"$OUT/kernels.log" 2>&1
grep -E '^(--- FAIL|FAIL|ok|PASS)|^--- PASS: Test|panic|many_items' "$OUT/kernels.log" | head -20
grep -B2 -A10 -E '^\s*--- FAIL' "$OUT/kernels.log" | head -30
echo "== A/B: prefill on the 64-row tiles (200 ms warm-up)"
for pf in 512 768; do
	CONFIGS=qwen3-30b-a3b-8l BATCH=1 STEPS=25 ROUNDS=2 PREFILL=$pf VARIANTS="base: off:MK_MOE_W64_MAX=0" \
		timeout 240 bash scripts/ab_model.sh
done
echo "== cuda: decode graphs with the early merge"
(cd backend/cuda && MKSERVE_KERNEL_LIB=$PWD/../../.dev/mearly/libmkernel.so timeout 120 ../../.dev/cuda.test -test.count=1 \
	-test.run 'TestEngineMatchesGreedy|TestStepGraph|TestEngineGraphs' 2>&1 | grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' | head)
echo "== A/B: the merge launches the o GEMV before it waits"
CONFIGS="qwen3-30b-a3b-8l mixtral-8x7b-4l" BATCH=1,32 ROUNDS=2 \
	VARIANTS="base: mearly:MKSERVE_KERNEL_LIB=$PWD/.dev/mearly/libmkernel.so" timeout 240 bash scripts/ab_model.sh
