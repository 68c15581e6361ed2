"""What every stepper shares (the mask loop, mask_loop.Batch, and the samplers of other families:
renoise, seeded, speculative, InDel, Steerling): its inputs, its counters, its clock, and the
interface events.finish_result reads. A stepper's `events()` yields StepEvent / BlockEvent; its
`result()` is the Result after them."""

from __future__ import annotations

import time
from typing import Iterator

import torch

from .canvas import Canvas, generated, plan
from .config import DecodeConfig
from .decoder import Decoder
from .events import BlockEvent, Result, StepEvent, plain_result, reset_peak_memory


class Stepper:
    """One batch's decoding state. Subclasses set `canvas` and `cache` (anything with `nbytes`) and
    call `start_clock()` where their timing starts (before the cache is built)."""

    canvas: Canvas
    cache: object
    started: float

    def __init__(self, decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig,
                 gen_lens: list[int] | None = None):
        self.decoder, self.cfg, self.prompts = decoder, cfg, prompts
        self.gen_lens = gen_lens or [cfg.gen_len] * len(prompts)      # each row's own length
        self.nfe = self.committed = self.edits = self.blocks_done = 0  # edits: tokens overwritten (T2T)
        self.first_step: float | None = None                          # seconds to the first step's end

    def plan_canvas(self, causal: bool = False) -> Canvas:
        """The canvas of the prompts and their generation lengths (canvas.plan)."""
        decoder, specials = self.decoder, self.decoder.specials
        return plan(self.prompts, self.cfg, mask=specials.mask, pad=specials.pad, causal=causal,
                    context_length=decoder.context_length, gen_lens=self.gen_lens)

    def start_clock(self) -> None:
        """Peak memory and the clock start here."""
        reset_peak_memory(self.decoder.device)
        self.started = time.perf_counter()

    def count(self, committed: int) -> None:
        """One forward done, committing `committed` positions."""
        self.nfe += 1
        self.committed += committed
        self.stamp()

    def stamp(self) -> None:
        """The first step's time, once."""
        if self.first_step is None:
            self.first_step = time.perf_counter() - self.started

    def events(self) -> Iterator[StepEvent | BlockEvent]:
        raise NotImplementedError

    def generated(self) -> torch.Tensor:
        """(B, width): each row's generated region so far, from its first generated position."""
        return generated(self.canvas, self.decoder.specials.mask)

    def result(self) -> Result:
        """Each row's answer: its region's tokens before the first end token."""
        return plain_result(self, self.generated())
