#!/usr/bin/env bash
# scripts/device.sh — the one script for the GPU machine (which has no Go).
#
# On the CPU machine:   make device-bins      (builds .dev/device.tar.xz:
#                       mkserve, kernels.test, cuda.test, mkserve.test,
#                       all CGO_ENABLED=0)
# Then, through the device tool, from the repository root:
#   run  carry: [".dev/device.tar.xz"]  command: MK_MODE=test bash scripts/device.sh
#
# It unpacks the archive into .dev/, builds .dev/libmkernel.so with nvcc from
# every kernels/*.cu (sm_90a), and then, by MK_MODE:
#   quick  the kernel and CUDA-backend tests only (and the MoE kernel tests
#          again under opt-in switches: MK_SWITCH_TESTS=0 skips those, ~7
#          minutes; with them quick and test need more than one 10-minute
#          device call);
#   test   quick + the serving tests on the GPU (cmd/mkserve's TestServe* and
#          TestBenchMoE{Fused,Grouped,Partial}GPU, each in its own process, with
#          MKSERVE_TEST_BACKEND=cuda) + the `mkserve logits --backend cuda`
#          contract (same output as the CPU form, within tolerance);
#   bench  every benchmark with its baseline in the same run: GEMMs vs
#          torch.matmul, attention vs torch SDPA, MoE vs a torch loop,
#          ring attention over emulated ranks vs one rank, separate
#          launches and torch SDPA (cuDNN, flash),
#          whole models at real shapes (random weights) against the floor,
#          `mkserve bench serve` against `mkserve serve --backend cuda`;
#   serve  only the serving tests and the logits contract;
#   none   only the build (then run a test binary yourself in the same call,
#          with MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so);
#   all    test, then bench (longer than one device call allows for most
#          machines: prefer two calls);
#   ep     (2+ GPUs) issue #7 over every GPU, one process per GPU: ours
#          (`mkserve bench moe --path fused --world R`), then the NCCL
#          baseline (scripts/bench_ep_nccl.py) with grouped GEMMs, then with
#          the per-expert loop; their moe_ep lines printed together
#   world  (2+ GPUs) the rest of issue #7 over every GPU: the two-GPU
#          correctness tests (TestServeWorldProcesses on cuda with both
#          transports, TestRingIPC with its timing, TestNCCL,
#          TestMoEFusedIPC), `bench model --world R` on deepseek-v3-4l
#          against one GPU, and `bench serve` against a world of R
#          processes and against one (scripts/bench_serve_gpu.sh WORLD=)
#          (MK_EP_SHAPES, MK_EP_TOKENS narrow them).
# Every test binary runs each top-level test in its own process (run_each), so
# a crash ends only that test. A summary table is printed last; all logs come
# back as $OUT/logs.tgz (the device tool returns at most 8 files).
# Environment: OUT (default .dev/out), MK_MODE (default test), MK_BENCHTIME_N
# (GEMM calls per timed batch, ours and torch's, default 100), MK_COUNT
# (batches, default 3), MK_SKIP (space-
# separated bench parts to skip: gemm attention decode moe ring backend model
# servebench), MK_TEST_FILTER (a -test.list pattern: only the matching
# top-level tests run), MK_LIB_OLD (a folder of an earlier revision's
# kernels/ sources, from `make device-old REV=...`: .dev/old/libmkernel.so
# built from it for A/Bs; see build_old), MK_LIB_VARIANTS ("NAME:-DMACRO=1 ...": more
# libraries built with those nvcc flags into .dev/NAME/, for A/Bs).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
OUT=${OUT:-$ROOT/.dev/out}
LOGS=$ROOT/.dev/logs
MODE=${MK_MODE:-test}
SKIP=" ${MK_SKIP:-} "
mkdir -p "$OUT" "$LOGS" "$ROOT/.dev"
export PATH="$PATH:/usr/local/cuda/bin"
# NVLink multicast stays off (device README); harmless on one GPU.
export NCCL_NVLS_ENABLE=0
status=0

if [ -f .dev/device.tar.xz ]; then
	tar -C .dev -xJf .dev/device.tar.xz || { echo "device.sh: cannot unpack .dev/device.tar.xz"; exit 1; }
fi
MK=$ROOT/.dev/mkserve

{
	date -u
	uname -a
	nvidia-smi
	nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
	command -v nvcc && nvcc --version
	python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} >"$LOGS/env.txt" 2>&1
nvidia-smi -L

NVCC=$(command -v nvcc) || { echo "device.sh: nvcc not found on PATH" >&2; exit 1; }
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
CUDA_LIB=$CUDA_ROOT/lib64
[ -d "$CUDA_LIB" ] || CUDA_LIB=$CUDA_ROOT/targets/x86_64-linux/lib
FLAGS=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC,-Wall -Xcompiler -fvisibility=hidden)

# build_lib DIR [NVCC FLAGS...] compiles every kernels/*.cu in parallel
# with the extra flags and links DIR/libmkernel.so.
build_lib() {
	local dir=$1 f pids=() rc=0 srcs=(kernels/*.cu) objs=()
	shift
	mkdir -p "$dir"
	for f in "${srcs[@]}"; do
		f=$(basename "$f" .cu)
		objs+=("$dir/mk_$f.o")
		"$NVCC" "${FLAGS[@]}" "$@" -Xptxas -v -c -o "$dir/mk_$f.o" "kernels/$f.cu" &
		pids+=($!)
	done
	for f in "${pids[@]}"; do wait "$f" || rc=1; done
	[ "$rc" = 0 ] || return 1
	"$NVCC" "${FLAGS[@]}" "$@" -shared -o "$dir/libmkernel.so" "${objs[@]}" \
		-lcublasLt -lcublas -ldl -Xlinker -rpath,"$CUDA_LIB"
}

# build makes .dev/libmkernel.so, then one library per variant of
# MK_LIB_VARIANTS ("NAME:-DMACRO=1,-DOTHER ..."): .dev/NAME/libmkernel.so,
# built with those flags, for same-call A/Bs (scripts/ab_model.sh with
# "NAME:MKSERVE_KERNEL_LIB=$PWD/.dev/NAME/libmkernel.so").
build() {
	build_lib .dev || return 1
	local v defs
	for v in ${MK_LIB_VARIANTS:-}; do
		defs=${v#*:}
		# shellcheck disable=SC2086
		build_lib ".dev/${v%%:*}" ${defs//,/ } || return 1
	done
	if [ -n "${MK_LIB_OLD:-}" ]; then build_old "$MK_LIB_OLD" || return 1; fi
}

# build_old SRC makes .dev/old/libmkernel.so from the kernels/ sources of an
# earlier revision in SRC (`make device-old REV=...` writes .dev/old/src;
# carry it and set MK_LIB_OLD=.dev/old/src): a .cu that differs from
# kernels/, or includes (through its local headers) a header that does, is
# compiled again from SRC; the others' objects are .dev's. An A/B against
# the previous build is then "old:MKSERVE_KERNEL_LIB=$PWD/.dev/old/libmkernel.so".
# The old library must have the Go binaries' ABI (mk_abi_version and
# layouts), and a .cu added since REV has no old object: the link fails.
build_old() {
	local src=$1 dir=.dev/old f b rc=0 objs=() pids=()
	[ -d "$src" ] || { echo "device.sh: MK_LIB_OLD=$src is not a folder"; return 1; }
	mkdir -p "$dir"
	for f in "$src"/*.cu; do
		b=$(basename "$f" .cu)
		if old_differs "$src" "$b.cu"; then
			"$NVCC" "${FLAGS[@]}" -c -o "$dir/mk_$b.o" "$f" &
			pids+=($!)
			objs+=("$dir/mk_$b.o")
		else
			objs+=(".dev/mk_$b.o")
		fi
	done
	for f in "${pids[@]}"; do wait "$f" || rc=1; done
	[ "$rc" = 0 ] || return 1
	echo "device.sh: old library from $src (${#pids[@]} sources compiled again)"
	"$NVCC" "${FLAGS[@]}" -shared -o "$dir/libmkernel.so" "${objs[@]}" \
		-lcublasLt -lcublas -ldl -Xlinker -rpath,"$CUDA_LIB"
}

# old_differs SRC FILE [SEEN...]: SRC/FILE differs from kernels/FILE, or a
# local header it includes (#include "x", followed through SRC) does.
old_differs() {
	local src=$1 f=$2 h
	shift 2
	cmp -s "$src/$f" "kernels/$f" || return 0
	for h in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$src/$f"); do
		case " $* " in *" $h "*) continue ;; esac
		[ -f "$src/$h" ] || continue
		old_differs "$src" "$h" "$f" "$@" && return 0
	done
	return 1
}

# GOLDEN_FAMILIES: TestGolden's subtests, each run in its own process.
GOLDEN_FAMILIES=${MK_GOLDEN_FAMILIES:-mixtral qwen2_moe qwen3_moe olmoe deepseek_v3 gpt_oss}

# run_each BIN LOG DIR SECONDS [PATTERN] runs every top-level test of the Go
# test binary BIN matching PATTERN (TestGolden once per family) as its own
# process from DIR, with a timeout of SECONDS each, appending to LOG.
# Returns 1 when any run fails.
run_each() {
	local bin=$1 log=$2 dir=$3 tmo=$4 filter=${5:-${MK_TEST_FILTER:-^Test}} rc=0 name pat src
	: >"$log"
	if [ ! -x "$bin" ]; then
		echo "device.sh: no test binary $bin (make device-bins, carry .dev/device.tar.xz)" | tee -a "$log"
		return 1
	fi
	for name in $(cd "$dir" && "$bin" -test.list "$filter"); do
		local pats=("^$name\$")
		if [ "$name" = TestGolden ]; then
			pats=()
			for f in $GOLDEN_FAMILIES; do pats+=("^TestGolden\$/^$f\$"); done
		fi
		for pat in "${pats[@]}"; do
			(cd "$dir" && timeout "$tmo" "$bin" -test.v -test.count=1 -test.run "$pat" \
				-test.timeout="$((tmo - 5))s") >>"$log" 2>&1
			src=$?
			if [ "$src" != 0 ]; then
				rc=1
				echo "device.sh: $(basename "$bin") -test.run '$pat' exited with rc $src" | tee -a "$log"
			fi
		done
	done
	return "$rc"
}

# switch_test LOG PATTERN VAR=VALUE...: the kernel tests matching PATTERN
# again, each in a process of its own (run_each), with the environment
# switches given (the library reads them once per process); the log is
# $LOGS/LOG.log, its failures and passes printed. Sets status on failure.
switch_test() {
	local log=$LOGS/$1.log pat=$2
	shift 2
	echo "== kernel tests $pat with $*"
	(export "$@" && run_each .dev/kernels.test "$log" . 120 "$pat") || status=1
	grep -E -- "--- FAIL|panic|^--- PASS" "$log" | head -10
}

# step NAME SECONDS CMD... runs one benchmark part unless MK_SKIP names it,
# logging to $LOGS/NAME.log and noting its time.
step() {
	local name=$1 tmo=$2
	shift 2
	case "$SKIP" in *" $name "*) echo "== $name skipped (MK_SKIP)"; return 0 ;; esac
	echo "== $name"
	SECONDS=0
	timeout "$tmo" "$@" >"$LOGS/$name.log" 2>&1
	local rc=$?
	echo "   $name: rc $rc after ${SECONDS}s"
	[ "$rc" = 0 ] || { status=1; tail -5 "$LOGS/$name.log"; }
}

# fresh_lib: .dev/libmkernel.so exists and is newer than every kernel source,
# so a second device.sh in the same call need not rebuild it.
fresh_lib() {
	[ -f .dev/libmkernel.so ] || return 1
	[ -z "$(find kernels -maxdepth 1 \( -name '*.cu' -o -name '*.h' -o -name '*.cuh' \) -newer .dev/libmkernel.so)" ]
}
SECONDS=0
if fresh_lib; then
	echo "== libmkernel.so is newer than every kernels/*.cu and *.h: not rebuilt"
	(true) &
else
	echo "== build libmkernel.so ($("$NVCC" --version | tail -1)) in the background"
	(build) >"$LOGS/build.log" 2>&1 &
fi
bpid=$!
if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
	case "$SKIP" in *" gemm "*) ;; *)
		echo "== torch GEMM baseline meanwhile"
		MK_TORCH_ITERS=${MK_BENCHTIME_N:-100} MK_TORCH_BATCHES=${MK_COUNT:-3} PYTHONUNBUFFERED=1 timeout 200 python3 kernels/bench_torch.py >"$LOGS/torch.log" 2>&1 || {
			echo "device.sh: PyTorch baseline failed (rc $?):"; tail -5 "$LOGS/torch.log"; status=1; }
	esac
fi
wait "$bpid"
brc=$?
echo "== build rc $brc after ${SECONDS}s"
if [ "$brc" != 0 ]; then
	grep -E "error" "$LOGS/build.log" | head -40
	echo "device.sh: the build failed; see build.log"
	tar -C "$ROOT/.dev" -czf "$OUT/logs.tgz" logs
	exit 1
fi
grep -sE "warning" "$LOGS/build.log" | head -10
export MKSERVE_KERNEL_LIB=$ROOT/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1 MKSERVE_REQUIRE_NCCL=1

if [ "$MODE" != bench ] && [ "$MODE" != serve ] && [ "$MODE" != none ] && [ "$MODE" != ep ] && [ "$MODE" != world ]; then
	echo "== kernel tests"
	SECONDS=0
	run_each .dev/kernels.test "$LOGS/test.log" . 120 || status=1
	grep -E -- "--- FAIL|panic" "$LOGS/test.log" | head -40
	echo "   took ${SECONDS}s"
	# The GEMVs' register-fed kernel at M ≤ 2 (the weight-resident one is
	# taken there where it fits).
	switch_test test_gemv_reg '^(TestGemvBF16|TestGemvBF16Multi|TestMoERouterF32|TestMoEGemvOneLaunchSameBits)$' MK_GEMV_SMEM=0
	# The tests again under switches read once per process: ~7 minutes
	# more; MK_SWITCH_TESTS=0 skips them, so that MK_MODE=test fits one
	# 10-minute device call (2026-11-30: the whole of it took more than 560 s).
	if [ "${MK_SWITCH_TESTS:-1}" = 1 ]; then
		# The opt-in one-launch routing and align.
		switch_test test_route_align '^TestMoE(Experts|CombineAddRMSNorm)$' MK_MOE_ROUTE_DIRECT=0 MK_MOE_ROUTE_ALIGN=1
		# Prefill attention on the mma.sync kernel at head dims 128 too (the
		# wgmma kernel, flash_wg, is the default there).
		switch_test test_flash_mma '^TestFlashAttention$' MK_FLASH_WG=0
		# The ring's gather and separate modes on the mma.sync kernel at
		# head dims 128 too (the wgmma kernel, ring_wg, is the default there).
		switch_test test_ring_mma '^TestRing(Attention|Watchdog)$' MK_RING_WG=0
		# The emulated ring's hops as before the fifty-second pass (register
		# copies, every slot waiting on every step).
		switch_test test_ring_regcopy '^TestRing(Attention|Watchdog)$' MK_RING_BULK=0 MK_RING_READY=0
		# Decode routing with the align launch (by default ≤ 4 tokens'
		# routing lays out its rows).
		switch_test test_route_nodirect '^TestMoE(Experts|WorkspaceReuse|CombineAddRMSNorm)$' MK_MOE_ROUTE_DIRECT=0
		# The single-role wgmma grouped GEMM (the default is the
		# warp-specialised kernel).
		switch_test test_wgmma1 '^TestMoEExperts$' MK_MOE_WGMMA=1
		# GEMM1's rows copied into tile order and loaded by TMA: on by default
		# only from intermediate 4096 (mkmoe::gather_by_copy), which the tests'
		# shapes are below: forced on here for the grouped and fused kernels.
		switch_test test_copy_rows '^TestMoE(Experts|FusedLayer|FusedWatchdog|FusedCapacity|FusedRankLocalStreams)$' \
			MK_MOE_G1_TMA=1 MK_MOE_FUSED_COPY_LOCAL=1
		# The grouped GEMM in clusters of two CTAs sharing weight tiles (off
		# by default): with gathered and with TMA-loaded rows.
		switch_test test_pair '^TestMoEExperts$' MK_MOE_PAIR=1
		switch_test test_pair_tma '^TestMoEExperts$' MK_MOE_PAIR=1 MK_MOE_G1_TMA=1
		# The other side of two more switches: f32 return rows in the fused
		# kernel (bf16 by default) and the grouped GEMM with one CTA per item
		# at every reduction size.
		switch_test test_ret_f32 '^TestMoE(Experts|FusedLayer|FusedRankLocalStreams)$' \
			MK_MOE_FUSED_RET_BF16=0 MK_MOE_PERSIST=0
		# GEMM2's reduction split forced on every mma.sync tile (by default
		# only from I = 4096).
		switch_test test_split '^TestMoE(Experts|FusedLayer)$' MK_MOE_G2_SPLIT=4
		# Persistent wgmma grids at every reduction size, their items taken
		# from a counter (MK_MOE_DYN: by default for I <= 1024, forty-fifth
		# pass), and with fixed strides (the earlier form).
		switch_test test_dyn '^TestMoE(Experts|WorkspaceReuse)$' MK_MOE_PERSIST=1 MK_MOE_DYN=1
		switch_test test_strides '^TestMoE(Experts|WorkspaceReuse)$' MK_MOE_PERSIST=1 MK_MOE_DYN=0 MK_MOE_TMA_C=0
		# GEMM1's tiles staged in shared memory and stored by TMA (MK_MOE_TMA_C;
		# by default with items by counter): one CTA an item, and persistent
		# with items by counter and the gathered rows copied for TMA.
		switch_test test_tma_c '^TestMoE(Experts|WorkspaceReuse)$' MK_MOE_TMA_C=1 MK_MOE_PERSIST=0
		switch_test test_tma_c_dyn '^TestMoE(Experts|WorkspaceReuse)$' MK_MOE_TMA_C=1 MK_MOE_PERSIST=1 MK_MOE_DYN=1 \
			MK_MOE_G1_TMA=1
		# The other side of the forty-sixth pass's two rules: the one-block
		# align at every size and the many-block align forced wherever E
		# allows; GEMM2's rows in f32 everywhere and in bf16 on every tile
		# (split sums, FP4 experts, the combine + add + norm).
		switch_test test_align1 '^TestMoE(Experts|WorkspaceReuse)$' MK_MOE_ALIGN_MULTI=0
		switch_test test_align_multi '^TestMoE(Experts|WorkspaceReuse|CombineAddRMSNorm)$' MK_MOE_ALIGN_MULTI=1
		switch_test test_y_f32 '^TestMoE(Experts|CombineAddRMSNorm)$' MK_MOE_Y_BF16=0
		# The fused layer's plan in one CTA a destination at every size, and
		# over many blocks (forced: two or more CTAs a destination) at every size.
		switch_test test_plan1 '^TestMoEFused(Layer|Capacity|Watchdog)$' MK_MOE_PLAN_MULTI=0
		switch_test test_plan_multi '^TestMoEFused(Layer|Capacity|Watchdog|RankLocalStreams)$' MK_MOE_PLAN_MULTI=1
		switch_test test_y_bf16 '^TestMoE(Experts|WorkspaceReuse|CombineAddRMSNorm|ExpertsFP4|FP4Path)$' MK_MOE_Y_BF16=1 MK_MOE_G2_SPLIT=2
	else
		echo "== MoE switch tests skipped (MK_SWITCH_TESTS=0)"
	fi
	echo "== CUDA backend tests"
	SECONDS=0
	run_each "$ROOT/.dev/cuda.test" "$LOGS/cuda.log" backend/cuda 150 || status=1
	grep -E -- "--- FAIL|panic|GOLDEN|relative L2 [0-9.e-]+ >" "$LOGS/cuda.log" | head -60
	echo "   took ${SECONDS}s"
fi
if [ "$MODE" = test ] || [ "$MODE" = all ] || [ "$MODE" = serve ]; then
	echo "== serving tests on the GPU (MKSERVE_TEST_BACKEND=cuda)"
	SECONDS=0
	MKSERVE_TEST_BACKEND=cuda run_each "$ROOT/.dev/mkserve.test" "$LOGS/serve.log" cmd/mkserve 240 '^Test(Serve|BenchServe|RunBatch$|ChatCommand$|BenchMoE(Fused|Grouped|Partial)GPU$)' || status=1
	grep -E -- "--- (FAIL|PASS)|panic" "$LOGS/serve.log" | head -30
	echo "   took ${SECONDS}s"
	echo "== mkserve logits --backend cuda against --backend cpu"
	: >"$LOGS/logits.log"
	for fam in mixtral deepseek_v3 gpt_oss; do
		dir=models/testdata/golden/$fam
		"$MK" logits --backend cpu --model "$dir" --ids 1,5,9,2,7 >"$LOGS/logits_cpu_$fam.json" 2>>"$LOGS/logits.log" &&
			"$MK" logits --backend cuda --model "$dir" --ids 1,5,9,2,7 >"$LOGS/logits_cuda_$fam.json" 2>>"$LOGS/logits.log" &&
			python3 - "$fam" "$LOGS/logits_cpu_$fam.json" "$LOGS/logits_cuda_$fam.json" <<'PY' >>"$LOGS/logits.log" 2>&1 || status=1
import json, math, sys
fam, a, b = sys.argv[1], json.load(open(sys.argv[2]))["logits"], json.load(open(sys.argv[3]))["logits"]
assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b)), "shapes differ"
num = sum((x - y) ** 2 for r, s in zip(a, b) for x, y in zip(r, s))
den = sum(x * x for r in a for x in r)
rel = math.sqrt(num / den)
same = sum(max(range(len(r)), key=r.__getitem__) == max(range(len(s)), key=s.__getitem__) for r, s in zip(a, b))
print(f"LOGITS {fam}: cuda vs cpu relative L2 {rel:.2e}, argmax equal {same}/{len(a)}")
sys.exit(0 if rel <= 2e-2 and same == len(a) else 1)
PY
	done
	cat "$LOGS/logits.log"
fi

if [ "$MODE" = bench ] || [ "$MODE" = all ]; then
	step gemm 300 .dev/kernels.test -test.run '^$' -test.bench 'GemmBF16|CopyD2D|Ops' \
		-test.benchtime "${MK_BENCHTIME_N:-100}x" -test.count "${MK_COUNT:-3}" -test.timeout=290s
	if [ -f scripts/bench_attention.sh ]; then step attention 200 bash scripts/bench_attention.sh "$MK"; fi
	if [ -f scripts/bench_decode.sh ]; then step decode 200 bash scripts/bench_decode.sh; fi
	if [ -f scripts/bench_moe.sh ]; then step moe 300 bash scripts/bench_moe.sh "$MK"; fi
	step ring 300 bash -c "$MK bench ring --seq 16384,65536 --ranks 1,2,4,8 --heads 32 --kv-heads 8 --head-dim 128 \
		--causal --iters 5 --json && python3 scripts/bench_ring_torch.py 16384,65536"
	# The CUDA backend on the small checkpoints against transformers (the
	# backend/cuda benchmarks, then scripts/bench_hf_default.py, one after
	# the other so neither disturbs the other's timings).
	step backend 200 bash -c "(cd backend/cuda && $ROOT/.dev/cuda.test -test.run '^\$' -test.bench . \
		-test.benchtime 20x -test.timeout=120s) && PYTHONUNBUFFERED=1 python3 scripts/bench_hf_default.py"
	step model 560 bash -c "
		$MK bench model --config configs/shapes/qwen3-30b-a3b --batch 1,32,256 --context 1024 --prefill 8192 --profile-ops --json
		$MK bench model --config configs/shapes/mixtral-8x7b --batch 1,32,256 --context 512 --prefill 8192 --profile-ops --json
		echo 'DIRECT: the same Qwen3 decode with GPU calls on the calling goroutines (MKSERVE_GPU_DIRECT=1)'
		MKSERVE_GPU_DIRECT=1 $MK bench model --config configs/shapes/qwen3-30b-a3b --batch 1,32 --context 1024 --prefill 0 --profile-ops --json"
	step servebench 300 bash -c "bash scripts/bench_serve_gpu.sh $MK exact; bash scripts/bench_serve_gpu.sh $MK fast"
fi

if [ "$MODE" = ep ]; then
	# Issue #7 over every GPU of the machine (one process each), three runs
	# one after the other: ours (`mkserve bench moe --path fused --world R`:
	# MoEFusedRankLocal over CUDA IPC, mk moe_ep lines with the layer
	# without communication), then the NCCL baseline with grouped GEMMs
	# (all-to-all + torch._grouped_mm + all-to-all), then with the
	# per-expert loop (nccl moe_ep lines ending in experts=...). MK_SKIP
	# names ep_mk, ep_nccl_grouped, ep_nccl_loop to leave one out.
	ngpu=$(nvidia-smi -L | wc -l)
	if [ "$ngpu" -lt 2 ]; then
		echo "device.sh: MK_MODE=ep needs 2 or more GPUs, this machine has $ngpu"
		status=1
	else
		EP_SHAPES=${MK_EP_SHAPES:-qwen3_30b_a3b,mixtral_8x7b,deepseek_v3}
		EP_TOKENS=${MK_EP_TOKENS:-16,256,1024,4096}
		step ep_mk 260 "$MK" bench moe --path fused --world "$ngpu" --shapes "$EP_SHAPES" --tokens "$EP_TOKENS" --iters 20
		step ep_nccl_grouped 170 python3 -m torch.distributed.run --nproc_per_node "$ngpu" scripts/bench_ep_nccl.py \
			--shapes "$EP_SHAPES" --tokens "$EP_TOKENS" --experts grouped
		step ep_nccl_loop 150 python3 -m torch.distributed.run --nproc_per_node "$ngpu" scripts/bench_ep_nccl.py \
			--shapes "$EP_SHAPES" --tokens "$EP_TOKENS" --experts loop
		for f in ep_mk ep_nccl_grouped ep_nccl_loop; do
			[ -f "$LOGS/$f.log" ] && { echo "== $f.log (tail)"; grep -v "moe_ep" "$LOGS/$f.log" | tail -15; }
		done
		echo "== moe_ep: <who> moe_ep <shape> <tokens/rank> <ranks> <ms> <mk: local_ms | nccl: comm_ms> <rel_err> [experts]"
		cat "$LOGS"/ep_mk.log "$LOGS"/ep_nccl_grouped.log "$LOGS"/ep_nccl_loop.log 2>/dev/null | grep -E "^(mk|nccl) moe_ep" | sort -k3,3 -k4,4n -k1,1
	fi
fi

if [ "$MODE" = world ]; then
	ngpu=$(nvidia-smi -L | wc -l)
	if [ "$ngpu" -lt 2 ]; then
		echo "device.sh: MK_MODE=world needs 2 or more GPUs, this machine has $ngpu"
		status=1
	else
		export MKSERVE_KERNEL_LIB=$ROOT/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
		step world_serve_test 200 bash -c "cd cmd/mkserve && MKSERVE_TEST_BACKEND=cuda ../../.dev/mkserve.test -test.v -test.count=1 -test.timeout 190s -test.run 'TestServeWorldProcesses\$'"
		step world_kernel_tests 200 bash -c "cd kernels && ../.dev/kernels.test -test.v -test.count=1 -test.timeout 190s -test.run '^Test(RingIPC|NCCL|MoEFusedIPC)\$'"
		grep -E -- '^(--- |    --- )|TIMING' "$LOGS/world_serve_test.log" "$LOGS/world_kernel_tests.log" | grep -v one_gpu
		step world_model 300 "$MK" bench model --config configs/shapes/deepseek-v3-4l --batch 1,32,128 --context 1024 --prefill 4096 --steps 5 --world "$ngpu"
		step world_model_one 200 "$MK" bench model --config configs/shapes/deepseek-v3-4l --batch 1,32,128 --context 1024 --prefill 4096 --steps 5
		tail -5 "$LOGS/world_model.log" "$LOGS/world_model_one.log"
		step world_serve 200 bash -c "WORLD=1 bash scripts/bench_serve_gpu.sh $MK fast; WORLD=$ngpu bash scripts/bench_serve_gpu.sh $MK fast"
		grep -E '"(request_throughput|output_throughput|median_ttft_ms|median_itl_ms)"|SERVE' "$LOGS/world_serve.log" | tr -s ' '
	fi
fi

python3 scripts/device_summary.py "$LOGS" | tee "$OUT/summary.txt"
tar -C "$ROOT/.dev" -czf "$OUT/logs.tgz" logs
echo "device.sh: status $status (mode $MODE; logs in \$OUT/logs.tgz)"
exit "$status"
