#!/usr/bin/env python3
"""scripts/sass_ldsm.py SASS FUNC — how far ahead the attention tile loops load their ldmatrix fragments.

Reads `cuobjdump -sass` output (a library, cubin or object), takes the
functions whose mangled name contains FUNC, finds their attention tile loops
(a backward branch enclosing exactly 256 HMMA, the D=128 MT=2 tile of
attn_tile.cuh) and prints per loop: instructions, LDSM count, how many LDSM
results are consumed within 2 instructions, and the median distance from an
LDSM to its first consumer.

Why: ncu's source view showed the ring kernel's tile loop stalled on
short_scoreboard at the HMMAs right after each LDSM (2.11 cycles per issued
instruction against flash_fwd's 0.65) with the same tile code. The register
allocator, short of registers, had stopped loading fragments ahead: 39 of 80
LDSMs used within 2 instructions against flash's 1. This counts that from
the SASS alone, so a change can be checked before any GPU run:

    nvcc -std=c++17 -arch=sm_90 -O3 -cubin -o /tmp/r.cubin kernels/ring.cu
    cuobjdump -sass /tmp/r.cubin > /tmp/r.sass
    python3 scripts/sass_ldsm.py /tmp/r.sass ring_kernelILi128ELi128ELi2E
"""
import re
import sys


def functions(path, sub):
    """Yields (name, [(address, instruction)]) for each function matching sub."""
    cur, ins = None, []
    for line in open(path, errors="replace"):
        if "Function :" in line:
            if cur and sub in cur:
                yield cur, ins
            cur, ins = line.split(":", 1)[1].strip(), []
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m and cur:
            ins.append((int(m.group(1), 16), m.group(2)))
    if cur and sub in cur:
        yield cur, ins


def tile_loops(ins, hmma=256, max_len=3000):
    """Backward-branch loops holding exactly hmma HMMA instructions."""
    at = {a: i for i, (a, _) in enumerate(ins)}
    for i, (a, t) in enumerate(ins):
        m = re.search(r"BRA\s+(?:`?\(?)?(?:!?U?P\d,\s*)?0x([0-9a-f]+)", t)
        if not m:
            continue
        tgt = int(m.group(1), 16)
        if tgt >= a or tgt not in at:
            continue
        body = [x for _, x in ins[at[tgt]:i + 1]]
        if len(body) <= max_len and sum("HMMA" in x for x in body) == hmma:
            yield tgt, body


def ldsm_distances(body):
    """For every LDSM, instructions until the first one reading its 4 destination registers."""
    out = []
    for j, s in enumerate(body):
        m = re.match(r"(?:@\S+\s+)?LDSM\S*\s+R(\d+),", s)
        if not m:
            continue
        r0 = int(m.group(1))
        regs = {f"R{r0 + q}" for q in range(4)}
        for k in range(j + 1, min(j + 300, len(body))):
            ops = body[k].split(" ", 1)
            if len(ops) > 1 and set(re.findall(r"R\d+", ops[1])) & regs:
                out.append(k - j)
                break
    return out


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    found = False
    for name, ins in functions(argv[1], argv[2]):
        found = True
        print(name[:100])
        for start, body in tile_loops(ins):
            d = ldsm_distances(body)
            near = sum(1 for x in d if x <= 2)
            med = sorted(d)[len(d) // 2] if d else 0
            print(f"  loop {start:x}: {len(body)} instr, LDSM {len(d)}, used within 2: {near}, median distance {med}")
    if not found:
        print(f"sass_ldsm.py: no function matching {argv[2]!r} in {argv[1]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
