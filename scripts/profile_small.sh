#!/usr/bin/env bash
# scripts/profile_small.sh — where the small-token MoE layers spend their
# time (thirty-sixth pass): the grouped layer at 1 / 16 / 256 tokens on the
# issue's three shapes (graph replay, eager, experts alone), ncu's
# per-kernel GPU time and DRAM bytes of one eager 1-token layer per shape.
# (The FP4 kernels' stall reasons are scripts/ncu_moe.sh's, WEIGHTS=fp4; its
# FP4 part here printed nothing in the thirty-sixth pass and was dropped.)
# Carry .dev/device.tar.xz (make device-bins) and this script.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -iE "error" "$OUT/build.log" | head -30; exit 1; }
echo "built t=${SECONDS}s"
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1 PATH="$PATH:/usr/local/cuda/bin"
declare -A F
F[deepseek_v3]="--hidden 7168 --intermediate 2048 --experts 256 --topk 8 --routing grouped"
F[qwen3_30b_a3b]="--hidden 2048 --intermediate 768 --experts 128 --topk 8 --routing softmax"
F[mixtral_8x7b]="--hidden 4096 --intermediate 14336 --experts 8 --topk 2 --routing softmax"
p='import json,sys
for r in json.load(open(sys.argv[1])): print("%6d ms %.4f eager %.4f experts %.4f GB/s %.0f err %.1e" % (r["tokens"], r["ms"], r.get("eager_ms") or 0, r["experts_ms"], r["weight_gbps"], r["rel_err"]))'
for s in deepseek_v3 mixtral_8x7b qwen3_30b_a3b; do
	# shellcheck disable=SC2086
	timeout 120 .dev/mkserve bench moe --path grouped ${F[$s]} --tokens 1,16,256 --iters 20 --json >"$OUT/moe_$s.json" 2>"$OUT/moe_$s.err"
	echo "== $s rc=$? t=${SECONDS}s"; python3 -c "$p" "$OUT/moe_$s.json" || tail -3 "$OUT/moe_$s.err"
done
for s in deepseek_v3 mixtral_8x7b qwen3_30b_a3b; do
	# shellcheck disable=SC2086
	timeout 200 ncu --clock-control none --csv --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum \
		.dev/mkserve bench moe --path grouped ${F[$s]} --tokens 1 --iters 1 --graph=false --check-rows 0 >"$OUT/ncu_$s.csv" 2>"$OUT/ncu_$s.err"
	echo "== ncu $s 1 token rc=$? t=${SECONDS}s (the last 12 kernels)"; python3 scripts/ncu_kernels.py "$OUT/ncu_$s.csv" 12 || tail -5 "$OUT/ncu_$s.err"
done
echo "done t=${SECONDS}s"
