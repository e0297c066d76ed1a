#!/usr/bin/env bash
# scripts/pending_gpu.sh — what the twenty-fourth pass wrote after its
# device time ran out (docs/PERF.md, "GPU, twenty-fourth pass", last
# section). Delete or rewrite it once its results are in PERF.md. On the GPU
# machine, from the repository root, with .dev/device.tar.xz carried (make
# device-bins), in two device calls (~8 minutes each):
#   bash scripts/pending_gpu.sh 1   (items 1–4)
#   bash scripts/pending_gpu.sh 2   (items 1, 5–7)
#   1. build .dev/libmkernel.so;
#   2. tests of the decode routing (≤ 4 tokens) that lays out its rows
#      itself (MK_MOE_ROUTE_DIRECT=1, new, off by default: no align) —
#      TestMoEExperts, the new TestMoEWorkspaceReuse (a 1-token call after
#      a 4-token one in the same workspace) — and of MK_GEMV_RES_MAXK=4096;
#   3. A/B at batch 1, 2, 4: route direct on Qwen3-8l and Mixtral-4l;
#   4. A/B DeepSeek-V3-4l batch 1 (~30 s a run): without the grouped tiles'
#      L2 prefetch (MK_MOE_L2PF=0; the default since the twenty-fourth
#      pass, whose DeepSeek-V3 step A/B ran out of time), and with the
#      resident GEMV kept to K ≤ 4096 (MK_GEMV_RES_MAXK=4096: DeepSeek-V3's
#      K = 7168 GEMVs back on the register-fed kernel);
#   5. the fused MoE kernel's tests with its weight copies' 256-byte L2
#      prefetch (MK_MOE_FUSED_L2PF=256, new, off by default);
#   6. A/B of it: fused layers at R = 8 emulated (where the fused kernel
#      is the engine's path), 1024 / 4096 tokens a rank, all three shapes
#      (bench moe --path fused, which also times the separate launches:
#      the #5 ratio, whose separate GEMMs already prefetch);
#      (the grouped bench's reference check, now the same code, once too);
#   7. BenchmarkPagedAttn's new graph-replay figures (graph-us/op,
#      graph-GB/s) for the warp kernel at batch 1 and 32, 1k–32k: the #4
#      paged-decode target as decode steps run the kernel.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
MK_MODE=none bash scripts/device.sh >"$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head -30; exit 1; }
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
if [ "${1:-1}" = 2 ]; then
	echo "== fused MoE tests, MK_MOE_FUSED_L2PF=256"
	MK_MOE_FUSED_L2PF=256 timeout 150 .dev/kernels.test -test.count=1 \
		-test.run '^(TestMoEFusedLayer|TestMoEFusedCapacity|TestMoEFusedRankLocalStreams)$' >"$OUT/fused.log" 2>&1
	grep -E '^(--- FAIL|FAIL|ok|PASS)|panic' "$OUT/fused.log" | head -10
	echo "== A/B fused layers, R = 8 (t=${SECONDS}s)"
	PATHS=fused RANKS=8 TOKENS=1024,4096 ROUNDS=2 VARIANTS="base: pf256:MK_MOE_FUSED_L2PF=256" \
		timeout 220 bash scripts/ab_moe.sh >"$OUT/ab_fused.txt" 2>&1
	cat "$OUT/ab_fused.txt"
	echo "== bench moe, grouped path (its reference check, shared with the fused path since the twenty-fourth pass)"
	timeout 60 .dev/mkserve bench moe --path grouped --hidden 2048 --intermediate 768 --experts 128 --topk 8 \
		--routing softmax --tokens 1,64 --ranks 1 --json 2>&1 | grep -oE '"(tokens|ms|rel_err|route_mismatch)":[^,]*' | paste -sd' '
	left=$((560 - SECONDS))
	echo "== paged decode, eager and graph replay (t=${SECONDS}s, ${left}s left)"
	MK_DECODE_POOL_TOKENS=1048576 timeout "$left" .dev/kernels.test -test.run '^$' \
		-test.bench 'PagedAttn/warp/B=(1|32)_ctx' -test.benchtime 20x >"$OUT/paged.log" 2>&1
	grep -E '^(Benchmark|FAIL|panic)' "$OUT/paged.log"
	exit 0
fi
echo "== MoE tests with MK_MOE_ROUTE_DIRECT=1"
MK_MOE_ROUTE_DIRECT=1 timeout 150 .dev/kernels.test -test.count=1 -test.v \
	-test.run '^(TestMoEExperts|TestMoEWorkspaceReuse|TestMoECombineAddRMSNorm)$' >"$OUT/direct.log" 2>&1
echo "pass $(grep -c -- '--- PASS' "$OUT/direct.log") fail $(grep -c -- '--- FAIL' "$OUT/direct.log")"
grep -E -- '--- FAIL|panic|^(ok|PASS|FAIL)' "$OUT/direct.log" | head -10
echo "== TestMoEWorkspaceReuse (align path)"
timeout 60 .dev/kernels.test -test.count=1 -test.run '^TestMoEWorkspaceReuse$' 2>&1 | tail -2
echo "== GEMV tests, MK_GEMV_RES_MAXK=4096"
MK_GEMV_RES_MAXK=4096 timeout 60 .dev/kernels.test -test.count=1 \
	-test.run '^(TestGemvBF16|TestGemvBF16Multi|TestMoERouterF32)$' 2>&1 | tail -2
echo "== A/B batch 1, 2, 4, route direct (t=${SECONDS}s)"
CONFIGS="qwen3-30b-a3b-8l mixtral-8x7b-4l" BATCH=1,2,4 ROUNDS=2 VARIANTS="base: direct:MK_MOE_ROUTE_DIRECT=1" \
	timeout 140 bash scripts/ab_model.sh >"$OUT/ab_direct.txt" 2>&1
cat "$OUT/ab_direct.txt"
echo "== A/B DeepSeek-V3-4l batch 1 (t=${SECONDS}s)"
CONFIGS="deepseek-v3-4l" BATCH=1 ROUNDS=2 \
	VARIANTS="base: nopf:MK_MOE_L2PF=0 maxk:MK_GEMV_RES_MAXK=4096" \
	timeout $((580 - SECONDS)) bash scripts/ab_model.sh >"$OUT/ab_ds.txt" 2>&1
cat "$OUT/ab_ds.txt"
echo "done t=${SECONDS}s"
