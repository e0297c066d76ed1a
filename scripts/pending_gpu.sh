#!/usr/bin/env bash
# scripts/pending_gpu.sh — the first device call after the twentieth pass:
# runs what that pass wrote after its device time ran out (docs/PERF.md,
# "Written after the device time ran out"), tests first, then the A/Bs.
# Delete or rewrite it once its results are in PERF.md. On the GPU machine,
# from the repository root, with .dev/device.tar.xz carried (make
# device-bins):  bash scripts/pending_gpu.sh
#   1. build .dev/libmkernel.so and two experiment libraries (device.sh's
#      MK_LIB_VARIANTS): early (-DMK_PDL_EARLY), pre2 (+ -DMK_GEMV_PRE2);
#   2. the sampling and stamp tests (kernels.test; cuda.test, also with the
#      opt-in MKSERVE_SAMPLE_SPLIT=3);
#   3. kernel stamps of a Qwen3-8l batch-1 step (MKSERVE_STEP_STAMPS=2);
#   4. A/B: early / pre2 against the default library, GEMM1 split in 2 / 4
#      (MK_MOE_G1_SPLIT; Qwen3-8l batch 1; ~8 minutes in all); split sampling
#      mode 3 against 2 with top-p-only sampling.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
MK_LIB_VARIANTS="early:-DMK_PDL_EARLY=1 pre2:-DMK_PDL_EARLY=1,-DMK_GEMV_PRE2=1" MK_MODE=none \
	bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
K=$PWD/.dev/kernels.test C=$PWD/.dev/cuda.test
echo "== kernels: sampling, stamps"
timeout 120 "$K" -test.count=1 -test.v -test.run 'TestSample|TestStamp' 2>&1 | grep -E '^(--- |FAIL|ok|PASS)|panic|rows,' | head -20
echo "== kernels: the expert GEMMs (default; GEMM1 split in 2 and 4; last_split is new in both splits)"
for n in 1 2 4; do
	MK_MOE_G1_SPLIT=$n timeout 200 "$K" -test.count=1 -test.run 'TestMoEExperts|TestMoERouteExperts' 2>&1 | grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' | head -5
done
echo "== cuda: sampling, stamps (default, then MKSERVE_SAMPLE_SPLIT=3)"
(cd backend/cuda && timeout 120 "$C" -test.count=1 -test.v -test.run 'TestSample|TestEngineMatchesGreedy|TestStepStamps|TestStepKernelStamps' 2>&1 |
	grep -E '^(--- |FAIL|ok|PASS)|panic|stamped' | head -20)
(cd backend/cuda && MKSERVE_SAMPLE_SPLIT=3 timeout 120 "$C" -test.count=1 -test.run 'TestSample|TestEngineMatchesGreedy' 2>&1 |
	grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' | head)
echo "== kernel stamps, Qwen3-8l batch 1"
MKSERVE_STEP_STAMPS=2 timeout 120 .dev/mkserve bench model --config configs/shapes/qwen3-30b-a3b-8l --batch 1 \
	--context 1024 --prefill 0 --steps 20 --json >"$OUT/kstamps.json" 2>"$OUT/kstamps.err" || tail -3 "$OUT/kstamps.err"
PYTHONPATH=scripts python3 - "$OUT/kstamps.json" <<'PY'
import sys
from ab_table import read_rows
for r in read_rows(sys.argv[1]):
    if r.get("kind") != "decode":
        continue
    print("batch %d ms %.3f (stamped)" % (r["batch"], r["ms"]))
    for o in r.get("stamps", [])[:20]:
        print("  %-28s %5.1f calls %8.1f us" % (o["op"][:28], o["calls_per_step"], o["us_per_step"]))
    print("  layer 2:", " ".join("%s:%.1f" % (o["op"][:18], o["us_per_step"]) for o in r.get("stamp_seq", [])[17:34]))
PY
echo "== A/B: early trigger, second GEMV batch before the wait, GEMM1 split"
CONFIGS=qwen3-30b-a3b-8l BATCH=1 ROUNDS=2 \
	VARIANTS="base: early:MKSERVE_KERNEL_LIB=$PWD/.dev/early/libmkernel.so pre2:MKSERVE_KERNEL_LIB=$PWD/.dev/pre2/libmkernel.so,MK_GEMV_SINGLE_K=2048 g1s2:MK_MOE_G1_SPLIT=2 g1s4:MK_MOE_G1_SPLIT=4" \
	timeout 240 bash scripts/ab_model.sh
echo "== A/B: top-p-only rows on the split kernels"
CONFIGS=qwen3-30b-a3b-8l BATCH=1,32 ROUNDS=2 EXTRA="--temperature 0.7 --top-p 0.9" \
	VARIANTS="general:MKSERVE_SAMPLE_SPLIT=2 cut:MKSERVE_SAMPLE_SPLIT=3" timeout 150 bash scripts/ab_model.sh
