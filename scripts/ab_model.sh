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
EXTRA=${EXTRA:-}
export MKSERVE_KERNEL_LIB=${MKSERVE_KERNEL_LIB:-$PWD/.dev/libmkernel.so} MKSERVE_REQUIRE_GPU=1
BIN=${BIN:-.dev/mkserve}
[ -x "$BIN" ] || { echo "ab_model.sh: no $BIN (MK_MODE=none bash scripts/device.sh first)"; exit 1; }
RES=$(mktemp -d)
read -r -a VS <<<"$VARIANTS"
n=${#VS[@]}
for ((round = 0; round < ROUNDS; round++)); do
	for ((j = 0; j < n; j++)); do
		v=${VS[$(((j + round) % n))]}
		name=${v%%:*}
		assigns=${v#*:}
		for cfg in $CONFIGS; do
			out="$RES/$name.$cfg.$round.json"
			# shellcheck disable=SC2086
			env ${assigns//,/ } timeout 300 "$BIN" bench model --config "configs/shapes/$cfg" --batch "$BATCH" \
				--context "$CONTEXT" --prefill 0 --steps "$STEPS" --json $EXTRA >"$out" 2>"$out.err" ||
				echo "ab_model.sh: $name $cfg round $round failed: $(grep -v '^{' "$out.err" | tail -1)"
		done
	done
done
python3 - "$RES" "$VARIANTS" <<'PY'
import glob, json, os, statistics, sys
res, variants = sys.argv[1], [v.split(":", 1)[0] for v in sys.argv[2].split()]
runs = {}
for f in glob.glob(os.path.join(res, "*.json")):
    name, cfg, _ = os.path.basename(f)[:-5].rsplit(".", 2)
    text = open(f).read()
    at = text.find("\n[") + 1 if not text.startswith("[") else 0
    try:  # the JSON array, whatever else stdout holds
        rows = json.JSONDecoder().raw_decode(text[at:])[0]
    except Exception:
        continue
    for r in rows:
        if r.get("kind") != "decode":
            continue
        runs.setdefault((cfg, r["batch"]), {}).setdefault(name, []).append(
            (r["ms"], r.get("replay_gpu_ms") or 0, r.get("over_floor") or 0))
print("%-18s %5s  " % ("config", "batch") + "  ".join("%-30s" % v for v in variants))
for key in sorted(runs):
    base = runs[key].get(variants[0])
    bm = statistics.median(m for m, _, _ in base) if base else None
    cells = []
    for v in variants:
        got = runs[key].get(v)
        if not got:
            cells.append("%-30s" % "-")
            continue
        med = statistics.median(m for m, _, _ in got)
        ratio = " ×%.3f" % (med / bm) if bm and v != variants[0] else ""
        gpu = statistics.median(g for _, g, _ in got)
        fl = statistics.median(f for _, _, f in got)
        cells.append("%-30s" % ("%s%s gpu %.3f %.2f×fl" % (",".join("%.3f" % m for m, _, _ in got), ratio, gpu, fl)))
    print("%-18s %5d  " % key + "  ".join(cells))
PY
rm -rf "$RES"
