#!/usr/bin/env bash
# scripts/kstamps.sh — one decode layer's kernels, µs a step each, by clock
# stamps after every kernel (MKSERVE_STEP_STAMPS=2; each stamp costs
# ~0.7 µs, included in every figure), for several settings. On the GPU
# machine, after `MK_MODE=none bash scripts/device.sh`:
#   VARIANTS="fused: sep:MKSERVE_FUSED_DECODE=0" bash scripts/kstamps.sh
# A variant is NAME:ASSIGNMENTS (assignments joined by commas; none: the
# build as it is). Environment:
#   VARIANTS  (required)
#   CONFIG    qwen3-30b-a3b-8l (configs/shapes/…)   BATCH 1   CONTEXT 1024
#   FIRST     15: the index of the first op printed in the step's sequence
#   COUNT     15: how many ops (15 from 15: about one Qwen3 layer, the 2nd)
# Prints, per variant, the stamped step time and the ops in step order.
# Caution: a stamp is a kernel after every kernel, so a kernel launched
# early under programmatic dependent launch (its constant loads before its
# wait) now waits behind the stamp instead: stamps showed the weight-
# resident q/k/v GEMV 8.2 → 9.5 µs where whole steps got faster (docs/
# PERF.md, twenty-third pass). Judge early-launch changes by ab_model.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
: "${VARIANTS:?set VARIANTS, e.g. VARIANTS=\"base: sep:MKSERVE_FUSED_DECODE=0\"}"
CONFIG=${CONFIG:-qwen3-30b-a3b-8l}
BATCH=${BATCH:-1}
CONTEXT=${CONTEXT:-1024}
FIRST=${FIRST:-15}
COUNT=${COUNT:-15}
. scripts/ab_common.sh
ab_setup kstamps.sh
for v in $VARIANTS; do
	name=${v%%:*} assigns=${v#*:}
	# shellcheck disable=SC2086
	env ${assigns//,/ } MKSERVE_STEP_STAMPS=2 timeout 120 "$BIN" bench model --config "configs/shapes/$CONFIG" \
		--batch "$BATCH" --context "$CONTEXT" --prefill 0 --steps 20 --json >"$RES/$name.json" 2>"$RES/$name.err" ||
		{ echo "$name: bench model failed:"; tail -3 "$RES/$name.err"; continue; }
	PYTHONPATH=scripts python3 - "$RES/$name.json" "$name" "$FIRST" "$COUNT" <<'PY'
import sys
from ab_table import read_rows
path, name, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for r in read_rows(path):
    if r.get("kind") != "decode":
        continue
    print("%s: batch %d, %.3f ms a step (stamped)" % (name, r["batch"], r["ms"]))
    seq = r.get("stamp_seq", [])[first:first + count]
    print("  " + " ".join("%s:%.1f" % (o["op"][:18], o["us_per_step"]) for o in seq))
PY
done
rm -rf "$RES"
