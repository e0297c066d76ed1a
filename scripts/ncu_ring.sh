#!/usr/bin/env bash
# scripts/ncu_ring.sh [SEQ] [RANKS] — ncu metrics of the single-rank flash
# kernel and the ring kernel over the same sequence (bench ring's first
# launches: flash_fwd, then ring_kernel<..., 1> with gather buffers and
# ring_kernel<..., 0> with two receive buffers when RANKS > 1), to see where
# the ring's overhead against one rank goes. On the GPU machine, after `MK_MODE=none bash
# scripts/device.sh` (the library and .dev/mkserve):
#   bash scripts/ncu_ring.sh 16384 1        (STALLS=1: with the stall reasons)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SEQ=${1:-16384}
R=${2:-1}
N=2
[ "$R" -gt 1 ] && N=3
export PATH="$PATH:/usr/local/cuda/bin"
NCU=$(command -v ncu) || { echo "ncu_ring.sh: ncu not found on PATH"; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
M=$M,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum
M=$M,lts__t_sector_hit_rate.pct,dram__bytes_read.sum
# STALLS=1: also the warp stall reasons (cycles per issued instruction spent
# in each), the WarpStateStats section's breakdown.
if [ "${STALLS:-0}" = 1 ]; then
	for r in barrier long_scoreboard short_scoreboard math_pipe_throttle wait mio_throttle not_selected selected \
		dispatch_stall lg_throttle no_instruction branch_resolving tex_throttle; do
		M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
	done
fi
"$NCU" --clock-control none --kernel-name regex:'flash_fwd|ring_kernel' --launch-count "$N" --section WarpStateStats --section LaunchStats --section Occupancy --metrics "$M" \
	.dev/mkserve bench ring --seq "$SEQ" --ranks "$R" --heads 32 --kv-heads 8 --head-dim 128 --causal --iters 3 2>&1 |
	grep -vE '^==PROF==|^ *seq ' | sed -n '/flash_fwd\|ring_kernel/,$p'
