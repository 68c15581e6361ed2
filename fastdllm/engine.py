"""The block loop: the only place that iterates over blocks and steps.

`generate` is a generator of typed events (StepEvent per forward, BlockEvent per finished block)
ending with a Result. It knows nothing about terminals; the CLI view, chat and bench consume it.

Per step the span to recompute is the cache mode's choice:

    mode     first step of a block (and every refresh_every steps)   other steps
    none     [0, T)                                                   [0, T)
    prefix   [0, T)                                                   [block_start, T)
    dual     [0, T)                                                   [block_start, block_end)

Logits are asked for only at the block's still-masked positions (on a GPU, where CUDA graphs
need static shapes, at every position of the block; see graphs.py). The engine keeps a host copy of
the canvas, so the candidates are known without asking the device; each step does exactly one
device-to-host transfer (the step's tokens, confidences and decisions).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Union

import torch

from .config import DecodeConfig
from .decoding import fixed_schedule, predict, select
from .errors import UserError
from .graphs import SpanForward
from .loading import LoadedModel


@dataclass(frozen=True)
class StepEvent:
    block: int
    step: int                   # step inside the block
    nfe: int                    # forwards so far, this one included
    span: tuple[int, int]       # canvas span recomputed (a full refresh when it starts at 0)
    positions: torch.Tensor     # (B, K) generation-relative positions that were candidates
    tokens: torch.Tensor        # (B, K) predicted tokens
    confidences: torch.Tensor   # (B, K)
    committed: torch.Tensor     # (B, K) bool: the candidates committed this step


@dataclass(frozen=True)
class BlockEvent:
    block: int
    start: int                  # generation-relative [start, end)
    end: int
    tokens: torch.Tensor        # (B, block_len) the finished block
    ended: torch.Tensor         # (B,) bool: the answer has ended in this block or before


@dataclass
class Result:
    ids: list[list[int]]        # per row: the answer, up to (not including) its end token
    texts: list[str]
    canvas: torch.Tensor        # (B, gen_len) everything decoded (mask ids where early stop skipped)
    prompt_tokens: list[int]
    nfe: int
    committed: int              # positions committed, all rows
    blocks_decoded: int
    early_stopped: bool
    seconds_first_step: float
    seconds_total: float
    seconds_load: float
    peak_memory_bytes: int
    peak_memory_kind: str       # "cuda allocated" or "process RSS"
    cache_bytes: int
    config: DecodeConfig
    batch: int = field(default=1)

    @property
    def generated_tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)

    @property
    def tokens_per_forward(self) -> float:
        return self.committed / max(self.nfe * self.batch, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds_total if self.seconds_total > 0 else 0.0

    def to_dict(self) -> dict:
        """The figures of this run as plain data (row lists when batched)."""
        one = self.batch == 1
        return {
            "text": self.texts[0] if one else self.texts, "ids": self.ids[0] if one else self.ids,
            "prompt_tokens": self.prompt_tokens[0] if one else self.prompt_tokens,
            "generated_tokens": self.generated_tokens, "nfe": self.nfe,
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "timings": {"load_s": round(self.seconds_load, 4), "first_step_s": round(self.seconds_first_step, 4),
                        "total_s": round(self.seconds_total, 4)},
            "peak_memory_bytes": self.peak_memory_bytes, "peak_memory_kind": self.peak_memory_kind,
            "cache_bytes": self.cache_bytes, "early_stopped": self.early_stopped,
            "blocks_decoded": self.blocks_decoded, "config": self.config.to_dict(),
        }


Event = Union[StepEvent, BlockEvent, Result]


def generate(lm: LoadedModel, prompts: list[list[int]], cfg: DecodeConfig) -> Iterator[Event]:
    """Decode `prompts` (token id lists, any lengths: left-padded into one batch) under `cfg`."""
    model, specials = lm.model, lm.specials
    device = lm.device
    P, T = _check_lengths(lm, prompts, cfg)
    B = len(prompts)
    _reset_peak_memory(device)
    started = time.perf_counter()

    host = torch.full((B, T), specials.mask, dtype=torch.long)      # (B, T) host copy of the canvas
    valid = torch.ones((B, T), dtype=torch.bool)
    for row, ids in enumerate(prompts):                             # left padding
        host[row, :P - len(ids)] = specials.pad
        host[row, P - len(ids):P] = torch.tensor(ids)
        valid[row, :P - len(ids)] = False
    canvas = host.to(device)
    cache = model.new_cache(valid.to(device), keep_kv=cfg.cache != "none")
    forward = SpanForward.for_model(lm, canvas, cache)
    banned = torch.tensor([specials.mask], device=device)
    stops = torch.tensor(specials.stops)
    generator = torch.Generator(device=device).manual_seed(cfg.seed)

    nfe = committed = blocks_done = 0
    first_step = None
    for block in range(cfg.num_blocks):
        s, e = P + block * cfg.block_len, P + (block + 1) * cfg.block_len
        schedule = fixed_schedule((host[:, s:e] == specials.mask).sum(1), cfg.steps_per_block)
        step = 0
        while bool((block_masked := host[:, s:e] == specials.mask).any()):
            span = _span(cfg, step, s, e, T)
            scheduled = schedule[:, min(step, cfg.steps_per_block - 1)]
            with torch.inference_mode():
                positions, tokens, conf, chosen = _decode_step(
                    forward, span, block_masked, s, scheduled, cfg, banned, generator)
            host.scatter_(1, positions, torch.where(chosen, tokens, host.gather(1, positions)))
            nfe += 1
            committed += int(chosen.sum())
            if first_step is None:
                first_step = time.perf_counter() - started
            yield StepEvent(block, step, nfe, span, positions - P, tokens, conf, chosen)
            step += 1
        blocks_done += 1
        ended = torch.isin(host[:, P:e], stops).any(1)
        yield BlockEvent(block, s - P, e - P, host[:, s:e].clone(), ended.clone())
        if cfg.early_stop and bool(ended.all()):
            break

    total = time.perf_counter() - started
    generated = host[:, P:]
    answers = [_answer(row, stops, specials.mask) for row in generated]
    peak, kind = _peak_memory(device)
    yield Result(
        ids=answers, texts=[lm.tokenizer.decode(a, skip_special_tokens=True) for a in answers],
        canvas=generated, prompt_tokens=[len(p) for p in prompts], nfe=nfe, committed=committed,
        blocks_decoded=blocks_done, early_stopped=blocks_done < cfg.num_blocks,
        seconds_first_step=first_step or 0.0, seconds_total=total, seconds_load=lm.load_seconds,
        peak_memory_bytes=peak, peak_memory_kind=kind, cache_bytes=cache.nbytes, config=cfg, batch=B)


def run(lm: LoadedModel, prompts: list[list[int]], cfg: DecodeConfig,
        on_event: Callable[[StepEvent | BlockEvent], None] | None = None) -> Result:
    """Drain `generate`, passing step and block events to `on_event`; return the Result."""
    for event in generate(lm, prompts, cfg):
        if isinstance(event, Result):
            return event
        if on_event is not None:
            on_event(event)
    raise RuntimeError("generate ended without a result")


def _decode_step(forward: SpanForward, span, block_masked, s, scheduled, cfg, banned, generator):
    """One forward and one decision. block_masked (B, L) is the host mask of the active block."""
    canvas = forward.canvas
    device = canvas.device
    K = block_masked.shape[1] if forward.full_block else int(block_masked.sum(1).max())
    # Candidate slots: each row's masked positions first, then committed ones as filler, so the
    # K indices of a row are distinct and the scatter below is deterministic.
    order = torch.argsort((~block_masked).to(torch.int8), dim=1, stable=True)[:, :K]     # (B, K)
    candidate = block_masked.gather(1, order)
    positions = order + s
    pos_dev = positions.to(device, non_blocking=True)
    logits = forward(span, pos_dev).to(device)                                      # (B, K, V)
    tokens, conf = predict(logits, temperature=cfg.temperature, measure=cfg.confidence,
                           banned=banned, generator=generator)
    chosen = select(conf, candidate.to(device), cfg, scheduled.to(device))
    canvas.scatter_(1, pos_dev, torch.where(chosen, tokens, canvas.gather(1, pos_dev)))
    packed = torch.stack([tokens.to(conf.dtype), conf, chosen.to(conf.dtype)]).cpu()   # the one sync
    return positions, packed[0].long(), packed[1], packed[2].bool()


def _span(cfg: DecodeConfig, step: int, s: int, e: int, T: int) -> tuple[int, int]:
    refresh = step == 0 or cfg.cache == "none" or (cfg.refresh_every and step % cfg.refresh_every == 0)
    if refresh:
        return 0, T
    return (s, T) if cfg.cache == "prefix" else (s, e)


def _check_lengths(lm: LoadedModel, prompts: list[list[int]], cfg: DecodeConfig) -> tuple[int, int]:
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("empty prompt: give at least one token of input")
    P = max(len(p) for p in prompts)
    T = P + cfg.gen_len
    if T > lm.context_length:
        raise UserError(f"prompt ({P} tokens) + gen_len ({cfg.gen_len}) = {T} exceeds the model's "
                        f"context of {lm.context_length} tokens")
    return P, T


def _answer(row: torch.Tensor, stops: torch.Tensor, mask: int) -> list[int]:
    """Tokens before the first end token (or before the first undecoded position)."""
    end = torch.isin(row, stops) | (row == mask)
    cut = int(end.nonzero()[0]) if bool(end.any()) else row.numel()
    return row[:cut].tolist()


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS"
