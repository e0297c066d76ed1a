#!/usr/bin/env bash
# scripts/ptxas_check.sh FILE.cu [REGEX] — registers, stack and spills of the
# sm_90a kernels of one kernels/ source, on the CPU machine (no GPU): the
# local nvcc (Debian bookworm's 11.8, whose ptxas knows no sm_90a) makes
# sm_90 PTX, the PTX is retargeted to sm_90a / PTX 8.4, and ptxas 12.4
# (Debian trixie's nvidia-cuda-toolkit, unpacked into .dev/ptxas12 on
# first use, nothing installed system-wide) assembles it with -v. REGEX
# picks the kernels to report (default: every entry). SASS=FUNCREGEX also
# prints the SASS of the matching functions (to find spills: STL/LDL).
#
# A proxy, not the device's compiler: CUDA 13's front end and ptxas give
# other counts (sixteenth pass, fused_wg_kernel: 80-byte stack here 112),
# but the same direction for a change; the device build (scripts/device.sh,
# .dev/logs/build.log) has the real ones. moe_fused.cu's TMA map arrays are
# shrunk to one rank in the copy compiled here: nvcc 11.8 limits kernel
# parameters to 4 KB.
#   bash scripts/ptxas_check.sh kernels/moe_fused.cu fused_wg_kernel
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
SRC=${1:?usage: scripts/ptxas_check.sh FILE.cu [REGEX]}
RE=${2:-.}
[ -f "$SRC" ] || { echo "ptxas_check.sh: no file $SRC" >&2; exit 2; }
NVCC=$(command -v nvcc) || { echo "ptxas_check.sh: nvcc not found (apt-get install nvidia-cuda-toolkit)" >&2; exit 1; }
TOOLS=.dev/ptxas12
PTXAS=$TOOLS/usr/bin/ptxas
if [ ! -x "$PTXAS" ]; then
	# Debian trixie's toolkit, fetched with a private apt configuration (the
	# system's sources and lists stay as they are) and unpacked, not installed.
	A=$(mktemp -d)
	mkdir -p "$A/lists/partial" "$A/cache/archives/partial"
	echo "deb http://deb.debian.org/debian trixie main contrib non-free" >"$A/sources.list"
	O=(-o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts=/dev/null
		-o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache")
	apt-get "${O[@]}" update >/dev/null 2>&1 || { echo "ptxas_check.sh: apt-get update (trixie) failed" >&2; exit 1; }
	(cd "$A" && apt-get "${O[@]}" download nvidia-cuda-toolkit >/dev/null 2>&1)
	deb=$(ls "$A"/nvidia-cuda-toolkit_*.deb 2>/dev/null | head -1)
	[ -n "$deb" ] || { echo "ptxas_check.sh: could not download nvidia-cuda-toolkit from trixie" >&2; exit 1; }
	mkdir -p "$TOOLS"
	dpkg -x "$deb" "$TOOLS"
	rm -rf "$A"
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
d=$(dirname "$SRC")
cp "$d"/*.cuh "$d"/*.h "$W"/ 2>/dev/null || true
f=$(basename "$SRC")
sed -e 's/gu\[kMaxRanks\]/gu[1]/; s/dn\[kMaxRanks\]/dn[1]/; s/act\[kMaxRanks\]/act[1]/; s/recv\[kMaxRanks\]/recv[1]/; s/k\[kMaxRanks\]\[3\]/k[1][3]/; s/v\[kMaxRanks\]\[3\]/v[1][3]/' "$SRC" >"$W/$f"
(cd "$W" && "$NVCC" -arch=sm_90 -ptx -std=c++17 -O3 "$f" -o k.ptx 2>&1 | grep -v "Wno-deprecated-gpu-targets" >&2 || true)
[ -s "$W/k.ptx" ] || { echo "ptxas_check.sh: nvcc made no PTX" >&2; exit 1; }
sed -e 's/^\.version .*/.version 8.4/' -e 's/^\.target sm_90$/.target sm_90a/' "$W/k.ptx" >"$W/k90a.ptx"
"$PTXAS" -arch=sm_90a -O3 -v "$W/k90a.ptx" -o "$W/k.cubin" 2>"$W/v.txt" || { cat "$W/v.txt" >&2; exit 1; }
grep -E "C7[0-9]{3}" "$W/v.txt" >&2 || true
python3 - "$W/v.txt" "$RE" <<'PY'
import re, subprocess, sys
text, pat = open(sys.argv[1]).read().splitlines(), re.compile(sys.argv[2])
name = None
for line in text:
    m = re.search(r"Compiling entry function '([^']+)'", line)
    if m:
        raw = m.group(1)
        try:
            name = subprocess.run(["c++filt", raw], capture_output=True, text=True).stdout.strip() or raw
        except OSError:
            name = raw
        name = re.sub(r"\(anonymous namespace\)::", "", name)
        continue
    if name is None or not pat.search(name):
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
    if m:
        spill = m.groups()
    m = re.search(r"Used (\d+) registers", line)
    if m:
        print(f"{m.group(1):>4} regs  stack {spill[0]:>4}  spill st {spill[1]:>4} ld {spill[2]:>4}  {name}")
        name = None
PY
if [ -n "${SASS:-}" ]; then
	"$TOOLS/usr/bin/cuobjdump" -sass "$W/k.cubin" | awk -v k="$SASS" '/Function :/ {on = ($0 ~ k)} on'
fi
