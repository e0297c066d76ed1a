#!/usr/bin/env python3
"""The NCCL baseline of issue #7: one MoE layer with expert parallelism over
R processes (one GPU each), the all-to-all way: every rank routes its own
tokens (router matmul + top-k, as scripts/bench_moe_torch.py), exchanges
per-destination row counts (all_to_all_single), sends each (token, k) row
to the rank holding its expert (all_to_all_single of the hidden rows and of
the expert ids), runs its local experts, sends the results back
(all_to_all_single) and combines them at the source with the routing
weights (index_add_). Experts sit in contiguous blocks of E/R per rank
(kernels.MoEBlockPlacement).

The local experts (--experts): grouped (default) sorts the received rows by
expert and runs two grouped GEMMs, torch._grouped_mm(rows [N, H] bf16,
gate_up^T [S, H, 2I], offs=cumsum(rows per expert) int32) then SwiGLU then
torch._grouped_mm(act [N, I], down^T [S, I, H], offs): NCCL all-to-all +
grouped GEMM + all-to-all, the baseline issue #7 asks for. Where
torch._grouped_mm is missing or refuses (older torch, CPU, float32), the
loop runs instead and the output line says so. loop: one torch.matmul pair
per expert (bench_moe_torch.py's experts()).

Run (one process per GPU; NVLink multicast off, as the device README asks):
  NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --nproc_per_node R \\
      scripts/bench_ep_nccl.py --shapes qwen3_30b_a3b --tokens 1024,4096
Smoke test on CPUs (no GPU): add --backend gloo (tiny shapes: --shapes tiny).

Rank 0 prints, per (shape, tokens per rank):
  nccl moe_ep <shape> <tokens_per_rank> <ranks> <ms> <comm_ms> <rel_err> experts=<grouped|loop|loop(fallback:REASON)>
ms: median over --iters of the whole layer (routing to combine), with a
barrier before each iteration and the slowest rank's time; comm_ms: the
three all-to-alls of the rows alone (the same layer timed again with the
count exchange and the row exchanges bracketed by events, summed); rel_err:
the first --check-rows tokens of every rank against their outputs computed
directly through their own experts (each expert's weights come from its
own seed, so any rank can make any expert), relative L2, the worst rank. Times: CUDA events on GPUs, perf_counter on CPUs.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_moe_torch import SHAPES, experts, route  # noqa: E402 (the one-GPU baseline's routing and expert loop)

SHAPES = dict(SHAPES, tiny=(64, 32, 8, 2, "softmax"))


def blocks(E, R):
    """Rank r holds experts [r*E//R, (r+1)*E//R)."""
    return [(r * E // R, (r + 1) * E // R) for r in range(R)]


class Clock:
    """CUDA events on a GPU, perf_counter on a CPU (gloo smoke tests)."""

    def __init__(self, cuda):
        self.cuda = cuda

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def ms(self, a, b):
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b)
        return (b - a) * 1e3


class Experts:
    """The local experts on received rows: grouped GEMMs or the loop."""

    def __init__(self, want):
        self.kind = want
        self.note = want
        if want == "grouped" and not hasattr(torch, "_grouped_mm"):
            self.fallback(f"no torch._grouped_mm in torch {torch.__version__}")

    def fallback(self, why):
        self.kind = "loop"
        self.note = "loop(fallback:" + "_".join(why.split()) + ")"

    def __call__(self, recv, local_ids, gu, dn, inter):
        """recv [N, H], local_ids [N] (0..S-1) -> [N, H] float32."""
        if self.kind == "grouped":
            if recv.dtype != torch.bfloat16:
                self.fallback(f"grouped_mm needs bf16, rows are {recv.dtype}")
            else:
                try:
                    return grouped_experts(recv, local_ids, gu, dn, inter)
                except (RuntimeError, NotImplementedError) as e:
                    print(f"bench_ep_nccl: torch._grouped_mm failed, using the loop: {e}", file=sys.stderr, flush=True)
                    self.fallback(f"grouped_mm failed: {type(e).__name__}")
        return experts(recv, local_ids.unsqueeze(1), torch.ones(recv.shape[0], 1, device=recv.device), gu, dn, inter)


def grouped_experts(recv, local_ids, gu, dn, inter):
    """Rows sorted by expert, two torch._grouped_mm calls with offsets (group
    end rows, int32 on the device: no host sync), SwiGLU between them in
    bf16 as the loop does; the outputs back in received order, float32."""
    N, H = recv.shape
    if N == 0:
        return torch.zeros(0, H, dtype=torch.float32, device=recv.device)
    order = torch.argsort(local_ids, stable=True)
    xs = recv.index_select(0, order)
    offs = torch.cumsum(torch.bincount(local_ids, minlength=gu.shape[0]), 0).to(torch.int32)
    h = torch._grouped_mm(xs, gu.transpose(1, 2), offs=offs)  # [N, 2I]
    a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]  # [N, I] bf16
    y = torch._grouped_mm(a, dn.transpose(1, 2), offs=offs)  # [N, H]
    out = torch.empty(N, H, dtype=torch.float32, device=recv.device)
    out.index_copy_(0, order, y.float())
    return out


def layer(x, gate, bias, gu, dn, K, inter, routing, blk, rank, R, clock=None, run_experts=None):
    """One MoE layer on this rank: x [T, H] this rank's tokens; gu, dn this
    rank's experts [S, 2I, H], [S, H, I]. Returns out [T, H] float32 and,
    with a clock, the milliseconds of the all-to-alls."""
    T, H = x.shape
    ids, w = route(torch.matmul(x, gate.t()), K, routing, bias)
    flat = ids.reshape(-1)  # [T*K]
    owner = torch.zeros_like(flat)
    for d, (lo, hi) in enumerate(blk):
        owner[(flat >= lo) & (flat < hi)] = d
    order = torch.argsort(owner, stable=True)  # rows grouped by destination
    send_counts = torch.bincount(owner, minlength=R)
    comm = 0.0
    m0 = clock.mark() if clock else None
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    sc, rc = send_counts.tolist(), recv_counts.tolist()  # host sync, as the all-to-all API needs
    rows = x.index_select(0, order // K)  # [T*K, H] in destination order
    recv = torch.empty(sum(rc), H, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv, rows, output_split_sizes=rc, input_split_sizes=sc)
    recv_ids = torch.empty(sum(rc), dtype=flat.dtype, device=x.device)
    dist.all_to_all_single(recv_ids, flat.index_select(0, order), output_split_sizes=rc, input_split_sizes=sc)
    if clock:
        m1 = clock.mark()
        comm += clock.ms(m0, m1)
    # Local experts on the received rows (one row each: top-1 of its own id).
    lo, _ = blk[rank]
    y = run_experts(recv, recv_ids - lo, gu, dn, inter)
    m2 = clock.mark() if clock else None
    back = torch.empty(T * K, H, dtype=torch.float32, device=x.device)
    dist.all_to_all_single(back, y, output_split_sizes=sc, input_split_sizes=rc)
    if clock:
        comm += clock.ms(m2, clock.mark())
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    out.index_add_(0, order // K, back * w.reshape(-1)[order, None])
    return out, comm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="qwen3_30b_a3b")
    ap.add_argument("--tokens", default="16,256,1024,4096")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--score-bias", type=float, default=0.0,
                    help="grouped routing: std of the random score bias, as mkserve bench moe's --score-bias (0: even)")
    ap.add_argument("--check-rows", type=int, default=4, help="tokens per rank checked against the direct computation")
    ap.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    ap.add_argument("--experts", default="grouped", choices=["grouped", "loop"],
                    help="local experts: torch._grouped_mm with offsets (falls back to the loop where missing) or the per-expert loop")
    a = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group(a.backend)
    rank, R = dist.get_rank(), dist.get_world_size()
    cuda = a.backend == "nccl"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dt = torch.bfloat16 if cuda else torch.float32
    clock = Clock(cuda)
    ok = True
    for name in a.shapes.split(","):
        H, inter, E, K, routing = SHAPES[name]
        if E % R:
            raise SystemExit(f"{name}: {E} experts do not split over {R} ranks")
        g = torch.Generator(device="cpu").manual_seed(7)  # the same router on every rank
        gate = (torch.randn(E, H, generator=g) / H ** 0.5).to(dev, dt)
        bias = (torch.randn(E, generator=g) * a.score_bias).to(dev) if routing == "grouped" else None
        blk = blocks(E, R)
        lo, hi = blk[rank]

        def expert(e):
            """Expert e's weights from its own seed: the same on every rank,
            made where they are needed (a rank never holds all of them)."""
            ge = torch.Generator(device=dev).manual_seed(1_000_003 + e)
            gu = torch.randn(2 * inter, H, generator=ge, device=dev) / H ** 0.5
            dn = torch.randn(H, inter, generator=ge, device=dev) / inter ** 0.5
            return gu.to(dt), dn.to(dt)

        run_experts = Experts(a.experts)
        mine = [expert(e) for e in range(lo, hi)]
        gu, dn = torch.stack([m[0] for m in mine]), torch.stack([m[1] for m in mine])
        for T in [int(t) for t in a.tokens.split(",")]:
            gx = torch.Generator(device="cpu").manual_seed(1000 * rank + T)
            x = torch.randn(T, H, generator=gx).to(dev, dt)
            out, _ = layer(x, gate, bias, gu, dn, K, inter, routing, blk, rank, R, run_experts=run_experts)
            # The reference: the first --check-rows tokens, each through its
            # own experts directly (float32 math on the same bf16 values).
            ids, w = route(torch.matmul(x, gate.t()), K, routing, bias)
            C = min(T, a.check_rows)
            ref = torch.zeros(C, H, dtype=torch.float32, device=dev)
            for t in range(C):
                for k in range(K):
                    egu, edn = expert(int(ids[t, k]))
                    h = torch.matmul(egu.float(), x[t].float())
                    act = (torch.nn.functional.silu(h[:inter]) * h[inter:]).to(dt).float()
                    ref[t] += w[t, k].float() * torch.matmul(edn.float(), act)
            err = ((out[:C] - ref).norm() / ref.norm()).item()
            ts, cs = [], []
            for i in range(a.iters + 2):
                dist.barrier()
                t0 = clock.mark()
                layer(x, gate, bias, gu, dn, K, inter, routing, blk, rank, R, run_experts=run_experts)
                t1 = clock.mark()
                ms = clock.ms(t0, t1)
                _, c = layer(x, gate, bias, gu, dn, K, inter, routing, blk, rank, R, clock, run_experts)
                if i >= 2:
                    ts.append(ms)
                    cs.append(c)
            stats = torch.tensor([statistics.median(ts), statistics.median(cs), err], dtype=torch.float64, device=dev)
            dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # the slowest rank, the worst error
            ms, comm, err = stats.tolist()
            if rank == 0:
                print(f"nccl moe_ep {name} {T} {R} {ms:.4f} {comm:.4f} {err:.2e} experts={run_experts.note}", flush=True)
            ok = ok and err <= 1e-2
    dist.destroy_process_group()
    if not ok:
        raise SystemExit("bench_ep_nccl: relative error above 1e-2")


if __name__ == "__main__":
    main()
