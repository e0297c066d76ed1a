#!/usr/bin/env bash
# scripts/sass_diff.sh FILE.cu FUNCREGEX [REV] — whether a change moved the
# machine code of some kernels, on the CPU machine (no GPU): the SASS of the
# functions matching FUNCREGEX in kernels/FILE.cu as REV (default HEAD) has
# it against the working tree's, both through scripts/ptxas_check.sh's
# proxy (nvcc 11.8's PTX assembled by ptxas 12.4 for sm_90a), with
# addresses, encodings and the anonymous namespaces' hashes left out.
# Prints the line counts and the first lines of the difference; nothing
# after the counts means the same code. For refactors that should not
# change a kernel (the device's CUDA 13 may still differ: a proxy).
#   bash scripts/sass_diff.sh kernels/moe.cu moe_gemm_kernel
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
SRC=${1:?usage: scripts/sass_diff.sh FILE.cu FUNCREGEX [REV]}
RE=${2:?usage: scripts/sass_diff.sh FILE.cu FUNCREGEX [REV]}
REV=${3:-HEAD}
ROOT=$PWD
TMP=$(mktemp -d)
trap 'git -C "$ROOT" worktree remove --force "$TMP/old" >/dev/null 2>&1 || true; rm -rf "$TMP"' EXIT
git worktree add -q --detach "$TMP/old" "$REV"
mkdir -p "$TMP/old/.dev"
bash scripts/ptxas_check.sh "$SRC" '^$' >/dev/null 2>&1 || true # unpacks ptxas 12.4 into .dev/ptxas12 once
ln -sfn "$ROOT/.dev/ptxas12" "$TMP/old/.dev/ptxas12"
(cd "$TMP/old" && SASS="$RE" bash scripts/ptxas_check.sh "$SRC" '^$' >"$TMP/old.txt" 2>&1) || true
SASS="$RE" bash scripts/ptxas_check.sh "$SRC" '^$' >"$TMP/new.txt" 2>&1 || true
# norm: the SASS without addresses and encodings, each function's name
# demangled with its anonymous namespace left out.
norm() {
	python3 - "$1" <<'PY'
import re, subprocess, sys
for line in open(sys.argv[1]):
    m = re.search(r"Function : (\S+)", line)
    if m:
        name = subprocess.run(["c++filt", m.group(1)], capture_output=True, text=True).stdout.strip()
        print("Function :", re.sub(r"\(anonymous namespace\)::", "", name))
        continue
    line = re.sub(r"/\*[^*]*\*/", "", line).rstrip()
    if line:
        print(line)
PY
}
echo "$REV: $(grep -c 'Function :' "$TMP/old.txt" || true) functions, $(wc -l <"$TMP/old.txt") lines; working tree: $(grep -c 'Function :' "$TMP/new.txt" || true) functions, $(wc -l <"$TMP/new.txt") lines"
diff <(norm "$TMP/old.txt") <(norm "$TMP/new.txt") | head -"${LINES_SHOWN:-30}" || true
