#!/usr/bin/env python3
"""GGUF file sizes computed from a published shape, for the catalog's GGUF entries whose sizes
could not be read (catalog.yaml: `source: computed`), and what fastdllm holds when it loads such a
file on a CPU. No weights: the model is built on the meta device (scripts/catalog_sizes.py).

Which type each tensor gets, as llama.cpp decides it (read, not copied):
  --outtype q8_0 (convert_hf_to_gguf.py `prepare_tensors`): every 2-D weight Q8_0 (a row not a
      multiple of 32: F16), 1-D tensors and the MoE router F32;
  llama-quantize Q4_K_M (src/llama-quant.cpp `llama_tensor_get_type`): the output head Q6_K;
      attn_v and ffn_down Q6_K in the layers `use_more_bits` picks (the first and last eighth, and
      every third between), else Q4_K; every other 2-D weight Q4_K; 1-D and the router F32.
Bytes per value: F32 4, F16 2, Q8_0 34/32, Q4_K 144/256, Q6_K 210/256 (gguf-py GGML_QUANT_SIZES).
The figure is the tensor data only: the header (the vocabulary, a few MB) is not counted.

fastdllm on a CPU (docs/specs/gguf.md 10-11): Q4_K -> int4 (0.5 + 5/32 bytes a weight), Q6_K and Q8_0
(with --quantize int8) -> int8 rows (1 byte); the embedding int8, the head bf16 (int8 only where
this CPU runs W8A8: the larger is taken), norms and routers bf16; plus the 384-token bf16 cache.

    python scripts/gguf_sizes.py                       # every GGUF entry of the catalog
    python scripts/gguf_sizes.py --check               # also the read sizes against the computed
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from catalog_sizes import published_config  # noqa: E402

from fastdllm.checkpoints import catalog  # noqa: E402

BYTES = {"F32": 4.0, "F16": 2.0, "Q8_0": 34 / 32, "Q4_K": 144 / 256, "Q6_K": 210 / 256}
HELD = {"F32": 2.0, "F16": 2.0, "Q8_0": 1.0, "Q4_K": 0.5 + 5 / 32, "Q6_K": 1.0}    # fastdllm's kept form
# published sizes the catalog's notes compare against (read from public pins of these files)
READ = {"LLaDA-MoE-7B-A1B-Instruct Q8_0": ("package:LLaDA-MoE-7B-A1B-Instruct", "Q8_0", 7_829_549_248),
        "RND1-Base-0910 Q8_0": ("writer:rnd1", "Q8_0", 32_483_927_584)}


def shapes_of(shape: str) -> tuple[dict, object]:
    """Published names -> shapes of a `shape:` value, and the config (meta device)."""
    import torch

    from fastdllm.checkpoints.family import family_of

    config, model_cls, _ = family_of(published_config(shape), Path("config"), refuse=False)
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = model_cls(config)
    return {n: tuple(t.shape) for n, t in model.state_dict().items()}, config


def use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def role(name: str) -> str:
    if name.endswith(("embed_tokens.weight", "transformer.wte.weight")):
        return "embedding"
    if name in ("lm_head.weight", "model.transformer.ff_out.weight"):
        return "head"
    if name.endswith(("mlp.gate.weight", "router.weight")) or ".gate." in name and "experts" not in name:
        return "router"
    if re.search(r"\.(v_proj)\.weight$", name):
        return "attn_v"
    if re.search(r"\.(down_proj|ff_out)\.weight$", name):
        return "ffn_down"
    return "other"


def layer_of(name: str) -> int | None:
    m = re.search(r"\.(?:blocks|layers)\.(\d+)\.", name)
    return int(m[1]) if m else None


def gguf_type(name: str, shape: tuple, quant: str, n_layers: int) -> str:
    kind = role(name)
    if len(shape) < 2 or kind == "router":
        return "F32"
    if quant == "Q8_0":
        return "Q8_0" if shape[-1] % 32 == 0 else "F16"
    if quant == "Q4_K_M":
        if kind == "head":
            return "Q6_K"
        if kind in ("attn_v", "ffn_down") and use_more_bits(layer_of(name), n_layers):
            return "Q6_K"
        return "Q4_K"
    if quant in ("F16", "BF16"):
        return "F16"
    raise ValueError(quant)


def sizes(shape: str, quant: str) -> tuple[int, int]:
    """(file bytes of the tensor data, bytes fastdllm holds on a CPU with the 384-token cache)."""
    from math import prod

    from fastdllm.checkpoints.info import memory_estimate, shape_summary

    shapes, config = shapes_of(shape)
    n_layers = config.num_hidden_layers
    file = held = 0.0
    for name, shape_ in shapes.items():
        kind, count = gguf_type(name, shape_, quant, n_layers), prod(shape_)
        file += count * BYTES[kind]
        role_ = role(name)
        held += count * (1.0 if role_ == "embedding" else 2.0 if role_ in ("head", "router") or len(shape_) < 2
                         else HELD[kind])
    cache = memory_estimate(shape_summary(shapes, config), catalog.CANVAS_TOKENS)["bf16"]["cache"]
    return int(file), int(held + cache)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the sizes read from the hub")
    args = ap.parse_args()
    for name, entry in catalog.entries().items():
        for tag, fields in entry.gguf.items():
            file, held = sizes(entry.shape, tag)
            print(f"{name:28} {tag:7} file {file:>15,} B ({file / 1e9:.2f} GB)  held on a CPU {held / catalog.GIB:.1f} GiB"
                  f"  catalog: {fields.get('bytes'):,} ({fields.get('source')})")
    if args.check:
        for label, (shape, quant, read) in READ.items():
            file, _ = sizes(shape, quant)
            print(f"{label:36} computed {file:>15,} read {read:>15,}  ({(read - file) / read:+.2%} header and rounding)")


if __name__ == "__main__":
    main()
