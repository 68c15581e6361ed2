"""The canvas KV cache: per layer, one static key/value buffer as long as the whole canvas.

A forward over a span [a, b) writes its fresh keys/values into [a, b) and attends to the whole
buffer. Cache modes are then only a choice of span (see engine.py); nothing is ever copied or
concatenated, and shapes stay static for the whole generation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CanvasCache:
    positions: torch.Tensor            # (B, T) RoPE position of each canvas slot (left padding shifts rows)
    key_mask: torch.Tensor | None      # (B, 1, 1, T) True where a real token; None when nothing is padded
    keys: list[torch.Tensor] | None    # per layer (B, H_kv, T, D), keys stored after RoPE
    values: list[torch.Tensor] | None  # per layer (B, H_kv, T, D)
    block: int | None = None           # block-causal attention: its block size (None: bidirectional)

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

    def store(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the span's fresh k/v (B, H_kv, S, D) at [start, start+S); return what to attend to."""
        if self.keys is None:
            if k.shape[2] != self.length:
                raise RuntimeError("a span forward needs a KV cache (cache mode 'none' covers the whole canvas)")
            return k, v
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
        if self.keys is None:
            return 0
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
