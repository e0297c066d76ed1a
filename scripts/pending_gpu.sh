#!/usr/bin/env bash
# scripts/pending_gpu.sh — the first device call after the twenty-third
# pass: what that pass could not finish on the GPU (docs/PERF.md, "GPU,
# twenty-third pass", last section). Delete or rewrite it once its results
# are in PERF.md. On the GPU machine, from the repository root, with
# .dev/device.tar.xz carried (make device-bins), in two device calls:
#   bash scripts/pending_gpu.sh 1   (items 1–3, ~8 minutes)
#   bash scripts/pending_gpu.sh 2   (items 1, 4, 5)
#   bash scripts/pending_gpu.sh 3   (items 1, 6, 7)
#   1. build .dev/libmkernel.so;
#   2. A/B: the weight-resident GEMV's row split (G warps a row when a CTA
#      holds fewer rows than warps: routers) against one warp a row
#      (MK_GEMV_RES_SPLIT=0, never run) and against the register-fed GEMV
#      (MK_GEMV_SMEM=0), DeepSeek-V3-4l and Qwen3-8l at batch 1;
#   3. the CUDA backend's tests and the serving tests on the final tree
#      (its kernel tests passed on the H200; these ran out of time);
#   4. the MoE expert tests (the resident down kernel, MK_MOE_GEMV=3, ABI
#      21: never run), then A/B: the two-kernel MoE GEMV decode path
#      (MK_MOE_GEMV=1, last measured in the seventh pass, before
#      programmatic launch) and mode 3 against the grouped GEMMs, Qwen3-8l
#      and Mixtral-4l at batch 1 and 2;
#   5. ncu of a batch-1 Qwen3-8l graph step's kernels with their DRAM
#      bytes: the expert GEMMs' bandwidth in isolation (GEMM1 streams 50 MB
#      at ~2.9 TB/s, GEMM2 25 MB at ~2.4 TB/s by kernel stamps);
#   6. the weight-resident GEMV and the early launches at 3–4 rows
#      (MK_GEMV_SMEM_ROWS=4, never run): GEMV/router tests, then A/B at
#      batch 3 and 4 on Qwen3-8l;
#   7. the kernel test suite on the final tree (MK_SWITCH_TESTS=0; ~6
#      minutes: whatever the call's time leaves).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
if [ "${1:-1}" = 3 ]; then
	echo "== GEMV tests with MK_GEMV_SMEM_ROWS=4"
	MK_GEMV_SMEM_ROWS=4 timeout 60 .dev/kernels.test -test.count=1 \
		-test.run '^(TestGemvBF16|TestGemvBF16Multi|TestMoERouterF32|TestPagedDecodeBF16|TestAddRMSNorm)$' 2>&1 | tail -3
	echo "== A/B: resident GEMVs at 3-4 rows"
	CONFIGS="qwen3-30b-a3b-8l" BATCH=3,4 ROUNDS=2 VARIANTS="rows2: rows4:MK_GEMV_SMEM_ROWS=4" \
		timeout 150 bash scripts/ab_model.sh >"$OUT/ab_rows.txt" 2>&1
	cat "$OUT/ab_rows.txt"
	echo "== kernel tests"
	MK_SWITCH_TESTS=0 MK_MODE=quick timeout $((560 - SECONDS)) bash scripts/device.sh >"$OUT/test.log" 2>&1
	echo "rc $?"; tail -30 "$OUT/test.log"
	tar -C .dev -czf "$OUT/logs_tests.tgz" logs 2>/dev/null
	exit 0
fi
if [ "${1:-1}" = 2 ]; then
	echo "== MoE expert tests (the resident down kernel's gemvres cases: never run)"
	timeout 150 .dev/kernels.test -test.count=1 -test.v -test.run '^TestMoEExperts$' >"$OUT/moe.log" 2>&1
	grep -E '^(--- FAIL|FAIL|ok|PASS)|panic|--- (PASS|FAIL): TestMoEExperts/gemvres' "$OUT/moe.log" | head -12
	grep -B3 -A12 -E '^\s+--- FAIL' "$OUT/moe.log" | head -30
	echo "== A/B: the MoE GEMV decode paths"
	CONFIGS="qwen3-30b-a3b-8l mixtral-8x7b-4l" BATCH=1,2 ROUNDS=2 \
		VARIANTS="grouped: gemv:MK_MOE_GEMV=1 gemvres:MK_MOE_GEMV=3" \
		timeout 250 bash scripts/ab_model.sh >"$OUT/ab_gemv.txt" 2>&1
	cat "$OUT/ab_gemv.txt"
	echo "== ncu, Qwen3-8l batch 1, graph nodes with DRAM bytes"
	GRAPHS=1 BYTES=1 timeout 150 bash scripts/ncu_step.sh configs/shapes/qwen3-30b-a3b-8l 1 2>&1 | tail -40
	exit 0
fi
echo "== GEMV tests (two shapes new: 1–3 resident rows a CTA)"
timeout 60 .dev/kernels.test -test.count=1 -test.run '^(TestGemvBF16|TestGemvBF16Multi|TestMoERouterF32)$' 2>&1 | tail -3
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
