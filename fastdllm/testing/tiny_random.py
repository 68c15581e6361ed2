"""Random-weight checkpoints in the exact published layouts, at any size: for tests, the speed
benchmark and trying the tool without a download. Config keys, tensor names, sharding with
`model.safetensors.index.json`, bf16 on disk and tokenizer files are those of the real repositories;
only the sizes (and the weights) differ."""

from __future__ import annotations

import json
import shutil
import sysconfig
from pathlib import Path

import torch

from ..checkpoints.published import FOLDER
from ..models import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM
from ..training import tokenizer as bpe

# The real non-weight files of the published checkpoints (configs, tokenizers), shipped with the
# package (fastdllm/checkpoints/published/) so that tiny checkpoints can be written from an installed
# fastdllm too.
FIXTURES = FOLDER


def write_llada(out: Path, *, d_model=64, n_layers=2, n_heads=4, n_kv_heads=None, mlp_hidden_size=128,
                vocab_size=None, bpe_vocab=400, max_sequence_length=4096, seed=0, logit_scale=1.0,
                init_std=None, shard_bytes="200KB", dtype=torch.bfloat16, fixtures: Path = FIXTURES) -> Path:
    """LLaDA-8B-Instruct's layout (config keys of the published config.json, tensor names, Llama-3
    chat template) with a small byte-level BPE tokenizer trained on a few stdlib files."""
    out = Path(out)
    texts = [p.read_text(encoding="utf-8") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("[a-c]*.py"))[:8]]
    tok = bpe.train_bpe(texts, bpe_vocab)
    ids = bpe.save_llada_tokenizer(tok, out, chat_template=bpe.LLADA_CHAT_TEMPLATE)
    vocab = vocab_size or tok.get_vocab_size()
    published = json.loads((Path(fixtures) / "LLaDA-8B-Instruct" / "config.json").read_text())
    published.update(d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads or n_heads,
                     mlp_hidden_size=mlp_hidden_size, vocab_size=vocab, embedding_size=vocab,
                     max_sequence_length=max_sequence_length, mask_token_id=ids[bpe.MASK],
                     eos_token_id=ids[bpe.EOS], pad_token_id=ids[bpe.EOS])
    config = LLaDAConfig.from_dict(published)
    model = _random(LLaDAModelLM, config, seed, logit_scale, init_std)
    _save(model, out, shard_bytes, dtype)
    _keep_published_keys(out, published)
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": ids[bpe.BOS], "eos_token_id": ids[bpe.EOS]}) + "\n")
    return out


def write_dream(out: Path, *, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64,
                seed=0, logit_scale=1.0, init_std=None, shard_bytes="2MB", dtype=torch.bfloat16,
                fixtures: Path = FIXTURES) -> Path:
    """Dream-v0-Instruct-7B's layout with its real tokenizer files (vocab 152064)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(fixtures) / "Dream-v0-Instruct-7B"
    for name in ("vocab.json", "merges.txt", "added_tokens.json", "tokenizer_config.json",
                 "special_tokens_map.json", "generation_config.json"):
        shutil.copyfile(src / name, out / name)
    published = json.loads((src / "config.json").read_text())
    published.update(hidden_size=hidden_size, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                     num_key_value_heads=n_kv_heads, intermediate_size=intermediate_size, max_window_layers=n_layers)
    config = DreamConfig.from_dict(published)
    model = _random(DreamModel, config, seed, logit_scale, init_std)
    _save(model, out, shard_bytes, dtype)
    _keep_published_keys(out, published)
    return out


def _random(cls, config, seed: int, logit_scale: float, init_std: float | None):
    """Random weights give near-uniform predictions at the usual init; a larger init_std (sharper
    attention, position-dependent states) and logit_scale give varied, peaked confidences."""
    torch.manual_seed(seed)
    model = cls(config)
    with torch.no_grad():
        if init_std is not None:
            for p in model.parameters():
                if p.ndim == 2:
                    p.normal_(0.0, init_std)
        (model.output_head or model.embed).weight.mul_(logit_scale)
    return model


def _save(model, out: Path, shard_bytes: str, dtype: torch.dtype) -> None:
    model.to(dtype).save_pretrained(out, max_shard_size=shard_bytes)


def _keep_published_keys(out: Path, published: dict) -> None:
    """save_pretrained rewrites config.json; put back the published one (auto_map included)."""
    saved = json.loads((out / "config.json").read_text())
    published = dict(published, torch_dtype=saved.get("dtype", saved.get("torch_dtype", "bfloat16")))
    (out / "config.json").write_text(json.dumps(published, indent=2) + "\n")
