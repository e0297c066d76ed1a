#!/usr/bin/env bash
# bench_cpu_forms.sh: the CPU backend's weight forms and KV cache types on
# this machine's cores, one table (docs/CPU.md, docs/PERF.md "Q8 weights…",
# "FP4 weights", "A bf16 KV cache on the CPU"). Meant for machines with
# more cores than the 2-core development one (the GPU machine has 16),
# where Q8's and FP4's decoding costs less against the memory's bandwidth.
#
#   bash scripts/bench_cpu_forms.sh [MKSERVE] [ROUNDS]
#
# MKSERVE defaults to .dev/mkserve; ROUNDS (default 2) interleaves the
# variants. Needs ~20 GB of memory (the gpt-oss-20b 4-layer stack in bf16
# plus its loading copy). Writes the raw lines to $OUT/cpu_forms.txt when
# OUT is set.
set -euo pipefail
mk=${1:-.dev/mkserve}
rounds=${2:-2}
out=${OUT:-/tmp}/cpu_forms.txt
: > "$out"
q3=$(mktemp -d)
python3 - "$q3" <<'PY'
import json, sys
c = json.load(open("configs/shapes/qwen3-30b-a3b-8l/config.json"))
c["num_hidden_layers"] = 4
json.dump(c, open(sys.argv[1] + "/config.json", "w"))
PY
row() { # label, then bench model's flags
	local label=$1
	shift
	echo -n "$label: "
	"$mk" bench model --backend cpu "$@" 2>&1 | grep -E '^(prefill|decode)|rror' |
		awk '{printf "%s b%s ctx%s %s ms | ", $1, $2, $3, $5}'
	echo
}
for r in $(seq "$rounds"); do
	for w in stored q8; do
		row "round $r qwen3-4l $w" --config "$q3" --cpu-weights "$w" --batch 1,4,16 --context 256 --contexts 16 --prefill 512 --steps 30
	done
	for w in stored auto q8; do
		row "round $r gpt-oss-20b-4l $w" --config configs/shapes/gpt-oss-20b-4l --cpu-weights "$w" --batch 1,4 --context 256 --contexts 4 --prefill 256 --steps 30
	done
	for kv in auto bf16; do
		row "round $r qwen3-4l kv $kv" --config "$q3" --kv-cache-dtype "$kv" --batch 1,4 --context 8192 --contexts 1 --prefill 0 --steps 20
	done
done | tee -a "$out"
echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo)" | tee -a "$out"
