#!/usr/bin/env python3
"""scripts/ring_sched_model.py — a schedule model of ring_wg's gather ring
(emulated ranks, causal zigzag split): slots of known key-tile counts taken
from one queue by C CTAs, a slot's step s usable only once s hops of the
chunk chain have passed, and R·ncomm CTAs away copying until the last hop.
It prints the modelled overhead over one rank for the queue orders and comm
settings (kernels/README.md, ring attention; docs/PERF.md, fifty-first
pass). A model, not a measurement: the per-tile time and slot bubble are
parameters, and nothing of L2, clocks or the copies' effect on the compute
is in it.

  python3 scripts/ring_sched_model.py [--seq 16384] [--ctas 132] [--tile-us 1.9]
"""
import argparse
import heapq


def slots(R, n, heads, order):
    """(rank, chunk, tile in chunk) of every slot in queue order."""
    tpc = n // (2 * R) // 128
    out = []
    if order == "rank":  # the fiftieth pass: one rank after another, its later span first
        for r in range(R):
            for c in (2 * R - 1 - r, r):
                out += [(r, c, ti) for ti in reversed(range(tpc)) for _ in range(heads)]
    else:  # the fifty-first pass: spans by start, latest first
        for c in reversed(range(2 * R)):
            r = c if c < R else 2 * R - 1 - c
            out += [(r, c, ti) for ti in reversed(range(tpc)) for _ in range(heads)]
    return out, tpc


def makespan(R, order, a):
    s, tpc = slots(R, a.seq, a.heads, order)
    comm = a.ncomm * R if R > 1 else 0
    free = [(0.0, i) for i in range(a.ctas - comm)] + [((R - 1) * a.hop_us, 10**6 + i) for i in range(comm)]
    heapq.heapify(free)
    end = 0.0
    for r, c, ti in s:
        t, i = heapq.heappop(free)
        t += a.bubble_us
        for st in range(R):
            q = (r - st) % R  # the rank whose chunks rank r holds at step st
            vis = sum(tpc if cc < c else ti + 1 if cc == c else 0 for cc in (q, 2 * R - 1 - q))
            if vis:
                t = max(t, st * a.hop_us) + vis * a.tile_us
        end = max(end, t)
        heapq.heappush(free, (t, i))
    return end


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--ctas", type=int, default=132)
    p.add_argument("--tile-us", type=float, default=1.9, help="µs a 128 × 128 key tile (both GEMMs)")
    p.add_argument("--bubble-us", type=float, default=3.0, help="µs between two slots of a CTA")
    p.add_argument("--ncomm", type=int, default=8, help="comm CTAs a rank")
    p.add_argument("--hop-us", type=float, default=45.0, help="µs a hop of every rank's chunk")
    a = p.parse_args()
    base = makespan(1, "rank", a)
    print(f"one rank: {base:.0f} µs")
    for R in (2, 4, 8):
        row = [f"R = {R}"]
        for order in ("rank", "start"):
            row.append(f"{order} order {100 * (makespan(R, order, a) / base - 1):+.2f} %")
        print("  ".join(row))


if __name__ == "__main__":
    main()
