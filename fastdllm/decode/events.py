"""What the engine yields: a StepEvent per forward, a BlockEvent per finished block, and a Result
at the end. Positions are generation-relative (0 = a row's first generated position)."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass, field
from typing import Union

import torch

from .config import DecodeConfig


@dataclass(frozen=True)
class StepEvent:
    block: int
    step: int                   # step inside the block; -1: a block-causal store pass (its K/V kept
                                # as final; Fast-dLLM v2 commits the next block's first token there)
    nfe: int                    # forwards so far, this one included
    span: tuple[int, int]       # canvas span recomputed (a full refresh when it starts at 0)
    positions: torch.Tensor     # (B, K) generation-relative positions that were candidates
    tokens: torch.Tensor        # (B, K) predicted tokens
    confidences: torch.Tensor   # (B, K)
    committed: torch.Tensor     # (B, K) bool: the candidates committed this step
    renoised: bool = False      # a renoising sampler's step: `tokens` is the whole next canvas,
                                # `committed` its accepted positions (the rest is fresh noise),
                                # `confidences` -entropy; the block's tokens come with its BlockEvent
    edited: torch.Tensor | None = None   # (B, K) bool: written tokens overwritten this step (token
                                         # editing, T2T); None where a step cannot edit
    deleted: torch.Tensor | None = None  # (B, K) bool, InDel (docs/specs/llada2-2.md §3): offsets where a DELETE
    inserted: torch.Tensor | None = None  # or a SPLIT was written; `tokens` is then the block after the edits
    masks: torch.Tensor | None = None    # (B, K) bool, InDel: the block's masks after the edits
    positions_run: float | None = None   # FOCUS: the positions its layers ran, a mean over the layers (its
                                         # later layers run the kept set only; docs/accelerators/focus.md 5)

    @property
    def width(self) -> float:
        """Canvas positions this forward ran, one row's: the span's length, or the size of a
        position set (cache mode dkv, models/kv_cache.Slots), or FOCUS's mean over the layers."""
        if self.positions_run is not None:
            return self.positions_run
        start, end = self.span
        return end - start if isinstance(start, int) else int(start.index.shape[1])


@dataclass(frozen=True)
class BlockEvent:
    block: int
    start: int                  # generation-relative [start, end) of row 0 (block-causal rows of
    end: int                    # other prompt lengths are offset; their first block can be shorter)
    tokens: torch.Tensor        # (B, end - start) the finished block, in row 0's coordinates
    ended: torch.Tensor         # (B,) bool: the answer has ended in this block or before


@dataclass
class Result:
    ids: list[list[int]]        # per row: the answer, up to (not including) its end token
                                # (infilling: each hole up to its end token, joined)
    texts: list[str]
    canvas: torch.Tensor        # (B, gen_len) everything decoded (mask ids where early stop skipped)
    prompt_tokens: list[int]
    nfe: int
    committed: int              # positions committed, all rows
    edits: int                  # written tokens overwritten by token editing, all rows
    blocks_decoded: int
    early_stopped: bool
    seconds_first_step: float
    seconds_total: float
    peak_memory_bytes: int
    peak_memory_kind: str       # "cuda allocated" or "process RSS"
    cache_bytes: int
    config: DecodeConfig
    batch: int = field(default=1)
    holes: list[list[list[int]]] | None = None   # infilling: per row, each hole's tokens as decoded
    steps: list[list[int]] | None = None          # renoising samplers: per row, the steps of each canvas
    complete: list[bool | None] | None = None     # structured output: per row, whether its answer is a
                                                  # whole sentence of its constraint (None: a free row)
    matcher_seconds: float = 0.0                  # structured output: time in the grammar matcher
    constraint_errors: list[str | None] | None = None   # structured output: per row, why its matcher failed
                                                  # (the answer ended there), None where it did not
    positions_run: float | None = None            # canvas positions the forwards ran, one row's, summed
                                                  # (StepEvent.width; engine.generate counts them)

    @property
    def generated_tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)

    @property
    def tokens_per_forward(self) -> float:
        """Answer tokens (up to each row's end token) per forward of a row: the headline figure."""
        return self.generated_tokens / max(self.nfe * self.batch, 1)

    @property
    def committed_per_forward(self) -> float:
        """Canvas positions committed per forward of a row, the end padding after an answer included."""
        return self.committed / max(self.nfe * self.batch, 1)

    @property
    def finish_reasons(self) -> list[str]:
        """Per row: "stop" (the answer ended, or is a whole sentence of its constraint), "length"
        (a constrained answer the length cut before its constraint was complete) or "error" (its
        grammar matcher failed: constraint_errors says why)."""
        errors = self.constraint_errors or [None] * len(self.ids)
        return ["error" if e is not None else "length" if c is False else "stop"
                for c, e in zip(self.complete or [None] * len(self.ids), errors)]

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
            "tokens_per_forward": round(self.tokens_per_forward, 4), "committed": self.committed,
            "committed_per_forward": round(self.committed_per_forward, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "timings": {"first_step_s": round(self.seconds_first_step, 4), "total_s": round(self.seconds_total, 4)},
            "peak_memory_bytes": self.peak_memory_bytes, "peak_memory_kind": self.peak_memory_kind,
            "cache_bytes": self.cache_bytes, "early_stopped": self.early_stopped,
            "blocks_decoded": self.blocks_decoded, "edits": self.edits, "config": self.config.to_dict(),
            **({"steps_per_canvas": self.steps[0] if one else self.steps} if self.steps is not None else {}),
            **({"complete": self.complete[0] if one else self.complete,
                "finish_reason": self.finish_reasons[0] if one else self.finish_reasons,
                "matcher_s": round(self.matcher_seconds, 4)} if self.complete is not None else {}),
            **({"constraint_error": self.constraint_errors[0] if one else self.constraint_errors}
               if any(self.constraint_errors or ()) else {}),
        }


Event = Union[StepEvent, BlockEvent, Result]


def answer_ids(row: torch.Tensor, stops: torch.Tensor, mask: int) -> list[int]:
    """Tokens before the first end token (or before the first undecoded position)."""
    end = torch.isin(row, stops) | (row == mask)
    cut = int(end.nonzero()[0]) if bool(end.any()) else row.numel()
    return row[:cut].tolist()


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process RSS"
