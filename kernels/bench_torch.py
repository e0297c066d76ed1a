"""PyTorch baseline for kernels/bench_test.go, run on the GPU machine by
scripts/device.sh: the same bf16 GEMM shapes, C = A @ B.T with A [M,K] and
B [N,K] (torch.matmul, so cuBLAS underneath), random inputs rotated over the
same ≥512 MiB working set, CUDA events around 200 products after a warm-up,
three batches; then the same 200 products captured in a CUDA graph and
replayed, which takes Python's launch overhead out (small M is launch-bound
without it); also a 1 GiB device-to-device copy. Prints one line per
measurement: `torch gemm M N K <TFLOP/s> <us>`, `torch gemmgraph M N K
<TFLOP/s> <us>` and `torch copy <GB/s> <us>`.
"""
import os

import torch

# The shapes of kernels/gemm_shapes.txt (also read by kernels/bench_test.go).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_shapes.txt")) as f:
    SHAPES = [tuple(int(x) for x in line.split()[:3]) for line in f
              if line.strip() and not line.startswith("#")]
ROT = 512 << 20
ITERS = int(os.environ.get("MK_TORCH_ITERS", "200"))
BATCHES = int(os.environ.get("MK_TORCH_BATCHES", "3"))


def timed(fn, iters):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    s.record()
    for i in range(iters):
        fn(i)
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / iters  # ms


def main():
    dev = torch.device("cuda")
    print("torch", torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), flush=True)
    for m, n, k in SHAPES:
        ab, bb = 2 * m * k, 2 * n * k
        sets = max(1, min(16, -(-ROT // (ab + bb))))
        A = [torch.rand(m, k, device=dev, dtype=torch.bfloat16) * 2 - 1 for _ in range(sets)]
        B = [torch.rand(n, k, device=dev, dtype=torch.bfloat16) * 2 - 1 for _ in range(sets)]
        C = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _ in range(sets)]

        def run(i):
            j = i % sets
            torch.matmul(A[j], B[j].t(), out=C[j])

        timed(run, 2 * sets)
        for _ in range(BATCHES):
            ms = timed(run, ITERS)
            print(f"torch gemm {m} {n} {k} {2 * m * n * k / (ms * 1e-3) / 1e12:.2f} {ms * 1e3:.2f}", flush=True)
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for i in range(3):
                    run(i)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for i in range(ITERS):
                    run(i)
            graph.replay()
            for _ in range(BATCHES):
                ms = timed(lambda i: graph.replay(), 1) / ITERS
                print(f"torch gemmgraph {m} {n} {k} {2 * m * n * k / (ms * 1e-3) / 1e12:.2f} {ms * 1e3:.2f}", flush=True)
            del graph
        except Exception as e:  # the eager numbers above still stand
            print(f"torch gemmgraph {m} {n} {k} failed: {e}", flush=True)
        del A, B, C
        torch.cuda.empty_cache()
    nbytes = 1 << 30
    src = torch.rand(nbytes // 2, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    timed(lambda i: dst.copy_(src), 3)
    for _ in range(BATCHES):
        ms = timed(lambda i: dst.copy_(src), 50)
        print(f"torch copy {2 * nbytes / (ms * 1e-3) / 1e9:.1f} {ms * 1e3:.1f}", flush=True)


if __name__ == "__main__":
    main()
