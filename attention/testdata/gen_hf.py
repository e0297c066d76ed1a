"""Writes hf_golden.json: rotary embeddings and eager attention outputs
computed by Hugging Face transformers (5.x) on CPU in float32, for the Go
tests of package attention. Run with a python3 that has torch and
transformers:  python3 gen_hf.py OUT.json
"""
import json
import math
import sys

import torch
import transformers
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds
from transformers.models.gpt_oss import modeling_gpt_oss as goss
from transformers.models.llama import modeling_llama as llama
from transformers.models.mixtral import modeling_mixtral as mixtral
from transformers.models.qwen3_moe import modeling_qwen3_moe as qwen3

torch.manual_seed(1234)
OUT = {"transformers": transformers.__version__, "torch": torch.__version__, "rope": [], "attn": [], "log": []}


def flat(t):
    return [float(v) for v in t.detach().to(torch.float32).reshape(-1).tolist()]


def rope_case(name, style, cfg, rot_cls, apply_fn, heads, head_dim, positions, layout="neox"):
    try:
        rot = rot_cls(config=cfg)
        P = len(positions)
        pos = torch.tensor([positions], dtype=torch.long)
        x = torch.randn(P, heads, head_dim, dtype=torch.float32)
        q = x.clone().view(1, P, heads, head_dim).transpose(1, 2)
        cos, sin = rot(q, pos)
        qo, _ = apply_fn(q, q.clone(), cos, sin)
        out = qo.transpose(1, 2).reshape(P, heads * head_dim)
        rp = getattr(cfg, "rope_parameters", None)
        OUT["rope"].append({
            "name": name, "style": style, "layout": layout,
            "rope_parameters": {k: v for k, v in (rp or {}).items()} if isinstance(rp, dict) else repr(rp),
            "inv_freq": flat(rot.inv_freq), "attention_scaling": float(rot.attention_scaling),
            "heads": heads, "head_dim": head_dim, "pos": positions,
            "x": flat(x), "out": flat(out),
        })
        OUT["log"].append(f"rope {name}: ok, rope_parameters={rp}")
    except Exception as e:  # keep going: one run should report every case
        OUT["log"].append(f"rope {name}: FAILED {type(e).__name__}: {e}")


POS = [0, 1, 2, 17, 1000, 4095, 40000, 131071]

rope_case("mixtral default theta 1e6", "neox",
          transformers.MixtralConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                     rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
          mixtral.MixtralRotaryEmbedding, mixtral.apply_rotary_pos_emb, 2, 64, POS)
rope_case("qwen3-moe default theta 1e6 head 128", "neox",
          transformers.Qwen3MoeConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
          qwen3.Qwen3MoeRotaryEmbedding, qwen3.apply_rotary_pos_emb, 2, 128, POS)
rope_case("qwen3-moe yarn factor 4", "neox",
          transformers.Qwen3MoeConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                                      max_position_embeddings=131072,
                                      rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                       "original_max_position_embeddings": 32768}),
          qwen3.Qwen3MoeRotaryEmbedding, qwen3.apply_rotary_pos_emb, 2, 128, POS)
rope_case("llama linear factor 4", "neox",
          transformers.LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                                   rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
          llama.LlamaRotaryEmbedding, llama.apply_rotary_pos_emb, 2, 64, POS)
rope_case("llama3.1", "neox",
          transformers.LlamaConfig(hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=131072,
                                   rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192}),
          llama.LlamaRotaryEmbedding, llama.apply_rotary_pos_emb, 2, 128, POS)
rope_case("gpt-oss yarn", "neox",
          transformers.GptOssConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4,
                                    num_key_value_heads=1, head_dim=64,
                                    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                                                     "original_max_position_embeddings": 4096}),
          goss.GptOssRotaryEmbedding, goss.apply_rotary_pos_emb, 2, 64, POS)

ds_cfg = transformers.DeepseekV3Config(
    num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
    q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=64, qk_nope_head_dim=16, v_head_dim=12,
    max_position_embeddings=163840, rope_interleave=True,
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096})
rope_case("deepseek-v3 yarn interleaved", "interleaved", ds_cfg, ds.DeepseekV3RotaryEmbedding,
          ds.apply_rotary_pos_emb_interleave, 2, 64, POS, layout="halves")


def hf_allowed(Tq, past, window):
    n = past + Tq
    q_idx = torch.arange(past, n)[:, None]
    kv_idx = torch.arange(n)[None, :]
    try:
        from transformers import masking_utils as mu
        fn = mu.sliding_window_causal_mask_function(window) if window else mu.causal_mask_function
        allowed = fn(torch.tensor(0), torch.tensor(0), q_idx, kv_idx)
        return allowed.expand(Tq, n), "masking_utils"
    except Exception as e:
        allowed = kv_idx <= q_idx
        if window:
            allowed = allowed & (kv_idx > q_idx - window)
        return allowed, f"manual ({type(e).__name__}: {e})"


class Stub(torch.nn.Module):
    def __init__(self, groups, sinks=None):
        super().__init__()
        self.num_key_value_groups = groups
        if sinks is not None:
            self.sinks = torch.nn.Parameter(sinks)


def attn_case(name, eager, H, KV, D, Dv, Tq, past, window, scale, sinks=None):
    try:
        n = past + Tq
        q = torch.randn(Tq, H, D)
        k = torch.randn(n, KV, D)
        v = torch.randn(n, KV, Dv)
        allowed, src = hf_allowed(Tq, past, window)
        mask = torch.zeros(Tq, n).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
        mod = Stub(H // KV, sinks).eval()
        out, _ = eager(mod, q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                       mask, scaling=scale, dropout=0.0)
        OUT["attn"].append({
            "name": name, "heads": H, "kv_heads": KV, "head_dim": D, "v_head_dim": Dv, "tq": Tq, "past": past,
            "window": window, "scale": float(torch.tensor(scale, dtype=torch.float32)),
            "sinks": flat(sinks) if sinks is not None else None,
            "q": flat(q), "k": flat(k), "v": flat(v), "out": flat(out.reshape(Tq, H * Dv)),
        })
        OUT["log"].append(f"attn {name}: ok, mask from {src}")
    except Exception as e:
        OUT["log"].append(f"attn {name}: FAILED {type(e).__name__}: {e}")


attn_case("mixtral gqa4 chunked prefill", mixtral.eager_attention_forward, 8, 2, 32, 32, 5, 7, 0, 32 ** -0.5)
attn_case("mixtral gqa4 window 4", mixtral.eager_attention_forward, 8, 2, 32, 32, 6, 5, 4, 32 ** -0.5)
attn_case("gpt-oss sinks window 4 gqa8", goss.eager_attention_forward, 8, 1, 16, 16, 4, 9, 4, 16 ** -0.5,
          sinks=torch.randn(8) * 2)
attn_case("gpt-oss sinks full decode", goss.eager_attention_forward, 4, 2, 16, 16, 1, 12, 0, 16 ** -0.5,
          sinks=torch.randn(4) * 2 + 1)
try:
    ds_attn = ds.DeepseekV3Attention(ds_cfg, layer_idx=0)
    OUT["deepseek_scaling"] = float(ds_attn.scaling)
    OUT["deepseek_qk_head_dim"] = int(ds_cfg.qk_nope_head_dim + ds_cfg.qk_rope_head_dim)
    attn_case("deepseek mla shapes (Dv != D) with yarn mscale", ds.eager_attention_forward, 4, 4, 80, 12, 3, 4, 0,
              ds_attn.scaling)
except Exception as e:
    OUT["log"].append(f"deepseek attention: FAILED {type(e).__name__}: {e}")

with open(sys.argv[1], "w") as f:
    json.dump(OUT, f)
print("\n".join(OUT["log"]))
print("transformers", transformers.__version__, "torch", torch.__version__)
