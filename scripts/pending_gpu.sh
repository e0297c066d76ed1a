#!/usr/bin/env bash
# scripts/pending_gpu.sh — the first device call after the twenty-third
# pass: what that pass could not finish on the GPU (docs/PERF.md, "GPU,
# twenty-third pass", last section). Delete or rewrite it once its results
# are in PERF.md. On the GPU machine, from the repository root, with
# .dev/device.tar.xz carried (make device-bins):  bash scripts/pending_gpu.sh
#   1. build .dev/libmkernel.so;
#   2. A/B: the weight-resident GEMV's row split (G warps a row when a CTA
#      holds fewer rows than warps: routers) against one warp a row
#      (MK_GEMV_RES_SPLIT=0, never run) and against the register-fed GEMV
#      (MK_GEMV_SMEM=0), DeepSeek-V3-4l and Qwen3-8l at batch 1;
#   3. the CUDA backend's tests and the serving tests on the final tree
#      (its kernel tests passed on the H200; these ran out of time).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
echo "== GEMV tests with MK_GEMV_RES_SPLIT=0"
MK_GEMV_RES_SPLIT=0 timeout 60 .dev/kernels.test -test.count=1 \
	-test.run '^(TestGemvBF16|TestGemvBF16Multi|TestMoERouterF32)$' 2>&1 | tail -3
echo "== A/B (DeepSeek-V3 loads for ~20 s a run: give it time)"
CONFIGS="deepseek-v3-4l qwen3-30b-a3b-8l" BATCH=1 ROUNDS=2 \
	VARIANTS="on: nosplit:MK_GEMV_RES_SPLIT=0 nores:MK_GEMV_SMEM=0" \
	timeout 300 bash scripts/ab_model.sh >"$OUT/ab.txt" 2>&1
cat "$OUT/ab.txt"
echo "== CUDA backend tests"
(cd backend/cuda && timeout 200 ../../.dev/cuda.test -test.count=1 >"$OUT/cuda.log" 2>&1)
grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' "$OUT/cuda.log" | head -10
echo "== serving tests"
(cd cmd/mkserve && MKSERVE_TEST_BACKEND=cuda timeout 150 ../../.dev/mkserve.test -test.count=1 -test.run TestServe \
	>"$OUT/serve.log" 2>&1)
grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' "$OUT/serve.log" | head -10
