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
"""
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


def main():
    only = sys.argv[1:] or list(SHAPES)
    dev = "cuda"
    torch.manual_seed(0)
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
        bias = torch.randn(E, device=dev) * 0.1
        for T in TOKENS:
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
