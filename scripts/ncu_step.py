#!/usr/bin/env python3
"""scripts/ncu_step.py REPORT.csv [--layers N] [--start KERNEL]

Summarises an ncu per-kernel timing export of `mkserve bench model`
(`ncu --import rep.ncu-rep --csv --page raw`, metric
gpu__time_duration.sum; see scripts/ncu_step.sh): the kernels of the last
forward pass, which begins at the last launch of --start (default
`gather_rows`, the embedding), summed per kernel name, costliest first,
with µs per layer when --layers is given, and each kernel's DRAM read rate
(GB/s) when the export has dram__bytes_read.sum (scripts/ncu_step.sh with
BYTES=1). Rows that are not launches (ncu's units row) are skipped; a time
in ms, us or ns and a size in byte, Kbyte, Mbyte or Gbyte are converted.
"""
import argparse
import csv
import os
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
    by = cols.index("dram__bytes_read.sum") if "dram__bytes_read.sum" in cols else -1
    unit, bunit = "ns", 1.0
    sizes = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1.0}
    launches = []
    for r in rows[hdr + 1:]:
        if len(r) <= max(kn, tm, by):
            continue
        v = r[tm].replace(",", "")
        try:
            t = float(v)
        except ValueError:  # the units row: remember the units
            if v in ("nsecond", "usecond", "msecond", "ns", "us", "ms"):
                unit = v[0] + "s"
            if by >= 0 and r[by] in sizes:
                bunit = sizes[r[by]]
            continue
        b = 0.0
        if by >= 0:
            try:
                b = float(r[by].replace(",", "")) * bunit
            except ValueError:
                b = 0.0
        launches.append((short(r[kn]), t * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[unit], b))
    if not launches:
        sys.exit(f"{a.csv}: no kernel launches")
    starts = [i for i, (n, _, _) in enumerate(launches) if a.start in n]
    first = starts[-1] if starts else 0
    step = launches[first:]
    per = OrderedDict()
    for n, t, b in step:
        c, s, bb = per.get(n, (0, 0.0, 0.0))
        per[n] = (c + 1, s + t, bb + b)
    total = sum(t for _, t, _ in step)
    print(f"{len(launches)} launches in the report; the last step from launch {first}: "
          f"{len(step)} kernels, {total:.1f} µs" + (f", {total / a.layers:.1f} µs per layer" if a.layers else ""))
    print(f"{'kernel':40s} {'calls':>6s} {'µs':>10s} {'µs/call':>9s} {'share':>6s}" + ("  µs/layer" if a.layers else "")
          + ("   MB/call    GB/s" if by >= 0 else ""))
    for n, (c, s, bb) in sorted(per.items(), key=lambda kv: -kv[1][1])[:a.top]:
        line = f"{n[:40]:40s} {c:6d} {s:10.1f} {s / c:9.2f} {100 * s / total:5.1f}%"
        if a.layers:
            line += f"  {s / a.layers:8.2f}"
        if by >= 0:
            line += f"  {bb / c / 1e6:8.2f} {bb / (s * 1e-6) / 1e9 if s > 0 else 0:7.0f}"
        print(line)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except BrokenPipeError:  # the reader (`| head`) took what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        sys.exit(0)
