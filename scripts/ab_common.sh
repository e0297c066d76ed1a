# scripts/ab_common.sh — sourced by the A/B scripts (ab_moe.sh, ab_model.sh).
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
