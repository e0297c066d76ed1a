#!/usr/bin/env bash
# scripts/pending_gpu.sh — what the twenty-sixth pass wrote after its device
# time ran out (docs/PERF.md, "GPU, twenty-sixth pass", last section).
# Delete or rewrite it once its results are in PERF.md. On the GPU machine,
# from the repository root, with .dev/device.tar.xz carried (make
# device-bins), one device call (~5 minutes):
#   1. build .dev/libmkernel.so (the vectorised f32_to_bf16 and split_bf16);
#   2. TestConvert (bit for bit, tails and unaligned views) and
#      TestGemmSplit (bit for bit), then every kernel test;
#   3. the rank-local ring with gather buffers (mk_ring_attn_rank_gather,
#      ABI 22: ring_wg at head dims 128): TestRingRankLocalStreams (R = 2, 3,
#      4 launches on streams, bit for bit against the emulated launch) and
#      TestRingIPC (two processes; on nvidia-h200-x2 also one per GPU, with
#      the TIMING lines against flash_wg with all keys local: #7's ring
#      target) — the whole kernel suite of step 2 runs them too, this
#      prints their lines;
#   4. MKSERVE_PREFILL_BF16=1 (opt-in: a prefill's attention output in
#      bf16 only, read by the o projection without a conversion): the
#      backend's golden checkpoints and engine tests with it on;
#   5. the Qwen3-8l 8192-token prefill (39.0–41.3 ms before), twice each
#      without and with MKSERVE_PREFILL_BF16=1, and ncu's durations of the
#      two conversion kernels (159 µs / 81 µs a call at 8192 × 4096 /
#      8192 × 2048 before).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" .dev/logs/build.log | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
timeout 60 .dev/kernels.test -test.count=1 -test.v -test.timeout 55s -test.run '^(TestConvert|TestGemmSplit)$' >"$OUT/convert.log" 2>&1
echo "convert rc=$? pass $(grep -c -- '--- PASS' "$OUT/convert.log") fail $(grep -c -- '--- FAIL' "$OUT/convert.log")"
grep -E -- '--- FAIL|panic|_test.go' "$OUT/convert.log" | head -8
timeout 300 .dev/kernels.test -test.count=1 -test.v -test.timeout 295s >"$OUT/kernels.log" 2>&1
echo "kernels rc=$? $(tail -1 "$OUT/kernels.log")"
grep -E -- '--- FAIL|panic' "$OUT/kernels.log" | head
grep -E -- '--- (PASS|FAIL|SKIP): TestRing(RankLocalStreams|IPC)/|TIMING' "$OUT/kernels.log" | head -40
(cd backend/cuda && MKSERVE_PREFILL_BF16=1 timeout 200 ../../.dev/cuda.test -test.count=1 -test.v \
	-test.run '^(TestGolden|TestGoldenLatentMLA|TestEngineMatchesGreedy|TestEngineContextParallel)$' >"$OUT/prefill_bf16.log" 2>&1
	echo "prefill bf16 tests rc=$? pass $(grep -c -- '--- PASS' "$OUT/prefill_bf16.log") fail $(grep -c -- '--- FAIL' "$OUT/prefill_bf16.log")")
grep -E -- '--- FAIL|panic' "$OUT/prefill_bf16.log" | head
for r in 1 2; do
	for v in 0 1; do
		echo -n "prefill 8192 qwen3-8l, MKSERVE_PREFILL_BF16=$v, round $r (t=${SECONDS}s): "
		MKSERVE_PREFILL_BF16=$v timeout 60 .dev/mkserve bench model --backend cuda --config configs/shapes/qwen3-30b-a3b-8l \
			--batch 1 --steps 5 --prefill 8192 --json 2>&1 | grep -oE '"(kind|ms)":[^,}]*' | paste -sd' '
	done
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "== ncu (t=${SECONDS}s)"
timeout 150 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --launch-count 200 \
	-k 'regex:f32_to_bf16|split_bf16' .dev/mkserve bench model --backend cuda --config configs/shapes/qwen3-30b-a3b-8l \
	--batch 1 --steps 5 --prefill 8192 --json >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
python3 - "$OUT/ncu.csv" <<'PY'
import csv, re, sys, collections
lines = open(sys.argv[1]).read().split("\n")
start = [i for i, l in enumerate(lines) if l.startswith('"ID"')]
if not start:
    sys.exit("no ncu rows")
rows = list(csv.reader(lines[start[0]:]))
h = rows[0]
k, v, g = h.index("Kernel Name"), h.index("Metric Value"), h.index("Grid Size")
agg = collections.defaultdict(list)
for r in rows[1:]:
    if len(r) == len(h):
        agg[(re.sub(r"\(.*", "", r[k]).replace("void ", "").replace("<unnamed>::", ""), r[g])].append(float(r[v].replace(",", "")))
for (n, grid), ds in sorted(agg.items()):
    ds.sort()
    print(f"{n:16s} grid {grid:>14s} calls {len(ds):4d} median {ds[len(ds) // 2] / 1e3:8.1f} us")
PY
echo "done t=${SECONDS}s"
