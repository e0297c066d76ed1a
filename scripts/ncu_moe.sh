#!/usr/bin/env bash
# scripts/ncu_moe.sh SHAPE TOKENS — ncu metrics and warp stall reasons of the
# grouped expert GEMMs (the first GEMM1 and GEMM2 launches of `mkserve bench
# moe --path grouped`) at one token count, for the kernel MK_MOE_WGMMA picks
# (unset: the warp-specialised wgmma kernel; 1: the single-role one; 0:
# mma.sync). SHAPE: deepseek_v3, qwen3_30b_a3b, mixtral_8x7b, gpt_oss_120b
# or gpt_oss_20b; WEIGHTS=fp4 profiles the FP4 experts' kernels instead
# (the path MK_FP4_PATH forces, or the one the rule picks). SOURCE=DIR
# also writes ncu's per-SASS-line stall samples of the first launch to
# DIR/moe_source.csv and prints its 40 SASS lines with the most stall
# samples. MOE_PATH=fused profiles the fused layer's persistent kernel
# (fused_wg_kernel or fused_kernel; RANKS emulated ranks, default 1)
# instead. On the GPU machine, after `MK_MODE=none bash scripts/device.sh`:
#   bash scripts/ncu_moe.sh qwen3_30b_a3b 16384
#   MOE_PATH=fused SOURCE=$OUT bash scripts/ncu_moe.sh qwen3_30b_a3b 16384
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SHAPE=${1:-qwen3_30b_a3b}
T=${2:-16384}
case "$SHAPE" in
deepseek_v3) F="--hidden 7168 --intermediate 2048 --experts 256 --topk 8 --routing grouped" ;;
qwen3_30b_a3b) F="--hidden 2048 --intermediate 768 --experts 128 --topk 8 --routing softmax" ;;
mixtral_8x7b) F="--hidden 4096 --intermediate 14336 --experts 8 --topk 2 --routing softmax" ;;
gpt_oss_120b) F="--hidden 2880 --intermediate 2880 --experts 128 --topk 4 --routing softmax" ;;
gpt_oss_20b) F="--hidden 2880 --intermediate 2880 --experts 32 --topk 4 --routing softmax" ;;
*) echo "ncu_moe.sh: unknown shape $SHAPE"; exit 2 ;;
esac
export PATH="$PATH:/usr/local/cuda/bin"
NCU=$(command -v ncu) || { echo "ncu_moe.sh: ncu not found on PATH"; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed
M=$M,sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
M=$M,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum,dram__bytes_read.sum
for r in barrier long_scoreboard short_scoreboard math_pipe_throttle wait mio_throttle lg_throttle not_selected \
	selected dispatch_stall no_instruction branch_resolving sleeping membar; do
	M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
done
K='regex:moe_wgmma|moe_gemm'
W=bf16
if [ "${WEIGHTS:-bf16}" = fp4 ]; then
	K='regex:moe_fp4|moe_gemm_fp4|fp4_dequant'
	W=fp4
fi
P=(--path grouped --weights "$W")
N=2
if [ "${MOE_PATH:-grouped}" = fused ]; then
	K='regex:fused_wg_kernel|fused_kernel'
	P=(--path fused --ranks "${RANKS:-1}")
	N=1
fi
SRC=()
[ -n "${SOURCE:-}" ] && SRC=(--section SourceCounters -f -o /tmp/ncu_moe)
"$NCU" --clock-control none --kernel-name "$K" --launch-count "$N" --section LaunchStats --metrics "$M" "${SRC[@]}" \
	.dev/mkserve bench moe "${P[@]}" $F --tokens "$T" --iters 1 --check-rows 0 2>&1 |
	grep -vE '^==PROF==|^ *tokens|^H=' | sed -n '/moe_\|fused_/,$p'
if [ -n "${SOURCE:-}" ]; then
	"$NCU" --import /tmp/ncu_moe.ncu-rep --print-units base --page details --metrics "$M" 2>/dev/null | grep -vE '^==PROF==' | head -120
	"$NCU" --import /tmp/ncu_moe.ncu-rep --launch-count 1 --page source --csv --print-source sass >"$SOURCE/moe_source.csv" 2>/dev/null
	python3 - "$SOURCE/moe_source.csv" <<-'PY'
	import csv, sys
	rows = [r for r in csv.reader(open(sys.argv[1])) if r]
	head = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
	if head is None:
	    sys.exit("ncu_moe.sh: no stall-sample column in the source page")
	h = rows[head]
	col = next((i for i, c in enumerate(h) if "Sampling (All" in c), None)
	if col is None:
	    col = next(i for i, c in enumerate(h) if "Sampling" in c)
	src = next((i for i, c in enumerate(h) if c.strip() == "Source"), 1)
	def num(v):
	    try:
	        return float(v.replace(",", ""))
	    except ValueError:
	        return 0.0
	body = [r for r in rows[head + 1:] if len(r) == len(h)]
	total = sum(num(r[col]) for r in body) or 1.0
	for r in sorted(body, key=lambda r: -num(r[col]))[:40]:
	    print("%6.2f %%  %s" % (100 * num(r[col]) / total, r[src][:110]))
	PY
fi
