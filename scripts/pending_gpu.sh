#!/usr/bin/env bash
# scripts/pending_gpu.sh — the thirty-second pass's GPU check of
# speculation's cost meter (engine/spec.go specMeter). Delete or rewrite it
# once its results are in docs/PERF.md.
# On the GPU machine (nvidia-h200), from the repository root, with
# .dev/device.tar.xz carried (make device-bins): `bash scripts/pending_gpu.sh`
# (~3 minutes with the build).
#   Before the meter (call 184, same script shape): JSON-schema chat at
#   concurrency 4 served 64.6 requests/s with K = 0 and 53.3 with K = 4
#   (0.83×, 49 % of drafts accepted); repetitive text at batch 1, greedy
#   3 824 → 4 542 tok/s, sampled (0.7) 3 701 → 3 386.
#   Expected now: K = 4 within a few per cent of K = 0 where drafts lose
#   (the meter pauses them: spec_decode_pauses_total > 0) and the greedy
#   gain kept (no pauses there).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
# PENDING_MODE=none: only the build (the serving tests passed in calls 185-186).
OUT=$OUT MK_MODE=${PENDING_MODE:-serve} timeout 330 bash scripts/device.sh >"$OUT/serve_mode.log" 2>&1
echo "MK_MODE=${PENDING_MODE:-serve} rc=$? t=${SECONDS}s"
grep -E "serving tests on cuda" "$OUT/serve_mode.log" | head -2
serve() { # serve ARGS...: the default model on cuda, fast precision, until killed
	.dev/mkserve serve --backend cuda --precision fast --http-addr 127.0.0.1:8290 --grpc-addr "" --log-level error "$@" >"$OUT/srv.log" 2>&1 &
	pid=$!
	for _ in $(seq 1 120); do
		python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8290/health", timeout=2)' 2>/dev/null && return 0
		sleep 0.5
	done
	return 1
}
bench() { # bench LABEL ARGS...: bench serve against the running server
	local label=$1
	shift
	echo -n "  $label: "
	timeout 100 .dev/mkserve bench serve --json --base-url http://127.0.0.1:8290 --endpoint chat --num-prompts 64 \
		--random-input-len 64 --seed 1 "$@" 2>&1 |
		grep -oE '"(completed|failed|request_throughput|output_token_throughput)":[^,}]*' | paste -sd' '
}
for round in $(seq 1 "${ROUNDS:-2}"); do
	for spec in 0 4; do
		serve --json-whitespace compact --speculative-tokens "$spec" || { echo "server did not start"; exit 1; }
		echo "round $round, speculative_tokens $spec:"
		timeout 90 python3 scripts/spec_client.py http://127.0.0.1:8290
		bench "json-schema c4" --max-concurrency 4 --random-output-len 128 --json-schema scripts/bench_schema.json
		bench "plain c16" --max-concurrency 16 --random-output-len 64
		bench "plain c1" --max-concurrency 1 --num-prompts 32 --random-output-len 64
		python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8290/metrics").read().decode())' |
			grep -E "^mkserve:spec_decode_(num_(draft|accepted)_tokens|pauses)_total" | sed 's/^/  /'
		kill $pid
		wait $pid 2>/dev/null
	done
done
echo "done t=${SECONDS}s"
