"""Prophet (pixeli99/Prophet `generate_earlyexit.py` with `eval_llada.py`, read at 460afe4;
docs/accelerators/prophet.md 3): early answer commit, a stop test read by the engine.

Anchors (`answer_anchor`, their `constraints_text`, e.g. "200:The|201:answer|202:is"): each
`pos:word` is encoded as " " + word without special tokens and written at generation offsets pos,
pos + 1, ... before the first step; they are never masks, so no step changes them and a block's
schedule counts its masks only. The answer region is the `answer_tokens` slots from two after the
last anchor token (their `max + 2`), clipped at the row's end.

A *check step* is one whose forward recomputes the whole canvas (every step with cache none;
with prefix/dual a block's first step and every `refresh_every`): only its logits outside the
active block are fresh. It asks the forward for logits at the block's candidates, the answer
region and every other mask of the row (`Check.widen`), then per row:

    gap      top-1 minus top-2 of the raw logits over the full vocabulary (the mask id included),
             in the logits' dtype, at each answer slot (masked or not); mean in float64
    phase    progress = scheduled rules: (b * S + i + 1) / total_steps (their global step, block b,
             step i); adaptive rules: (masks decided before this step + 1) / the row's masks
    exit     mean gap >= prophet_early if progress < 0.33, prophet_mid if < 0.67, else prophet_late

A row that exits (and has candidates this step) takes this step's prediction (the mask id banned)
at every remaining mask of its canvas, in every block, so it has nothing left to decode: the
engine's early stop sees it as finished. Rows are independent (theirs examines row 0 only).
"""

from __future__ import annotations

import torch

from ..errors import UserError
from .config import parse_anchor
from .rules import RULES
from .selection import predict


def anchor_tokens(text: str, encode) -> dict[int, int]:
    """Generation offset -> token id, as their _parse_constraints (a later word wins an overlap)."""
    tokens = {}
    for pos, word in parse_anchor(text):
        for i, token in enumerate(encode(" " + word)):
            tokens[pos + i] = token
    return tokens


def threshold(cfg, progress: float) -> float:
    """Their should_early_exit: the gap the answer must reach at this share of the decoding."""
    return cfg.prophet_early if progress < 0.33 else cfg.prophet_mid if progress < 0.67 else cfg.prophet_late


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    """(B, K, V) -> (B, K) float64: top-1 minus top-2 over the full vocabulary, taken in the logits' dtype."""
    top = logits.topk(2, dim=-1).values
    return (top[..., 0] - top[..., 1]).double()


class Prophet:
    """A batch's anchors, answer regions and mask counts; `check` makes a check step's test."""

    def __init__(self, cfg, decoder, canvas, causal: bool, infilling: bool):
        if causal:
            raise UserError(f"prophet fills every later block from one forward; {decoder.name} decodes blocks "
                            f"causally, one after another")
        if infilling:
            raise UserError("prophet measures an answer after an anchor; a template with holes has none")
        if decoder.encode is None:
            raise UserError(f"prophet: {decoder.name} has no tokenizer to encode answer_anchor with")
        self.cfg, self.mask, self.canvas = cfg, decoder.specials.mask, canvas
        anchors = anchor_tokens(cfg.answer_anchor, decoder.encode)
        host, B, T = canvas.host, canvas.host.shape[0], canvas.length
        at = torch.arange(T)[None, :]
        starts, ends = torch.tensor(canvas.starts)[:, None], torch.tensor(canvas.ends)[:, None]
        self.inside = (at >= starts) & (at < ends)                      # (B, T) each row's generated region
        for offset, token in anchors.items():                          # written once; never masks again
            for row in range(B):
                if canvas.starts[row] + offset < canvas.ends[row]:
                    host[row, canvas.starts[row] + offset] = token
        first = max(anchors) + 2                                         # their answer_start
        self.region = self.inside & (at >= starts + first) & (at < starts + first + cfg.answer_tokens)   # (B, T)
        self.masks = ((host == self.mask) & self.inside).sum(1)         # (B,) the masks to decode
        self.exited = torch.zeros(B, dtype=torch.bool)                  # (B,) rows that took the exit
        self.exit_nfe = [None] * B                                      # per row: the forward it exited at

    def check(self, host: torch.Tensor, span: tuple[int, int], block: int, step: int, nfe: int) -> "Check | None":
        """The test of this step (block `block`, its step `step`), or None if its forward is not fresh
        outside the block (a cached step). nfe: this forward's number."""
        cfg = self.cfg
        if span != (0, self.canvas.length):
            return None
        masked = (host == self.mask) & self.inside                       # (B, T)
        if RULES[cfg.rule].scheduled:                                    # their global_step / steps
            progress = [(block * cfg.steps_per_block + step + 1) / cfg.total_steps] * host.shape[0]
        else:                                                           # the share decided, one step ahead
            decided = self.masks - masked.sum(1)
            progress = ((decided + 1).double() / self.masks.clamp_min(1).double()).tolist()
        bar = torch.tensor([threshold(cfg, p) for p in progress], dtype=torch.float64)
        return Check(self, masked, bar, nfe)


class Check:
    """One check step: widen the slots asked for, test the gaps, fill an exiting row."""

    def __init__(self, prophet: Prophet, masked: torch.Tensor, bar: torch.Tensor, nfe: int):
        self.prophet, self.masked, self.bar, self.nfe = prophet, masked, bar, nfe

    def widen(self, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, K) of the block's slots -> (B, K + X): then the answer region and every
        other mask of the row (X: the most any row needs), padded with distinct slots never written."""
        B, T = self.masked.shape
        wanted = self.masked | self.prophet.region
        asked = torch.zeros_like(wanted).scatter_(1, positions, True)
        wanted &= ~asked
        key = torch.where(wanted, 0, torch.where(asked, 2, 1)).to(torch.int8)   # wanted first, then filler
        extra = torch.argsort(key, dim=1, stable=True)[:, :int(wanted.sum(1).max())]
        self.width = positions.shape[1]
        self.fill_at = self.masked.gather(1, extra)                      # (B, X) the masks among them
        self.answer = self.prophet.region.gather(1, torch.cat([positions, extra], 1))   # (B, K + X)
        return torch.cat([positions, extra], 1)

    def test(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, K + X, V) -> the block's (B, K, V); keeps the others and each row's verdict."""
        device = logits.device
        answer = self.answer.to(device)
        gap = torch.where(answer, top2_gap(logits), 0.0)
        mean = gap.sum(1) / answer.sum(1).clamp_min(1)                   # float64 mean over the region
        self.passed = answer.any(1) & (mean >= self.bar.to(device))      # (B,) no region: never
        self.gap = mean
        self.rest = logits[:, self.width:]
        return logits[:, :self.width]

    def fill(self, tokens, conf, chosen, candidate, cfg, banned, generator):
        """A row that passed and decodes this step commits every candidate of the block and every
        other mask of its canvas, with this step's prediction. All (B, K) -> (B, K + X)."""
        exiting = self.passed & candidate.any(1)                         # (B,) on the logits' device
        chosen = chosen | (candidate & exiting[:, None])
        take = self.fill_at.to(chosen.device) & exiting[:, None]         # (B, X)
        rest = torch.zeros(take.shape, dtype=tokens.dtype, device=tokens.device)
        if bool(take.any()):                                              # predicted only when used
            rest = predict(self.rest, temperature=cfg.temperature, measure="prob", banned=banned,
                           generator=generator)[0]
        state = self.prophet
        for row in exiting.nonzero()[:, 0].tolist():
            state.exited[row], state.exit_nfe[row] = True, self.nfe
        return (torch.cat([tokens, rest], 1), torch.cat([conf, torch.zeros_like(rest, dtype=conf.dtype)], 1),
                torch.cat([chosen, take], 1))
