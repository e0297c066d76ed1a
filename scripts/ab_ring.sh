#!/usr/bin/env bash
# scripts/ab_ring.sh — `mkserve bench ring` under several settings,
# alternating variant by variant each round (one process per variant and
# round), printing each variant's overhead over one rank per R, every
# round's, and its median. The bench itself interleaves its methods launch
# by launch with an L2 flush before each (fifty-first pass), so rounds
# agree within ~0.5 points; variants still alternate so that none spans a
# change of machine state. On the GPU machine, after
# `MK_MODE=none bash scripts/device.sh`:
#   VARIANTS="base: ready:MK_RING_READY=1 cs:MK_RING_CS=1" bash scripts/ab_ring.sh
# A variant is NAME:ASSIGNMENTS, assignments joined by commas (e.g.
# "old:MKSERVE_KERNEL_LIB=$PWD/.dev/old/libmkernel.so", after make
# device-old REV=... and MK_LIB_OLD=.dev/old/src). Environment:
#   VARIANTS (required)   SEQ 16384   RANKS 2,4,8   ROUNDS 3   ITERS 10
#   HEADS 32   KV_HEADS 8
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
: "${VARIANTS:?set VARIANTS, e.g. VARIANTS=\"base: ready:MK_RING_READY=1\"}"
SEQ=${SEQ:-16384}
RANKS=${RANKS:-2,4,8}
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-10}
HEADS=${HEADS:-32}
KV_HEADS=${KV_HEADS:-8}
. scripts/ab_common.sh
ab_setup ab_ring.sh
for round in $(seq 1 "$ROUNDS"); do
	for v in $VARIANTS; do
		name=${v%%:*} assigns=${v#*:}
		# shellcheck disable=SC2086 # the assignments are words on purpose
		env ${assigns//,/ } "$BIN" bench ring --seq "$SEQ" --ranks "$RANKS" --heads "$HEADS" --kv-heads "$KV_HEADS" \
			--head-dim 128 --causal --iters "$ITERS" --json >"$RES/$name.$round.json" 2>"$RES/$name.$round.err" ||
			{ echo "ab_ring.sh: $name round $round failed:"; tail -3 "$RES/$name.$round.err"; }
	done
done
python3 - "$RES" "$VARIANTS" "$ROUNDS" <<'PY'
import json, statistics, sys
res, variants, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
for v in variants:
    name = v.split(':', 1)[0]
    per = {}
    for k in range(1, rounds + 1):
        try:
            rows = json.load(open(f'{res}/{name}.{k}.json'))
        except (OSError, ValueError):
            continue
        for o in rows:
            per.setdefault((o['seq'], o['ranks']), []).append(
                (100 * (o['ms'] / o['single_rank_ms'] - 1), o['ms'], o['speedup_vs_separate'], o['rel_err']))
    for (seq, r), xs in sorted(per.items()):
        ov = [x[0] for x in xs]
        print(f"{name:10s} seq {seq} R {r}: overhead {' '.join(f'{x:+.1f}' for x in ov)} % "
              f"(median {statistics.median(ov):+.1f} %), ring {statistics.median(x[1] for x in xs):.3f} ms, "
              f"{statistics.median(x[2] for x in xs):.2f}x separate, rel_err {max(x[3] for x in xs):.1e}")
PY
rm -rf "$RES"
