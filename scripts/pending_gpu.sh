#!/usr/bin/env bash
# scripts/pending_gpu.sh — the thirty-second pass's GPU check of grammar
# validators sharing their Grammar's parse-state cache (grammar/cfg.go).
# Delete or rewrite it once its results are in docs/PERF.md.
# On the GPU machine (nvidia-h200), from the repository root, with
# .dev/device.tar.xz carried (make device-bins): `bash scripts/pending_gpu.sh`
# (~2 minutes with the build).
#   Before (call 184, the same loads): plain 354 requests/s (22 636 output
#   tok/s), --json-object 366 (13 490), --json-schema 245 (15 710),
#   --grammar scripts/bench_grammar.gbnf 193 (8 873): every request's
#   validator built its own DFA states and masks, ~0.5 ms a cold mask over
#   GPT-2's vocabulary on the CPU. Expected now: the grammar's output
#   tokens/s near the JSON modes'.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
OUT=$OUT MK_MODE=${PENDING_MODE:-none} timeout 330 bash scripts/device.sh >"$OUT/serve_mode.log" 2>&1
echo "MK_MODE=${PENDING_MODE:-none} rc=$? t=${SECONDS}s"
grep -E "serving tests on cuda" "$OUT/serve_mode.log" | head -2
# BINS: the servers to compare, each "LABEL:PATH" (the same loads each;
# default: this build alone). Call 189 ran "before:.dev/before/mkserve
# after:.dev/mkserve" (the binary of the commit before the change, built
# here and carried as .dev/before/mkserve.xz).
[ -f .dev/before/mkserve.xz ] && [ ! -x .dev/before/mkserve ] && xz -dk .dev/before/mkserve.xz && chmod +x .dev/before/mkserve
for round in $(seq 1 "${ROUNDS:-2}"); do
	for bin in ${BINS:-this:.dev/mkserve}; do
		"${bin#*:}" serve --backend cuda --precision fast --http-addr 127.0.0.1:8290 --grpc-addr "" --log-level error \
			--json-whitespace compact >"$OUT/srv.log" 2>&1 &
		pid=$!
		for _ in $(seq 1 120); do
			python3 -c 'import urllib.request as u; u.urlopen("http://127.0.0.1:8290/health", timeout=2)' 2>/dev/null && break
			sleep 0.5
		done
		for a in "--json-object" "--grammar scripts/bench_grammar.gbnf"; do
			echo -n "round $round, ${bin%%:*}, bench serve chat '$a': "
			# shellcheck disable=SC2086
			timeout 100 .dev/mkserve bench serve --json --base-url http://127.0.0.1:8290 --endpoint chat --num-prompts 64 \
				--max-concurrency 16 --random-input-len 64 --random-output-len 64 --seed "$round" $a 2>&1 |
				grep -oE '"(completed|failed|request_throughput|output_token_throughput)":[^,}]*' | paste -sd' '
		done
		python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8290/metrics").read().decode())' |
			grep -E "^mkserve:grammar_mask_seconds_(sum|count)" | paste -sd' '
		kill $pid
		wait $pid 2>/dev/null
	done
done
echo "done t=${SECONDS}s"
