#!/usr/bin/env python3
"""Train mkserve's small default MoE model (models/default) from scratch in one run.

What it does, in order:
  1. reads the King James Bible, one verse a line ("Ge1:1 In the beginning ..."), as the
     Debian package bible-kjv-text ships it (extracted with that package's `bible` tool);
     holds out 1% of the verses (seeded) for a held-out loss;
  2. trains a byte-level BPE tokenizer (HF tokenizers; Qwen2-style Split regex, then
     ByteLevel without its own regex; NFC; specials <|endoftext|> <|im_start|> <|im_end|>
     at ids 0, 1, 2) and writes tokenizer.json and tokenizer_config.json with a ChatML
     chat template;
  3. builds a few hundred short synthetic ChatML dialogues from training verses
     ("Quote a verse about light." -> a verse that contains "light");
  4. trains a Qwen3MoeForCausalLM from scratch (bf16 autocast, AdamW, cosine LR over a
     wall-clock budget, router load-balancing aux loss), evaluating the held-out loss every
     few seconds and keeping the best weights (the KJV is ~1M tokens: a 240 s run at
     batch 64 x 256 overfits after ~45 s, so the default budget is 60 s);
  5. saves the best weights in bf16 with save_pretrained(safe_serialization=True), a
     generation_config.json (eos <|im_end|> and <|endoftext|>, sampling defaults), the
     tokenizer files, reloads the saved checkpoint to re-check its held-out loss, and
     prints greedy and sampled generations.

Needs torch, transformers 5.x and tokenizers; meant for one GPU (falls back to CPU, slowly).
Usage:
    python3 scripts/train_default.py --data .dev/train/kjv.txt --out /tmp/default --seconds 60
"""

import argparse
import inspect
import json
import math
import os
import random
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ENDOFTEXT, IM_START, IM_END = 0, 1, 2

# Qwen2's pre-tokenizer split (digits one by one).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ChatML; renders <|im_start|>ROLE\nCONTENT<|im_end|>\n per message.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Words the synthetic dialogues ask about.
TOPICS = [
    "love", "light", "darkness", "water", "bread", "wine", "king", "shepherd", "sheep", "peace",
    "mercy", "fire", "sea", "mountain", "wisdom", "fear", "joy", "sin", "faith", "hope",
    "truth", "heart", "life", "death", "river", "tree", "gold", "silver", "lion", "lamb",
    "stars", "sun", "moon", "night", "rain", "wind", "stone", "house", "city", "war",
    "sword", "children", "mother", "father", "brother", "friend", "heaven", "earth", "garden",
    "prayer", "song", "praise", "strength", "salvation", "righteousness", "judgment", "spirit",
    "glory", "grace", "money", "poor", "rich", "bird", "fish", "field", "harvest", "wilderness",
    "temple", "law", "word", "voice", "eyes", "hands", "blood", "honey", "oil", "salt",
]
USER_FORMS = [
    "Quote a verse about {}.",
    "Give me a verse about {}.",
    "What does the Bible say about {}?",
    "Tell me about {}.",
    "Say something about {}.",
    "{}",
]
SYSTEM_PROMPTS = ["You are a helpful assistant.", "You quote the King James Bible."]


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------
# Data.

REF = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_verses(path):
    """[(book, chapter, verse, text)] from `bible -f` output."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            m = REF.match(line)
            if not m:
                raise ValueError(f"{path}:{n}: not a 'BookC:V text' line: {line[:60]!r}")
            out.append((m.group(1), int(m.group(2)), int(m.group(3)), m.group(4).strip()))
    return out


def chapters(verses):
    """Verse lists grouped by (book, chapter), in order."""
    groups, key = [], None
    for b, c, _, t in verses:
        if (b, c) != key:
            groups.append([])
            key = (b, c)
        groups[-1].append(t)
    return groups


def dialogues(train_verses, n, rng):
    """n ChatML conversations: a user asks about a topic, the assistant answers with a
    training verse that contains that word."""
    by_topic = {}
    for _, _, _, t in train_verses:
        if len(t) > 220:
            continue
        words = set(re.findall(r"[a-z]+", t.lower()))
        for w in TOPICS:
            if w in words:
                by_topic.setdefault(w, []).append(t)
    topics = sorted(w for w in by_topic if len(by_topic[w]) >= 3)
    convs = []
    for _ in range(n):
        w = rng.choice(topics)
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
        form = rng.choice(USER_FORMS)
        q = form.format(w.capitalize() if form == "{}" else w)
        msgs.append({"role": "user", "content": q})
        msgs.append({"role": "assistant", "content": rng.choice(by_topic[w])})
        convs.append(msgs)
    return convs, topics


def render_chat(msgs, add_generation_prompt=False):
    """The same text CHAT_TEMPLATE renders (checked against the tokenizer's own rendering)."""
    s = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs)
    if add_generation_prompt:
        s += "<|im_start|>assistant\n"
    return s


# ---------------------------------------------------------------------------
# Tokenizer.


def train_tokenizer(texts, vocab_size, out_dir):
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(pattern=Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s!r} got id {tok.token_to_id(s)}, want {i}")
    if tok.get_vocab_size() > vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, more than {vocab_size}")
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    cfg = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": {
            str(i): {
                "content": s,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, s in enumerate(SPECIALS)
        },
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": SPECIALS[IM_END],
        "errors": "replace",
        "model_max_length": 1024,
        "pad_token": SPECIALS[ENDOFTEXT],
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    return tok


# ---------------------------------------------------------------------------
# Model.


def config_fields(cls):
    names = set()
    try:
        names |= set(inspect.signature(cls.__init__).parameters)
    except (TypeError, ValueError):
        pass
    for base in cls.__mro__:
        names |= set(getattr(base, "__annotations__", {}) or {})
    return names


def make_config(a):
    cls = transformers.Qwen3MoeConfig
    kw = dict(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=2 * a.hidden,  # dense MLP size; unused: every layer is sparse
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim,
        moe_intermediate_size=a.moe_inter,
        num_experts=a.experts,
        num_experts_per_tok=a.topk,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
        attention_bias=False,
        attention_dropout=0.0,
        use_sliding_window=False,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        output_router_logits=False,
        router_aux_loss_coef=a.aux_coef,
        bos_token_id=ENDOFTEXT,
        eos_token_id=IM_END,
        pad_token_id=ENDOFTEXT,
    )
    if "rope_parameters" in config_fields(cls):
        kw["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    else:
        kw["rope_theta"] = 10000.0
    return cls(**kw)


def n_experts(cfg):
    return getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts")


def balance_loss(router_logits, num_experts, top_k):
    """Switch-style load-balancing loss (the formula of transformers'
    load_balancing_loss_func: E * sum over top-k slots and experts of the fraction of
    tokens sent times the mean router probability), taken per layer and averaged.
    transformers pools all layers' logits before counting, which only balances expert
    index i summed over layers and let single experts of single layers go idle.
    Minimum (perfect balance) is top_k."""
    losses = []
    for r in router_logits:
        p = r.float().reshape(-1, num_experts).softmax(-1)  # [T, E]
        chosen = F.one_hot(p.topk(top_k, dim=-1).indices, num_experts).float()  # [T, k, E]
        losses.append((chosen.mean(0) * p.mean(0)[None]).sum() * num_experts)
    return torch.stack(losses).mean()


def forward_loss(model, x, y, cfg, with_aux):
    out = model(input_ids=x, output_router_logits=with_aux, use_cache=False)
    ce = F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), y.reshape(-1))
    aux = None
    if with_aux:
        aux = balance_loss(out.router_logits, n_experts(cfg), cfg.num_experts_per_tok)
    return ce, aux, out


def windows(stream, seq):
    """Non-overlapping [n, seq+1] windows covering a token stream (last partial dropped)."""
    n = (len(stream) - 1) // seq
    t = torch.tensor(stream[: n * seq + 1], dtype=torch.long)
    idx = torch.arange(n)[:, None] * seq + torch.arange(seq + 1)[None]
    return t[idx]


@torch.no_grad()
def heldout_loss(model, cfg, wins, dev, amp, bs=64):
    was = model.training
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, len(wins), bs):
        w = wins[i : i + bs].to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            ce, _, _ = forward_loss(model, w[:, :-1], w[:, 1:], cfg, False)
        tot += ce.item() * w[:, 1:].numel()
        cnt += w[:, 1:].numel()
    model.train(was)
    return tot / max(cnt, 1)


@torch.no_grad()
def expert_usage(model, cfg, wins, dev, amp):
    """Fraction of top-k slots each expert gets on held-out tokens, per layer."""
    model.eval()
    w = wins[:32].to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        out = model(input_ids=w[:, :-1], output_router_logits=True, use_cache=False)
    E, k = n_experts(cfg), cfg.num_experts_per_tok
    rows = []
    for lg in out.router_logits:
        top = lg.float().reshape(-1, E).topk(k, dim=-1).indices
        rows.append((torch.bincount(top.reshape(-1), minlength=E).float() / top.numel()).tolist())
    return rows


def generate(model, tok, prompt, dev, sample, max_new=60):
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids.to(dev)
    gc = transformers.GenerationConfig(
        max_new_tokens=max_new,
        do_sample=sample,
        temperature=0.8 if sample else 1.0,
        top_p=0.95 if sample else 1.0,
        eos_token_id=[IM_END, ENDOFTEXT],
        pad_token_id=ENDOFTEXT,
    )
    out = model.generate(ids, generation_config=gc, attention_mask=torch.ones_like(ids))
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=False)


def load_hf_tokenizer(d):
    """The saved tokenizer as transformers loads it (AutoTokenizer, else the fast class)."""
    try:
        return transformers.AutoTokenizer.from_pretrained(d)
    except Exception as e:  # noqa: BLE001 - fall back, but say so
        log(f"AutoTokenizer failed ({e!r}); using PreTrainedTokenizerFast")
        return transformers.PreTrainedTokenizerFast(
            tokenizer_file=os.path.join(d, "tokenizer.json"),
            eos_token=SPECIALS[IM_END],
            pad_token=SPECIALS[ENDOFTEXT],
            chat_template=CHAT_TEMPLATE,
        )


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=".dev/train/kjv.txt")
    ap.add_argument("--out", default="models/default")
    ap.add_argument("--seconds", type=float, default=60.0, help="wall-clock training budget (cosine LR spans it)")
    ap.add_argument("--seed", type=int, default=1611)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=32)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--moe-inter", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--dialogues", type=int, default=600)
    ap.add_argument("--eval-every", type=float, default=5.0, help="seconds between held-out evals")
    ap.add_argument("--log-every", type=int, default=50, help="steps between loss lines")
    a = ap.parse_args()

    t_start = time.time()
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp = dev.type == "cuda"
    if amp:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, tokenizers {tokenizers.__version__}")
    log(f"device {dev}" + (f" ({torch.cuda.get_device_name(0)})" if amp else ""))

    # ---- data
    verses = read_verses(a.data)
    ids = list(range(len(verses)))
    rng.shuffle(ids)
    n_held = max(1, len(verses) // 100)
    held = set(ids[:n_held])
    train_v = [v for i, v in enumerate(verses) if i not in held]
    held_v = [v for i, v in enumerate(verses) if i in held]
    chaps = chapters(train_v)
    convs, topics = dialogues(train_v, a.dialogues, rng)
    conv_texts = [render_chat(c) for c in convs]
    log(f"data: {len(verses)} verses, {len(train_v)} train / {len(held_v)} held out, "
        f"{len(chaps)} chapters, {len(convs)} dialogues over {len(topics)} topics")

    # ---- tokenizer
    tok_texts = ["\n".join(c) + "\n" for c in chaps] + conv_texts
    t0 = time.time()
    btok = train_tokenizer(tok_texts, a.vocab, a.out)
    log(f"tokenizer: {btok.get_vocab_size()} tokens, trained in {time.time() - t0:.1f}s")
    hf_tok = load_hf_tokenizer(a.out)
    probe = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Quote a verse about light."}]
    try:
        rendered = hf_tok.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        ok = rendered == render_chat(probe, True)
        log(f"chat template check: {'ok' if ok else 'MISMATCH'}: {rendered!r}")
    except Exception as e:  # noqa: BLE001 - report only
        log(f"chat template check failed: {e!r}")
    sample_text = "In the beginning God created the heaven and the earth.\n"
    if btok.decode(btok.encode(sample_text).ids, skip_special_tokens=False) != sample_text:
        raise RuntimeError("tokenizer does not round-trip plain text")

    def enc(s):
        return btok.encode(s, add_special_tokens=False).ids

    # Training stream: chapters (verses one a line) and dialogues, each closed by
    # <|endoftext|>; dialogues sit between chapters at random places.
    segs = ["\n".join(c) + "\n" for c in chaps]
    for t in conv_texts:
        segs.insert(rng.randrange(len(segs) + 1), t)
    stream = []
    for s in segs:
        stream.extend(enc(s))
        stream.append(ENDOFTEXT)
    held_stream = enc("\n".join(v[3] for v in held_v) + "\n")
    held_w = windows(held_stream, a.seq)
    train_t = torch.tensor(stream, dtype=torch.long, device=dev)
    log(f"tokens: train {len(stream)}, held out {len(held_stream)} ({len(held_w)} windows of {a.seq}), "
        f"{sum(len(v[3]) for v in verses) / (len(stream) + len(held_stream)):.2f} chars/token")

    # ---- model
    cfg = make_config(a)
    model = transformers.Qwen3MoeForCausalLM(cfg).to(dev)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if not tied:
        log("lm_head was not tied to embed_tokens; tying it")
        model.lm_head.weight = model.model.embed_tokens.weight
        tied = True
    n_params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    per_tok = n_params - a.layers * (n_experts(cfg) - a.topk) * 3 * a.hidden * a.moe_inter
    log(f"model: Qwen3MoeForCausalLM {a.layers} layers, hidden {a.hidden}, {a.heads}/{a.kv_heads} heads x {a.head_dim}, "
        f"{n_experts(cfg)} experts top-{a.topk} x {a.moe_inter}, vocab {a.vocab}, tied={tied}")
    log(f"params: {n_params:,} total ({2 * n_params / 1e6:.1f} MB in bf16), ~{per_tok:,} active per token")

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=amp,
    )

    def lr_at(step, frac):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    def batch():
        off = torch.randint(0, len(stream) - a.seq - 1, (a.batch,), device=dev)
        idx = off[:, None] + torch.arange(a.seq + 1, device=dev)[None]
        w = train_t[idx]
        return w[:, :-1], w[:, 1:]

    # Dry run of everything after training (one step, save, reload, chat, generate) so a
    # broken API fails now rather than after the budget is spent.
    x, y = batch()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        ce, aux, _ = forward_loss(model, x, y, cfg, True)
    (ce + a.aux_coef * aux).backward()
    opt.zero_grad(set_to_none=True)
    log(f"dry run: initial loss {ce.item():.3f} (ln V = {math.log(a.vocab):.3f}), aux {aux.item():.3f}")
    dry = os.path.join("/tmp", "train_default_dry")
    model.save_pretrained(dry, safe_serialization=True)
    m2 = transformers.Qwen3MoeForCausalLM.from_pretrained(dry, dtype=torch.bfloat16).to(dev)
    generate(m2, hf_tok, render_chat(probe, True), dev, True, max_new=4)
    del m2
    log(f"dry run ok; setup took {time.time() - t_start:.1f}s")

    # ---- train
    model.train()
    best = (float("inf"), -1, None)
    step, tokens, t_train = 0, 0, time.time()
    last_eval = t_train
    hist = []
    run_ce = run_aux = 0.0
    while True:
        el = time.time() - t_train
        if el >= a.seconds:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, el / a.seconds)
        x, y = batch()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
            ce, aux, _ = forward_loss(model, x, y, cfg, True)
        loss = ce + a.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens += x.numel()
        run_ce += ce.item()
        run_aux += aux.item()
        if step % a.log_every == 0:
            log(f"step {step:6d}  {el:6.1f}s  lr {opt.param_groups[0]['lr']:.2e}  train loss {run_ce / a.log_every:.4f}  "
                f"aux {run_aux / a.log_every:.4f}  {tokens / max(el, 1e-9) / 1e3:.0f}k tok/s")
            run_ce = run_aux = 0.0
        if time.time() - last_eval >= a.eval_every:
            last_eval = time.time()
            hl = heldout_loss(model, cfg, held_w, dev, amp)
            hist.append((step, round(time.time() - t_train, 1), round(hl, 4)))
            mark = ""
            if hl < best[0]:
                best = (hl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
                mark = "  (best)"
            log(f"eval step {step}: held-out loss {hl:.4f} ppl {math.exp(hl):.2f}{mark}")
    train_s = time.time() - t_train
    hl = heldout_loss(model, cfg, held_w, dev, amp)
    hist.append((step, round(train_s, 1), round(hl, 4)))
    log(f"trained {step} steps, {tokens:,} tokens ({tokens / len(stream):.1f} epochs) in {train_s:.1f}s; "
        f"last held-out loss {hl:.4f}")
    if hl < best[0]:
        best = (hl, step, None)
    else:
        model.load_state_dict(best[2])
        log(f"keeping the weights of step {best[1]} (held-out loss {best[0]:.4f})")
    final_hl = heldout_loss(model, cfg, held_w, dev, amp)
    log(f"final held-out loss {final_hl:.4f}, perplexity {math.exp(final_hl):.2f} (step {best[1]})")
    try:
        for i, row in enumerate(expert_usage(model, cfg, held_w, dev, amp)):
            log(f"expert share layer {i}: " + " ".join(f"{r:.3f}" for r in row))
    except Exception as e:  # noqa: BLE001 - report only
        log(f"expert usage not available: {e!r}")

    # ---- save
    model = model.to(torch.bfloat16)
    model.config.output_router_logits = False
    gen = transformers.GenerationConfig(
        bos_token_id=ENDOFTEXT,
        eos_token_id=[IM_END, ENDOFTEXT],
        pad_token_id=ENDOFTEXT,
        do_sample=True,
        temperature=0.8,
        top_p=0.95,
    )
    model.generation_config = gen
    model.save_pretrained(a.out, safe_serialization=True)
    gen.save_pretrained(a.out)
    sizes = {f: os.path.getsize(os.path.join(a.out, f)) for f in sorted(os.listdir(a.out))}
    log("saved: " + ", ".join(f"{f} {s:,} B" for f, s in sizes.items()))

    # ---- reload and check
    m = transformers.Qwen3MoeForCausalLM.from_pretrained(a.out, dtype=torch.bfloat16).to(dev)
    tok = load_hf_tokenizer(a.out)
    reload_hl = heldout_loss(m, m.config, held_w, dev, False)
    log(f"reloaded bf16 checkpoint: held-out loss {reload_hl:.4f}, perplexity {math.exp(reload_hl):.2f}")
    summary = dict(
        steps=step, best_step=best[1], tokens=tokens, train_seconds=round(train_s, 1),
        total_seconds=round(time.time() - t_start, 1), params=n_params, active_params_per_token=per_tok,
        train_tokens=len(stream), heldout_tokens=len(held_stream), heldout_verses=len(held_v),
        dialogues=len(convs), final_heldout_loss=round(final_hl, 4), final_heldout_ppl=round(math.exp(final_hl), 2),
        reloaded_bf16_heldout_loss=round(reload_hl, 4), eval_history=hist, device=str(dev),
        gpu=torch.cuda.get_device_name(0) if amp else None, args=vars(a),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__, tokenizers=tokenizers.__version__),
    )
    log("SUMMARY " + json.dumps(summary))

    prompts = [
        ("completion", "In the beginning"),
        ("completion", "And the LORD said unto Moses,"),
        ("chat", render_chat([{"role": "user", "content": "Quote a verse about light."}], True)),
        ("chat", render_chat([{"role": "user", "content": "Tell me about the sea."}], True)),
    ]
    torch.manual_seed(a.seed)
    for sample in (False, True):
        for kind, p in prompts[:3] if not sample else prompts[1:]:
            try:
                text = generate(m, tok, p, dev, sample)
                log(f"--- {'sampled' if sample else 'greedy'} {kind}: {p!r}\n{text}")
            except Exception as e:  # noqa: BLE001 - report only
                log(f"--- generation failed for {p!r}: {e!r}")
    log(f"done in {time.time() - t_start:.1f}s")


if __name__ == "__main__":
    sys.exit(main())
