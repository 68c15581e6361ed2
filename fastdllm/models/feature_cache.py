"""dLLM-Cache (maomaocun/dLLM-cache, docs/accelerators/dllm-cache.md 5.1): a per-layer *feature* cache for a
bidirectional family, cache mode `dllm_cache` (decode/cache_modes.py).

Every step runs the whole canvas [0, T) through every layer, but a layer recomputes its attention
and FFN only at some slots and takes the rest from the cache; the residual stream itself is always
fresh (x + attn + ffn, with attn and ffn cached per slot). The canvas splits at the prompt's end P
(every row's first generated slot; left padding belongs to the prompt) into the prompt [0, P) and
the response [P, T). At forward n (counted from 1 over the whole generation):

- the prompt is recomputed when (n - 1) % prompt_interval == 0, the response when
  (n - 1) % gen_interval == 0, and layer 0 always recomputes both;
- otherwise, with transfer_ratio r > 0, the layer projects V for every response slot, picks per row
  the int(r * (T - P)) response slots whose fresh V has the lowest cosine similarity to the cached
  V, replaces every response V, and recomputes K, attention and FFN of the picked slots only.

What a layer keeps: its keys/values in the CanvasCache buffers (after RoPE, at fixed positions),
and here its attention output (after the output projection) and FFN output, (B, T, d) each. A
recomputed slot's queries attend to the whole buffer (fresh K/V where recomputed, cached elsewhere).
The family's block provides `attn_norm`, `attend` (the family's self-attention over a span or a
position set, storing its K/V), `ffn` (norm + MLP) and `values` (V alone); LLaDA's and Dream's do.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from .kv_cache import CanvasCache, Slots, Span


class FeatureCache:
    """One generation's features and refresh schedule (state per Batch, never process-wide)."""

    def __init__(self, prompt_len: int, prompt_interval: int, gen_interval: int, transfer_ratio: float):
        self.prompt_len, self.prompt_interval, self.gen_interval = prompt_len, prompt_interval, gen_interval
        self.transfer_ratio = transfer_ratio
        self.step = 0                      # forwards so far, the current one included (their current_step)
        self.attn: dict[int, torch.Tensor] = {}   # layer -> (B, T, d) attention outputs
        self.ffn: dict[int, torch.Tensor] = {}    # layer -> (B, T, d) FFN outputs
        self.trace: list | None = None     # tests: (step, layer, prompt?, response?, picked (B, n) or None)

    def schedule(self, layer: int) -> tuple[bool, bool]:
        """(recompute the prompt, recompute the response) at this forward, for `layer`."""
        n = self.step - 1
        return (layer == 0 or n % self.prompt_interval == 0), (layer == 0 or n % self.gen_interval == 0)

    def layer(self, block, x: torch.Tensor, span: Span, layer: int) -> torch.Tensor:
        """x (B, T, d) the layer's input over the whole canvas (`span` covers it) -> its output (B, T, d)."""
        if layer == 0:
            self.step += 1
        B, T, _ = x.shape
        P = self.prompt_len
        prompt, response = self.schedule(layer)
        h = block.attn_norm(x)
        picked = None
        if prompt and response:                                      # the whole layer
            if self.trace is not None:
                self.trace.append((self.step, layer, True, True, None))
            attn = self.attn[layer] = block.attend(h, span, layer)
            x = x + attn
            return x + self.keep(self.ffn, layer, block.ffn(x))
        parts = [torch.arange(P, device=x.device).expand(B, P)] if prompt else []
        if response:
            parts.append(torch.arange(P, T, device=x.device).expand(B, T - P))
        elif self.transfer_ratio > 0:
            picked = self.pick(block, h, span.cache, layer)          # (B, n) canvas slots
            parts.append(picked)
        if self.trace is not None:
            self.trace.append((self.step, layer, prompt, response, None if picked is None else picked.tolist()))
        slots = torch.cat(parts, 1) if parts else None               # (B, S): the slots recomputed
        if slots is not None and slots.shape[1]:
            at = slots[..., None]
            rows = lambda t: t.gather(1, at.expand(-1, -1, t.shape[-1]))   # noqa: E731  (B, S, ...)
            shape = lambda t: t.gather(1, at[..., None].expand(-1, -1, *t.shape[2:]))   # noqa: E731  cos/sin
            at_slots = replace(span, start=Slots(slots, torch.ones_like(slots, dtype=torch.bool)),
                               cos=shape(span.cos), sin=shape(span.sin))
            fresh = block.attend(rows(h), at_slots, layer)
            self.attn[layer].scatter_(1, at.expand(-1, -1, x.shape[-1]), fresh)
        x = x + self.attn[layer]
        if slots is not None and slots.shape[1]:
            self.ffn[layer].scatter_(1, at.expand(-1, -1, x.shape[-1]), block.ffn(rows(x)))
        return x + self.ffn[layer]

    def pick(self, block, h: torch.Tensor, cache: CanvasCache, layer: int) -> torch.Tensor:
        """Their refresh_index: the response slots whose fresh V is least like the cached V (cosine
        over all heads' values of a slot), int(r * response length) per row; every response V is
        replaced by the fresh one. Returns (B, n) canvas slots."""
        P = self.prompt_len
        B, T, _ = h.shape
        values = cache.values[layer]                                  # (B, H_kv, T, D)
        new = block.values(h[:, P:])                                  # (B, G, H_kv * D)
        old = values[:, :, P:].transpose(1, 2).reshape(new.shape)
        similarity = F.cosine_similarity(new, old, dim=-1)            # (B, G)
        n = int((T - P) * self.transfer_ratio)
        values[:, :, P:] = new.view(B, T - P, values.shape[1], values.shape[3]).transpose(1, 2)
        return P + similarity.topk(n, dim=1, largest=False).indices

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.attn.values(), *self.ffn.values()])

    @staticmethod
    def keep(store: dict, layer: int, features: torch.Tensor) -> torch.Tensor:
        store[layer] = features
        return features
