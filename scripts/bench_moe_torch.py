#!/usr/bin/env python3
"""PyTorch baseline for `mkserve bench moe`: one MoE layer as a per-expert
loop in eager PyTorch (router matmul, top-k routing, then per expert:
index_select, torch.matmul, silu(gate)*up, torch.matmul, index_add_), bf16
weights and activations, on the shapes of DeepSeek-V3, Qwen3-30B-A3B and
Mixtral-8x7B; plus the ceilings measured in the same run: torch.matmul
8192^3 bf16 (TFLOP/s) and a 1 GiB device copy (GB/s).

Prints one line per measurement:
  torch moe <shape> <tokens> <ms> <tflops> <weight_gbps> <experts_touched>
  torch moe_experts <shape> <tokens> <ms>      (the expert loop alone)
  torch matmul 8192 <ms> <tflops>
  torch copy <GB/s>
Times: median over iterations, CUDA events; fresh tokens every iteration.

With --ranks R1,R2,… it prints instead baseline (b) of `mkserve bench moe
--path fused --ranks R` (issue #5): the layer over R expert-parallel ranks
emulated on one GPU, T tokens per rank, experts in contiguous blocks of E/R
per rank (kernels.MoEBlockPlacement), the all-to-all as copies:
  torch moe_ep <shape> <tokens_per_rank> <ranks> <ms> <comm_ms>
  torch moe_ep_check <shape> <tokens_per_rank> <ranks> <rel_err>
ms: the whole layer (every rank's router and routing, dispatch, experts,
return, combine). comm_ms: the dispatch and return copies alone, from CUDA
events recorded around them in a second pass on the same tokens (launch
gaps between the copies included). rel_err: relative L2 of the ranks'
outputs against the one-rank loop (experts()) on the same tokens and
routing, in a first pass whose buffers are poisoned with NaN; above 1e-2 or
NaN the check line ends in FAIL and the script exits with status 1.

Usage: bench_moe_torch.py [SHAPE…] [--shapes A,B] [--tokens 1,16,…] [--ranks 1,8] [--iters 5]
"""
import argparse
import math
import statistics
import sys

import torch

SHAPES = {
    # name: hidden, intermediate, experts, top-k, routing
    "deepseek_v3": (7168, 2048, 256, 8, "grouped"),
    "qwen3_30b_a3b": (2048, 768, 128, 8, "softmax"),
    "mixtral_8x7b": (4096, 14336, 8, 2, "softmax"),
}
TOKENS = [1, 16, 64, 256, 1024, 4096, 16384]
EP_TOKENS = [1, 16, 256, 1024, 4096]  # per rank, --ranks mode


def route(logits, k, routing, bias):
    if routing == "grouped":  # DeepSeek-V3: sigmoid, bias for choice, 8 groups, top-4 groups, scale 2.5
        s = torch.sigmoid(logits.float())
        c = s + bias
        T, E = c.shape
        g = c.view(T, 8, E // 8).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(g).scatter_(1, g.topk(4, dim=-1).indices, 1.0)
        mask = keep.unsqueeze(-1).expand(T, 8, E // 8).reshape(T, E)
        c = c.masked_fill(mask == 0, float("-inf"))
        ids = c.topk(k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * 2.5
        return ids, w
    p = torch.softmax(logits.float(), dim=-1)
    w, ids = p.topk(k, dim=-1)
    return ids, w / w.sum(-1, keepdim=True)


def experts(x, ids, w, gu, dn, inter):
    T, H = x.shape
    k = ids.shape[1]
    out = torch.zeros(T, H, device=x.device, dtype=torch.float32)
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=gu.shape[0]).tolist()  # host sync, as such loops do
    wf = w.reshape(-1)
    off = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = order[off:off + n]
        off += n
        tok = rows // k
        xe = x.index_select(0, tok)
        h = torch.matmul(xe, gu[e].t())
        a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
        y = torch.matmul(a, dn[e].t())
        out.index_add_(0, tok, y.float() * wf[rows, None])
    return out


def timed(fn, iters, prep=None):
    ts = []
    for i in range(iters + 2):
        if prep:
            prep(i)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 2:
            ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def blocks(E, R):
    """Per rank the experts [lo, hi) it holds: expert e on rank e*R//E, as
    kernels.MoEBlockPlacement (an empty block (E, E) for a rank without any)."""
    lo, hi = [E] * R, [E] * R
    for e in reversed(range(E)):
        lo[e * R // E] = e
    for e in range(E):
        hi[e * R // E] = e + 1
    return list(zip(lo, hi))


def moe_ep(xs, gate, bias, gu, dn, K, inter, routing, blk, marks=None, poison=False):
    """One MoE layer over R = len(xs) emulated expert-parallel ranks on one
    GPU. xs[r]: rank r's tokens [T, H] bf16; rank d holds experts blk[d] =
    [lo, hi) (the views gu[lo:hi] [S, 2I, H] and dn[lo:hi] [S, H, I]).
    Per rank: router matmul + routing; dispatch: per (source s, dest d) a
    gather of s's rows for d's experts into a send buffer and its copy into
    d's receive buffer (with the rows' expert ids); per rank d and local
    expert: matmuls on its received rows → f32 rows; return: per (d, s) one
    block copy back to s; at s: index_add_ of the rows × routing weights.
    marks: None, or 4 CUDA events recorded around the dispatch ([0], [1])
    and return ([2], [3]) copies. poison: fill every intermediate buffer
    with NaN first, so a row never written shows. Returns (per rank out
    [T, H] f32, per rank ids [T, K], per rank weights [T, K])."""
    R = len(xs)
    E = gate.shape[0]
    T, H = xs[0].shape
    dev = xs[0].device
    routed = []  # per source: ids, w, sorted expert ids [T*K], token of each sorted assignment [T*K], sorted weights [T*K]
    for x in xs:
        ids, w = route(torch.matmul(x, gate.t()), K, routing, bias)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # by expert, hence by destination rank
        routed.append((ids, w, flat.index_select(0, order), order // K, w.reshape(-1).index_select(0, order)))
    # counts[s][e]: rows source s sends to expert e; one host sync (an all-to-all's count exchange).
    counts = torch.stack([torch.bincount(r[0].reshape(-1), minlength=E) for r in routed]).tolist()
    n = [[sum(counts[s][lo:hi]) for lo, hi in blk] for s in range(R)]  # n[s][d]: rows s → d
    recv = [torch.empty(sum(n[s][d] for s in range(R)), H, device=dev, dtype=xs[0].dtype) for d in range(R)]
    recv_exp = [torch.empty(r.shape[0], device=dev, dtype=torch.long) for r in recv]
    back = [torch.empty(T * K, H, device=dev, dtype=torch.float32) for _ in range(R)]  # sorted assignment order
    ys = [torch.empty(r.shape[0], H, device=dev, dtype=torch.float32) for r in recv]
    if poison:
        for b in recv + back + ys:
            b.fill_(float("nan"))
        for b in recv_exp:
            b.fill_(-1)
    if marks:
        marks[0].record()
    roff = [0] * R
    for s in range(R):  # dispatch: receive buffers in source blocks, each sorted by expert
        a = 0
        for d in range(R):
            m = n[s][d]
            if m:
                send = xs[s].index_select(0, routed[s][3][a:a + m])
                recv[d][roff[d]:roff[d] + m].copy_(send)
                recv_exp[d][roff[d]:roff[d] + m].copy_(routed[s][2][a:a + m])
                roff[d] += m
            a += m
    if marks:
        marks[1].record()
    for d, (lo, hi) in enumerate(blk):  # experts, on each rank's received rows
        if recv[d].shape[0] == 0:
            continue
        gu_d, dn_d = gu[lo:hi], dn[lo:hi]
        order = torch.argsort(recv_exp[d], stable=True)
        off = 0
        for e in range(lo, hi):
            m = sum(counts[s][e] for s in range(R))
            if m == 0:
                continue
            rows = order[off:off + m]
            off += m
            h = torch.matmul(recv[d].index_select(0, rows), gu_d[e - lo].t())
            act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
            ys[d].index_copy_(0, rows, torch.matmul(act, dn_d[e - lo].t()).float())
    if marks:
        marks[2].record()
    roff = [0] * R
    for s in range(R):  # return: the same (s, d) blocks back, f32 as the fused path's return
        a = 0
        for d in range(R):
            m = n[s][d]
            if m:
                back[s][a:a + m].copy_(ys[d][roff[d]:roff[d] + m])
                roff[d] += m
            a += m
    if marks:
        marks[3].record()
    outs = []
    for s in range(R):  # combine at the source
        _, _, _, tok, wsorted = routed[s]
        out = torch.zeros(T, H, device=dev, dtype=torch.float32)
        out.index_add_(0, tok, back[s] * wsorted[:, None])
        outs.append(out)
    return outs, [r[0] for r in routed], [r[1] for r in routed]


def bench_ep(name, gate, bias, gu, dn, T, R, iters):
    """Times moe_ep for T tokens per rank over R ranks and checks it once
    against the one-rank loop; prints its two lines, returns the check's
    pass."""
    H, I, E, K, routing = SHAPES[name]
    blk = blocks(E, R)
    x = torch.empty(R, T, H, device=gate.device, dtype=torch.bfloat16)  # [ranks, tokens, hidden]
    xs = list(x.unbind(0))
    x.normal_()
    outs, ids, ws = moe_ep(xs, gate, bias, gu, dn, K, I, routing, blk, poison=True)
    ref = experts(x.view(R * T, H), torch.cat(ids), torch.cat(ws), gu, dn, I).double()
    got = torch.cat(outs).double()
    rel = ((got - ref).norm() / ref.norm().clamp_min(1e-300)).item()
    ok = math.isfinite(rel) and rel <= 1e-2
    print(f"torch moe_ep_check {name} {T} {R} {rel:.2e}{'' if ok else ' FAIL'}", flush=True)
    del outs, ids, ws, ref, got
    ts, cs = [], []
    for i in range(iters + 2):
        x.normal_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        moe_ep(xs, gate, bias, gu, dn, K, I, routing, blk)
        b.record()
        b.synchronize()
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        moe_ep(xs, gate, bias, gu, dn, K, I, routing, blk, marks=marks)
        marks[3].synchronize()
        if i >= 2:
            ts.append(a.elapsed_time(b))
            cs.append(marks[0].elapsed_time(marks[1]) + marks[2].elapsed_time(marks[3]))
    print(f"torch moe_ep {name} {T} {R} {statistics.median(ts):.4f} {statistics.median(cs):.4f}", flush=True)
    return ok


def ints(s):
    return [int(v) for v in s.split(",") if v]


def main():
    ap = argparse.ArgumentParser(description="PyTorch MoE baselines for mkserve bench moe")
    ap.add_argument("shape", nargs="*", help="shapes (as --shapes)")
    ap.add_argument("--shapes", default="", help="comma-separated: " + ",".join(SHAPES) + " (default all)")
    ap.add_argument("--tokens", default="", help="token counts (per rank with --ranks), comma-separated")
    ap.add_argument("--ranks", default="", help="emulated expert-parallel rank counts, comma-separated: "
                    "prints the moe_ep lines only (no ceilings, no one-rank lines)")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations per moe_ep line")
    ap.add_argument("--score-bias", type=float, default=0.0,
                    help="grouped routing: std of the random score bias, as mkserve bench moe's --score-bias "
                         "(0: even routing; 0.1 was fixed before the fifty-fifth pass and concentrates it)")
    args = ap.parse_args()
    only = args.shape + [v for v in args.shapes.split(",") if v] or list(SHAPES)
    for name in only:
        if name not in SHAPES:
            ap.error(f"unknown shape {name!r} (known: {', '.join(SHAPES)})")
    dev = "cuda"
    torch.manual_seed(0)
    if args.ranks:
        ranks = ints(args.ranks)
        tokens = ints(args.tokens) or EP_TOKENS
        ok = True
        for name in only:
            H, I, E, K, _ = SHAPES[name]
            gate = torch.randn(E, H, device=dev, dtype=torch.bfloat16) / H**0.5
            gu = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) / H**0.5
            dn = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) / I**0.5
            bias = torch.randn(E, device=dev) * args.score_bias
            for R in ranks:
                for T in tokens:
                    ok = bench_ep(name, gate, bias, gu, dn, T, R, args.iters) and ok
                    torch.cuda.empty_cache()
            del gate, gu, dn
            torch.cuda.empty_cache()
        sys.exit(0 if ok else 1)
    tok_list = ints(args.tokens) or TOKENS
    # Ceilings first.
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = timed(lambda: torch.matmul(a, b), 10)
    print(f"torch matmul 8192 {ms:.4f} {2 * 8192**3 / ms / 1e9:.1f}", flush=True)
    del a, b
    src = torch.empty(1 << 29, device=dev, dtype=torch.float16)
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), 10)
    print(f"torch copy {2 * src.numel() * 2 / ms / 1e6:.0f}", flush=True)
    del src, dst
    for name in only:
        H, I, E, K, routing = SHAPES[name]
        gate = torch.randn(E, H, device=dev, dtype=torch.bfloat16) / H**0.5
        gu = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) / H**0.5
        dn = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) / I**0.5
        bias = torch.randn(E, device=dev) * args.score_bias
        for T in tok_list:
            x = torch.empty(T, H, device=dev, dtype=torch.bfloat16)
            state = {}

            def prep(i):
                x.normal_()

            def layer():
                logits = torch.matmul(x, gate.t())
                ids, w = route(logits, K, routing, bias)
                state["ids"] = ids
                experts(x, ids, w, gu, dn, I)

            iters = 3 if T >= 4096 else 5
            ms = timed(layer, iters, prep)
            touched = int(torch.unique(state["ids"]).numel())
            fl = 2 * 3 * T * K * H * I
            gbps = touched * 3 * H * I * 2 / ms / 1e6
            print(f"torch moe {name} {T} {ms:.4f} {fl / ms / 1e9:.2f} {gbps:.0f} {touched}", flush=True)
            ids, w = route(torch.matmul(x, gate.t()), K, routing, bias)
            ms2 = timed(lambda: experts(x, ids, w, gu, dn, I), iters)
            print(f"torch moe_experts {name} {T} {ms2:.4f}", flush=True)
        del gate, gu, dn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
