#!/usr/bin/env python3
"""scripts/ring_sched_model.py — a schedule model of ring_wg's gather ring
(emulated ranks, causal zigzag split): slots of known key-tile counts taken
from one queue by C CTAs, a slot's step s usable only once s hops of the
chunk chain have passed, and R·ncomm CTAs away copying until the last hop.
It prints the modelled overhead over one rank for the queue orders, the
two zigzag splits (rank r holding chunks r and 2R−1−r, "inner"; or R−1−r
and R+r, "outer", the fifty-second pass's) and hops of whole chunks or
pruned to the halves still needed downstream (hop_rows; a hop's time
scales with the halves it moves) (kernels/README.md, ring attention;
docs/PERF.md, fifty-first and fifty-second passes). A model, not a measurement: the per-tile time and slot bubble are
parameters, and nothing of L2, clocks or the copies' effect on the compute
is in it.

  python3 scripts/ring_sched_model.py [--seq 16384] [--ctas 132] [--tile-us 1.9]
"""
import argparse
import heapq


def chunks(R, r, split):
    """The (early, late) chunks of 2R that rank r holds."""
    return (r, 2 * R - 1 - r) if split == "inner" else (R - 1 - r, R + r)


def slots(R, n, heads, order, split):
    """(rank, chunk, tile in chunk) of every slot in queue order."""
    tpc = n // (2 * R) // 128
    owner = {c: r for r in range(R) for c in chunks(R, r, split)}
    out = []
    if order == "rank":  # the fiftieth pass: one rank after another, its later span first
        for r in range(R):
            for c in reversed(chunks(R, r, split)):
                out += [(r, c, ti) for ti in reversed(range(tpc)) for _ in range(heads)]
    else:  # the fifty-first pass: spans by start, latest first
        for c in reversed(range(2 * R)):
            out += [(owner[c], c, ti) for ti in reversed(range(tpc)) for _ in range(heads)]
    return out, tpc


def arrivals(R, split, prune, hop_us):
    """When each step's chunks have arrived (µs): hop k moves the halves
    hop_rows forwards (all of them unpruned), every rank's at once, in
    hop_us × (halves moved) / (2R)."""
    last = {r: max(chunks(R, r, split)) for r in range(R)}  # a rank sees a chunk iff its last chunk is not earlier
    out, t = [0.0], 0.0
    for k in range(R - 1):
        moved = 0
        for r in range(R):
            q = (r - k) % R
            down = [(r + j) % R for j in range(1, R - k)]
            for c in chunks(R, q, split):
                moved += 1 if not prune or any(last[d] >= c for d in down) else 0
        t += hop_us * moved / (2 * R)
        out.append(t)
    return out


def makespan(R, order, a, split="outer", prune=True):
    s, tpc = slots(R, a.seq, a.heads, order, split)
    arr = arrivals(R, split, prune, a.hop_us)
    comm = a.ncomm * R if R > 1 else 0
    free = [(0.0, i) for i in range(a.ctas - comm)] + [(arr[-1], 10**6 + i) for i in range(comm)]
    heapq.heapify(free)
    end = 0.0
    for r, c, ti in s:
        t, i = heapq.heappop(free)
        t += a.bubble_us
        for st in range(R):
            q = (r - st) % R  # the rank whose chunks rank r holds at step st
            vis = sum(tpc if cc < c else ti + 1 if cc == c else 0 for cc in chunks(R, q, split))
            if vis:
                t = max(t, arr[st]) + vis * a.tile_us
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
        for order, split, prune in (("rank", "inner", False), ("start", "inner", False), ("start", "outer", False),
                                    ("start", "outer", True)):
            lab = f"{order} order, {split} split, {'pruned' if prune else 'whole'} hops"
            row.append(f"{lab} {100 * (makespan(R, order, a, split, prune) / base - 1):+.2f} %")
        print("  ".join(row))


if __name__ == "__main__":
    main()
