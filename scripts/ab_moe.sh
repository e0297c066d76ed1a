#!/usr/bin/env bash
# scripts/ab_moe.sh — `mkserve bench moe` under several settings in one
# process tree, alternating (variant order rotates every round), so that a
# comparison never spans two machines (the same build differs by up to ±4 %
# between machines of one kind: docs/PERF.md, sixteenth pass). On the GPU
# machine, after `MK_MODE=none bash scripts/device.sh`:
#   VARIANTS="base: g1tma:MK_MOE_G1_TMA=1" bash scripts/ab_moe.sh
# A variant is NAME:ASSIGNMENTS, assignments joined by commas, e.g.
# "old:MKSERVE_KERNEL_LIB=$PWD/.dev/oldk/libmkernel.so" for another library
# (it must have the same ABI as .dev/mkserve). Environment:
#   VARIANTS  (required) the variants; the first is the baseline
#   SHAPES    qwen3_30b_a3b mixtral_8x7b deepseek_v3 (default: all three)
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
export MKSERVE_KERNEL_LIB=${MKSERVE_KERNEL_LIB:-$PWD/.dev/libmkernel.so} MKSERVE_REQUIRE_GPU=1
BIN=${BIN:-.dev/mkserve}
[ -x "$BIN" ] || { echo "ab_moe.sh: no $BIN (MK_MODE=none bash scripts/device.sh first)"; exit 1; }
shape_flags() {
	case "$1" in
	deepseek_v3) echo "--hidden 7168 --intermediate 2048 --experts 256 --topk 8 --routing grouped" ;;
	qwen3_30b_a3b) echo "--hidden 2048 --intermediate 768 --experts 128 --topk 8 --routing softmax" ;;
	mixtral_8x7b) echo "--hidden 4096 --intermediate 14336 --experts 8 --topk 2 --routing softmax" ;;
	*) echo "ab_moe.sh: unknown shape $1" >&2; return 1 ;;
	esac
}
RES=$(mktemp -d)
read -r -a VS <<<"$VARIANTS"
n=${#VS[@]}
for ((round = 0; round < ROUNDS; round++)); do
	for ((j = 0; j < n; j++)); do
		v=${VS[$(((j + round) % n))]}
		name=${v%%:*}
		assigns=${v#*:}
		for shape in $SHAPES; do
			F=$(shape_flags "$shape") || exit 2
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
	done
done
python3 - "$RES" "$VARIANTS" <<'PY'
import glob, json, os, statistics, sys
res, variants = sys.argv[1], [v.split(":", 1)[0] for v in sys.argv[2].split()]
runs = {}
for f in glob.glob(os.path.join(res, "*.json")):
    name, shape, path, _ = os.path.basename(f)[:-5].split(".")
    try:
        rows = json.load(open(f))
    except Exception:
        continue
    for r in rows:
        runs.setdefault((shape, path, r["tokens"]), {}).setdefault(name, []).append(
            (r["ms"], r["rel_err"], r.get("separate_ms") or 0))
print("%-14s %-7s %6s  " % ("shape", "path", "tokens") + "  ".join("%-24s" % v for v in variants))
for key in sorted(runs):
    base = runs[key].get(variants[0])
    bm = statistics.median(m for m, _, _ in base) if base else None
    cells = []
    for v in variants:
        got = runs[key].get(v)
        if not got:
            cells.append("%-24s" % "-")
            continue
        ms = [m for m, _, _ in got]
        med = statistics.median(ms)
        err = max(e for _, e, _ in got)
        seps = [s for _, _, s in got if s > 0]
        ratio = " ×%.3f" % (med / bm) if bm and v != variants[0] else ""
        sep = " sep %.3f" % statistics.median(seps) if seps else ""
        cells.append("%-24s" % ("%s%s e%.0e%s" % (",".join("%.3f" % m for m in ms), ratio, err, sep)))
    print("%-14s %-7s %6d  " % key + "  ".join(cells))
PY
rm -rf "$RES"
