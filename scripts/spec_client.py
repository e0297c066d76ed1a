#!/usr/bin/env python3
# scripts/spec_client.py URL — what prompt-lookup speculation buys on a
# served model: five 256-token completions after a passage repeated three
# times, greedy then at temperature 0.7 (seeds 0-4), tokens/s of each, and
# the server's spec_decode counters. Run against `mkserve serve
# --speculative-tokens K` and K = 0 (docs/PERF.md, thirtieth pass).
import json, sys, time, urllib.request
url = sys.argv[1]
p = "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God divided the light from the darkness. " * 3
def one(max_tokens, temp, seed):
    body = json.dumps({"prompt": p, "max_tokens": max_tokens, "temperature": temp, "seed": seed, "ignore_eos": True}).encode()
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})))
    return r, time.time() - t
for temp in (0, 0.7):
    one(16, temp, 1)
    tot, n = 0.0, 0
    for s in range(5):
        r, dt = one(256, temp, s)
        tot += dt; n += r["usage"]["completion_tokens"]
    print("  temperature %.1f: %d tokens in %.1f ms = %.0f tok/s, last text %r" % (temp, n, tot * 1000, n / tot, r["choices"][0]["text"][:50]))
m = urllib.request.urlopen(url + "/metrics").read().decode()
print("  ", [l for l in m.splitlines() if l.startswith("mkserve:spec_decode")])
