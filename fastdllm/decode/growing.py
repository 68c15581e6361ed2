"""iLLaDA's decoding additions (docs/specs/illada.md 3.2, 3.4), as policies of the one mask loop.

Growing canvas (`variable_length`, the authors' `var_generate`): they append one block of masks to
the prompt and the finished blocks, decode it with `block_steps` full forwards, and stop between
blocks once the answer holds a stop. Here the canvas keeps its length (prompt + gen_len masks) and
at every step of block [s, e) the key mask hides [e, T) and spans end at e: the slots after the
block are neither computed nor attended to, so they "do not exist yet". RoPE positions are the
absolute ones of the authors' growing tensor, so cache none is their algorithm exactly; the early
stop after the block where the answer ends is the engine's own. Like DPad's suffix (the same
mechanism: suffix_dropout.py), the mask is written in place into the cache's key mask.

End-of-thinking boost (`end_think_boost`): until the generated region holds the ids S of
`</think>` as a run, each forward adds B * r^power to one logit at p, the first masked position of
the current block: the id of S after the longest proper prefix of S that ends right before p (else
S[0]); r = clamp((p - c + 1) / gen_len, 0, 1), c the row's first generated position. Planned on the
host copy of the canvas, added in the logits' dtype before any prediction or confidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UserError


class GrowingCanvas:
    """A batch's key mask, narrowed at every block start to the slots before the block's end."""

    def __init__(self, canvas, cache, name: str, causal: bool, infilling: bool):
        if causal:
            raise UserError(f"variable_length: {name} attends block-causally, so it never sees the blocks after "
                            f"the current one anyway (unset variable_length)")
        if infilling:
            raise UserError("variable_length grows the answer after the prompt; infilling decodes holes inside "
                            "given text (unset one)")
        self.cache = cache
        self.valid = canvas.valid.to(cache.positions.device, copy=True)      # (B, T) the canvas's own mask
        cache.key_mask = self.valid[:, None, None, :].clone()               # (B, 1, 1, T), written in place

    def block(self, s: int, e: int) -> int:
        """Before the first forward of block [s, e): hide [e, T); spans end at e."""
        mask = self.cache.key_mask[:, 0, 0]
        mask.copy_(self.valid)
        mask[:, e:] = False
        return e


@dataclass(frozen=True)
class Bonus:
    """One step's boosts: (row, canvas position, id, amount) each."""
    boosts: list[tuple[int, int, int, float]]

    def apply(self, logits: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """logits (B, K, V) at canvas `positions` (B, K): each boost added in place, in their dtype."""
        for row, p, token, amount in self.boosts:
            found = (positions[row] == p).nonzero()
            if len(found):                        # (a row that takes no step has no logits there)
                logits[row, int(found[0, 0]), token] += amount
        return logits


class EndThinkBoost:
    """The boost's plan for each step of a batch (`plan`), from the host canvas."""

    def __init__(self, cfg, ids: list[int], starts: list[int], mask: int):
        self.ids, self.starts, self.mask = list(ids), starts, mask
        self.gen_len, self.boost, self.power = cfg.gen_len, cfg.end_think_boost, cfg.end_think_power
        self.run = torch.tensor(self.ids)

    @classmethod
    def of(cls, cfg, decoder, starts: list[int]) -> "EndThinkBoost":
        """The boost for a batch whose rows start generating at `starts`; S is `</think>` as the
        decoder's tokenizer encodes it without special tokens (one id or several)."""
        ids = decoder.encode("</think>") if decoder.encode is not None else []
        if not ids:
            raise UserError(f"end_think_boost: {decoder.name} has no tokenizer that encodes `</think>`")
        return cls(cfg, ids, starts, decoder.specials.mask)

    def plan(self, host: torch.Tensor, s: int, e: int) -> Bonus:
        """The boosts of the next forward of block [s, e) (host (B, T), the canvas before it)."""
        boosts = []
        n = len(self.ids)
        for row, c in enumerate(self.starts):
            masked = (host[row, s:e] == self.mask).nonzero()
            if not len(masked) or self.holds_run(host[row, c:]):
                continue
            p = s + int(masked[0, 0])
            r = min(max((p - c + 1) / self.gen_len, 0.0), 1.0)
            token = self.ids[0]
            for k in range(min(n - 1, p - c), 0, -1):          # the longest proper prefix of S before p
                if host[row, p - k:p].tolist() == self.ids[:k]:
                    token = self.ids[k]
                    break
            boosts.append((row, p, token, self.boost * r ** self.power))
        return Bonus(boosts)

    def holds_run(self, region: torch.Tensor) -> bool:
        """Whether `region` (L,) holds S as a contiguous run."""
        n = len(self.ids)
        if region.numel() < n:
            return False
        return bool((region.unfold(0, n, 1) == self.run).all(1).any())
