#!/usr/bin/env python3
"""scripts/ncu_kernels.py CSV [N] — the last N kernels (default 12) of an
`ncu --csv --print-units base --metrics gpu__time_duration.sum,
dram__bytes_read.sum` run, one line each: launch id, name, grid, µs, DRAM
MB read and TB/s, then their summed time. Lines that are not the CSV's
(the profiled program's own output) are skipped."""
import csv
import sys


def main():
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
    head, kernels = None, {}
    for row in csv.reader(open(path)):
        if row and row[0] == "ID":
            head = row
            continue
        if not head or len(row) != len(head):
            continue
        d = dict(zip(head, row))
        key = (int(d["ID"]), d["Kernel Name"][:48], d.get("Grid Size", ""))
        kernels.setdefault(key, {})[d["Metric Name"]] = float(d["Metric Value"].replace(",", "") or 0)
    total = 0.0
    for (i, name, grid), m in sorted(kernels.items())[-n:]:
        ns, b = m.get("gpu__time_duration.sum", 0.0), m.get("dram__bytes_read.sum", 0.0)
        total += ns
        print("%4d %-48s %-14s %8.1f us %8.1f MB %5.2f TB/s" % (i, name, grid, ns / 1e3, b / 1e6, b / ns / 1e3 if ns else 0))
    print("sum %.1f us" % (total / 1e3))


if __name__ == "__main__":
    main()
