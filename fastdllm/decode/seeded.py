"""The seeded block decoder: Nemotron-Labs Diffusion's `generate` (docs/specs/nemotron-diffusion.md §3).
Not a second engine: it plans the canvas, yields the same StepEvent / BlockEvent / Result as
mask_loop.Batch, and chooses with the rules table (threshold: C's `threshold`; fixed: its even schedule).

A causal prefill writes the prompt's K/V and its last logit gives the first block's first token
(the seed). Each block [s, e) = [seed, masks]: steps denoise the block bidirectionally against
the cache and commit masked positions by the rule; a row stops its block once a stop token stands
with no mask before it. Then one causal forward over the finished block writes its K/V and gives
the next block's seed (shown as the next block's step -1). Rows are independent: each decodes as it
would alone (the reference breaks a block for the whole batch when one row ends; we do not)."""

from __future__ import annotations

from typing import Iterator

import torch

from ..errors import UserError
from .canvas import answer_ended
from .config import DecodeConfig
from .decoder import Decoder
from .events import BlockEvent, StepEvent
from .rules import RULES
from .selection import block_schedule, predict, select
from .stepper import Stepper


def refuse(decoder: Decoder, cfg: DecodeConfig, holes, constraints) -> None:
    """One-line errors for what the seeded decoder does not combine with."""
    rule = RULES[cfg.rule]
    name = decoder.name
    for on, why in ((holes is not None, "cannot fill holes: its blocks follow the prompt"),
                    (bool(constraints) and any(constraints), "structured output is not wired to its decoder yet"),
                    (rule.renoise or rule.whole_canvas or rule.bound is not None,
                     f"rule {cfg.rule} is not one of its block rules (threshold, fixed, dynamic, factor, frechet, dinfer)"),
                    (cfg.cache != "prefix", f"cache {cfg.cache}: each block is decoded against the causal cache of "
                                            "the finished ones (use prefix)"),
                    (cfg.credit or cfg.prophet or cfg.dpad_window or cfg.edit_threshold is not None
                     or cfg.sub_block_len is not None, "credit, prophet, dpad, editing and sub-blocks are mask-loop options")):
        if on:
            raise UserError(f"{name}: {why}")


class SeededBatch(Stepper):
    """One batch's state; `events()` and `result()` as mask_loop.Batch."""

    def __init__(self, decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig, gen_lens: list[int] | None = None):
        super().__init__(decoder, prompts, cfg, gen_lens)
        self.canvas = self.plan_canvas()
        self.start_clock()
        self.cache = decoder.model.new_cache(self.canvas.valid.to(decoder.device))
        self.generator = torch.Generator(device=decoder.device).manual_seed(cfg.seed)

    # --- pieces ----------------------------------------------------------------------------------
    def _predict(self, logits: torch.Tensor):
        return predict(logits, temperature=self.cfg.temperature, measure=self.cfg.confidence,
                       banned=(self.decoder.specials.mask,), generator=self.generator)

    def _seed(self, a: int, b: int, block: int, rows: torch.Tensor) -> StepEvent:
        """Causal forward over [a, b) keeping its K/V; its last logit is the token at b for `rows`."""
        host, device = self.canvas.host, self.decoder.device
        with torch.inference_mode():
            logits = self.decoder.model.encode(host[:, a:b].to(device), a, self.cache)
            token, conf = self._predict(logits[:, None])
        token, conf = token.cpu(), conf.cpu()
        host[:, b] = torch.where(rows, token[:, 0], host[:, b])
        self.count(int(rows.sum()))
        at = torch.full((len(self.prompts), 1), b) - torch.tensor(self.canvas.starts)[:, None]
        return StepEvent(block, -1, self.nfe, (a, b), at, token, conf.double(), rows[:, None].clone())

    def _alive(self, s: int) -> torch.Tensor:
        """(B,) rows that decode the block at s: within their length, answer not ended."""
        canvas, specials = self.canvas, self.decoder.specials
        within = torch.tensor([s < end for end in canvas.ends])
        if not self.cfg.early_stop:
            return within
        return within & ~answer_ended(canvas, torch.tensor(specials.stops), specials.mask)

    # --- the loop --------------------------------------------------------------------------------
    def events(self) -> Iterator[StepEvent | BlockEvent]:
        cfg, canvas, model = self.cfg, self.canvas, self.decoder.model
        host, device, specials = canvas.host, self.decoder.device, self.decoder.specials
        stops, mask = torch.tensor(specials.stops), specials.mask
        starts = torch.tensor(canvas.starts)[:, None]
        s0 = canvas.blocks[0][0]
        alive = self._alive(s0)                                       # rows that decode the next block
        yield self._seed(0, s0, 0, alive)                             # the prefill gives the first seed
        for block, (s, e) in enumerate(canvas.blocks):
            active = alive.clone()               # a seed that is a stop still takes one step, as in C
            masked = (host[:, s:e] == mask) & active[:, None]
            schedule = block_schedule(masked.sum(1), cfg)              # (B, steps) the fixed rule's counts
            positions = torch.arange(s, e)[None, :].expand(len(self.prompts), -1) - starts
            for step in range(cfg.steps_per_block):
                candidates = (host[:, s:e] == mask) & active[:, None]
                if not bool(candidates.any()):
                    break
                with torch.inference_mode():
                    tokens, conf = self._predict(model.denoise(host[:, s:e].to(device), s, self.cache))
                    chosen = select(conf, candidates.to(device), cfg, schedule[:, step].to(device))
                tokens, conf, chosen = tokens.cpu(), conf.cpu(), chosen.cpu()
                host[:, s:e] = torch.where(chosen, tokens, host[:, s:e])
                self.count(int(chosen.sum()))
                yield StepEvent(block, step, self.nfe, (s, e), positions, tokens, conf.double(), chosen)
                active &= ~_ended_in_block(host[:, s:e], stops, mask)
            self.blocks_done += 1
            done = answer_ended(canvas, stops, mask)
            first = canvas.starts[0]
            yield BlockEvent(block, s - first, e - first, host[:, s:e].clone(), done)
            if block == len(canvas.blocks) - 1 or not bool((alive := self._alive(e)).any()):
                break
            yield self._seed(s, e, block + 1, alive)                  # the commit pass: K/V and the next seed


def _ended_in_block(block: torch.Tensor, stops: torch.Tensor, mask: int) -> torch.Tensor:
    """(B,) a stop token stands in the block with no mask before the first one (C's break test, per row)."""
    stop = torch.isin(block, stops)
    first = torch.where(stop.any(1), stop.long().argmax(1), block.shape[1])
    before = (block == mask) & (torch.arange(block.shape[1])[None, :] < first[:, None])
    return stop.any(1) & ~before.any(1)
