#!/usr/bin/env bash
# scripts/decode_device.sh — one device call for the paged decode attention
# work: builds libmkernel.so (while the PyTorch baseline scripts/decode_torch.py
# runs), runs the decode kernel tests, the CUDA backend's tests (from
# backend/cuda so the golden testdata resolves), then BenchmarkPagedAttn and
# BenchmarkCopyD2D, and prints a summary (paged attention µs and K/V GB/s
# against the measured copy rate and the torch baseline).
# Layout: run from a folder D holding kernels/ (sources), kernels.test,
# cuda.test, decode_torch.py and this script, inside the repository
# (D/../../backend/cuda must exist). Logs go to $OUT.
set -uo pipefail
D=$(cd "$(dirname "$0")" && pwd)
cd "$D" || exit 1
OUT=${OUT:-$D/out}
mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
NVCC=$(command -v nvcc) || { echo "no nvcc"; exit 1; }
CUDA_ROOT=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
CUDA_LIB=$CUDA_ROOT/lib64
[ -d "$CUDA_LIB" ] || CUDA_LIB=$CUDA_ROOT/targets/x86_64-linux/lib
FLAGS=(-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC,-Wall -Xcompiler -fvisibility=hidden)
status=0
build() {
	local pids=() objs=() rc=0 f
	for f in kernels/*.cu; do
		f=$(basename "$f" .cu)
		objs+=("obj_$f.o")
		local extra=()
		[ "$f" = decode ] && extra=(-Xptxas -v)
		"$NVCC" "${FLAGS[@]}" "${extra[@]}" -c -o "obj_$f.o" "kernels/$f.cu" &
		pids+=($!)
	done
	for f in "${pids[@]}"; do wait "$f" || rc=1; done
	[ "$rc" = 0 ] || return 1
	"$NVCC" "${FLAGS[@]}" -shared -o libmkernel.so "${objs[@]}" -lcublasLt -lcublas -Xlinker -rpath,"$CUDA_LIB"
}
SECONDS=0
(build) >"$OUT/build.log" 2>&1 &
bpid=$!
if [ "${SKIP_TORCH:-0}" != 1 ]; then
	(PYTHONUNBUFFERED=1 timeout 70 python3 decode_torch.py >"$OUT/torch.log" 2>&1) &
	tpid=$!
else
	tpid=
fi
wait "$bpid" || { echo "BUILD FAILED after ${SECONDS}s"; grep -E "error" "$OUT/build.log" | head -30; exit 1; }
echo "== build ok after ${SECONDS}s"
grep -A2 "paged_attn" "$OUT/build.log" | grep -E "registers|spill" | head -8
export MKSERVE_KERNEL_LIB=$D/libmkernel.so MKSERVE_REQUIRE_GPU=1
SECONDS=0
timeout "${TEST_TMO:-120}" ./kernels.test -test.v -test.count=1 -test.run "${KTESTS:-PagedAttn|KVWrite}" >"$OUT/test.log" 2>&1 || status=1
grep -E -- "^(--- |=== RUN|FAIL|ok|PASS)|panic|relative L2 error [0-9.e-]+ >|workspace" "$OUT/test.log" | grep -v "=== RUN" | head -60
echo "== kernel tests took ${SECONDS}s (status $status)"
SECONDS=0
if [ "${SKIP_CUDA:-0}" != 1 ]; then
	# TestGolden in its own process (it leaves expert loads that TestOpsMatchCPU
	# would count), the rest in another; then both again with the CUDA-core
	# kernel (MKSERVE_PAGED_VARIANT=1; the default picks the tensor cores).
	: >"$OUT/cuda.log"
	for v in "" 1; do
		for sel in "-test.run=^TestGolden$" "-test.skip=^TestGolden$"; do
			echo "=== variant '${v:-auto}' $sel" >>"$OUT/cuda.log"
			(cd ../../backend/cuda && MKSERVE_PAGED_VARIANT=$v timeout "${CUDA_TMO:-40}" "$D/cuda.test" -test.v -test.count=1 \
				"$sel" -test.timeout=300s) >>"$OUT/cuda.log" 2>&1 || { status=1; echo "cuda.test variant '${v:-auto}' $sel failed"; }
		done
	done
	grep -E -- "^=== variant|^--- |^(FAIL|ok|PASS)|panic|logits relative L2 [0-9.e-]+,|OPS .*attention|relative L2 [0-9.e-]+ >" "$OUT/cuda.log" | head -90
	echo "== cuda tests took ${SECONDS}s (status $status)"
fi
[ -n "$tpid" ] && wait "$tpid"
SECONDS=0
timeout "${BENCH_TMO:-50}" ./kernels.test -test.run '^$' -test.bench "${BENCH:-PagedAttn|CopyD2D}" -test.benchtime 20x \
	-test.count "${COUNT:-3}" -test.timeout=300s >"$OUT/bench.log" 2>&1 || { status=1; tail -5 "$OUT/bench.log"; }
echo "== bench took ${SECONDS}s"
python3 - "$OUT" <<'PY' | tee "$OUT/summary.txt"
import os, re, statistics, sys
out = sys.argv[1]
rd = lambda n: open(os.path.join(out, n), errors="replace").read() if os.path.exists(os.path.join(out, n)) else ""
bench, torch = rd("bench.log"), rd("torch.log")
med = lambda xs: statistics.median(xs) if xs else float("nan")
def metric(line, unit):
    m = re.search(r"([0-9.e+-]+) " + re.escape(unit) + r"(\s|$)", line)
    return float(m.group(1)) if m else None
copy = [metric(l, "GB/s") for l in bench.splitlines() if l.startswith("BenchmarkCopyD2D")]
copy = med([c for c in copy if c])
pa = {}
for l in bench.splitlines():
    m = re.match(r"BenchmarkPagedAttn/(mma|simt)/B=(\d+)_ctx=(\d+)(-\d+)?\s", l)
    if m:
        pa.setdefault((int(m.group(2)), int(m.group(3))), {}).setdefault(m.group(1), []).append((metric(l, "us/op"), metric(l, "GB/s")))
    elif l.startswith("BenchmarkPagedAttn/"):
        print("layout:", l.split()[0], metric(l, "us/op"), "us", metric(l, "GB/s"), "GB/s")
tb = {}
for l in torch.splitlines():
    p = l.split()
    if len(p) >= 6 and p[:2] == ["torch", "paged"]:
        tb[(int(p[2]), int(p[3]))] = (float(p[4]), float(p[5]))
for l in torch.splitlines():
    if l.startswith("#"): print(l)
print(f"device copy (read+write) {copy:.0f} GB/s; paged attention GB/s = K/V bytes read once / time")
print(f"{'batch':>6}{'ctx':>7}{'mma us':>9}{'mma GB/s':>10}{'% copy':>8}{'simt us':>9}{'simt GB/s':>10}{'torch gather+sdpa us':>22}{'sdpa only us':>14}{'mma/torch':>10}")
for k in sorted(pa):
    row = {}
    for v in ("mma", "simt"):
        xs = pa[k].get(v, [])
        row[v] = (med([x[0] for x in xs if x[0]]), med([x[1] for x in xs if x[1]]))
    t = tb.get(k, (float("nan"), float("nan")))
    mu, mg = row["mma"]; su, sg = row["simt"]
    print(f"{k[0]:>6}{k[1]:>7}{mu:>9.1f}{mg:>10.0f}{100 * mg / copy:>7.0f}%{su:>9.1f}{sg:>10.0f}{t[0]:>22.1f}{t[1]:>14.1f}{t[0] / mu:>10.1f}")
PY
echo "status $status"
exit $status
