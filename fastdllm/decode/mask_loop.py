"""The mask loop (engine.stepper's default): the block loop over a masked canvas, where each step
recomputes the cache mode's span (cache_modes.py) and decides one step (step.py, with the
accelerators plugged in, accelerators/; or FOCUS's own step, focus.py; or, where device_step.py
applies, by default on CUDA graphs, the whole step on the device, as one graph).

Logits are asked for only at the block's still-masked positions (on a GPU, where CUDA graphs
need static shapes, at every position of the block; see graphs.py). The loop keeps a host copy of
the canvas, so the candidates and the end of a block are known without asking the device; each
step does exactly one device-to-host transfer (the step's tokens, confidences and decisions).
"""

from __future__ import annotations

from typing import Iterator

import torch

from ..errors import UsageError, UserError
from ..models.feature_cache import FeatureCache
from ..models.kv_cache import Slots
from .accelerators.constraint import Constraint
from .accelerators.credit import Credit
from .accelerators.end_think import EndThink
from .accelerators.klass import Klass
from .accelerators.prophet import ProphetStop
from .batch_invariant import make_batch_invariant
from .cache_modes import CACHE_MODES, span_for
from .canvas import answer_ended, plan_infill
from .combinations import refuse_family, refuse_pairs
from .config import DecodeConfig
from .constraint import Compiled, RowConstraints
from .credit import CreditTrace
from .decoder import Decoder
from .device_step import DeviceStep
from .editing import BlockRows, refuse_partial_routing
from .events import BlockEvent, Result, StepEvent, answer_ids
from .focus import Focus
from .graphs import SpanForward
from .growing import EndThinkBoost, GrowingCanvas
from .klass import KlassTrace
from .prophet import Prophet
from .rules import RULES
from .selection import block_schedule, sub_block
from .step import complete_block, decode_step
from .stepper import Stepper
from .suffix_dropout import SuffixDropout


class Batch(Stepper):
    """One batch's decoding state: the canvas (host copy and device copy), the cache, the counters.
    `events()` runs the block loop; a consumer may stop iterating at any BlockEvent (the server
    does, to let rows leave and join: the rows' prompts plus `generated()` so far, with the rest
    of their lengths, plan the next batch)."""

    def __init__(self, decoder: Decoder, prompts: list[list[int]], cfg: DecodeConfig,
                 gen_lens: list[int] | None = None, holes: list[tuple[int, int]] | None = None,
                 constraints: list[Compiled | None] | None = None):
        super().__init__(decoder, prompts, cfg, gen_lens)
        model, specials = decoder.model, decoder.specials
        # constraint.py: the rows' grammar matchers, met at each row's frontier (None: no row has one)
        self.constraint = (RowConstraints(constraints, specials.stops)
                           if constraints and refuse_constrained(cfg, holes, constraints, len(prompts)) else None)
        if RULES[cfg.rule].renoise:
            raise UserError(f"rule {cfg.rule} belongs to renoising samplers; {decoder.name} commits masked positions")
        self.causal = model.attention.causal
        if CACHE_MODES[cfg.cache].delayed and self.causal:
            raise UserError(f"cache {cfg.cache} delays caching of decoded tokens under bidirectional attention; "
                            f"{decoder.name}'s finished blocks are already final (use prefix)")
        for method, asked in (("edit_threshold", cfg.edit_threshold is not None), ("dpad", bool(cfg.dpad_window)),
                              ("batch_invariant", cfg.batch_invariant)):
            if asked:
                refuse_family(model, decoder.name, method, UserError)       # combinations.FAMILY
        refuse_partial_routing(decoder, cfg)
        if holes is not None:
            if len(prompts) != 1 or gen_lens is not None:
                raise ValueError("infilling decodes one template row at a time")
            self.canvas = infill_canvas(decoder, prompts[0], holes, cfg)
        else:
            self.canvas = self.plan_canvas(self.causal)
        if (why := model.padded_batch_refusal) and not bool(self.canvas.valid.all()):
            raise UserError(why)                        # a family decoded one unpadded row at a time (iLLaDA)
        # prophet.py: Prophet's stop test; it writes the answer anchors into the canvas now
        self.prophet = Prophet(cfg, decoder, self.canvas, self.causal, holes is not None) if cfg.prophet else None
        device = decoder.device
        self.start_clock()
        self.cache = model.new_cache(self.canvas.valid.to(device), block=cfg.block_len if self.causal else None,
                                     keep_kv=self.causal or CACHE_MODES[cfg.cache].keeps_kv
                                     or bool(cfg.dpad_window or cfg.variable_length))
        # suffix_dropout.py: DPad's kept suffix, laid out in the cache at every block start (spans end at E)
        self.dpad = cfg.dpad_window and SuffixDropout(cfg, self.canvas, self.cache, bool(holes))
        # growing.py: variable_length, nothing after the block (spans and keys end at its end)
        self.growing = cfg.variable_length and GrowingCanvas(self.canvas, self.cache, decoder.name, self.causal,
                                                             holes is not None)
        # growing.py: iLLaDA's end-of-thinking boost, planned on the host canvas before each forward
        self.boost = EndThinkBoost.of(cfg, decoder, self.canvas.starts) if cfg.end_think_boost else None
        self.forward = SpanForward.for_model(model, self.canvas.host.to(device), self.cache, widen=not self.causal)
        # focus.py: FOCUS's per-block state and its step (the forward keeps a block's likely masks only)
        self.focus = Focus(cfg, decoder, self.forward, self.cache) if cfg.focus_alpha is not None else None
        if cfg.batch_invariant:                     # batch_invariant.py: each row as it is decoded alone
            make_batch_invariant(self.forward, cfg, self.canvas.valid, decoder.name)
        if CACHE_MODES[cfg.cache].features:
            self.cache.features = feature_cache(cfg, self.canvas, holes)
            self.forward.graphs = False     # its layers branch on the host's step count: eager forwards
        # credit.py: CreditDecoding's per-block credit, (B, L, V)
        self.credit = CreditTrace(cfg, len(prompts), model.config.vocab_size) if cfg.credit else None
        # klass.py: KLASS's KL history of the active block, (B, L, V), and the next block's look-ahead
        self.klass = KlassTrace(cfg, len(prompts), model.config.vocab_size) \
            if cfg.rule == "klass" else None
        # accelerators/: the methods plugged into the host-planned step, in their hooks' order
        self.accelerators = [a for a in (self.klass and Klass(self.klass), self.prophet and ProphetStop(self.prophet),
                                         self.boost and EndThink(self.boost), self.credit and Credit(self.credit),
                                         self.constraint and Constraint(self.constraint)) if a]

    def events(self) -> Iterator[StepEvent | BlockEvent]:
        cfg, canvas, specials = self.cfg, self.canvas, self.decoder.specials
        host, B, T, causal = canvas.host, len(self.prompts), canvas.length, self.causal
        device = self.decoder.device
        banned = (specials.mask,)                                     # never predicted (host ints)
        delayed, upcoming, shift = CACHE_MODES[cfg.cache].delayed, None, self.decoder.model.logit_shift   # dkv
        stops = torch.tensor(specials.stops)
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
        starts = torch.tensor(canvas.starts)[:, None]
        rel = lambda positions: positions - starts                       # noqa: E731  generation-relative
        ended = lambda: answer_ended(canvas, stops, specials.mask)        # noqa: E731  (B,) bool

        def store(s: int, e: int, block: int) -> StepEvent:
            """A block-causal store pass over the finished span [s, e), as a step (step -1) of `block`."""
            with torch.inference_mode():
                at, tokens, chosen = complete_block(self.forward, self.decoder.model, host, s, e, specials.mask,
                                                    self.constraint)
            self.nfe, self.committed = self.nfe + 1, self.committed + int(chosen.sum())
            return StepEvent(block, -1, self.nfe, (s, e), rel(at), tokens, chosen.double(), chosen)

        stopped, fast = False, self.forward.device_step and DeviceStep.applies(cfg, causal) \
            and not (self.accelerators or self.focus)                   # host path
        if canvas.prefill:                                              # the blocks before the first decoded one
            yield store(0, canvas.prefill, 0)
        for block, (s, e) in enumerate(canvas.blocks):
            if causal and cfg.early_stop and bool(ended().all()):      # a store pass committed the stop, at
                first = max(s, canvas.starts[0])                        # this block's first position: the
                yield BlockEvent(block, first - canvas.starts[0], e - canvas.starts[0],  # block ends the answer
                                 host[:, first:e].clone(), ended())     # (a consumer that stops at blocks sees it)
                break
            end = (self.dpad.block(s, e) if self.dpad else               # DPad: spans end at its E;
                   self.growing.block(s, e) if self.growing else T)       # variable_length: at e
            counted = torch.full((B,), cfg.block_len) if causal else (host[:, s:e] == specials.mask).sum(1)
            schedule = block_schedule(counted, cfg)
            on_device = DeviceStep(self.forward, cfg, s, e, specials.mask, banned, generator) if fast else None
            rows, step = BlockRows(B, cfg), 0                           # editing.py: who takes the next step
            for a in self.accelerators:
                a.start_block(block, canvas.blocks)
            while rows.begin(block_masked := host[:, s:e] == specials.mask):
                # dkv: the set the next step recomputes, from the canvas before this step commits
                pending, upcoming = upcoming, delayed and Slots.delayed(host == specials.mask, shift, device)
                if on_device is not None:                               # device_step.py: decided on the device
                    span = span_for(cfg, step, s, e, end, pending=pending)
                    with torch.inference_mode():
                        positions, tokens, conf, chosen = on_device(span)
                    edited = torch.zeros_like(chosen)
                else:                                                   # planned here, decided there
                    candidates, sub = sub_block(block_masked & rows.live[:, None], cfg.sub_block_len, s, host,
                                                specials.mask)
                    span = span_for(cfg, step, s, e, end, causal=causal, sub=sub, pending=pending)
                    scheduled = schedule[:, min(step, cfg.steps_per_block - 1)]
                    editable = rows.editable(host, s, e, canvas.starts, canvas.ends, specials.mask)
                    for a in self.accelerators:
                        a.plan(host, span, step, self.nfe + 1)
                    with torch.inference_mode():
                        positions, tokens, conf, chosen, edited = self.focus.step(
                            step, host, s, e, candidates, scheduled, generator) if self.focus else decode_step(
                            self.forward, span, candidates, s, scheduled, cfg, banned, generator, editable,
                            self.accelerators)
                wrote = chosen | edited                                  # commits (M2T) and edits (T2T)
                host.scatter_(1, positions, torch.where(wrote, tokens, host.gather(1, positions)))
                rows.end(wrote, edited)
                self.count(int(chosen.sum()))
                self.edits += int(edited.sum())
                yield StepEvent(block, step, self.nfe, span, rel(positions), tokens, conf, chosen, edited=edited,
                                positions_run=self.focus.positions_run if self.focus else None)
                step += 1
                if causal and cfg.early_stop and not rows.editing and bool(ended().all()):
                    stopped = True                                      # nothing before the stops can change
                    break                                               # (an edit still could: block end)
            self.blocks_done += 1
            done = ended()                                              # (B,) the answer ended here or before
            first = max(s, canvas.starts[0])                            # row 0's generated part of the block
            yield BlockEvent(block, first - canvas.starts[0], e - canvas.starts[0], host[:, first:e].clone(), done)
            if stopped or (cfg.early_stop and bool(done.all())) or block == len(canvas.blocks) - 1:
                break
            if causal and not rows.fresh:                               # store the finished block's K/V
                yield store(s, e, block + 1)                            # (unless its last forward saw it final)

    def result(self) -> Result:
        specials, canvas = self.decoder.specials, self.canvas
        region = self.generated()
        stops = torch.tensor(specials.stops)
        if canvas.holes:                    # infilling: each hole up to its end token, joined
            fills = [canvas.host[0, s:e] for s, e in canvas.holes]
            holes = [[f.tolist() for f in fills]]
            answers = [[t for f in fills for t in answer_ids(f, stops, specials.mask)]]
        else:
            holes = None
            answers = [answer_ids(row[:g], stops, specials.mask) for row, g in zip(region, self.gen_lens)]
        result = self.finish(answers, region, holes=holes)
        if self.constraint is not None:
            result.complete, result.matcher_seconds = self.constraint.complete(answers), self.constraint.seconds
            result.constraint_errors = list(self.constraint.errors)
        return result


def refuse_constrained(cfg: DecodeConfig, holes, constraints: list, rows: int) -> bool:
    """Whether any row is constrained; UserError (one line) for what cannot honour a constraint."""
    if len(constraints) != rows:
        raise ValueError(f"{len(constraints)} constraints for {rows} rows")
    if not any(c is not None for c in constraints):
        return False
    if holes is not None:
        raise UsageError("structured output: not combined with infilling (the text after a hole is not part of the "
                         "sentence; docs/specs/structured-output.md)")
    refuse_pairs(cfg, "structured", UsageError)
    return True


def feature_cache(cfg: DecodeConfig, canvas, holes) -> FeatureCache:
    """dLLM-Cache's state for this generation: the canvas splits at the prompts' common end."""
    if holes is not None:
        raise UserError(f"cache {cfg.cache} splits the canvas into prompt and answer; infilling's holes lie inside "
                        f"the text")
    assert len(set(canvas.starts)) == 1, "left-padded canvas: one prompt end for every row"
    return FeatureCache(canvas.starts[0], cfg.prompt_interval, cfg.gen_interval, cfg.transfer_ratio)


def infill_canvas(decoder: Decoder, row: list[int], holes: list[tuple[int, int]], cfg: DecodeConfig):
    """The canvas of one template row (canvas.plan_infill), with this model's refusals."""
    model = decoder.model
    return plan_infill(row, holes, cfg, mask=decoder.specials.mask, context_length=decoder.context_length,
                       causal=model.attention.causal, shifted=bool(model.logit_shift), name=decoder.name)
