"""The published shapes by name and random-weight models of them (built on the device, or written
to disk in LLaDA's layout): what the benchmarks time when no real checkpoint is at hand. Imported by
harness.py, whose names the benchmarks use (harness.SHAPES, harness.build)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fastdllm.checkpoints import loading
from fastdllm.models import FAMILIES
from fastdllm.testing.tiny_blockdiff import write_fast_dllm_v2, write_sdar
from fastdllm.testing.tiny_random import FIXTURES, write_dream, write_llada

@dataclass(frozen=True)
class Shape:
    """A model shape: `config` overrides the family's config (its published one, read from the tiny
    checkpoint of `tiny`'s arguments that lends the tokenizer and special tokens)."""
    text: str
    family: str                       # a key of TINY
    config: dict
    tiny: dict = field(default_factory=dict)


# family -> writer of a one-layer checkpoint: the tokenizer and special tokens a random model borrows
TINY = {
    "llada": lambda out, vocab_size=32000, fixtures=FIXTURES: write_llada(
        out, d_model=64, n_layers=1, n_heads=4, mlp_hidden_size=128, vocab_size=vocab_size, fixtures=fixtures,
        max_sequence_length=8192),
    "dream": lambda out: write_dream(out, hidden_size=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=64),
    "sdar": lambda out: write_sdar(out, n_layers=1),
    "v2": lambda out: write_fast_dllm_v2(out, n_layers=1),
}

# the published shapes by name (random weights; only the named keys differ from the family's config)
SHAPES = {
    "mid": Shape("random LLaDA d512, 8 layers, 8 heads, MLP 1408, vocab 32000", "llada",
                 dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, mlp_hidden_size=1408), dict(vocab_size=32000)),
    "llada-8b": Shape("random LLaDA-8B: d4096, 32 layers, 32 heads, MLP 12288, vocab 126464", "llada",
                      dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288),
                      dict(vocab_size=126464)),
    "22m": Shape("random Dream d64, 8 layers, 4 heads (2 KV), MLP 1536, vocab 152064 (Dream's), untied head", "dream",
                 dict(hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=1536, max_window_layers=8)),
    "0.5b": Shape("random Dream d896, 24 layers, 14 heads (2 KV), MLP 4864, vocab 151936, tied head "
                  "(Qwen2.5-0.5B's shape)", "dream", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                                           num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                                                           tie_word_embeddings=True, max_window_layers=24)),
    "1.5b": Shape("random Dream d1536, 28 layers, 12 heads (2 KV), MLP 8960, vocab 151936, tied head "
                  "(Qwen2.5-1.5B's shape)", "dream", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                                           num_key_value_heads=2, intermediate_size=8960, vocab_size=151936,
                                                           tie_word_embeddings=True, max_window_layers=28)),
    "sdar-1.7b": Shape("random SDAR-1.7B", "sdar", dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                                                      num_key_value_heads=8, head_dim=128, intermediate_size=6144)),
    "sdar-8b": Shape("random SDAR-8B", "sdar", dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                                                  num_key_value_heads=8, head_dim=128, intermediate_size=12288)),
    "v2-1.5b": Shape("random Fast-dLLM v2 1.5B", "v2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                                          num_key_value_heads=2, intermediate_size=8960,
                                                          tie_word_embeddings=True, vocab_size=151936)),
    "v2-7b": Shape("random Fast-dLLM v2 7B", "v2", dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                                                      num_key_value_heads=4, intermediate_size=18944)),
}


def build(shape: Shape | str, dtype: str, device: str = "cpu", quantize: str = "none") -> loading.LoadedModel:
    """A random model of `shape` built on the device (no checkpoint of its size on disk: writing and
    reading back an 8B one would take minutes), with the tokenizer of a tiny checkpoint loaded the
    normal way."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    with tempfile.TemporaryDirectory() as tmp:
        lm = loading.load(TINY[shape.family](Path(tmp) / "m", **shape.tiny), dtype=dtype, device=device)
    config = dict(shape.config)
    if "layer_types" in lm.model.config.to_dict():             # v2 configs list one per layer
        config["layer_types"] = ["full_attention"] * config.get("num_hidden_layers", 1)
    return random_weights(lm, config, quantize)


def randomize(model: torch.nn.Module, std: float = 0.02, fill_rest: bool = False) -> None:
    """Every weight of 2 or more dimensions (matrices, stacked experts) from N(0, std). The rest
    (norm scales, biases) stay as the classes initialised them, or with `fill_rest` (a model built
    on the meta device has no values yet) biases 0 and the others 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std)
            elif fill_rest:
                p.zero_() if name.endswith("bias") else p.fill_(1.0)


def random_weights(lm: loading.LoadedModel, overrides: dict, quantize: str = "none",
                   family: str | None = None) -> loading.LoadedModel:
    """Swap `lm`'s model for a random one (2-D weights std 0.02, the rest as the classes initialise
    them) of its family (or `family`, a model_type) with `overrides` on its config, built on its
    device and dtype; `quantize` int8 / int4: converted as loading does."""
    config_cls, model_cls, _ = FAMILIES[family or lm.family][0]
    config = config_cls.from_dict({**lm.model.config.to_dict(), **overrides})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(lm.dtype)
    try:
        with torch.device(lm.device):
            model = model_cls(config).eval()
        randomize(model)
    finally:
        torch.set_default_dtype(default)
    if quantize in ("int8", "int4"):
        model.prepare_for_inference(pack=False)
        loading.cpu_quantize(model, quantize, lm.dtype, True, ())
        lm.quantize = quantize
    else:
        model.prepare_for_inference()
    lm.model = model
    lm.info = loading.describe(lm)
    return lm


def write_random(shape: Shape, out: Path, **kw) -> Path:
    """A random-weight checkpoint of an LLaDA `shape` on disk in the published layout (bf16, shards
    of 2 GB), for the runs that load it as a user does (--quantize 8bit/4bit, the authors' code);
    `kw`: write_llada's (logit_scale, ...)."""
    assert shape.family == "llada", "on-disk random checkpoints: LLaDA's layout"
    c = shape.config
    return write_llada(out, d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                       mlp_hidden_size=c["mlp_hidden_size"], max_sequence_length=8192, shard_bytes="2GB",
                       **{**shape.tiny, **kw})
