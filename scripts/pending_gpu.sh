#!/usr/bin/env bash
# scripts/pending_gpu.sh — what the twenty-ninth pass wrote after its device
# time ran out (docs/PERF.md, "Written after the device time ran out
# (twenty-ninth pass)"). Delete or rewrite it once its results are in
# PERF.md. On the GPU machine (nvidia-h200), from the repository root, with
# .dev/device.tar.xz carried (make device-bins): `bash scripts/pending_gpu.sh`
# (~2 minutes after the build).
#   MK_RING_READY=1 — ring_wg's slots skip the waits (a flag round trip and
#   the producer warpgroup's barrier) for chunks their CTA already saw
#   arrive, and, emulated, for those whose arrival counters read full when
#   the slot is taken (ready_steps). The ring tests with it (emulated and
#   rank-local streams), then bench ring at 16k R = 2 / 4 / 8 with and
#   without it, alternating, three rounds, with the copies and without
#   (MK_RING_NOCOPY=1, a measurement whose results are wrong). Expected
#   from call 171's ncu (R = 8 without copies: barrier stalls 1.51 warp-
#   cycles an issue against 1.13 at R = 1, the same instructions): R = 8's
#   16k overhead without copies +14 % → ~+8 %, with copies ~−3 points.
#   Make it the default if it wins (ring.cu, fill_params: noready).
#   MK_RING_BULK=1 — ring_wg's comm CTAs forward chunks by TMA bulk copies
#   through shared memory (copy_bulk: one thread, 3 × 32 KB in flight)
#   instead of 384 threads' 16-byte loads. The ring tests with it, then the
#   same A/B rounds. Expected: the emulated hops faster (going from 4 to 8
#   comm CTAs a rank gained 0.1–0.3 ms at 16k R = 8), so R = 8's copy share
#   (~half its 16k overhead) shrinks. Make it the default if it wins (ring.cu,
#   fill_params: bulk).
# Then the serving test on the CUDA backend with requests that sample on
# the host (JSON mode, n = 2, logit_bias) beside plain ones: since the
# twenty-ninth pass only those rows' logits come back (backend Rows) while
# the others stay on the device sampler (engine.mixedPicks) — written
# without a GPU, so this is its first run there.
# Then what constrained decoding costs on the GPU: `bench serve` against
# `serve --backend cuda --precision fast` on the default model, plain and
# with --json-object (rows with a grammar sample on the host, only their
# logits rows copied back; the others stay on the device sampler).
# Then `bench ring --repeat 6 --spacer-mb 40`: the same ring measured six
# times in one process, each time with its buffers 40 MB further on (a
# spacer allocated first). The ring's 16k timings have been bimodal from
# run to run (R = 2: 4.46 or 4.8–4.9 ms, twenty-eighth pass); if the
# modes follow the repetitions' placement, buffer placement (L2 slices /
# the two L2 halves) decides them, and the engine's allocator could place
# the ring's buffers on purpose.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" .dev/logs/build.log | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
echo "built t=${SECONDS}s"
MK_RING_READY=1 timeout 60 .dev/kernels.test -test.count=1 -test.v -test.timeout 55s \
	-test.run '^(TestRingAttention|TestRingWatchdog|TestRingRankLocalStreams)$' >"$OUT/ringready.log" 2>&1
rc=$?
echo "ring tests, MK_RING_READY=1: rc=$rc pass $(grep -c -- '--- PASS' "$OUT/ringready.log") fail $(grep -c -- '--- FAIL' "$OUT/ringready.log")"
grep -E -- '--- FAIL|panic' "$OUT/ringready.log" | head
[ $rc = 0 ] || exit 1
MK_RING_BULK=1 timeout 60 .dev/kernels.test -test.count=1 -test.v -test.timeout 55s \
	-test.run '^(TestRingAttention|TestRingWatchdog|TestRingRankLocalStreams)$' >"$OUT/ringbulk.log" 2>&1
rc=$?
echo "ring tests, MK_RING_BULK=1: rc=$rc pass $(grep -c -- '--- PASS' "$OUT/ringbulk.log") fail $(grep -c -- '--- FAIL' "$OUT/ringbulk.log")"
grep -E -- '--- FAIL|panic' "$OUT/ringbulk.log" | head
for r in 1 2 3; do
	for v in "MK_RING_READY=0" "MK_RING_READY=1" "MK_RING_READY=0 MK_RING_NOCOPY=1" "MK_RING_READY=1 MK_RING_NOCOPY=1" "MK_RING_BULK=1" "MK_RING_BULK=1 MK_RING_READY=1"; do
		echo -n "round $r $v 16k: "
		# shellcheck disable=SC2086
		env $v timeout 30 .dev/mkserve bench ring --seq 16384 --ranks 2,4,8 --heads 32 --kv-heads 8 --head-dim 128 --causal \
			--iters 5 --json 2>&1 | grep -oE '"(ranks|ms|single_rank_ms)":[^,}]*' | cut -c1-22 | paste -sd' '
	done
done
(cd cmd/mkserve && MKSERVE_TEST_BACKEND=cuda timeout 120 ../../.dev/mkserve.test -test.v -test.count=1 -test.timeout 115s \
	-test.run '^TestServeEndToEnd$' >"$OUT/serve_mixed.log" 2>&1; echo "serving, mixed host/device sampling on cuda: rc=$? $(tail -1 "$OUT/serve_mixed.log")")
for b in "" "--json-object"; do
	echo "== bench serve on cuda, fast, BENCH_ARGS='$b' (t=${SECONDS}s)"
	BENCH_ARGS="$b" timeout 150 bash scripts/bench_serve_gpu.sh .dev/mkserve fast 2>&1 |
		grep -oE '"(completed|failed|output_token_throughput|request_throughput)":[^,}]*' | paste -sd' '
done
echo "== placement: --repeat 6 --spacer-mb 40 (t=${SECONDS}s)"
timeout 120 .dev/mkserve bench ring --seq 16384 --ranks 2,8 --heads 32 --kv-heads 8 --head-dim 128 --causal --iters 5 \
	--repeat 6 --spacer-mb 40 --json 2>&1 | python3 -c 'import json,sys
for r in json.load(sys.stdin): print("   R=%d spacer %4d MB: ring %.3f ms, one rank %.3f, separate %.3f" % (r["ranks"], r.get("spacer_mb", 0), r["ms"], r["single_rank_ms"], r["separate_ms"]))'
echo "done t=${SECONDS}s"
