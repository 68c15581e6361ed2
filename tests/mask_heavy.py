"""Fixtures that do not hide the confidence's normaliser: a copy of a tiny checkpoint whose output
head gives the mask token real probability.

The writers scale the mask row of the head down (or leave it random), so p(mask) is about 1e-16 and
`p / (1 - p(mask))` cannot be told from `p`. Here the mask row becomes 0.95 times the row of a word the
model predicts often (the second most often: the first would take the confidence of so many
positions that no step commits more than one): wherever that word wins, the mask's logit is 0.95
times the winner's (p(mask) 0.1-0.3 on these fixtures), yet the mask itself stays below it. The references ban
the mask id from the argmax as fastdllm does (docs/specs/llada2-moe.md Q5), so nothing else changes."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from fastdllm.checkpoints import loading

HEADS = ("lm_head.weight", "model.transformer.ff_out.weight")   # Qwen-style / LLaDA names (untied)


def logits_over(lm, canvas: list[int]) -> torch.Tensor:
    """(T, V) float64 logits of one full forward over `canvas` under the family's own attention
    (block-causal families: their block size), unshifted."""
    x = torch.tensor([canvas])
    cache = lm.model.new_cache(torch.ones_like(x, dtype=torch.bool), keep_kv=False, block=lm.model.attention.block)
    with torch.no_grad():
        return lm.model.head(lm.model.hidden_states(x, 0, cache))[0].double()


def often_predicted_word(lm, canvas: list[int], rank: int = 1) -> int:
    """The token the model predicts `rank`-th most often over `canvas` (0: the most; a full, plain
    forward; never the mask)."""
    logits = logits_over(lm, canvas)
    logits[:, lm.specials.mask] = float("-inf")
    return Counter(logits.argmax(-1).tolist()).most_common(rank + 1)[rank][0]


def with_heavy_mask(src: Path, dst: Path, mask_id: int, word_id: int, scale: float = 0.95) -> Path:
    """Copy checkpoint `src` to `dst` with head row `mask_id` := scale * row `word_id`."""
    dst = Path(shutil.copytree(src, dst))
    for shard in sorted(dst.glob("*.safetensors")):
        tensors = load_file(str(shard))
        name = next((n for n in HEADS if n in tensors), None)
        if name is not None:
            head = tensors[name]
            head[mask_id] = head[word_id] * scale
            save_file(tensors, str(shard), metadata={"format": "pt"})
            return dst
    raise ValueError(f"{src} has no untied output head ({', '.join(HEADS)})")


def heavy_copy(lm, dst: Path, canvas: list[int]):
    """The float64 LoadedModel of `lm`'s checkpoint with a heavy mask row (see the module doc), the
    word chosen on `canvas` (a prompt and its masks: what the first step sees)."""
    word = often_predicted_word(lm, canvas)
    return loading.load(with_heavy_mask(lm.path, dst, lm.specials.mask, word), dtype="fp64")


def max_mask_probability(lm, canvas: list[int]) -> float:
    """The largest p(mask) the model gives at any position of `canvas` (one full forward)."""
    return float(logits_over(lm, canvas).softmax(-1)[:, lm.specials.mask].max())


def prompt_of(lm, boundary: bool) -> list[int]:
    """The chat prompt of conftest.HEAVY_PROMPT (42 tokens: off the block grid of 16), or 48 tokens
    (on it): the prompt the accelerators' exactness tests decode."""
    from conftest import HEAVY_PROMPT

    prompt = lm.encode(HEAVY_PROMPT, chat=True)
    return (prompt + lm.encode(" Then test it on a few numbers, please, and explain", chat=False))[:48] \
        if boundary else prompt
