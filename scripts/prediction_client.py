#!/usr/bin/env python3
# scripts/prediction_client.py URL — what OpenAI's predicted outputs buy on a
# served model (docs/PERF.md, thirty-second pass): a greedy chat reply of
# 256 tokens, then the same request five times each with no prediction,
# with the reply itself as the prediction (a file sent back unchanged),
# and with an edit of it (a sentence replaced in the middle, as a code edit
# would change a few lines); tokens/s of each and the usage's accepted and
# rejected prediction tokens. Checks every reply equals the first.
import json, sys, time, urllib.request
url = sys.argv[1]
msgs = [{"role": "user", "content": "Tell me of the waters, the light and the firmament, at length."}]
def ask(pred):
    body = {"model": "default", "messages": msgs, "max_tokens": 256, "temperature": 0, "ignore_eos": True}
    if pred is not None:
        body["prediction"] = {"type": "content", "content": pred}
    t = time.time()
    r = json.load(urllib.request.urlopen(urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})))
    return r, time.time() - t
first, _ = ask(None)
reply = first["choices"][0]["message"]["content"]
mid = len(reply) // 2
edited = reply[:mid] + " And behold, a new thing was written here in the midst of it all. " + reply[mid + 60:]
for name, pred in (("none", None), ("the reply", reply), ("an edit", edited)):
    tot, n, acc, rej, same = 0.0, 0, 0, 0, True
    for _ in range(5):
        r, dt = ask(pred)
        tot += dt
        n += r["usage"]["completion_tokens"]
        d = r["usage"].get("completion_tokens_details") or {}
        acc += d.get("accepted_prediction_tokens", 0)
        rej += d.get("rejected_prediction_tokens", 0)
        same = same and r["choices"][0]["message"]["content"] == reply
    print("  prediction %-9s: %d tokens in %.1f ms = %.0f tok/s, accepted %d, rejected %d, replies equal: %s" % (name, n, tot * 1000, n / tot, acc, rej, same))
