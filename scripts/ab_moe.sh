#!/usr/bin/env bash
# scripts/ab_moe.sh — `mkserve bench moe` under several settings in one
# process tree, alternating (variant order rotates every round), so that a
# comparison never spans two machines (the same build differs by up to ±4 %
# between machines of one kind: docs/PERF.md, sixteenth pass). On the GPU
# machine, after `MK_MODE=none bash scripts/device.sh`:
#   VARIANTS="base: g1tma:MK_MOE_G1_TMA=1" bash scripts/ab_moe.sh
# A variant is NAME:ASSIGNMENTS, assignments joined by commas, e.g.
# "old:MKSERVE_KERNEL_LIB=$PWD/.dev/old/libmkernel.so" for another library
# (make device-old REV=..., carry .dev/old/src, MK_LIB_OLD=.dev/old/src)
# (it must have the same ABI as .dev/mkserve). Environment:
#   VARIANTS  (required) the variants; the first is the baseline
#   SHAPES    qwen3_30b_a3b mixtral_8x7b deepseek_v3 (default: all three; also olmoe)
#   PATHS     fused grouped (default: both); fused runs --ranks $RANKS
#   TOKENS    1024,4096,16384   ROUNDS 2   ITERS 8   RANKS 1
#   EXTRA     more bench moe flags (e.g. --max-rows-factor 2)
# Prints one line per (shape, path, tokens): each variant's times over
# the rounds, its ratio of medians to the baseline (< 1: faster), and the
# median of separate_ms where the bench reports it (the fused path).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
: "${VARIANTS:?set VARIANTS, e.g. VARIANTS=\"base: new:MK_X=1\"}"
SHAPES=${SHAPES:-qwen3_30b_a3b mixtral_8x7b deepseek_v3}
PATHS=${PATHS:-fused grouped}
TOKENS=${TOKENS:-1024,4096,16384}
ROUNDS=${ROUNDS:-2}
ITERS=${ITERS:-8}
RANKS=${RANKS:-1}
EXTRA=${EXTRA:-}
. scripts/ab_common.sh
ab_setup ab_moe.sh
# run NAME ASSIGNMENTS ROUND: every shape and path of one variant.
run() {
	local name=$1 assigns=$2 round=$3 shape path out F
	for shape in $SHAPES; do
		F=$(moe_shape_flags "$shape") || exit 2
		for path in $PATHS; do
			P=(--path "$path")
			[ "$path" = fused ] && P+=(--ranks "$RANKS")
			out="$RES/$name.$shape.$path.$round.json"
			# shellcheck disable=SC2086
			env ${assigns//,/ } timeout 300 "$BIN" bench moe $F "${P[@]}" --tokens "$TOKENS" --iters "$ITERS" \
				--check-rows 1 --json $EXTRA >"$out" 2>"$out.err" ||
				{ echo "ab_moe.sh: $name $shape $path round $round failed: $(grep -v '^{' "$out.err" | tail -1)"; }
		done
	done
}
# report prints the table of the runs so far.
report() {
	PYTHONPATH=scripts python3 - "$RES" "$VARIANTS" <<-'PY'
	import sys
	from ab_table import results, table, variant_names
	variants, runs = variant_names(sys.argv[2]), {}
	for (name, shape, path, _), rows in results(sys.argv[1]):
	    for r in rows:
	        runs.setdefault((shape, path, r["tokens"]), {}).setdefault(name, []).append(
	            (r["ms"], {"err": r["rel_err"], "sep": r.get("separate_ms") or 0}))
	table(runs, variants, "%-14s %-7s %6d", "%-14s %-7s %6s" % ("shape", "path", "tokens"),
	      [("err", "e%.0e", max), ("sep", "sep %.3f")], width=24)
	PY
}
ab_rotate run report
report
rm -rf "$RES"
