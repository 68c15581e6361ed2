"""What the HTTP layer hands the scheduler (a Job) and what it gets back, in order, through the
job's `deliver` callback (called on the worker thread): StepUpdate*, TextUpdate*, then exactly one
of Finished or Failed. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Union

from ..decode.config import DecodeConfig


@dataclass(frozen=True)
class StepUpdate:
    positions: list[int]        # answer-relative positions committed by this forward (with token
    tokens: list[int]           # editing, also those it overwrote); their token ids


@dataclass(frozen=True)
class TextUpdate:
    text: str                   # new final text of the answer (from a finished block), never taken back


@dataclass(frozen=True)
class Finished:
    text: str                   # the whole answer (cut at the end token or the first stop string)
    ids: list[int]              # its token ids (before a stop string's cut: up to the end token)
    finish_reason: str          # "stop" (end token or stop string) | "length" (the canvas was used up)
                                # | "abort" (the server stopped first: the finished blocks)
    prompt_tokens: int
    completion_tokens: int      # len(ids)
    nfe: int                    # forwards that decided positions of this answer (what it costs alone)
    committed: int              # positions of this answer committed in them
    seconds: float              # from submit to finish
    queued_seconds: float       # waiting before the first forward
    mean_batch: float           # mean rows per forward while this answer was decoded
    edits: int = 0              # token editing: written tokens of this answer overwritten

    @property
    def tokens_per_forward(self) -> float:
        """Answer tokens per forward (the headline figure)."""
        return self.completion_tokens / max(self.nfe, 1)

    @property
    def committed_per_forward(self) -> float:
        """Positions committed per forward, the end padding after the answer included."""
        return self.committed / max(self.nfe, 1)


@dataclass(frozen=True)
class Failed:
    status: int                 # HTTP status: 400 a bad request found late, 500 an engine failure
    message: str
    code: str | None = None     # the error's code ("constraint_failed": the grammar matcher failed)


Update = Union[StepUpdate, TextUpdate, Finished, Failed]


@dataclass
class Job:
    id: str
    prompt: list[int]           # token ids (chat template already applied)
    cfg: DecodeConfig           # gen_len = max_tokens rounded up to whole blocks
    deliver: Callable[[Update], None]
    stop: tuple[str, ...] = ()  # stop strings: the answer is cut before the first
    steps: bool = False         # also deliver a StepUpdate per forward
    suffix: list[int] | None = None   # infilling: the answer fills cfg.gen_len masks before these tokens
    constraint: object = None         # structured output: decode.constraint.Compiled (decoded alone)
    submitted: float = field(default=0.0)   # time.perf_counter() at submit (set by the scheduler)


class QueueFull(Exception):
    """The queue holds --max-queue jobs already (the app answers 429)."""


class ShuttingDown(Exception):
    """The server is stopping and takes no new jobs (the app answers 503)."""
