#!/usr/bin/env bash
# scripts/ab_model.sh — `mkserve bench model` decode steps under several
# settings in one process tree, alternating (the variant order rotates every
# round), so that a comparison never spans two machines (the same build
# differs by up to ±4 % between machines of one kind). On the GPU machine,
# after `MK_MODE=none bash scripts/device.sh`:
#   VARIANTS="base: pf:MKSERVE_L2_PREFETCH=1" bash scripts/ab_model.sh
# A variant is NAME:ASSIGNMENTS, assignments joined by commas; the first is
# the baseline. Environment:
#   VARIANTS  (required)
#   CONFIGS   qwen3-30b-a3b-8l mixtral-8x7b-4l deepseek-v3-4l (configs/shapes/…)
#   BATCH     1,32   CONTEXT 1024   STEPS 30   ROUNDS 2
#   PREFILL   0: with N > 0 the table is of the N-token prefill (one row per
#             config; STEPS/5 runs, the median) instead of the decode steps
#   EXTRA     more bench model flags (e.g. --temperature 1)
# Prints one line per (config, batch): each variant's step times (ms,
# overlapped decode: the engine's default) over the rounds, its ratio of
# medians to the baseline (< 1: faster), and the replays' GPU time.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
: "${VARIANTS:?set VARIANTS, e.g. VARIANTS=\"base: pf:MKSERVE_L2_PREFETCH=1\"}"
CONFIGS=${CONFIGS:-qwen3-30b-a3b-8l mixtral-8x7b-4l deepseek-v3-4l}
BATCH=${BATCH:-1,32}
CONTEXT=${CONTEXT:-1024}
STEPS=${STEPS:-30}
ROUNDS=${ROUNDS:-2}
PREFILL=${PREFILL:-0}
EXTRA=${EXTRA:-}
. scripts/ab_common.sh
ab_setup ab_model.sh
# run NAME ASSIGNMENTS ROUND: every config of one variant.
run() {
	local name=$1 assigns=$2 round=$3 cfg out
	for cfg in $CONFIGS; do
		out="$RES/$name.$cfg.$round.json"
		# shellcheck disable=SC2086
		env ${assigns//,/ } timeout 300 "$BIN" bench model --config "configs/shapes/$cfg" --batch "$BATCH" \
			--context "$CONTEXT" --prefill "$PREFILL" --steps "$STEPS" --json $EXTRA >"$out" 2>"$out.err" ||
			echo "ab_model.sh: $name $cfg round $round failed: $(grep -v '^{' "$out.err" | tail -1)"
	done
}
# report prints the table of the runs so far.
report() {
	PYTHONPATH=scripts python3 - "$RES" "$VARIANTS" "$PREFILL" <<-'PY'
	import sys
	from ab_table import results, table, variant_names
	variants, runs, prefill = variant_names(sys.argv[2]), {}, int(sys.argv[3])
	for (name, cfg, _), rows in results(sys.argv[1]):
	    for r in rows:
	        if prefill > 0 and r.get("kind") == "prefill":
	            runs.setdefault((cfg, r["tokens"]), {}).setdefault(name, []).append(
	                (r["ms"], {"tps": r.get("tokens_per_s") or 0}))
	        elif prefill == 0 and r.get("kind") == "decode":
	            runs.setdefault((cfg, r["batch"]), {}).setdefault(name, []).append(
	                (r["ms"], {"gpu": r.get("replay_gpu_ms") or 0, "floor": r.get("over_floor") or 0}))
	if prefill > 0:
	    table(runs, variants, "%-18s %6d", "%-18s %6s" % ("config", "tokens"), [("tps", "%.0f tok/s")])
	else:
	    table(runs, variants, "%-18s %5d", "%-18s %5s" % ("config", "batch"), [("gpu", "gpu %.3f"), ("floor", "%.2f×fl")])
	PY
}
ab_rotate run report
report
rm -rf "$RES"
