#!/usr/bin/env python3
"""Generate tokenizer test data for mkserve's tokenizer package with the real
Hugging Face `tokenizers` library.

It trains small BPE tokenizers offline (no network, no downloaded weights) in
the styles of the model families mkserve serves, then records how the real
library encodes and decodes a list of hard strings:

  qwen2        NFC + Split(Qwen2 regex) + ByteLevel(use_regex=False), ByteLevel
               decoder, <|endoftext|> <|im_start|> <|im_end|> specials, a
               special token that lives inside the model vocab at a
               non-contiguous id, normalized and non-special added tokens.
  llama3       Split(Llama-3 regex, digit groups of 1-3) + ByteLevel,
               ignore_merges, TemplateProcessing with <|begin_of_text|>, added
               tokens with lstrip / rstrip / single_word flags.
  bytefallback Llama-2 / Mixtral style: Prepend("▁") + Replace(" ", "▁")
               normalizer, no pre-tokenizer, BPE byte_fallback with the 256
               <0xXX> tokens, <unk> <s> </s>, decoder Replace + ByteFallback +
               Fuse + Strip, TemplateProcessing "<s> $A".
  metaspace    Metaspace(prepend_scheme="first", split=True) pre-tokenizer,
               byte_fallback, decoder ByteFallback + Metaspace.
  deepseek3    DeepSeek-V3 style: a Sequence of three Splits (digit groups,
               CJK runs, a letters/punctuation regex) plus a Split on trailing
               blanks before a line end ($), ByteLevel, non-ASCII special
               tokens (<｜begin▁of▁sentence｜>), Sequence[ByteLevel,
               TemplateProcessing] post-processor.
  misc         NFKC + Lowercase + Replace(regex) + Strip normalizers,
               WhitespaceSplit + Punctuation + Digits + Split(String,
               merged_with_previous), BPE with continuing_subword_prefix,
               end_of_word_suffix and [UNK], BPEDecoder, BertProcessing.
  misc2        BertNormalizer, BertPreTokenizer + Digits, BPE with "##"
               prefix, WordPiece decoder, RobertaProcessing.
  gpt2         the real GPT-2 tokenizer.json (given with --gpt2); only
               expected.json is written for it.

For each tokenizer it writes <out>/<name>/tokenizer.json (not for gpt2),
<out>/<name>/tokenizer_config.json and <out>/<name>/expected.json.

Run on a machine that has `tokenizers` installed:
    python3 scripts/gen_tokenizer_testdata.py --out /tmp/td --gpt2 .dev/gpt2/tokenizer.json
"""

import argparse
import json
import os
import random
import sys
import traceback

import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# Pre-tokenizer regexes written from their documented behaviour: contractions
# (case-insensitive), a letter run optionally preceded by one non-letter,
# non-digit, non-newline char, digits (one at a time for Qwen2, groups of up to
# three for Llama-3), punctuation runs with trailing newlines, newline runs,
# whitespace not followed by non-space, and any remaining whitespace.
QWEN2_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_RE = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Training text: public-domain English (the Gettysburg Address, 1863, and the
# Preamble of the US Constitution, 1787) plus lines written for this script.
CORPUS = """Four score and seven years ago our fathers brought forth on this continent, a new nation, conceived in Liberty, and dedicated to the proposition that all men are created equal.
Now we are engaged in a great civil war, testing whether that nation, or any nation so conceived and so dedicated, can long endure. We are met on a great battle-field of that war. We have come to dedicate a portion of that field, as a final resting place for those who here gave their lives that that nation might live. It is altogether fitting and proper that we should do this.
But, in a larger sense, we can not dedicate -- we can not consecrate -- we can not hallow -- this ground. The brave men, living and dead, who struggled here, have consecrated it, far above our poor power to add or detract. The world will little note, nor long remember what we say here, but it can never forget what they did here. It is for us the living, rather, to be dedicated here to the unfinished work which they who fought here have thus far so nobly advanced. It is rather for us to be here dedicated to the great task remaining before us -- that from these honored dead we take increased devotion to that cause for which they gave the last full measure of devotion -- that we here highly resolve that these dead shall not have died in vain -- that this nation, under God, shall have a new birth of freedom -- and that government of the people, by the people, for the people, shall not perish from the earth.
We the People of the United States, in Order to form a more perfect Union, establish Justice, insure domestic Tranquility, provide for the common defence, promote the general Welfare, and secure the Blessings of Liberty to ourselves and our Posterity, do ordain and establish this Constitution for the United States of America.
The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the Quick Brown Fox?
I'm sure you're right, but we'll see; they've said it's fine and I'd agree. Don't worry, it'll work. You'RE IT.
In 2024 the model served 1234567 requests at 3.14 ms each, 99.9% of them under 250 ms; call 555-0100 or write to user@example.com.
def forward(self, x):
    h = self.embed(x)  # [tokens, hidden]
    for layer in self.layers:
        h = layer(h)
    return self.norm(h)
if (a < b && b >= c) { return a->next; } else { x += 0x1F; }
{"role": "user", "content": "What is the weather in Paris?", "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
<html><body><p class="note">Hello &amp; welcome</p></body></html>
The café served crème brûlée; the naïve coöperative's résumé was déjà vu. Straße, Ærø, Øresund, Ångström.
Ελληνικά κείμενα και Русский текст и עברית ועוד العربية نص हिन्दी पाठ.
你好，世界！这是一个用于测试分词器的中文句子。我们今天学习机器学习和自然语言处理。
日本語のテキストです。カタカナとひらがなと漢字を混ぜて書きます。東京は大きい都市です。
한국어 문장도 조금 포함합니다. 안녕하세요, 반갑습니다.
Emoji time: 👍 😀 🎉 🚀 ❤️ 🤖 and flags 🇫🇷 🇯🇵 with people 👩‍💻 👨‍👩‍👧.
Tabs\tand\tnewlines\nmix with   multiple   spaces    here.
Numbers: 0 1 22 333 4444 55555 666666 7777777 and 3.14159 2.71828 1,000,000.
"""


def corpus_lines():
    lines = CORPUS.replace("\\t", "\t").replace("\\n", "\n").split("\n")
    lines = [l + "\n" for l in lines if l]
    # Repeat so that frequent pairs are clearly frequent.
    return lines * 3


HARD_STRINGS = [
    "",
    " ",
    "  ",
    "   leading spaces",
    "trailing spaces   ",
    "\t\ttabs\tand spaces \t ",
    "line1\r\nline2\r\n\r\nline4\r",
    "\n\n\n",
    " \n \n x",
    "a\n\n b  \n\t c",
    "1234567",
    "3.14159 and 1,000,000 and 2024-01-01T12:30:00Z",
    "007 x1y22z333 12345678901234567890",
    "Hello, world! How's it going? I'M FINE, they'll've done it; we'd go.",
    "don't DON'T You're you'RE it's IT'S",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな",
    "한국어 텍스트 안녕하세요",
    "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🤖🤖🤖",
    "\x00\x01\x02\x1f\x7f text\x0b\x0c end",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|endoftext|>x<|endoftext|>",
    "x<|im_end|>y <|im_end|> z<|im_end",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>",
    "<s>hello</s> <s> world </s><unk>",
    "literal byte tokens <0x41><0x0A> and ▁ and ▁▁x",
    "a" * 300,
    "supercalifragilistic" * 15,
    "Café naïve résumé coöperate — Ελληνικά Русский עברית العربية हिन्दी",
    "e\u0301 cafe\u0301 \u212b \u2126 ﬁ",
    "def f(x):\n    return x**2  # comment\n\tpass\n",
    "!!!??? ... ---- ==== ***",
    "<html><body>&amp;</body></html>",
    "   \u00a0\u2003 nbsp and em-space \u3000 ideographic\u2028sep",
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}',
    "text   <mask>   more<mask>x <mask>",
    "[TOOL]   args [TOOL]\n\nnext",
    "word words sword word. (word) xword word",
    "Straße and STRASSE and straße",
    "café and cafe\u0301 and CAFÉ",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "<|reserved_0|> reserved <|reserved_0|>",
    "hello <|endoftext|> world",
    "Ġ Ċ ĉ ÿ",
    "'s 's 'S 'll 'LL 'd '",
    "x" + " " * 7 + "y" + "\n" * 3 + " z",
    "１２３ ＡＢＣ ①②③ ⅣⅤ",
    " abracadabra abracadabra supercalifragilistic",
    "a        b         c" + " " * 8 + "d",
    "The nation's people",
    "trailing blanks  \nand tabs\t\t\nend  ",
    "<｜begin▁of▁sentence｜>Hi<｜end▁of▁sentence｜>",
    "Hello-world well-known [MASK] hello world [CLS]",
    "ＡＢＣ Ⅻ ﬁ İstanbul ΣΑΣ",
]

POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCXYZ0123456789")
    + [" ", " ", " ", "  ", "\t", "\n", "\r\n", "'s", "'T", ".", ",", "!", "?", "-", "_", "(", ")", "<", ">", "|"]
    + ["é", "e\u0301", "ß", "你", "好", "の", "한", "Ж", "ع", "👍", "🏽", "\u200d", "❤️", "🇫🇷", "\u00a0", "\u3000"]
    + ["<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<mask>", "[TOOL]", "word", "<think>", "<0x41>", "▁", "Ġ", "\x00", "\x1b"]
    + ["the", "The", " the", "nation", "123", "4567"]
)


def random_strings(n, seed, max_len=30):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randint(0, max_len)
        out.append("".join(rng.choice(POOL) for _ in range(k)))
    return out


def added_token(content, special, **kw):
    return AddedToken(content, special=special, **kw)


def reload(tok):
    return Tokenizer.from_str(tok.to_str())


def edit_json(tok, fn):
    j = json.loads(tok.to_str())
    fn(j)
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def train(tok, vocab_size, **kw):
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False, **kw)
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    return tok


def build_qwen2():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    # A reserved special token placed in the model vocab at a non-contiguous id:
    # HF keeps a model-vocab id for an added token that the model already knows.
    def put_reserved(j):
        j["model"]["vocab"]["<|reserved_0|>"] = 1499
    tok = edit_json(tok, put_reserved)
    tok.add_special_tokens([
        added_token("<|endoftext|>", True, normalized=False),
        added_token("<|im_start|>", True, normalized=False),
        added_token("<|im_end|>", True, normalized=False),
        added_token("<|reserved_0|>", True, normalized=False),
    ])
    tok.add_tokens([
        added_token("<think>", False, normalized=False),
        added_token("</think>", False, normalized=False),
        # Non-special, normalized: matched against NFC-normalized text, so
        # "cafe\u0301" matches too.
        added_token("café", False, normalized=True),
    ])
    cfg = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "chat_template": "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        "model_max_length": 32768,
    }
    return tok, cfg


def build_llama3():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_RE), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    # ignore_merges plus whole words that no merge sequence reaches: with
    # ignore_merges they come out as one token.
    def extra(j):
        m = j["model"]
        m["ignore_merges"] = True
        n = max(m["vocab"].values()) + 1
        for w in ["Ġabracadabra", "ĠĠĠĠĠĠĠĠ", "supercalifragilistic", "Ġnation's"]:
            if w not in m["vocab"]:
                m["vocab"][w] = n
                n += 1
    tok = edit_json(tok, extra)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens([added_token(s, True, normalized=False) for s in specials])
    tok.add_special_tokens([added_token("<mask>", True, lstrip=True, normalized=False)])
    tok.add_tokens([
        added_token("[TOOL]", False, rstrip=True, normalized=False),
        added_token("word", False, single_word=True, normalized=False),
        added_token("Straße", False, normalized=True),
    ])
    bot = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
        special_tokens=[("<|begin_of_text|>", bot)],
    )
    cfg = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": {"content": "<|eot_id|>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "__type": "AddedToken"},
        "pad_token": None,
        "chat_template": [
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}"},
            {"name": "tool_use", "template": "{{ bos_token }}TOOLS{% for m in messages %}{{ m.content }}{% endfor %}"},
        ],
        "model_max_length": 131072,
    }
    return tok, cfg


def byte_fallback_json(tok, vocab_extra_specials):
    """Rebuild a trained BPE so the vocab starts <unk> <s> </s> <0x00>..<0xFF>
    like Llama-2, keeping the trained merges."""
    j = json.loads(tok.to_str())
    m = j["model"]
    old = sorted(m["vocab"].items(), key=lambda kv: kv[1])
    head = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    vocab = {t: i for i, t in enumerate(head)}
    for t, _ in old:
        if t not in vocab:
            vocab[t] = len(vocab)
    m["vocab"] = vocab
    m["unk_token"] = "<unk>"
    m["byte_fallback"] = True
    m["fuse_unk"] = True
    j["added_tokens"] = []
    return Tokenizer.from_str(json.dumps(j, ensure_ascii=False))


def build_bytefallback():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    train(tok, 700, limit_alphabet=120)
    tok = byte_fallback_json(tok, [])
    tok.pre_tokenizer = None
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([added_token(s, True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    cfg = {
        "bos_token": {"content": "<s>", "lstrip": False, "normalized": False, "rstrip": False, "single_word": False, "__type": "AddedToken"},
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": None,
        "add_bos_token": True,
        "add_eos_token": False,
        "chat_template": "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}",
    }
    return tok, cfg


def build_metaspace():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    train(tok, 700, limit_alphabet=120)
    tok = byte_fallback_json(tok, [])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first", split=True)])
    tok.add_special_tokens([added_token(s, True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    tok.add_special_tokens([added_token("[INST]", True, normalized=False), added_token("[/INST]", True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A </s> $B:1", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
    )
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True}
    return tok, cfg


DEEPSEEK_LETTERS = (
    r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_deepseek3():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[ \t]+$"), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(r"[一-龥぀-ゟ゠-ヿ]+"), behavior="isolated", invert=False),
        pre_tokenizers.Split(Regex(DEEPSEEK_LETTERS), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    train(tok, 1100, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.add_special_tokens([added_token(s, True, normalized=False) for s in
                            ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]])
    tok.add_tokens([added_token("<think>", False, normalized=False), added_token("</think>", False, normalized=False)])
    bos = tok.token_to_id("<｜begin▁of▁sentence｜>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<｜begin▁of▁sentence｜> $A", pair="<｜begin▁of▁sentence｜> $A $B:1",
                                      special_tokens=[("<｜begin▁of▁sentence｜>", bos)]),
    ])
    cfg = {"bos_token": {"content": "<｜begin▁of▁sentence｜>", "__type": "AddedToken"},
           "eos_token": {"content": "<｜end▁of▁sentence｜>", "__type": "AddedToken"},
           "add_bos_token": True, "add_eos_token": False, "model_max_length": 131072}
    return tok, cfg


def build_misc():
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                           normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation("contiguous"),
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Split("-", "merged_with_previous"),
    ])
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    train(tok, 600, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[MASK]"], limit_alphabet=80,
          continuing_subword_prefix="##", end_of_word_suffix="</w>")
    tok.add_tokens([added_token("hello world", False, normalized=True)])
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", tok.token_to_id("[CLS]")))
    return tok, {"unk_token": "[UNK]", "cls_token": "[CLS]"}


def build_misc2():
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.BertPreTokenizer(), pre_tokenizers.Digits(individual_digits=False)])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    train(tok, 600, special_tokens=["[UNK]", "<s>", "</s>"], limit_alphabet=100, continuing_subword_prefix="##")
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    return tok, None


def record(name, tok, strings, seed):
    rng = random.Random(seed)
    vocab_full = tok.get_vocab(with_added_tokens=True)
    max_id = max(vocab_full.values())
    cases = []
    for s in strings:
        e0 = tok.encode(s, add_special_tokens=False)
        e1 = tok.encode(s, add_special_tokens=True)
        case = {
            "text": s,
            "ids": e0.ids,
            "tokens": e0.tokens,
            "ids_special": e1.ids,
            "decode": tok.decode(e0.ids, skip_special_tokens=False),
            "decode_skip": tok.decode(e0.ids, skip_special_tokens=True),
            "decode_special": tok.decode(e1.ids, skip_special_tokens=False),
            "decode_special_skip": tok.decode(e1.ids, skip_special_tokens=True),
        }
        try:
            if tok.normalizer is not None:
                case["normalized"] = tok.normalizer.normalize_str(s)
            if tok.pre_tokenizer is not None:
                case["pretokenized"] = [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(s)]
        except Exception as ex:  # debugging aid only
            case["debug_error"] = repr(ex)
        cases.append(case)
    # Decoding arbitrary id sequences (broken UTF-8, stray byte tokens,
    # specials in the middle).
    decode_cases = []
    for _ in range(40):
        n = rng.randint(1, 16)
        ids = [rng.randint(0, max_id) for _ in range(n)]
        ids = [i for i in ids if tok.id_to_token(i) is not None]
        decode_cases.append({
            "ids": ids,
            "decode": tok.decode(ids, skip_special_tokens=False),
            "decode_skip": tok.decode(ids, skip_special_tokens=True),
        })
    # HF's own streaming decoder, for information.
    stream = []
    try:
        from tokenizers.decoders import DecodeStream
        for c in cases[:60]:
            ds = DecodeStream(skip_special_tokens=False)
            chunks = []
            for i in c["ids_special"]:
                out = ds.step(tok, i)
                chunks.append(out)
            stream.append({"ids": c["ids_special"], "chunks": chunks})
    except Exception as ex:
        stream = [{"error": repr(ex)}]
    added = []
    for i, t in sorted(tok.get_added_tokens_decoder().items()):
        added.append({"id": i, "content": t.content, "special": t.special, "lstrip": t.lstrip,
                      "rstrip": t.rstrip, "single_word": t.single_word, "normalized": t.normalized})
    probe_tokens = [t for t, _ in sorted(vocab_full.items(), key=lambda kv: kv[1])][:: max(1, len(vocab_full) // 50)]
    probe_tokens += ["<|im_end|>", "<s>", "not-a-token-xyz", "Ġthe", "the", "<0x41>", "Ġabracadabra", "[UNK]"]
    return {
        "name": name,
        "tokenizers_version": tokenizers.__version__,
        "vocab_size": tok.get_vocab_size(with_added_tokens=False),
        "vocab_size_with_added": tok.get_vocab_size(with_added_tokens=True),
        "max_id": max_id,
        "added_tokens": added,
        "token_to_id": {t: tok.token_to_id(t) for t in probe_tokens},
        "cases": cases,
        "decode_cases": decode_cases,
        "stream": stream,
    }


def write(out, name, tok, cfg, strings, seed, save_tokenizer=True):
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    if save_tokenizer:
        tok.save(os.path.join(d, "tokenizer.json"), pretty=True)
        # Reload from disk so the expectations come from the file we ship.
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    if cfg is not None:
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, ensure_ascii=False, indent=2)
    exp = record(name, tok, strings, seed)
    with open(os.path.join(d, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(exp, f, ensure_ascii=False, indent=1)
    print(f"{name}: vocab {exp['vocab_size']} (+added {exp['vocab_size_with_added']}), {len(exp['cases'])} cases,"
          f" {os.path.getsize(os.path.join(d, 'expected.json'))} bytes expected.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpt2", default="")
    args = ap.parse_args()
    print("tokenizers", tokenizers.__version__, "python", sys.version.split()[0])
    builders = [("qwen2", build_qwen2), ("llama3", build_llama3), ("bytefallback", build_bytefallback),
                ("metaspace", build_metaspace), ("deepseek3", build_deepseek3), ("misc", build_misc), ("misc2", build_misc2)]
    failed = 0
    for i, (name, fn) in enumerate(builders):
        try:
            tok, cfg = fn()
            write(args.out, name, tok, cfg, HARD_STRINGS + random_strings(60, 1000 + i) + random_strings(6, 1100 + i, 300), 2000 + i)
        except Exception:
            failed += 1
            print(f"FAILED {name}:")
            traceback.print_exc()
    if args.gpt2:
        try:
            tok = Tokenizer.from_file(args.gpt2)
            write(args.out, "gpt2", tok, None, HARD_STRINGS + random_strings(60, 1999) + random_strings(6, 1998, 300), 2999, save_tokenizer=False)
        except Exception:
            failed += 1
            print("FAILED gpt2:")
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
