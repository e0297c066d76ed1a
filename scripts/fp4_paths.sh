#!/bin/bash
# The FP4 experts' three paths (GEMV, FP4 grouped GEMM, dequantized) side by side, to set fp4_path's rule (moe_fp4.cuh): kernel tests on each forced path, bench moe at gpt-oss-120b's and gpt-oss-20b's layer shapes for each path (PATHS, default "bf16 gemv gemm dequant auto"), then the default path's whole gpt-oss-20b (and gpt-oss-120b with BIG=1). AB=VAR (e.g. MK_FP4_RING) instead runs the tests with VAR=0 and 1, then the GEMV sizes and gpt-oss-20b's small batches with VAR=0, 1, 0, 1 (an A/B in one call). Carry .dev/device.tar.xz (make device-bins) and this script.
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -iE "error" "$OUT/build.log" | head -30; exit 1; }
echo "built t=${SECONDS}s"
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
if [ -n "$AB" ]; then
	p='import json,sys
for r in json.load(open(sys.argv[1])): print(r["tokens"], r.get("fp4_path", r["weights"]), "%.4f ms"%r["ms"], "%.0f GB/s"%r["weight_gbps"], "err %.2g"%r["rel_err"])'
	for v in 0 1; do
		(cd kernels && env "$AB=$v" timeout 100 ../.dev/kernels.test -test.v -test.count=1 -test.run '^Test(MoEExpertsFP4|MoEFP4Path)$' >"$OUT/ktest_ab$v.log" 2>&1)
		echo "kernel tests $AB=$v rc=$? t=${SECONDS}s"; grep -E "^(--- |FAIL|ok)|panic|path .* want" "$OUT/ktest_ab$v.log" | head -8
	done
	for v in 0 1 0 1; do
		for e in 128 32; do
			env "$AB=$v" timeout 100 .dev/mkserve bench moe --path grouped --weights fp4 --hidden 2880 --intermediate 2880 --experts $e --topk 4 --routing softmax --iters 20 --tokens 1,2,4,8 --json >"$OUT/ab_e$e.json" 2>"$OUT/ab_e$e.err"
			echo "$AB=$v E=$e rc=$?"; python3 -c "$p" "$OUT/ab_e$e.json" || tail -3 "$OUT/ab_e$e.err"
		done
	done
	for v in 0 1; do
		env "$AB=$v" timeout 150 .dev/mkserve bench model --config configs/shapes/gpt-oss-20b --cuda-weights fp4 --batch 1,4,8 --context 1024 --prefill 512 --steps 20 >"$OUT/model_ab$v.log" 2>&1
		echo "gpt-oss-20b fp4 $AB=$v rc=$? t=${SECONDS}s"; grep -E "^decode" "$OUT/model_ab$v.log"
	done
	echo "done t=${SECONDS}s"; exit 0
fi
for p in "" gemv gemm dequant; do
	(cd kernels && MK_FP4_PATH=$p timeout 100 ../.dev/kernels.test -test.v -test.count=1 -test.run '^Test(FP4Dequant|MoEExpertsFP4|MoEFP4Path)$' >"$OUT/ktest_$p.log" 2>&1)
	echo "kernel tests MK_FP4_PATH=$p rc=$? t=${SECONDS}s"; grep -E "^(--- |FAIL|ok)|panic|path .* want" "$OUT/ktest_$p.log" | head -8
done
p='import json,sys
for r in json.load(open(sys.argv[1])): print(r["tokens"], r.get("fp4_path", r["weights"]), "%.4f ms"%r["ms"], "%.0f GB/s"%r["weight_gbps"], "%.0f TF"%r["tflops"], "err %.2g"%r["rel_err"])'
for e in 128 32; do
	sh="--hidden 2880 --intermediate 2880 --experts $e --topk 4 --routing softmax --iters 20"
	for v in ${PATHS:-bf16 gemv gemm dequant auto}; do
		case $v in
		bf16) w=bf16; tok=1,2,4,8,16,32,64,128,256,512,1024,2048 ;;
		gemv) w=fp4; tok=1,2,4,8 ;;
		gemm) w=fp4; tok=1,2,4,8,16,32,64,128,256,512,1024,2048 ;;
		dequant) w=fp4; tok=8,16,32,64,128,256,512,1024,2048 ;;
		auto) w=fp4; tok=1,2,4,8,16,32,64,128,256,512,1024,2048,4096 ;;
		esac
		MK_FP4_PATH=${v#auto} timeout 150 .dev/mkserve bench moe --path grouped --weights $w $sh --tokens $tok --json >"$OUT/moe_e${e}_$v.json" 2>"$OUT/moe_e${e}_$v.err"
		echo "E=$e $v rc=$? t=${SECONDS}s"; python3 -c "$p" "$OUT/moe_e${e}_$v.json" || tail -3 "$OUT/moe_e${e}_$v.err"
	done
done
timeout 150 .dev/mkserve bench model --config configs/shapes/gpt-oss-20b --cuda-weights fp4 --batch 1,4,8,16,32,64 --context 1024 --prefill 8192 --steps 10 >"$OUT/model_fp4.log" 2>&1
echo "bench model gpt-oss-20b fp4 rc=$? t=${SECONDS}s"; tail -8 "$OUT/model_fp4.log"
if [ -n "$BIG" ]; then
	(cd backend/cuda && timeout 100 ../../.dev/cuda.test -test.count=1 -test.run '^Test(FP4Weights|FP4FromMXFP4Checkpoint|PlanExperts)$' 2>&1 | tail -3)
	timeout 360 .dev/mkserve bench model --config configs/shapes/gpt-oss-120b --batch 1,8,32,64 --context 1024 --prefill 4096 --steps 10 >"$OUT/model_120b.log" 2>&1
	echo "bench model gpt-oss-120b rc=$? t=${SECONDS}s"; grep -iE "load|weights" "$OUT/model_120b.log" | head -4; tail -6 "$OUT/model_120b.log"
fi
echo "done t=${SECONDS}s"
