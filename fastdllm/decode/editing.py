"""Token editing (LLaDA2.1's T2T, docs/specs/llada2-editing.md) as state of the engine's one mask loop.

Per row of the batch, the active block is decoded while the row is `live`. Without editing a row
is done once its block has no mask left (the plain mask loop). With editing (DecodeConfig
`edit_threshold`) every step may also overwrite tokens already written in the block, and a full
block gets edit-only rounds: a row is done when a step that started with no mask edits nothing,
or when its `max_post_steps` rounds are spent (checked before the forward, as the checkpoint's
`generate` does). Rows are independent, so a batch decodes each row as it would alone; a finished
row rides along (its forwards change nothing and refresh its block's keys/values).

The cache rule follows from block-causal attention: earlier blocks never see the active one, so
edits never invalidate them; the active block's keys/values are final only after its last edit.
`fresh` tells the engine whether the block's last forward already saw every row's final tokens
(every row ended by the no-change exit): then that forward stored them and the store pass is
skipped.
"""

from __future__ import annotations

import torch

from ..errors import UserError


def refuse_partial_routing(decoder, cfg) -> None:
    """LLaDA2.2's block routing (docs/specs/llada2-2.md §2.2) routes whole 32-position blocks: a forward
    of part of one (a decoding block that does not tile them, a sub-block span) is refused."""
    block = decoder.model.routing_block
    if not block:
        return
    if cfg.block_len % block:
        raise UserError(f"{decoder.name} uses block routing over blocks of {block}: block_len {cfg.block_len} "
                        f"must be a multiple of {block}")
    if cfg.sub_block_len is not None and cfg.cache == "dual":
        raise UserError(f"{decoder.name} uses block routing over whole blocks of {block}; the dual cache's "
                        f"sub-block forwards route part of one (unset sub_block_len or use cache prefix)")


class BlockRows:
    """The rows' state in the active block: who still decodes it, edit-only rounds used."""

    def __init__(self, batch: int, cfg):
        self.threshold, self.budget = cfg.edit_threshold, cfg.max_post_steps
        self.editing = self.threshold is not None
        self.live = torch.ones(batch, dtype=torch.bool)       # (B,) rows still decoding this block
        self.post = torch.zeros(batch, dtype=torch.long)      # (B,) edit-only rounds taken
        self.filled = torch.zeros(batch, dtype=torch.bool)    # (B,) the current step began with no mask
        self.fresh = False                                    # the last forward saw the final block

    def begin(self, masked: torch.Tensor) -> bool:
        """masked (B, L): the block's masks before a step. Whether any row takes the step."""
        self.filled = ~masked.any(1)
        if self.editing:
            self.post += (self.filled & self.live).long()
            self.live &= ~(self.filled & (self.post > self.budget))   # the budget is spent: no forward
        else:
            self.live &= ~self.filled
        return bool(self.live.any())

    def end(self, wrote: torch.Tensor, edited: torch.Tensor) -> None:
        """wrote, edited (B, K): what the step just taken wrote (commits and edits) and edited."""
        if self.editing:
            self.live &= ~(self.filled & ~edited.any(1))       # no mask and no edit: the block is done
        self.fresh = not bool(wrote.any())

    def editable(self, host: torch.Tensor, s: int, e: int, starts: list[int], ends: list[int],
                 mask: int) -> torch.Tensor | None:
        """(B, L) bool: the positions of block [s, e) that may be edited this step (None without
        editing): written (not a mask), inside the row's generated region (never its prompt, never
        the padding after it), in a live row."""
        if not self.editing:
            return None
        at = torch.arange(s, e)[None, :]                                          # (1, L) canvas positions
        inside = (at >= torch.tensor(starts)[:, None]) & (at < torch.tensor(ends)[:, None])
        return (host[:, s:e] != mask) & inside & self.live[:, None]
