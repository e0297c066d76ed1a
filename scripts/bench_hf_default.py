#!/usr/bin/env python3
"""Baseline for backend/cuda's BenchmarkPrefill and BenchmarkDecode: the same
checkpoints run by Hugging Face transformers (bf16, PyTorch eager) on the
same GPU, with the same work per step:

  prefill: one 256-token prompt, logits of its last row (logits_to_keep=1);
  decode:  B sequences (B = 1, 16) with a 128-token KV cache (DynamicCache)
           each decode one token; the cache is cropped back to 128 after
           every step, as the Go benchmark re-decodes position 128.

Token ids are those of backend/cuda/bench_test.go: (i*7919 + 13) % vocab.
Each timed call is bracketed by torch.cuda.synchronize(); 3 warm-up calls,
then STEPS timed ones; medians are printed (ms per step and tokens/s).

Usage (on the GPU machine, from the repository root):
    python3 scripts/bench_hf_default.py [model_dir ...]
Default models: models/default and models/testdata/golden/mixtral.
Environment: STEPS (default 20), ATTN (default sdpa; eager as fallback).
"""
import os
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

STEPS = int(os.environ.get("STEPS", "20"))
WARMUP = 3
PROMPT, CTX = 256, 128


def ids(n, vocab):
    return [(i * 7919 + 13) % vocab for i in range(n)]


def timed(fn, before=None):
    """Median wall ms of fn() over STEPS calls after WARMUP; before() runs
    untimed ahead of every call."""
    out = []
    for i in range(WARMUP + STEPS):
        if before is not None:
            before()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= WARMUP:
            out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out), min(out), max(out)


def load(path):
    last = None
    for attn in (os.environ.get("ATTN", "sdpa"), "eager"):
        try:
            m = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation=attn)
            return m.to("cuda").eval(), attn
        except Exception as e:  # noqa: BLE001 (report and fall back)
            print(f"hf load {path} with attn_implementation={attn} failed: {e!r}", flush=True)
            last = e
    raise last


def bench(path):
    name = os.path.basename(os.path.normpath(path))
    model, attn = load(path)
    cfg = model.config
    V = cfg.vocab_size
    experts = getattr(cfg, "_experts_implementation", None)
    print(f"hf model {name}: {type(model).__name__}, {sum(p.numel() for p in model.parameters())} params, "
          f"dtype {next(model.parameters()).dtype}, attn {attn}, experts {experts}", flush=True)
    with torch.inference_mode():
        x = torch.tensor([ids(PROMPT, V)], device="cuda")

        def prefill():
            model(input_ids=x, use_cache=True, logits_to_keep=1)

        med, lo, hi = timed(prefill)
        print(f"hf prefill {name} tokens={PROMPT} median_ms={med:.3f} min_ms={lo:.3f} max_ms={hi:.3f} "
              f"tokens_per_s={PROMPT / med * 1e3:.1f}", flush=True)

        ctx = ids(CTX, V)
        for B in (1, 16):
            prompt = torch.tensor([ctx] * B, device="cuda")
            cache = model(input_ids=prompt, use_cache=True, logits_to_keep=1).past_key_values
            tok = torch.tensor([[ctx[s]] for s in range(B)], device="cuda")
            crop = getattr(cache, "crop", None)
            if crop is None:
                print("hf note: this cache has no crop(); decode context grows from 128", flush=True)

            def step():
                out = model(input_ids=tok, past_key_values=cache, use_cache=True)
                out.logits.float()  # [B, 1, V], as the Go benchmark copies logits out

            def back():
                nonlocal crop
                if crop is None:
                    return
                try:
                    crop(CTX)
                except RuntimeError as e:
                    # A sliding-window cache (the golden mixtral's window is
                    # 8 tokens) keeps no past to roll back to; its context
                    # is the window however long the sequence grows.
                    print(f"hf note: crop failed ({e}); decode context grows from {CTX}", flush=True)
                    crop = None

            med, lo, hi = timed(step, back)
            print(f"hf decode {name} batch={B} ctx={CTX} cache_len_after={cache.get_seq_length()} "
                  f"median_ms={med:.3f} min_ms={lo:.3f} max_ms={hi:.3f} tokens_per_s={B / med * 1e3:.1f}",
                  flush=True)
    del model
    torch.cuda.empty_cache()


def main():
    print(f"hf env: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.cuda.get_device_name(0)}, steps {STEPS}, warm-up {WARMUP}", flush=True)
    paths = sys.argv[1:] or ["models/default", "models/testdata/golden/mixtral"]
    rc = 0
    for p in paths:
        try:
            bench(p)
        except Exception as e:  # noqa: BLE001 (one model failing leaves the other's numbers)
            print(f"hf FAILED {p}: {e!r}", flush=True)
            rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
