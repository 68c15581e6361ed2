"""Cache modes: one table, beside CanvasCache (models/kv_cache.py). A mode is the canvas span a step
recomputes and whether the per-layer K/V buffers are kept; the engine asks `span_for` and never
names a mode. DecodeConfig's choices, the CLI help and bench labels are read from this table.
Torch-free, like rules.py.

Under bidirectional attention (LLaDA, Dream) the first step of each block (and every
`refresh_every` steps) recomputes the whole canvas; the cache is exact then and approximate at the
other steps of the block:

    mode     refresh step     other steps
    none     [0, T)           [0, T)
    prefix   [0, T)           [block_start, T)
    dual     [0, T)           [block_start, block_end)
    dkv      [0, T)           the slots not cached yet, anywhere in the canvas (a position set)
    dllm_cache [0, T)         [0, T), each layer's attention/FFN taken from its feature cache
                              except where its schedule recomputes them (models/feature_cache.py)

dkv is dKV-Cache-Decode (horseee/dKV-Cache, docs/accelerators/dkv.md 5.2), the delayed cache: a slot's
keys/values are cached one step after its position is decoded, and every other slot is recomputed
every step. So its steps 0 and 1 (nothing is cached before step 1's forward) and every
`refresh_every`-th are full; between them a step recomputes the slots whose logit position
(slot + logit shift) was masked at the start of the previous step: every mask, and the positions
the previous step committed (models/kv_cache.Slots; the engine builds the set from its host canvas).

dllm_cache is dLLM-Cache (maomaocun/dLLM-cache, docs/accelerators/dllm-cache.md 5.1): every step runs the whole
canvas, and inside each layer the prompt's and the response's features are refreshed on their own
intervals (prompt_interval, gen_interval), with transfer_ratio of the response recomputed between
(the slots whose V changed most); the engine attaches the FeatureCache and runs without CUDA graphs.

Under block-causal attention (SDAR, Fast-dLLM v2) finished blocks are final and never recomputed;
prefix recomputes the block, dual only the current sub-block once its first token is committed
(approximate inside the block, like DualCache), none everything up to the block's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class CacheMode:
    name: str
    keeps_kv: bool
    recompute: Callable[[int, int, int], tuple[int, int]]   # bidirectional: (block start, end, T) -> span
    causal: Callable[[int, int, tuple | None], tuple[int, int]]   # block-causal: (start, end, sub-block) -> span
    help: str
    delayed: bool = False    # dkv: between refreshes a step recomputes a position set, not a span
    features: bool = False   # dllm_cache: a per-layer feature cache inside the whole-canvas forward


CACHE_MODES: dict[str, CacheMode] = {m.name: m for m in [
    CacheMode("dual", True, lambda s, e, T: (s, e), lambda s, e, sub: sub or (s, e),
              "DualCache: prompt and masked suffix reused, only the block recomputed; block-causal: "
              "only the current sub-block, the rest of the block reused (Fast-dLLM v2's block cache)"),
    CacheMode("prefix", True, lambda s, e, T: (s, T), lambda s, e, sub: (s, e),
              "PrefixCache: prompt and finished blocks reused, the rest recomputed (exact when block-causal)"),
    CacheMode("none", False, lambda s, e, T: (0, T), lambda s, e, sub: (0, e),
              "no cache: every step runs the whole canvas (block-causal: everything up to the block's end)"),
    # dkv: (0, T) at its step 1; the set steps come from span_for (block-causal families are refused)
    CacheMode("dkv", True, lambda s, e, T: (0, T), lambda s, e, sub: (0, e),
              "dKV-Cache-Decode: a position's K/V cached one step after it is decoded, every mask recomputed "
              "each step, a full refresh every refresh_every steps (bidirectional families)", delayed=True),
    CacheMode("dllm_cache", True, lambda s, e, T: (0, T), lambda s, e, sub: (0, e),
              "dLLM-Cache: per layer the prompt's and response's attention/FFN outputs cached, refreshed every "
              "prompt_interval / gen_interval steps, transfer_ratio of the response recomputed between (LLaDA, Dream)",
              features=True),
]}


def span_for(cfg, step: int, s: int, e: int, T: int, *, causal: bool = False,
             sub: tuple[int, int] | None = None, pending=None) -> tuple:
    """The canvas span step `step` of the block [s, e) recomputes, for a canvas of T slots.
    Block-causal: never a finished block (their K/V are final); `sub` is the current sub-block
    when its forward may reuse the rest of the block (not at a block's first step). `pending`
    (dkv): the previous step's Slots.delayed; between refreshes the span is (pending, T)."""
    mode = CACHE_MODES[cfg.cache]
    if causal:
        return mode.causal(s, e, sub if step > 0 else None)
    refresh = step == 0 or not mode.keeps_kv or bool(cfg.refresh_every and step % cfg.refresh_every == 0)
    if mode.delayed and not (refresh or step == 1):
        return (pending, T)
    return (0, T) if refresh else mode.recompute(s, e, T)
