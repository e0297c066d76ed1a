# scripts/ab_common.sh — sourced by the A/B scripts (ab_moe.sh, ab_model.sh,
# ab_ring.sh), scripts/kstamps.sh and scripts/fused_decode.sh.
#
# ab_setup SCRIPT is their common start: the kernel library
# (MKSERVE_KERNEL_LIB, default .dev/libmkernel.so, with a GPU required), BIN
# (default .dev/mkserve, built by `MK_MODE=none bash scripts/device.sh`;
# without it SCRIPT says so and exits) and RES, a fresh results folder.
ab_setup() {
	export MKSERVE_KERNEL_LIB=${MKSERVE_KERNEL_LIB:-$PWD/.dev/libmkernel.so} MKSERVE_REQUIRE_GPU=1
	BIN=${BIN:-.dev/mkserve}
	[ -x "$BIN" ] || { echo "$1: no $BIN (MK_MODE=none bash scripts/device.sh first)"; exit 1; }
	RES=$(mktemp -d)
}

#
# ab_rotate FN [REPORT] calls FN NAME ASSIGNMENTS ROUND for every round of
# $ROUNDS and every variant of $VARIANTS (NAME:ASSIGNMENTS, assignments
# joined by commas), the variants' order rotated by one every round, so
# that a drift of the machine during the run falls on every variant alike.
# REPORT, when given, runs after every round but the last (the caller
# reports after the whole run): the table so far, so that a run cut short
# by a timeout still leaves its finished rounds.
ab_rotate() {
	local fn=$1 report=${2:-} round j v n
	local -a vs
	read -r -a vs <<<"$VARIANTS"
	n=${#vs[@]}
	for ((round = 0; round < ROUNDS; round++)); do
		for ((j = 0; j < n; j++)); do
			v=${vs[$(((j + round) % n))]}
			"$fn" "${v%%:*}" "${v#*:}" "$round"
		done
		if [ -n "$report" ] && ((round + 1 < ROUNDS)); then
			echo "-- after round $((round + 1)) of $ROUNDS"
			"$report"
		fi
	done
}

# moe_shape_flags SHAPE prints `mkserve bench moe`'s flags for one of the
# MoE layer shapes the issues name (and OLMoE's).
moe_shape_flags() {
	case "$1" in
	deepseek_v3) echo "--hidden 7168 --intermediate 2048 --experts 256 --topk 8 --routing grouped" ;;
	qwen3_30b_a3b) echo "--hidden 2048 --intermediate 768 --experts 128 --topk 8 --routing softmax" ;;
	mixtral_8x7b) echo "--hidden 4096 --intermediate 14336 --experts 8 --topk 2 --routing softmax" ;;
	olmoe) echo "--hidden 2048 --intermediate 1024 --experts 64 --topk 8 --routing softmax" ;;
	*) echo "unknown MoE shape $1" >&2; return 1 ;;
	esac
}
