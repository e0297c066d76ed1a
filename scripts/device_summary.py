#!/usr/bin/env python3
"""Summary table of a scripts/device.sh run: python3 scripts/device_summary.py LOGDIR.

Reads what device.sh wrote (test.log, cuda.log, serve.log, logits.log,
gemm.log + torch.log, attention.log, decode.log, moe.log, ring.log, model.log,
servebench.log) and prints one short table per part that ran; parts that did not
run are left out. Nothing here measures anything: it only reformats the logs.
"""
import json
import os
import re
import statistics
import sys

logs = sys.argv[1] if len(sys.argv) > 1 else ".dev/logs"


def read(name):
    p = os.path.join(logs, name)
    return open(p, errors="replace").read() if os.path.exists(p) else ""


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


def json_values(text):
    """Every top-level JSON array or object in text, in order."""
    dec, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        j = min([k for k in (text.find("[", i), text.find("{", i)) if k >= 0], default=-1)
        if j < 0:
            break
        try:
            v, end = dec.raw_decode(text, j)
            out.append(v)
            i = end
        except ValueError:
            i = j + 1
    return out


print("== summary")
for name, label in (("test.log", "kernel tests"), ("cuda.log", "CUDA backend tests"),
                    ("serve.log", "serving tests on cuda")):
    t = read(name)
    if not t:
        continue
    tops = re.findall(r"^--- (PASS|FAIL|SKIP): (\S+)", t, re.M)
    subs = re.findall(r"^\s+--- (PASS|FAIL|SKIP): (\S+)", t, re.M)
    line = f"{label:<24}"
    for kind in ("PASS", "FAIL", "SKIP"):
        n = [x for k, x in tops if k == kind]
        line += f" {kind.lower()} {len(n)} (+{sum(1 for k, _ in subs if k == kind)} sub)"
        if kind != "PASS" and n:
            line += " [" + " ".join(sorted(set(n))) + "]"
    crashed = re.findall(r"exited with rc (\d+)", t)
    if crashed:
        line += f"; {len(crashed)} process(es) exited non-zero"
    print(line)
for line in re.findall(r"^(?:GOLDEN|LOGITS).*", read("cuda.log") + read("logits.log"), re.M):
    print("  " + line)

# GEMMs: ours (Go benchmark) against torch.matmul (eager and CUDA graph).
bench, torch = read("gemm.log"), read("torch.log")
if bench:
    def metric(line, unit):
        m = re.search(r"([0-9.e+-]+) " + re.escape(unit) + r"(\s|$)", line)
        return float(m.group(1)) if m else None
    gemm, ops = {}, {}
    for line in bench.splitlines():
        m = re.match(r"BenchmarkGemmBF16/M=(\d+)_N=(\d+)_K=(\d+)", line)
        if m:
            gemm.setdefault(tuple(map(int, m.groups())), []).append(
                (metric(line, "TFLOP/s"), metric(line, "us/gemm")))
            continue
        m = re.match(r"Benchmark(CopyD2D|Ops/\S+?)(-\d+)?\s", line)
        if m:
            ops.setdefault(m.group(1), []).append((metric(line, "GB/s"), metric(line, "us/op") or metric(line, "us/copy")))
    tg, tgg, tc = {}, {}, []
    for line in torch.splitlines():
        p = line.split()
        if len(p) < 4 or p[0] != "torch":
            continue
        if p[1] == "gemm":
            tg.setdefault(tuple(map(int, p[2:5])), []).append(float(p[5]))
        elif p[1] == "gemmgraph" and "failed" not in line:
            tgg.setdefault(tuple(map(int, p[2:5])), []).append(float(p[5]))
        elif p[1] == "copy":
            tc.append(float(p[2]))
    print(f"{'GEMM bf16 M N K':<22}{'mk TF/s':>9}{'mk us':>9}{'torch TF/s':>11}{'graph TF/s':>11}{'mk/torch':>9}")
    for key in sorted(gemm, key=lambda k: (k[1] * k[2], k[0])):
        mt, mu = med([x[0] for x in gemm[key]]), med([x[1] for x in gemm[key]])
        tt, gt = med(tg.get(key, [])), med(tgg.get(key, []))
        print(f"{'%d %d %d' % key:<22}{mt:>9.1f}{mu:>9.1f}{tt:>11.1f}{gt:>11.1f}{mt / tt if tt == tt and tt else float('nan'):>9.2f}")
    for name, xs in sorted(ops.items()):
        print(f"  {name:<28} {med([x[0] for x in xs]):7.0f} GB/s")
    if tc:
        print(f"  {'torch copy_ 1 GiB':<28} {med(tc):7.0f} GB/s")

t = read("backend.log")
if t:
    print("-- CUDA backend on the small checkpoints (Go benchmarks) and transformers (hf lines)")
    for line in re.findall(r"^(?:Benchmark\S+\s.*|hf .*)", t, re.M):
        print("  " + " ".join(line.split()))

# Benchmarks that print JSON arrays of objects: one line per object.
for name in ("attention.log", "decode.log", "moe.log", "ring.log", "model.log"):
    t = read(name)
    if not t:
        continue
    print(f"-- {name[:-4]}")
    for v in json_values(t):
        rows = v if isinstance(v, list) else [v]
        for r in rows:
            if isinstance(r, dict):
                print("  " + " ".join(f"{k}={(f'{x:.4g}' if isinstance(x, float) else x)}" for k, x in r.items()))
    for line in re.findall(r"^(?:torch|TORCH|baseline|BASELINE|SUMMARY|MOE|Benchmark(?:PagedAttn|CopyD2D)).*", t, re.M)[:80]:
        print("  " + " ".join(line.split()))

t = read("servebench.log")
if "SERVE concurrency" in t:
    print("-- mkserve bench serve against mkserve serve --backend cuda (default model)")
    for part in t.split("SERVE concurrency ")[1:]:
        conc = part.split()[0]
        vals = [v for v in json_values(part) if isinstance(v, dict) and "completed" in v]
        if not vals:
            print(f"  concurrency {conc}: no result")
            continue
        v = vals[0]
        print(f"  concurrency {conc}: {v['request_throughput']:.2f} req/s, {v['output_token_throughput']:.0f} output tok/s, "
              f"TTFT p50/p99 {v['ttft']['p50_ms']:.1f}/{v['ttft']['p99_ms']:.1f} ms, "
              f"ITL p50/p99 {v['itl']['p50_ms']:.2f}/{v['itl']['p99_ms']:.2f} ms, failed {v['failed']}")
