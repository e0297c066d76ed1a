# scripts/bench_ring_torch.py SEQS — torch baselines for `mkserve bench ring`: SDPA (cuDNN,
# flash) over the whole sequence and the bf16 GEMM ceiling, one JSON object.
# Baselines in the same run: torch SDPA (cuDNN, then flash) on the whole
# sequence, causal, 32 q heads / 8 kv heads / d128, and the bf16 GEMM ceiling.
import sys, torch, json
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
res = {}
def med(f, n=5):
    for _ in range(2): f()
    ts = []
    for _ in range(n):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2]
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
ms = med(lambda: a @ b, 10); res["gemm_8192_tflops"] = 2*8192**3/ms/1e9
del a, b
H, KV, D = 32, 8, 128
for S in [int(x) for x in sys.argv[1].split(",")]:
    q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, KV, S, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, KV, S, D, device="cuda", dtype=torch.bfloat16)
    ke, ve = k.repeat_interleave(H//KV, 1), v.repeat_interleave(H//KV, 1)
    flops = 4*S*S/2*H*D
    for name, be in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
        try:
            with sdpa_kernel([be]):
                ms = med(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True), 5 if S <= 65536 else 3)
            res[f"sdpa_{name}_{S}_ms"] = ms; res[f"sdpa_{name}_{S}_tflops"] = flops/ms/1e9
        except Exception as e:
            res[f"sdpa_{name}_{S}_error"] = str(e)[:200]
    del q, k, v, ke, ve; torch.cuda.empty_cache()
print(json.dumps(res))
