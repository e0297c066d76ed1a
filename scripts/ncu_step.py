#!/usr/bin/env python3
"""scripts/ncu_step.py REPORT.csv [--layers N] [--start KERNEL]

Summarises an ncu per-kernel timing export of `mkserve bench model`
(`ncu --import rep.ncu-rep --csv --page raw`, metric
gpu__time_duration.sum; see scripts/ncu_step.sh): the kernels of the last
forward pass, which begins at the last launch of --start (default
`gather_rows`, the embedding), summed per kernel name, costliest first,
with µs per layer when --layers is given. Rows that are not launches
(ncu's units row) are skipped; a time in ms, us or ns is converted.
"""
import argparse
import csv
import sys
from collections import OrderedDict


def short(name):
    """The kernel's function name without namespaces, template arguments or parameters."""
    n = name.replace("(anonymous namespace)::", "")
    depth, out = 0, []
    for ch in n:  # drop template arguments <...>
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    n = "".join(out).split("(")[0].strip()
    return n.split(" ")[-1].split("::")[-1] or name


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--start", default="gather_rows")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args(argv)
    rows = list(csv.reader(open(a.csv, newline="")))
    hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hdr is None:
        sys.exit(f"{a.csv}: no 'Kernel Name' column")
    cols = rows[hdr]
    kn, tm = cols.index("Kernel Name"), cols.index("gpu__time_duration.sum")
    unit = "ns"
    launches = []
    for r in rows[hdr + 1:]:
        if len(r) <= max(kn, tm):
            continue
        v = r[tm].replace(",", "")
        try:
            t = float(v)
        except ValueError:  # the units row: remember the unit
            if v in ("nsecond", "usecond", "msecond", "ns", "us", "ms"):
                unit = v[0] + "s"
            continue
        launches.append((short(r[kn]), t * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[unit]))
    if not launches:
        sys.exit(f"{a.csv}: no kernel launches")
    starts = [i for i, (n, _) in enumerate(launches) if a.start in n]
    first = starts[-1] if starts else 0
    step = launches[first:]
    per = OrderedDict()
    for n, t in step:
        c, s = per.get(n, (0, 0.0))
        per[n] = (c + 1, s + t)
    total = sum(t for _, t in step)
    print(f"{len(launches)} launches in the report; the last step from launch {first}: "
          f"{len(step)} kernels, {total:.1f} µs" + (f", {total / a.layers:.1f} µs per layer" if a.layers else ""))
    print(f"{'kernel':40s} {'calls':>6s} {'µs':>10s} {'µs/call':>9s} {'share':>6s}" + ("  µs/layer" if a.layers else ""))
    for n, (c, s) in sorted(per.items(), key=lambda kv: -kv[1][1])[:a.top]:
        line = f"{n[:40]:40s} {c:6d} {s:10.1f} {s / c:9.2f} {100 * s / total:5.1f}%"
        if a.layers:
            line += f"  {s / a.layers:8.2f}"
        print(line)


if __name__ == "__main__":
    main(sys.argv[1:])
