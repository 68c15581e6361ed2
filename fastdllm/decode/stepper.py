"""What every stepper shares (the mask loop, mask_loop.Batch, and the samplers of other families:
renoise, seeded, speculative, InDel, Steerling): its inputs, its counters, its clock, and the
Result it finishes with (`finish`). A stepper's `events()` yields StepEvent / BlockEvent; its
`result()` is the Result after them."""

from __future__ import annotations

import time
from typing import Iterator

import torch

from .canvas import Canvas, generated, plan
from .config import DecodeConfig
from .constraint import RowConstraints
from .decoder import Decoder
from .events import BlockEvent, Result, StepEvent, answer_ids, peak_memory, reset_peak_memory


class Stepper:
    """One batch's decoding state. Subclasses set `canvas` and `cache` (anything with `nbytes`) and
    call `start_clock()` where their timing starts (before the cache is built)."""

    canvas: Canvas
    cache: object
    started: float
    # The rows' structured-output matchers (the mask loop under a constraint), else None.
    constraint: RowConstraints | None = None

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

    def result(self, steps=None) -> Result:
        """Each row's answer: its region's tokens before the first end token (renoise, seeded,
        speculative, InDel; `steps`: a renoising sampler's record of its steps)."""
        region, specials = self.generated(), self.decoder.specials
        stops = torch.tensor(specials.stops)
        answers = [answer_ids(row[:g], stops, specials.mask) for row, g in zip(region, self.gen_lens)]
        return self.finish(answers, region, steps=steps)

    def finish(self, answers: list[list[int]], region: torch.Tensor, holes=None, steps=None) -> Result:
        """The Result of this finished stepper: its answers and region, counters, timings, memory."""
        canvas = self.canvas
        in_holes = sum(e - s for s, e in canvas.holes or ())      # infilling: the row's masks are no prompt
        peak, kind = peak_memory(self.decoder.device)
        return Result(
            ids=answers, texts=[self.decoder.detokenize(a) for a in answers],
            canvas=region, prompt_tokens=[len(p) - in_holes for p in self.prompts], nfe=self.nfe,
            committed=self.committed, edits=self.edits, blocks_decoded=self.blocks_done,
            early_stopped=self.blocks_done < len(canvas.blocks), seconds_first_step=self.first_step or 0.0,
            seconds_total=time.perf_counter() - self.started, peak_memory_bytes=peak, peak_memory_kind=kind,
            cache_bytes=self.cache.nbytes, config=self.cfg, batch=len(self.prompts), holes=holes, steps=steps)
