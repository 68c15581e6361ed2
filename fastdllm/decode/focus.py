"""FOCUS (sands-lab/FOCUS, docs/accelerators/focus.md): inside a block of a block-causal model, keep the masked
tokens that layers 0 and 1's attention say will be decoded soon and drop the others from the rest
of the forward, on top of the authors' delayed cache.

Per row and block (docs 1): `uncached` (B, L), `warm`, the tokens committed and the steps that
committed any (their mean is the target's `avg`), `progress` (the rightmost block offset computed
at every layer). A step (docs 2): the processing set P (the block when warm, else the uncached
positions) runs layer 0; layer 1 runs once with one output row so that its q/k reach the
importance (the cache's `tap`; its K/V for all of P are stored then), the host picks the kept set
K (docs 3), then layer 1 again for K's rows and the later layers for K alone. A query set is a
`Slots` (the row's positions, then filler slots whose K/V are not stored); keys reach up to the
rightmost position of the set that attends (a (B, 1, 1, T) mask per row). Logits at K's masks only.
"""

from __future__ import annotations

import torch

from ..errors import UserError
from ..models.kv_cache import Slots
from ..models.layers import rotary_tables
from .combinations import refuse_family
from .selection import authors_dtype, predict, select


def importance(q: torch.Tensor, k: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """q (B, H, S, D), k (B, H_kv, S, D) after RoPE; rows (B, M) the slots of each row's masked
    positions (canvas order), valid (B, M). -> (B, M) in q's dtype: per key j, the attention its
    masked queries give it, max-pooled over its neighbours in M, summed over queries and heads."""
    work = torch.promote_types(q.dtype, torch.float32)
    H, D = q.shape[1], q.shape[-1]
    at = rows.to(q.device)[:, None, :, None]
    qm = q.gather(2, at.expand(-1, H, -1, D)).to(work)                                   # (B, H, M, D)
    km = k.gather(2, at.expand(-1, k.shape[1], -1, D)).to(work).repeat_interleave(H // k.shape[1], 1)
    keys = valid.to(q.device)[:, None, None, :]                                           # (B, 1, 1, M)
    scores = (qm @ km.transpose(-1, -2) * D ** -0.5).masked_fill(~keys, float("-inf"))   # (B, H, M, M)
    edge = torch.full_like(scores[..., :1], float("-inf"))
    pooled = torch.maximum(scores, torch.cat([edge, scores[..., :-1]], -1))
    pooled = torch.maximum(pooled, torch.cat([scores[..., 1:], edge], -1)).masked_fill(~keys, float("-inf"))
    weights = torch.where(keys.transpose(-1, -2), pooled.softmax(-1), 0.0)               # invalid queries: 0
    return weights.sum((1, 2)).to(q.dtype)


def choose(delta, valid, pos, target, evict, progress) -> torch.Tensor:
    """The kept masked positions (docs 3). delta, valid, pos (B, M): a row's masked positions of P
    in canvas order (pos: block offsets); target, evict, progress (B,). -> (B, M) bool."""
    B, M = delta.shape
    order = delta.masked_fill(~valid, float("-inf")).sort(dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(M).expand(B, M))      # ties: lowest first
    top = valid & (rank < target[:, None])
    n = valid.sum(1).clamp_min(1)
    mean = delta.masked_fill(~valid, 0).sum(1) / n
    std = ((delta - mean[:, None]).masked_fill(~valid, 0) ** 2).sum(1).div(n).sqrt()   # population
    over = valid & (delta >= (mean + std)[:, None])
    chosen = torch.where(evict[:, None], torch.where((over.sum(1) >= target)[:, None], over, top), valid)
    left = torch.zeros_like(chosen)                            # the masked neighbour left of a chosen one
    left[:, :-1] = chosen[:, 1:] & valid[:, 1:] & (pos[:, 1:] - pos[:, :-1] == 1)
    chosen = (chosen | left) & valid
    chosen = torch.where(chosen.any(1, keepdim=True), chosen, valid)
    right = torch.where(chosen, pos, -1).max(1).values
    return chosen | (valid & (pos < right[:, None]) & (pos > progress[:, None]))         # never computed: kept


def in_order(wanted: torch.Tensor) -> torch.Tensor:
    """(B, L) -> (B, n) each row's wanted offsets first (in order), then the others; n the most wanted."""
    return torch.argsort((~wanted).to(torch.int8), dim=1, stable=True)[:, :max(int(wanted.sum(1).max()), 1)]


def row_in(wanted: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The row of each block offset in a slot set built from `wanted` (B, L) (0 where not in it)."""
    return (wanted.long().cumsum(1) - 1).gather(1, offsets).clamp_min(0)


class Focus:
    """One batch's FOCUS state in its active block and its step (same returns as step.decode_step)."""

    def __init__(self, cfg, decoder, forward, cache):
        refuse_family(decoder.model, decoder.name, "focus_alpha", UserError)   # combinations.FAMILY
        self.cfg, self.model, self.forward, self.cache = cfg, decoder.model, forward, cache
        self.mask = decoder.specials.mask
        self.positions_run = 0.0                    # the last step's forward, for its StepEvent (run_layers)

    def start(self, B: int, L: int) -> None:
        self.uncached, self.warm = torch.ones(B, L, dtype=torch.bool), True
        self.decoded, self.steps = torch.zeros(B, dtype=torch.float32), torch.zeros(B, dtype=torch.long)
        self.progress = torch.full((B,), -1, dtype=torch.long)

    def step(self, step: int, host: torch.Tensor, s: int, e: int, candidates: torch.Tensor, scheduled, generator):
        """host (B, T) the canvas before the step; candidates (B, L) the masks that may be committed."""
        cfg, (B, L) = self.cfg, candidates.shape
        if step == 0:
            self.start(B, L)
        block = host[:, s:e]
        masked = block == self.mask                                                      # (B, L)
        self.uncached |= masked
        whole = self.warm or not cfg.focus_delayed
        processing = torch.ones_like(masked) if whole else self.uncached | ~self.uncached.any(1, keepdim=True)
        self.warm = False
        avg = torch.where(self.steps > 0, self.decoded / self.steps.clamp_min(1), 1.0)      # float32 as theirs
        m = (masked & processing).sum(1)
        target = torch.minimum(m, (avg.clamp_min(1.0) * cfg.focus_alpha).ceil().long().clamp_min(1))
        kept, logits, order = self.run_layers(s, e, processing, masked, target, m > target)
        self.progress = torch.maximum(self.progress, last(kept))
        if cfg.focus_delayed:                                        # from the tokens before this step's commits
            ready = ~masked & torch.cat([~masked[:, 1:], torch.ones(B, 1, dtype=torch.bool)], 1)
            self.uncached &= ~ready
        canvas = self.forward.canvas
        device = canvas.device
        tokens, conf = predict(logits, temperature=cfg.temperature, measure=cfg.confidence, banned=(self.mask,),
                               generator=generator, softmax_dtype=authors_dtype(self.model, logits))
        candidate = (kept & masked & candidates).gather(1, order)
        chosen = select(conf, candidate.to(device), cfg, scheduled.to(device))
        positions = order + s
        pos_dev = positions.to(device)
        current = canvas.gather(1, pos_dev)
        canvas.scatter_(1, pos_dev, torch.where(chosen, tokens, current))
        packed = torch.stack([tokens.double(), conf.double(), chosen.double()]).cpu()      # the step's record
        chosen = packed[2].bool()
        self.decoded += chosen.sum(1).float()
        self.steps += chosen.any(1).long()
        return positions, packed[0].long(), packed[1], chosen, torch.zeros_like(chosen)

    def run_layers(self, s: int, e: int, processing, masked, target, evict):
        """The step's forward (docs 2). Returns kept (B, L), logits (B, n, V) at `order` (B, n): the
        block offsets of each row's kept masks first, then others (distinct, for the commit)."""
        model, cache, canvas, blocks = self.model, self.cache, self.forward.canvas, self.model.blocks
        focus, last_layer = bool(evict.any()), len(blocks) - 1
        slots = self.slots(s, e, processing)
        x = model.embed(canvas.gather(1, slots.index))                                   # (B, S, d)
        cos, sin = self.tables(slots, x)
        pos = in_order(masked & processing)                                              # (B, M) block offsets
        valid = (masked & processing).gather(1, pos)
        rows = row_in(processing, pos).to(x.device)
        scores = [None, None]
        if focus:                                   # layers 0 and 1's importance of P's masks, from their q/k
            cache.tap = lambda layer, q, k: scores.__setitem__(layer, importance(q, k, rows, valid)) if layer < 2 else None
        try:
            x = blocks[0](x, cos, sin, self.keys(s, last(processing)), cache, 0, slots)
            kept = processing
            if focus:                               # layer 1 with one output row: its q/k, and P's K/V stored
                blocks[1](x, cos, sin, self.keys(s, last(processing)), cache, 1, slots,
                          torch.zeros(x.shape[0], 1, dtype=torch.long, device=x.device))
                work = torch.promote_types(scores[1].dtype, torch.float32)
                delta = scores[1].cpu().to(work) - scores[0].cpu().to(work)
                chosen = choose(delta, valid, pos, target, evict, self.progress)
                kept = processing & ~masked
                kept.scatter_(1, pos, kept.gather(1, pos) | chosen)
        finally:
            cache.tap = None
        order = in_order(kept & masked)                                                  # the logits' offsets
        keys = self.keys(s, last(kept))
        width = slots.index.shape[1]                # P's slots (filler included): layers 0 and 1 run them
        if last_layer == 1:                         # layer 1 is the last: outputs at the logits' rows only
            x = blocks[1](x, cos, sin, keys, cache, 1, slots, row_in(processing, order).to(x.device))
        else:                                       # layer 1's outputs for K only, then K alone
            x = blocks[1](x, cos, sin, keys, cache, 1, slots,
                          row_in(processing, in_order(kept)).to(x.device) if focus else None)
            if focus:
                slots = self.slots(s, e, kept)
                cos, sin = self.tables(slots, x)
            final = row_in(kept, order).to(x.device)
            for layer in range(2, last_layer + 1):
                x = blocks[layer](x, cos, sin, keys, cache, layer, slots, final if layer == last_layer else None)
        # pos/fwd (docs 5): the positions each layer computes keys/values for, averaged over the layers
        self.positions_run = (2 * width + (last_layer - 1) * slots.index.shape[1]) / (last_layer + 1)
        return kept, model.head(model.final_norm(x)), order

    def slots(self, s: int, e: int, wanted: torch.Tensor) -> Slots:
        """The slot set of the block offsets `wanted` (B, L): theirs first, then filler."""
        canvas = self.forward.canvas
        full = torch.zeros(canvas.shape, dtype=torch.bool)
        full[:, s:e] = wanted
        return Slots.of(full, canvas.device)

    def tables(self, slots: Slots, x: torch.Tensor):
        positions = self.cache.positions.to(x.device).gather(1, slots.index.to(x.device))
        return rotary_tables(positions, self.model.rotary_dim or self.model.head_dim, self.model.rope_theta, x.dtype)

    def keys(self, s: int, right: torch.Tensor) -> torch.Tensor:
        """(B, 1, 1, T): what a query of the block may attend to: its row's real tokens before the
        block and the block's offsets up to `right` (B,)."""
        B, T = self.cache.positions.shape
        allowed = torch.arange(T)[None, :] <= s + right[:, None]
        if self.cache.key_mask is not None:
            allowed &= self.cache.key_mask.reshape(B, T).cpu()
        return allowed[:, None, None, :].to(self.forward.canvas.device)


def last(wanted: torch.Tensor) -> torch.Tensor:
    """(B, L) -> (B,) the rightmost wanted offset of each row (-1: none)."""
    offsets = torch.arange(wanted.shape[1]).expand_as(wanted)
    return torch.where(wanted, offsets, -1).max(1).values
