#!/usr/bin/env bash
# scripts/device.sh — the kernels' one script for the GPU machine.
#
# Run it there, from the repository root, through the device tool (see
# kernels/README.md for the carry/run recipe). It
#   1. builds .dev/libmkernel.so with nvcc (sm_90a; the flags of kernels/Makefile),
#      while a PyTorch baseline (kernels/bench_torch.py) times the same GEMM shapes;
#   2. runs the carried Go test binary .dev/kernels.test (built here, on the
#      CPU machine: CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w'
#      -o .dev/kernels.test ./kernels) with MKSERVE_REQUIRE_GPU=1, so a missing
#      library or GPU fails instead of skipping; every top-level test runs
#      in its own process (run_each), so a panic ends only that test;
#   3. runs its benchmarks (GEMM TFLOP/s, copy and op GB/s);
#   4. runs the CUDA model backend's test binary .dev/cuda.test when carried
#      (CGO_ENABLED=0 go test -c -trimpath -ldflags='-s -w' -o .dev/cuda.test
#      ./backend/cuda) from backend/cuda, so testdata paths resolve (cuda.log),
#      also one process per top-level test and per TestGolden family;
#   5. prints a summary table last.
# MK_QUICK=1 skips the PyTorch baseline and the benchmarks.
# MK_CUDA_BENCH=1 only builds the library, then runs the CUDA backend's
# benchmarks (.dev/cuda.test -test.bench ., from backend/cuda; cuda_bench.log)
# and their transformers baseline (scripts/bench_hf_default.py; hf.log),
# one after the other so neither disturbs the other's timings; no tests.
# Logs go to $OUT (the device tool's result folder), else .dev/out.
# Environment: OUT, MK_BUILD_DIR (default .dev), MK_TEST_BIN (default
# .dev/kernels.test), MK_BENCHTIME (default 200x), MK_COUNT (default 3).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/.dev/out}
BUILD=${MK_BUILD_DIR:-$PWD/.dev}
TEST_BIN=${MK_TEST_BIN:-$PWD/.dev/kernels.test}
mkdir -p "$OUT" "$BUILD"
export PATH="$PATH:/usr/local/cuda/bin"
status=0

{
	date -u
	uname -a
	nvidia-smi
	nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
	command -v nvcc && nvcc --version
} >"$OUT/env.txt" 2>&1
nvidia-smi -L

NVCC=$(command -v nvcc) || { echo "device.sh: nvcc not found on PATH" >&2; exit 1; }
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
CUDA_LIB=$CUDA_ROOT/lib64
[ -d "$CUDA_LIB" ] || CUDA_LIB=$CUDA_ROOT/targets/x86_64-linux/lib
FLAGS=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC,-Wall -Xcompiler -fvisibility=hidden)

build() {
	local f pids=() rc=0
	local srcs=(kernels/*.cu) objs=()
	for f in "${srcs[@]}"; do
		f=$(basename "$f" .cu)
		objs+=("$BUILD/mk_$f.o")
		local extra=()
		[ "$f" = ops ] && extra=(-Xptxas -v) # registers, spills and shared memory of the op kernels
		"$NVCC" "${FLAGS[@]}" "${extra[@]}" -c -o "$BUILD/mk_$f.o" "kernels/$f.cu" &
		pids+=($!)
	done
	for f in "${pids[@]}"; do wait "$f" || rc=1; done
	[ "$rc" = 0 ] || return 1
	"$NVCC" "${FLAGS[@]}" -shared -o "$BUILD/libmkernel.so" "${objs[@]}" \
		-lcublasLt -lcublas -Xlinker -rpath,"$CUDA_LIB"
}

# GOLDEN_FAMILIES: TestGolden's subtests, each run in its own process.
GOLDEN_FAMILIES=${MK_GOLDEN_FAMILIES:-mixtral qwen2_moe qwen3_moe olmoe deepseek_v3 gpt_oss}

# run_each BIN LOG DIR SECONDS runs every top-level test of the Go test binary
# BIN (TestGolden once per family) as its own process from DIR, with a
# timeout of SECONDS each, appending to LOG, so that a panic or hang ends
# only its own test. Returns 1 when any run fails.
run_each() {
	local bin=$1 log=$2 dir=$3 tmo=$4 rc=0 name pat src
	: >"$log"
	for name in $(cd "$dir" && "$bin" -test.list '^Test'); do
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

echo "== build libmkernel.so ($("$NVCC" --version | tail -1)) in the background; PyTorch baseline meanwhile"
SECONDS=0
(build) >"$OUT/build.log" 2>&1 &
bpid=$!
if [ "${MK_QUICK:-0}" != 1 ] && [ "${MK_CUDA_BENCH:-0}" != 1 ]; then
	PYTHONUNBUFFERED=1 timeout 100 python3 kernels/bench_torch.py >"$OUT/torch.log" 2>&1 || {
		echo "device.sh: PyTorch baseline failed (rc $?):"; tail -5 "$OUT/torch.log"
	}
fi
wait "$bpid"
brc=$?
echo "== build rc $brc after ${SECONDS}s"
if [ "$brc" != 0 ]; then
	grep -E "error|warning" "$OUT/build.log" | head -40
	echo "device.sh: the build failed; see build.log"
	status=1
else
	grep -E "warning" "$OUT/build.log" | head -10
	export MKSERVE_KERNEL_LIB=$BUILD/libmkernel.so MKSERVE_REQUIRE_GPU=1
	if [ "${MK_CUDA_BENCH:-0}" = 1 ]; then
		CUDA_BIN=${MK_CUDA_TEST_BIN:-$PWD/.dev/cuda.test}
		echo "== CUDA backend benchmarks (benchtime ${MK_BENCHTIME:-20x})"
		SECONDS=0
		(cd backend/cuda && timeout 100 "$CUDA_BIN" -test.run '^$' -test.bench . \
			-test.benchtime "${MK_BENCHTIME:-20x}" -test.timeout=95s) >"$OUT/cuda_bench.log" 2>&1 || status=1
		grep -E "^Benchmark|FAIL|panic" "$OUT/cuda_bench.log"
		echo "== CUDA backend benchmarks took ${SECONDS}s; transformers baseline"
		SECONDS=0
		PYTHONUNBUFFERED=1 timeout 100 python3 scripts/bench_hf_default.py >"$OUT/hf.log" 2>&1 || status=1
		grep -E "^hf " "$OUT/hf.log"
		echo "== baseline took ${SECONDS}s"
		echo "device.sh: status $status (cuda bench; logs in $OUT)"
		exit "$status"
	fi
	if [ ! -x "$TEST_BIN" ]; then
		echo "device.sh: no test binary at $TEST_BIN (build it on the CPU machine and carry it)"
		status=1
	else
		echo "== tests (each top-level test in its own process)"
		SECONDS=0
		run_each "$TEST_BIN" "$OUT/test.log" . 60 || status=1
		grep -E -- "--- FAIL|^(FAIL|PASS|ok)|panic|Error|error" "$OUT/test.log" | grep -v "relative L2 error" | head -40
		echo "== tests took ${SECONDS}s"
		CUDA_BIN=${MK_CUDA_TEST_BIN:-$PWD/.dev/cuda.test}
		if [ -x "$CUDA_BIN" ]; then
			echo "== CUDA backend tests (each top-level test, and each TestGolden family, in its own process)"
			SECONDS=0
			run_each "$CUDA_BIN" "$OUT/cuda.log" backend/cuda 90 || status=1
			grep -E -- "--- FAIL|^(FAIL|PASS|ok)|panic|OPS|GOLDEN|GREEDY|ENGINE|relative L2 [0-9.e-]+ >" "$OUT/cuda.log" | head -120
			echo "== CUDA backend tests took ${SECONDS}s"
		fi
		[ "${MK_QUICK:-0}" = 1 ] && { echo "device.sh: status $status (quick; logs in $OUT)"; exit "$status"; }
		echo "== benchmarks"
		SECONDS=0
		timeout 130 "$TEST_BIN" -test.run '^$' -test.bench . -test.benchtime "${MK_BENCHTIME:-200x}" \
			-test.count "${MK_COUNT:-3}" -test.timeout=125s >"$OUT/bench.log" 2>&1 || {
			status=1
			tail -20 "$OUT/bench.log"
		}
		echo "== benchmarks took ${SECONDS}s"
	fi
fi

python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import os, re, statistics, sys
out = sys.argv[1]
def read(name):
    p = os.path.join(out, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""
test, bench, torch = read("test.log"), read("bench.log"), read("torch.log")
print("== summary")
tops = re.findall(r"^--- (PASS|FAIL|SKIP): (\S+)", test, re.M)
subs = re.findall(r"^\s+--- (PASS|FAIL|SKIP): (\S+)", test, re.M)
for kind in ("PASS", "FAIL", "SKIP"):
    names = [n for k, n in tops if k == kind]
    print(f"tests {kind.lower()}: {len(names)} top-level, {sum(1 for k, _ in subs if k == kind)} subtests {' '.join(names) if kind != 'PASS' else ''}")
for line in re.findall(r"GEMMs so far.*", test):
    print(line)
def metric(line, unit):
    m = re.search(r"([0-9.e+-]+) " + re.escape(unit) + r"(\s|$)", line)
    return float(m.group(1)) if m else None
gemm, ops = {}, {}
for line in bench.splitlines():
    m = re.match(r"BenchmarkGemmBF16/M=(\d+)_N=(\d+)_K=(\d+)", line)
    if m:
        key = tuple(map(int, m.groups()))
        gemm.setdefault(key, []).append((metric(line, "TFLOP/s"), metric(line, "us/gemm"), metric(line, "GB/s"), metric(line, "issue-us/op")))
        continue
    m = re.match(r"Benchmark(CopyD2D|Ops/\S+?)(-\d+)?\s", line)
    if m:
        ops.setdefault(m.group(1), []).append((metric(line, "GB/s"), metric(line, "us/op") or metric(line, "us/copy")))
tg, tgg, tc = {}, {}, []
for line in torch.splitlines():
    p = line.split()
    if len(p) < 4 or p[0] != "torch":
        continue
    if p[1] == "gemm":
        tg.setdefault(tuple(map(int, p[2:5])), []).append((float(p[5]), float(p[6])))
    elif p[1] == "gemmgraph" and "failed" not in line:
        tgg.setdefault(tuple(map(int, p[2:5])), []).append((float(p[5]), float(p[6])))
    elif p[1] == "copy":
        tc.append(float(p[2]))
med = lambda xs: statistics.median(xs) if xs else float("nan")
print("mk: libmkernel via Go (events; issue = host us per call); torch: eager torch.matmul, and graph = the same calls replayed from a CUDA graph")
print(f"{'GEMM bf16 (C=A·Bᵀ)':<24}{'mk TFLOP/s':>11}{'mk us':>8}{'issue us':>9}{'mk GB/s':>8}{'torch TF/s':>11}{'torch us':>9}{'graph TF/s':>11}{'graph us':>9}{'mk/graph':>9}")
for key in sorted(set(gemm) | set(tg), key=lambda k: (k[0] * k[1] * k[2], k)):
    mk = gemm.get(key, [])
    mt, mu, mb, mi = (med([x[i] for x in mk if x[i] is not None]) for i in range(4))
    tt = med([x[0] for x in tg.get(key, [])]); tu = med([x[1] for x in tg.get(key, [])])
    gt = med([x[0] for x in tgg.get(key, [])]); gu = med([x[1] for x in tgg.get(key, [])])
    print(f"{'M=%d N=%d K=%d' % key:<24}{mt:>11.3f}{mu:>8.2f}{mi:>9.2f}{mb:>8.0f}{tt:>11.3f}{tu:>9.2f}{gt:>11.3f}{gu:>9.2f}{mt / gt if gt == gt and gt else float('nan'):>9.2f}")
for name, xs in sorted(ops.items()):
    print(f"{name:<30} {med([x[0] for x in xs if x[0]]):9.0f} GB/s {med([x[1] for x in xs if x[1]]):9.1f} us")
print(f"{'torch copy_ 1 GiB':<30} {med(tc):9.0f} GB/s")
PY
echo "device.sh: status $status (logs in $OUT)"
exit "$status"
