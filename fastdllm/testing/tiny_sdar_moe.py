"""Random-weight checkpoints of SDAR-30B-A3B-Chat (`sdar_moe`, docs/specs/sdar-moe.md) in its published
layout. Written tensor by tensor with safetensors (no fastdllm model class).

Every non-weight file is the published one: config.json is JetLM/SDAR-30B-A3B-Chat's
(fastdllm/checkpoints/published/SDAR-30B-A3B-Chat/, every key in the published order) with only the
size keys shrunk; generation_config.json, tokenizer_config.json, added_tokens.json,
special_tokens_map.json and chat_template.jinja are byte copies of the published files (copied from
the checkpoint folder without weights; the mask token `<|MASK|>` = 151669 is named by the tokenizer
only, the config has no mask_token_id and no block_size); vocab.json and merges.txt are the Qwen2
BPE files that are byte-identical in Dream-v0-Instruct-7B and SDAR-30B-A3B-Chat (hence the
published row count 151936 of the embedding and the head: files of about 40 MB).

Tensors: Qwen3-MoE names (`model.layers.{i}.self_attn.{q,k,v,o}_proj`, `q_norm`, `k_norm`,
`mlp.gate.weight`, `mlp.experts.{j}.{gate,up,down}_proj.weight`, or a dense `mlp.{gate,up,down}_proj`
on the layers `mlp_only_layers` / `decoder_sparse_step` make dense), untied `lm_head`, sharded with
`model.safetensors.index.json` (embedding in the first shard, layers in order, norm and head last;
one layer's experts never split). Weights: normal(0, init_std) for matrices (the router too, so that
its choices vary from token to token), 1 + N(0, 0.1^2) for every RMSNorm weight, lm_head times
`logit_scale`, so that greedy confidences over the 152k vocabulary vary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from .files import DTYPE_NAMES, layer_shards, normal_makers, write_json, write_safetensors
from .tiny_moe import PUBLISHED, PUBLISHED_DIRS, swiglu

PUBLISHED_DIR = PUBLISHED / PUBLISHED_DIRS["sdar_moe"]
BPE_DIR = PUBLISHED / "Dream-v0-Instruct-7B"        # vocab.json, merges.txt: the same bytes as SDAR-30B-A3B's
COPIED = ("generation_config.json", "tokenizer_config.json", "added_tokens.json", "special_tokens_map.json",
          "chat_template.jinja")
MASK_ID, STOP_IDS = 151669, (151643, 151645)      # <|MASK|>; <|endoftext|> (config, generation) and <|im_end|>

# The published sizes are replaced by these (a config key given to the writer overrides either).
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8,
        "num_experts_per_tok": 3}
EXTRA_KEYS = {"block_size", "mask_token_id"}      # keys a caller may add that the published config lacks


def published_config() -> dict:
    return json.loads((PUBLISHED_DIR / "config.json").read_text())


def write_sdar_moe(out: Path, *, seed=0, init_std=0.3, logit_scale=4.0, sharded=True, dtype=torch.bfloat16,
                   **config) -> Path:
    """SDAR-30B-A3B-Chat's layout with the TINY sizes; `config` overrides config.json keys (e.g.
    norm_topk_prob=False, decoder_sparse_step=2, mlp_only_layers=[0], num_hidden_layers=3)."""
    c = published_config()
    unknown = set(config) - set(c) - EXTRA_KEYS
    if unknown:
        raise ValueError(f"not an sdar_moe config key: {sorted(unknown)}")
    c.update(TINY)
    c.update(config)
    if "max_window_layers" not in config:
        c["max_window_layers"] = c["num_hidden_layers"]      # published: = num_hidden_layers (48)
    c["torch_dtype"] = DTYPE_NAMES[dtype]

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", c)                            # the published key order (dicts keep it)
    for name in COPIED:
        shutil.copyfile(PUBLISHED_DIR / name, out / name)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(BPE_DIR / name, out / name)
    w = weights(c, torch.Generator().manual_seed(seed), init_std, logit_scale)
    write_safetensors(out, {k: v.to(dtype) for k, v in w.items()},
                      layer_shards(c["num_hidden_layers"], 3) if sharded else None)
    return out


def is_sparse(c: dict, layer: int) -> bool:
    """Qwen3-MoE's rule, on the raw config.json."""
    return (layer not in (c.get("mlp_only_layers") or []) and c["num_experts"] > 0
            and (layer + 1) % c["decoder_sparse_step"] == 0)


def weights(c: dict, g: torch.Generator, std: float, logit_scale: float) -> dict:
    mat, norm = normal_makers(g, std)
    d, H, KV, hd, E = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["num_experts"]
    w = {"model.embed_tokens.weight": mat(c["vocab_size"], d)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        for name, rows, cols in (("q", H * hd, d), ("k", KV * hd, d), ("v", KV * hd, d), ("o", d, H * hd)):
            w[p + f"self_attn.{name}_proj.weight"] = mat(rows, cols)      # (out, in); no bias
        w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"] = norm(hd), norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        if is_sparse(c, i):
            w[p + "mlp.gate.weight"] = mat(E, d)                            # the router (E, d), no bias
            for j in range(E):
                w.update(swiglu(p + f"mlp.experts.{j}.", mat, d, c["moe_intermediate_size"]))
        else:
            w.update(swiglu(p + "mlp.", mat, d, c["intermediate_size"]))
    w["model.norm.weight"] = norm(d)
    w["lm_head.weight"] = mat(c["vocab_size"], d) * logit_scale
    return w
