"""One job's row as the scheduler decodes it: what it has decided so far (whole blocks, final),
what it costs, what its client has been sent; and which jobs may share a batch."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..decode.cache_modes import CACHE_MODES
from ..decode.canvas import block_end, on_grid
from ..decode.canvas import fits as canvas_fits
from ..decode.config import DecodeConfig
from ..decode.events import answer_ids
from ..units import plural
from .jobs import Failed, Finished, Job, StepUpdate, TextUpdate


def sampled(cfg: DecodeConfig) -> bool:
    """Draws from the generator: such a row would depend on its batch-mates."""
    return cfg.temperature > 0 or cfg.confidence == "random"


def whole_answer(cfg: DecodeConfig) -> bool:
    """Settings whose decisions read the whole answer, not one block: Prophet (its anchors sit at
    answer offsets, its phases count the answer's steps), DPad (each block's kept suffix is the
    next draw of one seeded stream) and blocks on the grid of a bidirectional family (the first
    holds the prompt's tail, the last ends with the answer), KLASS (a block's first steps read
    the KL history of the previous block's last forward) and dLLM-Cache (its refresh schedule counts
    the answer's forwards, its features split the canvas at the prompt's end). Such a job is planned
    once, with its own config. So is iLLaDA's end-think boost: its progress counts from the prompt's
    end over the whole answer's length."""
    return (cfg.prophet or cfg.dpad_window is not None or cfg.block_align == "grid" or cfg.rule == "klass"
            or CACHE_MODES[cfg.cache].features or bool(cfg.end_think_boost))


def alone(job: Job) -> bool:
    """Decoded in a batch of its own: a sampled job (its seed reproduces its answer), an infilling
    one (its canvas is its own: prompt, hole, suffix), a whole-answer one and a constrained one (its
    grammar matcher lives with its one batch, so it never re-plans)."""
    return sampled(job.cfg) or job.suffix is not None or whole_answer(job.cfg) or job.constraint is not None


def batch_key(job: Job) -> tuple:
    """Jobs with equal keys share a batch: the same settings per block (their lengths may differ);
    a whole-answer job's key is its own config."""
    cfg = job.cfg
    if whole_answer(cfg):
        return cfg, job.id
    per_block = replace(cfg, gen_len=cfg.block_len, steps=None if cfg.steps is None else cfg.steps_per_block,
                        seed=cfg.seed if sampled(cfg) else 0)
    return per_block, job.id if alone(job) else None


def config_for(key: tuple, gen_len: int) -> DecodeConfig:
    """The batch's config: the key's settings over gen_len (rounded up to whole blocks); a
    whole-answer job's own config (it is never re-planned: it is alone and runs to its end)."""
    per_block = key[0]
    if whole_answer(per_block):
        return per_block
    gen_len = block_end(gen_len, per_block.block_len)
    blocks = gen_len // per_block.block_len
    return replace(per_block, gen_len=gen_len, steps=None if per_block.steps is None else per_block.steps * blocks)


def fits(decoder, rows: list["Row"], key: tuple) -> bool:
    """The batch's canvas fits the model's context; a family decoded one row at a time (iLLaDA's
    `padded_batch_refusal`) takes no second row."""
    if len(rows) > 1 and decoder.model.padded_batch_refusal:
        return False
    cfg = config_for(key, max(r.remaining for r in rows))
    causal = decoder.model.attention.causal
    return canvas_fits([len(r.context) for r in rows], [_gen(r.remaining, cfg, causal) for r in rows],
                       cfg.block_len, causal, decoder.context_length, grid=on_grid(cfg, causal))


def _gen(remaining: int, cfg: DecodeConfig, causal: bool) -> int:
    return remaining if causal else block_end(remaining, cfg.block_len)


class Row:
    def __init__(self, job: Job, decoder):
        self.job, self.decoder = job, decoder
        cfg, n = job.cfg, len(job.prompt)
        causal = decoder.model.attention.causal
        self.region = block_end(n + cfg.gen_len, cfg.block_len) - n if causal else cfg.gen_len
        self.decided: list[int] = []         # generated tokens of finished blocks (final)
        self.base = 0                        # len(decided) when the current batch was planned
        self.nfe = self.committed = self.edits = self.rows_seen = 0
        self.first_forward: float | None = None
        self.sent = ""                       # text delivered so far
        self.finished = False
        self.generator = None                # a renoising model's random stream, kept across batches

    @property
    def context(self) -> list[int]:
        """What the next batch is planned with: the prompt and the finished blocks."""
        return self.job.prompt + self.decided

    def batch_args(self, rows: list["Row"], cfg: DecodeConfig) -> dict:
        """decode.engine.stepper's arguments (the decoder aside) for `rows` (this one first) under cfg;
        an infilling row is alone, its canvas the prompt, cfg.gen_len masks (its region) and the suffix."""
        from ..decode.renoise import row_generator

        suffix = self.job.suffix
        if suffix is None:
            for r in rows:                   # kept across batches; used by renoising models only
                r.generator = r.generator or row_generator(self.decoder.device, r.job.cfg.seed)
            constraints = [r.job.constraint for r in rows] if self.job.constraint is not None else None
            if constraints and (len(rows) != 1 or self.decided):
                raise RuntimeError("a constrained row is decoded alone, in one batch")
            return dict(prompts=[r.context for r in rows], cfg=cfg, gen_lens=[r.remaining for r in rows],
                        generators=[r.generator for r in rows], constraints=constraints)
        if len(rows) != 1 or self.decided:
            raise RuntimeError("an infilling row is decoded alone, in one batch")
        n = len(self.job.prompt)
        ids = self.job.prompt + [self.decoder.specials.mask] * self.region + suffix
        return dict(prompts=[ids], cfg=cfg, holes=[(n, n + self.region)])

    def batch(self, rows: list["Row"], cfg: DecodeConfig):
        """The stepper of `rows` (this one first) under cfg (batch_args)."""
        from ..decode.engine import stepper

        return stepper(self.decoder, **self.batch_args(rows, cfg))

    @property
    def remaining(self) -> int:
        """Tokens of the job's length still to come (the next batch's gen_len for this row)."""
        return self.job.cfg.gen_len - len(self.decided)

    def planned(self) -> None:
        self.base = len(self.decided)

    def stepped(self, event, i: int, rows: int) -> None:
        """A forward of the batch (row i of `rows`): counted if it decided positions of this row
        (committed masks or, with token editing, overwrote written tokens) or stored its
        keys/values (a block-causal store pass). An edit-only round that changes nothing (the
        end of a block under editing) is not counted."""
        chosen = event.committed[i]
        edited = event.edited[i] if event.edited is not None else torch.zeros_like(chosen)
        wrote = chosen | edited
        if event.step >= 0 and not bool(wrote.any()):
            return
        self.nfe += 1
        self.committed += int(chosen.sum())
        self.edits += int(edited.sum())
        self.rows_seen += rows
        if self.first_forward is None:
            self.first_forward = time.perf_counter()
        if self.job.steps and bool(wrote.any()):           # an edited position is sent again, its new token
            at = event.positions[i][wrote] + self.base
            keep = at >= 0
            self.job.deliver(StepUpdate(at[keep].tolist(), event.tokens[i][wrote][keep].tolist()))

    def block_done(self, region: torch.Tensor, upto: int, cancelled: bool, metrics=None,
                   failure: str | None = None) -> None:
        """A block finished: `region` is this row's generated region in the batch, final up to
        `upto`. Delivers the new text, and Finished when the answer is complete; Failed (400) where
        the row's grammar matcher failed (`failure`: why), which ended the answer there."""
        self.decided = self.decided[:self.base] + region[:max(0, min(upto, self.region - self.base))].tolist()
        if cancelled:
            self.finished = True             # the client is gone: nothing more is delivered
            return
        text, ids, ended, cut = self._answer()
        if failure is not None:
            self.finished = True
            self.job.deliver(Failed(400, f"structured output: the grammar matcher failed after "
                                         f"{plural(len(ids), 'token')} of the answer ({failure}); a simpler "
                                         f"constraint may fit its limits", code="constraint_failed"))
            return
        done = (ended and self.job.cfg.early_stop) or cut is not None or len(self.decided) >= self.region
        self._send(text, final=done)
        if done:
            self.finished = True
            complete = ended or cut is not None
            if self.job.constraint is not None:        # a constrained answer is complete only as a sentence
                complete = self.job.constraint.accepts(ids)
            self._finish(text, ids, "stop" if complete else "length", metrics)

    def abort(self, metrics=None) -> None:
        """The server stops before this answer is whole: the answer is what its finished blocks hold."""
        self.finished = True
        text, ids, _, _ = self._answer()
        self._send(text, final=True)
        self._finish(text, ids, "abort", metrics)

    def _answer(self) -> tuple[str, list[int], bool, int | None]:
        """(text, ids, an end token stands in it, where a stop string cut it) of the finished blocks."""
        stops = torch.tensor(self.decoder.specials.stops)
        window = torch.tensor(self.decided[:self.job.cfg.gen_len], dtype=torch.long)
        ids = answer_ids(window, stops, self.decoder.specials.mask)
        ended = len(ids) < len(window)
        text = self.decoder.detokenize(ids)
        cut = _first_stop(text, self.job.stop)
        if cut is not None:
            text, ids = text[:cut], _ids_for(text[:cut], ids, self.decoder.detokenize)
        return text, ids, ended, cut

    def _send(self, text: str, *, final: bool) -> None:
        """Deliver the text beyond what was sent. Until the end, hold back what may still turn out
        to start a stop string, or an incomplete character."""
        hold = 0 if final else max((len(s) - 1 for s in self.job.stop), default=0)
        ready = text[:len(text) - hold] if hold else text
        if not final:
            ready = ready.rstrip("\ufffd")
        if ready.startswith(self.sent) and len(ready) > len(self.sent):
            self.job.deliver(TextUpdate(ready[len(self.sent):]))
            self.sent = ready

    def _finish(self, text: str, ids: list[int], reason: str, metrics) -> None:
        now = time.perf_counter()
        first = self.first_forward or now
        result = Finished(
            text=text, ids=ids, finish_reason=reason, prompt_tokens=len(self.job.prompt) + len(self.job.suffix or ()),
            completion_tokens=len(ids), nfe=self.nfe, committed=self.committed, edits=self.edits,
            seconds=now - self.job.submitted, queued_seconds=first - self.job.submitted,
            mean_batch=self.rows_seen / max(self.nfe, 1))
        if metrics:
            metrics.finished(result)
        self.job.deliver(result)


def _first_stop(text: str, stops: tuple[str, ...]) -> int | None:
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else None


def _ids_for(text: str, ids: list[int], detokenize) -> list[int]:
    """The shortest prefix of `ids` whose text covers `text` (the answer cut at a stop string)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(detokenize(ids[:mid])) >= len(text):
            hi = mid
        else:
            lo = mid + 1
    return ids[:lo]
