#!/usr/bin/env bash
# scripts/pending_gpu.sh — what the twenty-seventh pass changed after its
# device time ran out, and the profile its notes ask for first (docs/PERF.md,
# "GPU, twenty-seventh pass"). Delete or rewrite it once its results are in
# PERF.md. On the GPU machine, from the repository root, with
# .dev/device.tar.xz carried (make device-bins), three device calls of
# ~4–6 minutes: `bash scripts/pending_gpu.sh 1` (steps 1–4), `… 2` (1 and
# 5: the flash / ring tests of every variant, then their timings) and
# `… 3` (1, 6 and 7); no argument runs all three in one call:
#   1. build .dev/libmkernel.so;
#   2. the backend's allocator and graph tests: the large-buffer pool's
#      default cap (an eighth of the GPU's memory, at most 16 GiB) and its
#      byte count when a graph capture takes a pooled large buffer
#      (checkLarge in TestGraphStepsLeakNothing and TestAllocLargePool),
#      the per-step metadata caches (TestI32Caches; the MLA fresh prefill's
#      and the world's context-parallel attention's uploads, once a step
#      now), then the golden and engine tests and the world serving test;
#   3. the align's loops in batches of 8 ids a thread (align_block, on the
#      default path: moe_align_kernel took 52 µs at 8192 Qwen3 tokens, 64
#      dependent load-then-atomic steps a thread): the MoE kernel tests,
#      then ncu's duration of the align at 8k (expected ~10–15 µs);
#   4. the column copies of the MLA prefill (SplitCols / ConcatCols) a
#      row at a time, four floats a thread where aligned (copy_cols_rows:
#      one 32-bit division a unit instead of three 64-bit ones an
#      element; ~900 M floats a DeepSeek-V3 layer at 8k): TestCopyColsF32
#      with the MoE tests, the golden MLA checkpoints with the backend's;
#      then the 8k prefills (Qwen3-8l 30.0 ms, Mixtral-4l 50.9 ms in call
#      152, DeepSeek-V3-4l 154–159 ms in call 150) after the cap change,
#      the align and the copies;
#   5. flash_wg's and ring_wg's consumer loop: the lazy rescale (a warp
#      whose row maxima stayed put skips O's 64 multiplications by 1: the
#      same bits; default) and MK_FLASH_ALT=1 (P alternating between two
#      register arrays, so that ptxas does not serialise every wgmma:
#      C7513 in the device build of the default loop): TestFlashAttention
#      and the ring tests with and without MK_FLASH_ALT=1, then `bench
#      attention` at 1k / 4k / 16k and `bench ring` at 16k for the default,
#      MK_FLASH_RESCALE_ALL=1 (every tile, as before), MK_FLASH_ALT=1 and
#      MK_FLASH_PINGPONG=1 (the alternating loop with the two consumer
#      warpgroups taking turns, flash_wg only), alternating, two rounds,
#      and the 8k prefill with MK_FLASH_ALT=1. Flip the defaults that win
#      (kernels/flash.cu, ring.cu);
#   6. MK_FLASH_WG192=1: DeepSeek-V3's MLA prefill attention (head dims
#      192 / 128) on flash_wg (two stages, 8 rows a producer thread;
#      the mma.sync kernel ran 218 TFLOP/s at 4k): TestFlashAttention's
#      four MLA cases with it (above), `bench attention` at DeepSeek-V3's
#      128 heads and the DeepSeek-V3-4l 8k prefill, with and without
#      MK_FLASH_ALT=1;
#   7. ncu's full sections of flash_wg at 16k causal (32 / 8 heads, d 128:
#      445–454 TFLOP/s against cuDNN's 671) — stall reasons, tensor-pipe
#      and issue activity, to decide what closes the cuDNN gap (TMA for K
#      and V, the consumers' softmax, or the producer).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PART=${1:-all}
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" .dev/logs/build.log | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
# Which kernels ptxas serialised (C7513): flash_wg<false, false> and
# ring_wg<false> are expected, the <true, …> ones not.
grep -h "C7513" .dev/logs/build.log | grep -oE "in the function '[^']*'" | c++filt 2>/dev/null | sort | uniq -c
if [ "$PART" = 1 ] || [ "$PART" = all ]; then
(cd backend/cuda && timeout 150 ../../.dev/cuda.test -test.count=1 -test.v -test.timeout 145s \
	-test.run '^(TestAlloc.*|TestLarge.*|TestRelease|TestI32Caches|TestGraph.*|TestEngine.*|TestGolden.*)$' >"$OUT/cuda.log" 2>&1
	echo "cuda rc=$? pass $(grep -c -- '--- PASS' "$OUT/cuda.log") fail $(grep -c -- '--- FAIL' "$OUT/cuda.log") $(tail -1 "$OUT/cuda.log")")
grep -E -- '--- FAIL|panic|pool holds' "$OUT/cuda.log" | head
# The world of processes with context-parallel prefill (worldCPAttention's
# metadata through stepArrays), on this GPU or two.
(cd cmd/mkserve && MKSERVE_TEST_BACKEND=cuda timeout 100 ../../.dev/mkserve.test -test.v -test.count=1 -test.timeout 95s \
	-test.run 'TestServeWorldProcesses$' >"$OUT/wserve.log" 2>&1; echo "world serving test rc=$?")
grep -E -- '^(--- |    --- )' "$OUT/wserve.log" | head
timeout 150 .dev/kernels.test -test.count=1 -test.v -test.timeout 145s \
	-test.run '^(TestMoEExperts|TestMoEWorkspaceReuse|TestMoERoute|TestMoECombineAddRMSNorm|TestMoELocalize|TestCopyColsF32)$' >"$OUT/moe.log" 2>&1
echo "moe + copy-cols kernels rc=$? pass $(grep -c -- '--- PASS' "$OUT/moe.log") fail $(grep -c -- '--- FAIL' "$OUT/moe.log") $(tail -1 "$OUT/moe.log")"
grep -E -- '--- FAIL|panic' "$OUT/moe.log" | head
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 90 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 16 -k 'regex:moe_align' \
	.dev/mkserve bench model --backend cuda --config configs/shapes/qwen3-30b-a3b-8l --batch 1 --steps 5 --prefill 8192 --json 2>/dev/null |
	grep moe_align | awk -F'","' '{print $NF}' | tr -d '",' | sort -n | awk '{a[NR]=$1} END {print "moe_align at 8k: median " a[int((NR+1)/2)] " ns of " NR " calls"}'
for cfg in qwen3-30b-a3b-8l mixtral-8x7b-4l deepseek-v3-4l; do
	echo -n "prefill 8192 $cfg (t=${SECONDS}s): "
	timeout 60 .dev/mkserve bench model --backend cuda --config "configs/shapes/$cfg" --batch 1 --steps 15 --prefill 8192 --json 2>&1 |
		grep -oE '"(kind|ms|mallocs_per_run)":[^,}]*' | paste -sd' '
done
fi
if [ "$PART" = 2 ] || [ "$PART" = all ]; then
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in MK_FLASH_ALT=0 MK_FLASH_ALT=1 MK_FLASH_PINGPONG=1 MK_FLASH_WG192=1 MK_FLASH_WG192=1,MK_FLASH_ALT=1; do
	env ${v//,/ } timeout 150 .dev/kernels.test -test.count=1 -test.v -test.timeout 145s \
		-test.run '^(TestFlashAttention|TestRingAttention|TestRingWatchdog|TestRingRankLocalStreams)$' >"$OUT/flash_${v//[=,]/_}.log" 2>&1
	echo "flash + ring, $v: rc=$? pass $(grep -c -- '--- PASS' "$OUT/flash_${v//[=,]/_}.log") fail $(grep -c -- '--- FAIL' "$OUT/flash_${v//[=,]/_}.log") $(tail -1 "$OUT/flash_${v//[=,]/_}.log")"
	grep -E -- '--- FAIL|panic' "$OUT/flash_${v//[=,]/_}.log" | head
done
for r in 1 2; do
	for v in "MK_FLASH_ALT=0" "MK_FLASH_RESCALE_ALL=1" "MK_FLASH_ALT=1" "MK_FLASH_PINGPONG=1"; do
		echo -n "$v round $r: attention "
		env $v timeout 60 .dev/mkserve bench attention --seq 1024,4096,16384 --heads 32 --kv-heads 8 \
			--head-dim 128 --causal --json 2>&1 | grep -oE '"tflops":[^,}]*' | paste -sd' ' | tr '\n' ' '
		echo -n "; ring 16k R=4 "
		env $v timeout 60 .dev/mkserve bench ring --seq 16384 --ranks 4 --heads 32 --kv-heads 8 --head-dim 128 \
			--causal --iters 5 --json 2>&1 | grep -oE '"(ms|single_rank_ms|rel_err)":[^,}]*' | paste -sd' '
	done
done
fi
if [ "$PART" = 3 ] || [ "$PART" = all ]; then
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for v in MK_FLASH_WG192=0 MK_FLASH_WG192=1 MK_FLASH_WG192=1,MK_FLASH_ALT=1; do
	echo -n "MLA attention (128 heads, 192/128, causal) $v: "
	env ${v//,/ } timeout 60 .dev/mkserve bench attention --seq 4096,8192 --heads 128 --kv-heads 128 --head-dim 192 \
		--v-head-dim 128 --causal --json 2>&1 | grep -oE '"(tflops|rel_err)":[^,}]*' | paste -sd' ' | tr '\n' ' '
	echo -n "; deepseek-v3-4l prefill 8192: "
	env ${v//,/ } timeout 90 .dev/mkserve bench model --backend cuda --config configs/shapes/deepseek-v3-4l --batch 1 \
		--steps 15 --prefill 8192 --json 2>&1 | grep -oE '"(kind|ms)":[^,}]*' | head -2 | paste -sd' '
done
echo -n "prefill 8192 qwen3-8l MK_FLASH_ALT=1: "
MK_FLASH_ALT=1 timeout 60 .dev/mkserve bench model --backend cuda --config configs/shapes/qwen3-30b-a3b-8l --batch 1 \
	--steps 15 --prefill 8192 --json 2>&1 | grep -oE '"(kind|ms)":[^,}]*' | paste -sd' '
for alt in 0 1; do
	echo "== ncu flash_wg 16k causal, MK_FLASH_ALT=$alt (t=${SECONDS}s)"
	MK_FLASH_ALT=$alt timeout 200 "$NCU" --clock-control none --launch-skip 2 --launch-count 1 -k 'regex:flash_wg' \
		--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section InstructionStats \
		--section LaunchStats --section Occupancy \
		.dev/mkserve bench attention --seq 16384 --heads 32 --kv-heads 8 --head-dim 128 --causal --iters 10 --json \
		>"$OUT/ncu_flash$alt.txt" 2>&1
	grep -E "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Executed Ipc|Warp Cycles Per Issued|Stall|Tensor|Registers Per|Achieved Occupancy" \
		"$OUT/ncu_flash$alt.txt" | head -40
done
fi
echo "done t=${SECONDS}s"
