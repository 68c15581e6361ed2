"""The canvas KV cache: per layer, one static key/value buffer as long as the whole canvas; and
`Span`, what every layer of one forward over part of that canvas shares.

A forward over a span [a, b) writes its fresh keys/values into [a, b) and attends to the whole
buffer. Cache modes are then only a choice of span (see engine.py); nothing is ever copied or
concatenated, and shapes stay static for the whole generation. Cache mode dkv recomputes a position
set instead of a span (`Slots`): its fresh keys/values are scattered at those slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(eq=False)   # compared by identity: a span holding Slots never repeats (graphs.py's keys)
class Slots:
    """A position set a forward recomputes (cache mode dkv, decode/cache_modes.py), in place of a
    span's start: `index` (B, S) canvas slots, each row's own slots first, then filler (distinct
    slots of the row, `fresh` False) up to the longest row's count. A filler slot is computed, but its
    cached keys/values are kept: recomputing it changes nothing. Bidirectional attention only."""
    index: torch.Tensor    # (B, S) long
    fresh: torch.Tensor    # (B, S) bool

    @classmethod
    def of(cls, wanted: torch.Tensor, device: torch.device | None = None) -> "Slots":
        """wanted (B, T) bool (host) -> each row's wanted slots in canvas order, then filler; on `device`."""
        index = torch.argsort((~wanted).to(torch.int8), dim=1, stable=True)[:, :max(int(wanted.sum(1).max()), 1)]
        return cls(index.to(device), wanted.gather(1, index).to(device))

    @classmethod
    def delayed(cls, masked: torch.Tensor, shift: int, device: torch.device | None = None) -> "Slots":
        """dkv's set for the step after this one, from the canvas's mask (B, T) (host) at the start
        of this step: every slot whose logit position (slot + shift) is masked (a shifted family's
        last slot predicts nothing and stays cached)."""
        wanted = masked.roll(-shift, 1)
        wanted[:, masked.shape[1] - shift:] = False
        return cls.of(wanted, device)


@dataclass
class CanvasCache:
    positions: torch.Tensor            # (B, T) RoPE position of each canvas slot (left padding shifts rows)
    key_mask: torch.Tensor | None      # (B, 1, 1, T) True where a real token; None when nothing is padded
    keys: list[torch.Tensor] | None    # per layer (B, H_kv, T, D), keys stored after RoPE
    values: list[torch.Tensor] | None  # per layer (B, H_kv, T, D)
    block: int | None = None           # block-causal attention: its block size (None: bidirectional)
    features: object | None = None     # cache mode dllm_cache: its FeatureCache (models/feature_cache.py)
    tap: object | None = None          # FOCUS (decode/focus.py): called with (layer, q, k) after RoPE

    @classmethod
    def allocate(cls, valid: torch.Tensor, *, layers: list[tuple[torch.device, torch.dtype]],
                 kv_heads: int | list[int], head_dim: int | list[int], keep_kv: bool,
                 block: int | None = None) -> "CanvasCache":
        """`valid` (B, T) marks real tokens (False = left padding). `layers` gives each layer's
        device and dtype (accelerate may spread layers over devices); `kv_heads` and `head_dim` are
        one for all layers or one per layer (DiffusionGemma's two layer kinds). keep_kv=False gives
        a pass-through cache: every forward must then cover the whole canvas. `block`: attention is
        block-causal with blocks of that many positions."""
        positions = (valid.long().cumsum(-1) - 1).clamp(min=0)
        key_mask = None if bool(valid.all()) else valid[:, None, None, :]
        keys = values = None
        if keep_kv:
            heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * len(layers)
            dims = head_dim if isinstance(head_dim, list) else [head_dim] * len(layers)
            shapes = [(valid.shape[0], h, valid.shape[1], d) for h, d in zip(heads, dims)]
            keys = [torch.zeros(s, device=d, dtype=t) for (d, t), s in zip(layers, shapes)]
            values = [torch.zeros(s, device=d, dtype=t) for (d, t), s in zip(layers, shapes)]
        return cls(positions, key_mask, keys, values, block)

    @property
    def length(self) -> int:
        return self.positions.shape[1]

    def store(self, layer: int, start: int | Slots, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the span's fresh k/v (B, H_kv, S, D) at [start, start+S), or at the slots of a
        position set (filler slots keep their cached values); return what to attend to."""
        if self.keys is None:
            if k.shape[2] != self.length:
                raise RuntimeError("a span forward needs a KV cache (cache mode 'none' covers the whole canvas)")
            return k, v
        if isinstance(start, Slots):
            at = start.index.to(k.device)[:, None, :, None].expand_as(k)     # (B, H_kv, S, D)
            fresh = start.fresh.to(k.device)[:, None, :, None]
            for buffer, new in ((self.keys[layer], k), (self.values[layer], v)):
                buffer.scatter_(2, at, torch.where(fresh, new, buffer.gather(2, at)))   # distinct slots per row
            return self.keys[layer], self.values[layer]
        end = start + k.shape[2]
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer], self.values[layer]

    def mask_for(self, device: torch.device, start: int, end: int) -> torch.Tensor | None:
        """What the span [start, end)'s queries may attend to: (B, 1, 1, T) without padding
        keys, or under block-causal attention (B, 1, end - start, T), each query the blocks up to
        and including its own (bidirectional inside the block); None when everything is allowed."""
        padding = None if self.key_mask is None else self.key_mask.to(device, non_blocking=True)
        if self.block is None:
            return padding
        blocks = (self.positions // self.block).to(device, non_blocking=True)       # (B, T)
        allowed = blocks[:, None, None, :] <= blocks[:, None, start:end, None]      # (B, 1, S, T)
        return allowed if padding is None else allowed & padding

    @property
    def nbytes(self) -> int:
        features = 0 if self.features is None else self.features.nbytes   # dllm_cache's (B, T, d) pairs
        if self.keys is None:
            return features
        return features + sum(t.numel() * t.element_size() for t in self.keys + self.values)


@dataclass
class Span:
    """One forward's view of the canvas, the same for every layer (built once per forward by the
    family's forward, models/base.py): where the span lies (`start`, or the slots of a position
    set), its RoPE tables, which keys its queries may see, and the cache its keys/values go to."""
    cache: CanvasCache
    start: int | Slots
    cos: torch.Tensor                       # (B, S, 1, D) RoPE tables of the span's positions
    sin: torch.Tensor
    key_mask: torch.Tensor | None           # (B, 1, 1 or S, T) bool; None: every key
    q_scale: torch.Tensor | None = None     # (B, S) a factor per query after RoPE (Nemotron-Labs Diffusion)
