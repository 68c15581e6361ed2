"""The dispatch: `generate` runs the stepper of a model's decoder, `stepper` chooses it (with the
refusals of what that stepper does not combine with), `run` drains `generate`.

`generate` is a generator of typed events (StepEvent per forward, BlockEvent per finished block)
ending with a Result. It knows nothing about terminals; the CLI view, chat and bench consume it.
The steppers (stepper.Stepper) are the mask loop (mask_loop.Batch) and the samplers of other
families (renoise, seeded, speculative, indel, steerling).
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from ..errors import UserError
from .cache_modes import CACHE_MODES
from .combinations import refuse_family
from .config import DecodeConfig
from .constraint import Compiled
from .decoder import Decoder
from .events import BlockEvent, Event, Result, StepEvent  # noqa: F401  (re-exported: engine's events)
from .mask_loop import Batch, infill_canvas, refuse_constrained  # noqa: F401  (re-exported)
from .split_head import refuse as refuse_split


def generate(decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig,
             gen_lens: list[int] | None = None, holes: list[tuple[int, int]] | None = None,
             constraints: list[Compiled | None] | None = None) -> Iterator[Event]:
    """Decode `prompts` (token id lists of any lengths, one batch) under `cfg`; `gen_lens`: each
    row's own length (whole blocks, at most cfg.gen_len; default cfg.gen_len for every row).
    Infilling: one prompt holding mask ids at `holes` (infill.Filling), which alone are decoded.
    `constraints`: per row, its structured-output constraint or None (constraint.py)."""
    batch = stepper(decoder, prompts, cfg, gen_lens, holes, constraints=constraints)
    width = 0
    for event in batch.events():
        width += event.width if isinstance(event, StepEvent) else 0
        yield event
    result = batch.result()
    result.positions_run = width
    yield result


def stepper(decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig, gen_lens: list[int] | None = None,
            holes: list[tuple[int, int]] | None = None, generators: list[torch.Generator] | None = None,
            constraints: list[Compiled | None] | None = None):
    """The stepper of this model's decoder, with the same events and result: the mask loop (Batch),
    or the renoising sampler (renoise.RenoiseBatch; `generators`: its rows' random streams to continue),
    or the seeded block decoder (seeded.SeededBatch, Nemotron-Labs Diffusion), or LLaDA2.2's InDel
    stepper (indel.InDelBatch)."""
    sampler = decoder.model.sampler
    refuse_split(decoder.model, cfg)            # split_head.py: what tensor parallel does not decode with
    if cfg.focus_alpha is not None:             # focus.py: block-causal mask decoders only
        refuse_family(decoder.model, decoder.name, "focus_alpha", UserError)   # combinations.FAMILY
    if CACHE_MODES[cfg.cache].features and not decoder.model.feature_cache:
        raise UserError(f"cache {cfg.cache}: built for LLaDA and Dream only (their blocks host the feature cache); "
                        f"{decoder.name} is refused")
    if sampler == "steerling":                  # Steerling's generate_full (decode/steerling.py)
        from .steerling import SteerlingBatch

        return SteerlingBatch(decoder, prompts, cfg, gen_lens, holes, constraints)
    if (cfg.variable_length or cfg.end_think_boost) and (sampler != "mask" or cfg.indel):
        raise UserError(f"variable_length and end_think_boost belong to the mask loop (iLLaDA's decoding); "
                        f"{decoder.name}'s decoder is another")
    if cfg.top_p != 1.0 or cfg.repetition_penalty != 1.0 or cfg.entropy_sampling:
        raise UserError(f"top_p, repetition_penalty and entropy_sampling belong to Steerling's sampler; "
                        f"{decoder.name} is not a Steerling model")
    if cfg.rule == "klass":
        refuse_family(decoder.model, decoder.name, "klass", UserError)      # combinations.FAMILY
    if sampler == "seeded":
        from .seeded import SeededBatch, refuse
        from .speculative import SpeculativeBatch

        refuse(decoder, cfg, holes, constraints)
        return (SeededBatch if cfg.mode == "diffusion" else SpeculativeBatch)(decoder, prompts, cfg, gen_lens)
    if cfg.mode != "diffusion":
        raise UserError(f"mode {cfg.mode}: {decoder.name} decodes by diffusion only (ar and self_spec are "
                        f"Nemotron-Labs Diffusion's decoders)")
    if cfg.indel:
        if holes is not None or (constraints and any(constraints)):
            raise UserError("indel moves tokens inside a block: not combined with infilling or structured output")
        from .indel import InDelBatch

        return InDelBatch(decoder, prompts, cfg, gen_lens)
    if sampler != "renoise":
        return Batch(decoder, prompts, cfg, gen_lens, holes, constraints)
    if constraints and any(constraints):
        raise UserError(f"structured output: {decoder.name} rewrites every position every step, so no prefix "
                        f"stays for a grammar to check (use a mask-decoding model)")
    if cfg.credit:
        raise UserError(f"credit accumulates over a masked block's steps; {decoder.name} resamples whole canvases")
    if CACHE_MODES[cfg.cache].delayed:
        raise UserError(f"cache {cfg.cache} caches decoded tokens; {decoder.name} rewrites every position every step")
    if cfg.prophet or cfg.dpad_window:
        raise UserError(("prophet commits masked positions early" if cfg.prophet else "dpad drops masked suffix slots")
                        + f"; {decoder.name} resamples whole canvases")
    if cfg.edit_threshold is not None:
        raise UserError(f"{decoder.name} resamples whole canvases; token editing belongs to mask decoding (LLaDA2.x)")
    if holes is not None:
        raise UserError(f"{decoder.name} cannot fill holes: it resamples whole canvases after the text")
    from .renoise import RenoiseBatch

    return RenoiseBatch(decoder, prompts, cfg, gen_lens, generators)


def run(decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig,
        on_event: Callable[[StepEvent | BlockEvent], None] | None = None,
        holes: list[tuple[int, int]] | None = None, constraints: list[Compiled | None] | None = None) -> Result:
    """Drain `generate`, passing step and block events to `on_event`; return the Result."""
    for event in generate(decoder, prompts, cfg, holes=holes, constraints=constraints):
        if isinstance(event, Result):
            return event
        if on_event is not None:
            on_event(event)
    raise RuntimeError("generate ended without a result")
