#!/usr/bin/env bash
# scripts/pending_gpu.sh — the first device call after the twenty-second
# pass: runs what that pass wrote after its device time ran out
# (docs/PERF.md, "Written after the device time ran out (twenty-second
# pass)"). Delete or rewrite it once its results are in PERF.md. On the GPU
# machine, from the repository root, with .dev/device.tar.xz carried (make
# device-bins):  bash scripts/pending_gpu.sh
#   1. build .dev/libmkernel.so;
#   2. the weight-resident GEMV (MK_GEMV_SMEM=1, read once a process): the
#      GEMV, multi-projection and router tests, then the CUDA backend's
#      model tests, with it on;
#   3. A/B: decode steps with it on against off, Qwen3-8l and Mixtral-4l,
#      batch 1 and 2; kernel stamps of both (scripts/kstamps.sh, also
#      never run before).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
grep -E 'gemv_res_kernel' -A2 "$OUT/build.log" | grep -E 'registers|spill' | head -4
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
echo "== kernels: GEMV and router (round_a, the float A's bf16 rounding, now a function both GEMVs call)"
timeout 120 .dev/kernels.test -test.count=1 -test.run 'TestGemvBF16|TestMoERouterF32' 2>&1 | grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' | head
echo "== kernels with MK_GEMV_SMEM=1"
MK_GEMV_SMEM=1 timeout 200 .dev/kernels.test -test.count=1 -test.v \
	-test.run 'TestGemvBF16|TestMoERouterF32|TestMoEGemvOneLaunchSameBits|TestMarshalGemv' >"$OUT/kernels.log" 2>&1
grep -E '^(--- FAIL|FAIL|ok|PASS)|panic|^--- PASS: Test' "$OUT/kernels.log" | head -20
grep -B3 -A12 -E '^\s+--- FAIL' "$OUT/kernels.log" | head -40
echo "== cuda with MK_GEMV_SMEM=1"
(cd backend/cuda && MK_GEMV_SMEM=1 timeout 200 ../../.dev/cuda.test -test.count=1 \
	-test.run 'TestGolden|TestEngineMatchesGreedy|TestGraph|TestEngineGraphs|TestOpsMatchCPU|TestNormRoPEAttention' \
	>"$OUT/cuda.log" 2>&1)
grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' "$OUT/cuda.log" | head -10
echo "== A/B: the weight-resident GEMV"
CONFIGS="qwen3-30b-a3b-8l mixtral-8x7b-4l" BATCH=1,2 ROUNDS=2 \
	VARIANTS="base: res:MK_GEMV_SMEM=1" timeout 240 bash scripts/ab_model.sh
echo "== kernel stamps, Qwen3-8l batch 1"
VARIANTS="base: res:MK_GEMV_SMEM=1" timeout 120 bash scripts/kstamps.sh
