#!/usr/bin/env bash
# scripts/fused_decode.sh — one device call's look at the fused MoE layer at
# decode sizes (the forty-ninth pass's calls in one script). On the GPU
# machine, with .dev/device.tar.xz carried (make device-bins) and, for the
# A/B against an earlier revision, .dev/old/src (make device-old REV=...):
#   run(command="OUT=$OUT bash scripts/fused_decode.sh", carry=[".dev/device.tar.xz", ".dev/old/src"])
# It builds the library (and .dev/old/libmkernel.so when .dev/old/src is
# there), runs the fused kernel tests (each top-level test its own
# process), traces one launch per shape at TRACE_TOKENS (the summary lines:
# each GEMM phase's span and weight rate, the combine), then A/Bs the
# layer at TOKENS over VARIANTS (default: old against new when the old
# library was built, else the build alone). Everything goes to
# $OUT/main.log, printed at the end.
# Environment: OUT (default .dev/out), TOKENS (1,2,4,16,64), TRACE_TOKENS
# (1,16), SHAPES (the three of ab_moe.sh), ROUNDS (2), VARIANTS.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-.dev/out}
mkdir -p "$OUT"
. scripts/ab_common.sh
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
{
	old=()
	[ -d .dev/old/src ] && old=(MK_LIB_OLD=.dev/old/src)
	env "${old[@]}" MK_MODE=none bash scripts/device.sh >"$OUT/build.txt" 2>&1
	el "build rc $?"
	grep -h -A3 "Compiling entry function.*fused_kernel" .dev/logs/*.log 2>/dev/null | grep -iE "registers|spill" | head -6
	export MKSERVE_KERNEL_LIB=$PWD/.dev/libmkernel.so MKSERVE_REQUIRE_GPU=1
	for t in $(.dev/kernels.test -test.list '^TestMoE(Fused|Trace)'); do
		timeout 120 .dev/kernels.test -test.count=1 -test.timeout 115s -test.run "^$t\$" >"$OUT/test.txt" 2>&1
		rc=$?
		echo "$t rc $rc"
		[ "$rc" = 0 ] || grep -E "^\s*--- FAIL|_test.go" "$OUT/test.txt" | head -10
	done
	el "tests done"
	for s in ${SHAPES:-qwen3_30b_a3b mixtral_8x7b deepseek_v3}; do
		F=$(moe_shape_flags "$s") || continue
		# shellcheck disable=SC2086
		.dev/mkserve bench moe $F --path fused --tokens "${TRACE_TOKENS:-1,16}" --iters 8 --json \
			--trace /tmp/fused_decode_trace.jsonl >/dev/null 2>/tmp/fused_decode_trace.err
		el "trace $s rc $?"
		grep -A5 "trace:" /tmp/fused_decode_trace.err | cut -c1-240
	done
	v=${VARIANTS:-}
	if [ -z "$v" ]; then
		v="new:"
		[ -f .dev/old/libmkernel.so ] && v="old:MKSERVE_KERNEL_LIB=$PWD/.dev/old/libmkernel.so new:"
	fi
	VARIANTS=$v PATHS=fused TOKENS=${TOKENS:-1,2,4,16,64} ROUNDS=${ROUNDS:-2} bash scripts/ab_moe.sh 2>&1 | tail -20
	el "done"
} >"$OUT/main.log" 2>&1
cat "$OUT/main.log"
