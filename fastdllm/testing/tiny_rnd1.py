"""Random-weight checkpoints of RND1-Base-0910 (`rnd1`, docs/specs/rnd1.md) in its published layout.
Written tensor by tensor with safetensors (no fastdllm model class).

config.json holds the keys RND1's configuration class saves (configuration_rnd.py: its Qwen3-30B-A3B
constants, then mask_token_id, num_diffusion_steps, moe_backend; `architectures ["RND1"]`, the name
llama.cpp's converter matches) with only the size keys shrunk; the published file itself was not
read. The tokenizer is Qwen3's: vocab.json and merges.txt are the Qwen2 byte-level BPE files of
Dream-v0-Instruct-7B (151643 ids, identical in Qwen3), and the added tokens 151643-151668
(`<|endoftext|>` ... `</think>`) are SDAR-30B-A3B-Chat's published ones without its `<|MASK|>`:
Qwen3's own set. So id 151669, RND1's mask, is named by no token (config.json's mask_token_id says
it); the base model ships no chat template (fastdllm chats with a plain transcript).

Tensors: Qwen3-MoE names, every layer sparse (tiny_sdar_moe.weights), untied lm_head."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..checkpoints.gguf_arch import rnd1_published_config as rnd1_config
from .files import layer_shards, write_config, write_json, write_safetensors
from .tiny_sdar_moe import BPE_DIR, PUBLISHED_DIR, weights

MASK_ID, EOS_ID, PAD_ID = 151669, 151645, 151643      # config.json (rnd1_config): mask, <|im_end|>, <|endoftext|>
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 96, "moe_intermediate_size": 32, "num_experts": 8,
        "num_experts_per_tok": 3, "max_window_layers": 2}
SIZE_KEYS = set(TINY)


def write_rnd1(out: Path, *, seed=0, init_std=0.3, logit_scale=4.0, sharded=True, dtype=torch.bfloat16,
               drop=(), **config) -> Path:
    """RND1's layout with the TINY sizes; `config` overrides config.json keys, `drop` removes some."""
    out, c = write_config(out, rnd1_config(), "rnd1", TINY, config, drop, dtype)
    _write_qwen3_tokenizer(out)
    w = weights(c, torch.Generator().manual_seed(seed), init_std, logit_scale)
    write_safetensors(out, {k: v.to(dtype) for k, v in w.items()},
                      layer_shards(c["num_hidden_layers"], 3) if sharded else None)
    return out


def _write_qwen3_tokenizer(out: Path) -> None:
    """Qwen3's tokenizer files: SDAR-30B-A3B-Chat's published ones without the `<|MASK|>` SDAR adds."""
    for name in ("vocab.json", "merges.txt"):
        (out / name).write_bytes((BPE_DIR / name).read_bytes())
    config = json.loads((PUBLISHED_DIR / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"].pop(str(MASK_ID))
    config["additional_special_tokens"].remove("<|MASK|>")
    for key in ("mask_token", "chat_template"):
        config.pop(key, None)
    write_json(out / "tokenizer_config.json", config)
    added = json.loads((PUBLISHED_DIR / "added_tokens.json").read_text())
    write_json(out / "added_tokens.json", {k: v for k, v in added.items() if v != MASK_ID})
    special = json.loads((PUBLISHED_DIR / "special_tokens_map.json").read_text())
    special["additional_special_tokens"].remove("<|MASK|>")
    special.pop("mask_token", None)
    write_json(out / "special_tokens_map.json", special)
