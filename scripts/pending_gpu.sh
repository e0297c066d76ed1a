#!/usr/bin/env bash
# scripts/pending_gpu.sh — what the twenty-eighth pass wrote after its
# device time ran out, and the profile its notes ask for (docs/PERF.md,
# "GPU, twenty-eighth pass"). Delete or rewrite it once its results are in
# PERF.md. On the GPU machine, from the repository root, with
# .dev/device.tar.xz carried (make device-bins): calls of ~4–6 minutes,
# `bash scripts/pending_gpu.sh 1` (steps 1–2b) and `… 2` (1, 3 and 4) on
# nvidia-h200, `… 3` (1 and 5) on nvidia-h200-x2; no argument runs 1 and
# 2 in one call (~9 minutes).
#   1. build .dev/libmkernel.so;
#   2. MK_FLASH_TMA192=1 — DeepSeek-V3's MLA prefill tiles (head dims
#      192 / 128) by TMA as the 128 ones (24 K boxes and 16 V boxes a tile
#      from one thread): TestFlashAttention (its MLA cases: long, non-causal
#      with a past, GQA 2 with a prefix) and the golden checkpoints with it,
#      then `bench attention` at 128 heads and the DeepSeek-V3-4l 8k
#      prefill, alternating with and without, two rounds. Expected from the
#      128 kernel (+13–24 % at 4k–16k): 360 → ~400+ TFLOP/s, the prefill
#      ~120 → ~116 ms. If it wins, make it the default (flash.cu, launch:
#      `!mk::env_is("MK_FLASH_TMA192", '0')`);
#   2b. MKSERVE_MLA_BF16_CONCAT=1 — the same prefill's q and k built in bf16
#      directly (kernels.CopyColsBF16, ABI 24) instead of float32 then
#      rounded (~3.2 GB less traffic a layer at 8k): TestCopyColsF32 (its
#      bf16 cases, bit for bit), the golden checkpoints with it, and the
#      DeepSeek-V3-4l 8k prefill with it alone and with MK_FLASH_TMA192=1.
#      Expected ~1 ms a layer: ~120 → ~116 ms. Default it if it wins
#      (backend/cuda/mla.go, mlaConcatBF16);
#   3. where the ring's fixed cost at 16k goes (R = 4 +11 %, R = 8 +19–25 %
#      against one rank since both kernels load by TMA): ncu of one timed
#      gather launch of ring_wg at R = 4 and 8 (the first 1 + R ring_wg
#      launches are the correctness runs, then 2 warm-ups) — the SMs'
#      active cycles min / mean / max (the tail), the tensor pipe, the
#      warp states — the comm CTAs a rank (MK_RING_NCOMM 1 / 2 / 4: how
#      much the hops matter now) and the ring table at 16k / 64k / 128k;
#   4. MK_RING_PIPE=8: the gather ring's hops forwarded in 8 pieces a comm
#      part (comm_pipe), each piece sent on as soon as it has arrived, so
#      that the last step's chunk reaches a rank after about one part's
#      copy plus R − 2 pieces' rather than R − 1 parts' (R = 8 at 16k: 7
#      hops of an 8 MB chunk). The ring tests with it, then 16k R = 4 / 8
#      and 64k R = 8 alternating with MK_RING_PIPE=1, two rounds. Expected,
#      if the first slots' waits for chunks are what R = 8 adds: its 16k
#      overhead from +19–25 % toward R = 4's +11 %; nothing at R = 2.
#      Make it the default (ring.cu, ring_launch) if it wins;
#   5. (two GPUs) the rank-local ring with its tiles by TMA (RingMaps for
#      rank me only; the peer's chunk written over NVLink, seen through
#      the producer's system-scope acquire, then the proxy fence):
#      TestRingIPC (its timing against flash_wg with every key local, now
#      also on TMA), the world serving tests, and DeepSeek-V3-4l over two
#      GPUs against one (prefill 4096 with MLA on flash_wg now; decode
#      batch 1 / 32 / 128), as call 153 of the twenty-seventh pass.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PART=${1:-all}
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" .dev/logs/build.log | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
echo "built t=${SECONDS}s; C7513: $(grep -c C7513 .dev/logs/build.log)"
if [ "$PART" = 1 ] || [ "$PART" = all ]; then
MK_FLASH_TMA192=1 timeout 90 .dev/kernels.test -test.count=1 -test.v -test.timeout 85s -test.run '^TestFlashAttention$' >"$OUT/flash192.log" 2>&1
rc=$?
echo "TestFlashAttention, MK_FLASH_TMA192=1: rc=$rc pass $(grep -c -- '--- PASS' "$OUT/flash192.log") fail $(grep -c -- '--- FAIL' "$OUT/flash192.log")"
grep -E -- '--- FAIL|panic' "$OUT/flash192.log" | head
if [ $rc = 0 ]; then
	(cd backend/cuda && MK_FLASH_TMA192=1 timeout 90 ../../.dev/cuda.test -test.count=1 -test.timeout 85s -test.run '^TestGolden.*$' >"$OUT/golden192.log" 2>&1
		echo "golden, MK_FLASH_TMA192=1: rc=$? $(tail -1 "$OUT/golden192.log")")
	for r in 1 2; do
		for v in 0 1; do
			echo -n "round $r MK_FLASH_TMA192=$v: MLA 4k / 8k TFLOP/s "
			MK_FLASH_TMA192=$v timeout 60 .dev/mkserve bench attention --seq 4096,8192 --heads 128 --kv-heads 128 --head-dim 192 \
				--v-head-dim 128 --causal --json 2>&1 | grep -oE '"(tflops|rel_err)":[^,}]*' | paste -sd' ' | tr '\n' ' '
			echo -n "; deepseek-v3-4l prefill 8192: "
			MK_FLASH_TMA192=$v timeout 90 .dev/mkserve bench model --backend cuda --config configs/shapes/deepseek-v3-4l --batch 1 \
				--steps 10 --prefill 8192 --json 2>&1 | grep -oE '"(kind|ms)":[^,}]*' | head -2 | paste -sd' '
		done
	done
fi
timeout 60 .dev/kernels.test -test.count=1 -test.v -test.timeout 55s -test.run '^TestCopyColsF32$' >"$OUT/copycols.log" 2>&1
echo "TestCopyColsF32 (f32 and bf16): rc=$? pass $(grep -c -- '--- PASS' "$OUT/copycols.log") fail $(grep -c -- '--- FAIL' "$OUT/copycols.log")"
(cd backend/cuda && MKSERVE_MLA_BF16_CONCAT=1 timeout 90 ../../.dev/cuda.test -test.count=1 -test.timeout 85s -test.run '^TestGolden.*$' >"$OUT/goldenbf.log" 2>&1
	echo "golden, MKSERVE_MLA_BF16_CONCAT=1: rc=$? $(tail -1 "$OUT/goldenbf.log")")
for r in 1 2; do
	for v in "MKSERVE_MLA_BF16_CONCAT=0" "MKSERVE_MLA_BF16_CONCAT=1" "MKSERVE_MLA_BF16_CONCAT=1 MK_FLASH_TMA192=1"; do
		echo -n "round $r $v: deepseek-v3-4l prefill 8192: "
		env $v timeout 90 .dev/mkserve bench model --backend cuda --config configs/shapes/deepseek-v3-4l --batch 1 \
			--steps 10 --prefill 8192 --json 2>&1 | grep -oE '"(kind|ms)":[^,}]*' | head -2 | paste -sd' '
	done
done
fi
if [ "$PART" = 2 ] || [ "$PART" = all ]; then
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
M=gpu__time_duration.sum,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max
M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct
for s in barrier long_scoreboard wait selected not_selected dispatch_stall mio_throttle math_pipe_throttle sleeping; do
	M=$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
for R in 4 8; do
	echo "== ncu ring_wg gather, 16k, R=$R (t=${SECONDS}s)"
	timeout 120 "$NCU" --clock-control none -k regex:ring_wg --launch-skip $((1 + R + 2)) --launch-count 1 --metrics "$M" \
		.dev/mkserve bench ring --seq 16384 --ranks $R --heads 32 --kv-heads 8 --head-dim 128 --causal --iters 3 >"$OUT/ncu_ring$R.txt" 2>&1
	grep -E "^\s+(gpu__|smsp__|sm__|lts__|dram__)" "$OUT/ncu_ring$R.txt" | awk '{print "   ", $1, $(NF-1), $NF}'
done
echo "== ncu flash_wg 16k, the one-rank baseline (t=${SECONDS}s)"
timeout 120 "$NCU" --clock-control none -k regex:flash_wg --launch-skip 3 --launch-count 1 --metrics "$M" \
	.dev/mkserve bench attention --seq 16384 --heads 32 --kv-heads 8 --head-dim 128 --causal --iters 10 >"$OUT/ncu_flash.txt" 2>&1
grep -E "^\s+(gpu__|smsp__|sm__|lts__|dram__)" "$OUT/ncu_flash.txt" | awk '{print "   ", $1, $(NF-1), $NF}'
for n in 1 2 4; do
	echo -n "MK_RING_NCOMM=$n, 16k R=4,8: "
	MK_RING_NCOMM=$n timeout 40 .dev/mkserve bench ring --seq 16384 --ranks 4,8 --heads 32 --kv-heads 8 --head-dim 128 \
		--causal --iters 5 --json 2>&1 | grep -oE '"(ranks|ms|single_rank_ms)":[^,}]*' | paste -sd' '
done
echo "== bench ring (t=${SECONDS}s)"
timeout 200 .dev/mkserve bench ring --seq 16384,65536,131072 --ranks 2,4,8 --heads 32 --kv-heads 8 --head-dim 128 --causal \
	--iters 3 --json 2>&1 | grep -oE '"(seq|ranks|ms|single_rank_ms|separate_ms|tflops|rel_err)":[^,}]*' | paste -sd' ' |
	sed 's/"seq"/\n"seq"/g'
echo
timeout 150 .dev/kernels.test -test.count=1 -test.v -test.timeout 145s -test.run '^TestRingIPC$' >"$OUT/ringipc1.log" 2>&1
echo "TestRingIPC (two processes, this GPU; the rank-local ring on TMA): rc=$? pass $(grep -c -- '--- PASS' "$OUT/ringipc1.log") fail $(grep -c -- '--- FAIL' "$OUT/ringipc1.log")"
grep -E -- '--- FAIL|panic' "$OUT/ringipc1.log" | head
MK_RING_PIPE=8 timeout 90 .dev/kernels.test -test.count=1 -test.v -test.timeout 85s \
	-test.run '^(TestRingAttention|TestRingWatchdog)$' >"$OUT/ringpipe.log" 2>&1
rc=$?
echo "ring tests, MK_RING_PIPE=8: rc=$rc pass $(grep -c -- '--- PASS' "$OUT/ringpipe.log") fail $(grep -c -- '--- FAIL' "$OUT/ringpipe.log")"
grep -E -- '--- FAIL|panic' "$OUT/ringpipe.log" | head
if [ $rc = 0 ]; then
	for r in 1 2; do
		for v in 1 8; do
			echo -n "round $r MK_RING_PIPE=$v: "
			MK_RING_PIPE=$v timeout 60 .dev/mkserve bench ring --seq 16384 --ranks 4,8 --heads 32 --kv-heads 8 --head-dim 128 \
				--causal --iters 5 --json 2>&1 | grep -oE '"(ranks|ms|single_rank_ms)":[^,}]*' | paste -sd' ' | tr '\n' ' '
			echo -n "; 64k: "
			MK_RING_PIPE=$v timeout 60 .dev/mkserve bench ring --seq 65536 --ranks 8 --heads 32 --kv-heads 8 --head-dim 128 \
				--causal --iters 3 --json 2>&1 | grep -oE '"(ms|single_rank_ms)":[^,}]*' | paste -sd' '
		done
	done
fi
fi
if [ "$PART" = 3 ]; then
export NCCL_NVLS_ENABLE=0
nvidia-smi -L | head -2
timeout 200 .dev/kernels.test -test.count=1 -test.v -test.timeout 195s -test.run '^(TestRingIPC|TestRingRankLocalStreams)$' >"$OUT/ringipc.log" 2>&1
echo "TestRingIPC + rank-local streams: rc=$? pass $(grep -c -- '--- PASS' "$OUT/ringipc.log") fail $(grep -c -- '--- FAIL' "$OUT/ringipc.log")"
grep -E -- '--- FAIL|panic|ms|overhead' "$OUT/ringipc.log" | head -20
(cd cmd/mkserve && MKSERVE_TEST_BACKEND=cuda timeout 100 ../../.dev/mkserve.test -test.v -test.count=1 -test.timeout 95s \
	-test.run 'TestServeWorldProcesses$' >"$OUT/wserve.log" 2>&1; echo "world serving test rc=$?")
grep -E -- '^(--- |    --- )' "$OUT/wserve.log" | head
for w in 2 1; do
	echo "== world $w (t=${SECONDS}s)"
	args=""
	[ $w = 2 ] && args="--world 2"
	# shellcheck disable=SC2086
	timeout 110 .dev/mkserve bench model --backend cuda --config configs/shapes/deepseek-v3-4l --batch 1,32,128 --context 1024 \
		--prefill 4096 --steps 5 $args --json 2>"$OUT/world$w.err" | python3 -c 'import json,sys
for r in json.load(sys.stdin): print("  %-8s batch %4d ms %8.3f tokens/s %9.0f" % (r["kind"], r["batch"], r["ms"], r["tokens_per_s"]))' ||
		tail -3 "$OUT/world$w.err"
done
fi
echo "done t=${SECONDS}s"
