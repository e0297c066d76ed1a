"""Baseline for BenchmarkPagedAttn: what a PyTorch user runs for paged decode
attention without a paged kernel: gather the blocks of each sequence from the
bf16 pool through the block table, then F.scaled_dot_product_attention (GQA).
Same shapes as the Go benchmark (32 q heads, 8 kv heads, head dim 128, 16-token
blocks, random block ids, one query row per sequence). Also times SDPA alone on
an already contiguous cache (no gather) and reports vllm/flashinfer presence.
Prints lines: torch paged B ctx gather_sdpa_us sdpa_only_us kv_GBps_of_gather_sdpa"""
import importlib, sys, time
import torch
import torch.nn.functional as F

for m in ("vllm", "flashinfer"):
    try:
        importlib.import_module(m)
        print(f"# {m}: importable")
    except Exception as e:  # noqa: BLE001
        print(f"# {m}: not importable ({type(e).__name__})")
print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}")

H, KV, D, BS = 32, 8, 128, 16
dev = "cuda"
max_tokens = 256 * 32768
torch.manual_seed(0)
pool_blocks = max_tokens // BS
pk = torch.empty(pool_blocks, BS, KV, D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
pv = torch.empty_like(pk).uniform_(-1, 1)


def timeit(fn, iters):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


for B in (1, 32, 256):
    for L in (1024, 4096, 16384, 32768):
        nb = L // BS
        kv_bytes = B * L * KV * 2 * D * 2
        try:
            bt = torch.randperm(pool_blocks, device=dev)[: B * nb].view(B, nb)
            q = torch.randn(B, H, 1, D, dtype=torch.bfloat16, device=dev)

            def gather_sdpa():
                k = pk[bt].view(B, L, KV, D).transpose(1, 2)
                v = pv[bt].view(B, L, KV, D).transpose(1, 2)
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

            iters = 10 if kv_bytes > (1 << 30) else 30
            t_g = timeit(gather_sdpa, iters)
            k = pk[bt].view(B, L, KV, D).transpose(1, 2).contiguous()
            v = pv[bt].view(B, L, KV, D).transpose(1, 2).contiguous()
            t_s = timeit(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), iters)
            del k, v
            print(f"torch paged {B} {L} {t_g:.1f} {t_s:.1f} {kv_bytes / (t_g * 1e-6) / 1e9:.0f}", flush=True)
        except torch.OutOfMemoryError:
            print(f"torch paged {B} {L} OOM", flush=True)
        torch.cuda.empty_cache()
