#!/bin/bash
# thirty-fourth pass, written after the device time ran out (run it first next session; the grouped GEMM2 epilogue and the dequantization were refactored after the last GPU run): the FP4 path rule, the MXFP4 hand-over and the FP4 grouped GEMM (MK_FP4_GEMM=1) — kernel and backend tests, bench moe, gpt-oss-20b A/B. Carry .dev/device.tar.xz (make device-bins).
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -iE "error" "$OUT/build.log" | head -30; exit 1; }
echo "built t=${SECONDS}s"
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
(cd kernels && timeout 150 ../.dev/kernels.test -test.v -test.count=1 -test.run '^Test(FP4Dequant|MoEExpertsFP4|MoEExperts|MoEWorkspaceReuse|GemmSkinny.*)$' >"$OUT/ktest.log" 2>&1); echo "kernel tests rc=$? t=${SECONDS}s"
grep -E "^(--- |FAIL|ok|PASS)|panic|error" "$OUT/ktest.log" | grep -v "^    --- PASS" | head -20
(cd backend/cuda && timeout 100 ../../.dev/cuda.test -test.v -test.count=1 -test.run '^Test(FP4Weights|FP4FromMXFP4Checkpoint|PlanExperts)$' >"$OUT/ctest.log" 2>&1); echo "cuda tests rc=$? t=${SECONDS}s"
grep -E "^(--- |FAIL|ok|PASS)|relative L2|FP4 uploads|panic" "$OUT/ctest.log" | head -20
sh="--hidden 2880 --intermediate 2880 --experts 128 --topk 4 --routing softmax"
p='import json,sys
for r in json.load(open(sys.argv[1])): print(r["tokens"], "%.4f ms"%r["ms"], "%.0f GB/s"%r["weight_gbps"], "%.0f TF"%r["tflops"], "err %.2g"%r["rel_err"])'
timeout 100 .dev/mkserve bench moe --path grouped --weights fp4 $sh --tokens 1,8,16,32,33 --json >"$OUT/moe_fp4.json" 2>&1; echo "bench moe rc=$?"; python3 -c "$p" "$OUT/moe_fp4.json"
for wt in fp4 stored; do
	timeout 200 .dev/mkserve bench model --config configs/shapes/gpt-oss-20b --cuda-weights $wt --batch 1,8,16,32 --context 1024 --prefill 8192 --steps 10 >"$OUT/model_$wt.log" 2>&1
	echo "bench model gpt-oss-20b --cuda-weights $wt rc=$? t=${SECONDS}s"; tail -6 "$OUT/model_$wt.log"
done
# MK_FP4_GEMM=1: the FP4 grouped GEMM decoding in shared memory (written after the device time ran out)
(cd kernels && MK_FP4_GEMM=1 timeout 60 ../.dev/kernels.test -test.v -test.count=1 -test.run '^TestMoEExpertsFP4$' >"$OUT/ktest_gemm.log" 2>&1); echo "MK_FP4_GEMM=1 kernel tests rc=$?"
grep -E "^(--- |FAIL|ok|PASS)|FP4 MoE|panic|error" "$OUT/ktest_gemm.log" | head -16
for v in 0 1; do
	MK_FP4_GEMM=$v timeout 120 .dev/mkserve bench moe --path grouped --weights fp4 $sh --tokens 64,256,1024,4096,16384 --json >"$OUT/moe_gemm$v.json" 2>&1
	echo "MK_FP4_GEMM=$v bench moe rc=$?"; python3 -c "$p" "$OUT/moe_gemm$v.json"
done
# MK_FP4_UNROLL=1: the up kernel's loop two blocks a trip (ptxas 11.8: 246 instead of 260 instructions a block, no spills in the loop)
for v in 0 1 0 1; do
	MK_FP4_UNROLL=$v timeout 60 .dev/mkserve bench moe --path grouped --weights fp4 $sh --tokens 1,4,8 --json >"$OUT/moe_unroll$v.json" 2>&1
	echo "MK_FP4_UNROLL=$v"; python3 -c "$p" "$OUT/moe_unroll$v.json"
done
(cd kernels && MK_FP4_UNROLL=1 timeout 60 ../.dev/kernels.test -test.count=1 -test.run '^TestMoEExpertsFP4$' 2>&1 | tail -2)
echo "done t=${SECONDS}s"
