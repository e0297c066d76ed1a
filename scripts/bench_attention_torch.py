#!/usr/bin/env python3
"""PyTorch baseline for `mkserve bench attention`.

Times torch.nn.functional.scaled_dot_product_attention under
sdpa_kernel(SDPBackend.FLASH_ATTENTION) and SDPBackend.CUDNN_ATTENTION on the
shapes of the Go benchmark: batch sequences of seq tokens, bf16 q [B, H, S, D],
k [B, KH, S, D], v [B, KH, S, DV], random uniform [-1, 1). GQA goes through
enable_gqa=True; where a backend refuses that, k and v are expanded with
repeat_interleave outside the timing ("gqa": "repeat").

Timing: 3 warm-up calls, then --iters calls each between two CUDA events;
ms is the median. FLOPs follow FlashAttention's convention, as the Go
benchmark does: 2*B*H*(D+DV)*S^2, halved when causal (4*S^2*H*D/2 for D = DV).

Usage: python3 scripts/bench_attention_torch.py --seq 1024,4096,16384 \
          --heads 32 --kv-heads 8 --head-dim 128 --causal [--json]
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def flops(b, h, d, dv, s, causal):
    f = 2.0 * b * h * (d + dv) * s * s
    return f / 2 if causal else f


def time_calls(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    ms = sorted(a.elapsed_time(b) for a, b in ev)
    return statistics.median(ms), ms[0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", default="1024,4096,16384")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--v-head-dim", type=int, default=0)
    p.add_argument("--causal", action="store_true")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    dv = a.v_head_dim or a.head_dim
    seqs = [int(x) for x in a.seq.split(",")]
    dev = torch.device("cuda")
    res = []
    for name, backend in (("torch-flash", SDPBackend.FLASH_ATTENTION), ("torch-cudnn", SDPBackend.CUDNN_ATTENTION)):
        for s in seqs:
            g = torch.Generator(device=dev).manual_seed(s)
            q = torch.rand(a.batch, a.heads, s, a.head_dim, device=dev, generator=g).mul_(2).sub_(1).bfloat16()
            k = torch.rand(a.batch, a.kv_heads, s, a.head_dim, device=dev, generator=g).mul_(2).sub_(1).bfloat16()
            v = torch.rand(a.batch, a.kv_heads, s, dv, device=dev, generator=g).mul_(2).sub_(1).bfloat16()
            row = {"backend": name, "seq": s, "batch": a.batch, "heads": a.heads, "kv_heads": a.kv_heads,
                   "head_dim": a.head_dim, "v_head_dim": dv, "causal": a.causal, "iters": a.iters}
            try:
                with sdpa_kernel(backend):
                    gqa = "enable_gqa"
                    try:
                        F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, enable_gqa=True)
                        fn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=a.causal, enable_gqa=True)
                    except RuntimeError:
                        gqa = "repeat"
                        r = a.heads // a.kv_heads
                        kk, vv = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
                        fn = lambda: F.scaled_dot_product_attention(q, kk, vv, is_causal=a.causal)
                    ms, mn = time_calls(fn, a.iters)
                row.update(gqa=gqa, ms=ms, min_ms=mn,
                           tflops=flops(a.batch, a.heads, a.head_dim, dv, s, a.causal) / (ms * 1e-3) / 1e12)
            except Exception as e:  # a backend that cannot run the shape
                row.update(error=str(e).splitlines()[0][:200])
            res.append(row)
            if not a.json:
                if "error" in row:
                    print(f"{name} seq={s} failed: {row['error']}")
                else:
                    print(f"{name} seq={s} ms={row['ms']:.4f} min_ms={row['min_ms']:.4f} "
                          f"tflops={row['tflops']:.1f} gqa={row['gqa']}")
            sys.stdout.flush()
            del q, k, v
    if a.json:
        print(json.dumps(res))


if __name__ == "__main__":
    main()
