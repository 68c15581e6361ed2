"""Benchmark decoding configurations: expand a sweep into cases, run every case on one prompt set,
return one flat, JSON-ready record per case, and compare each with the `baseline` row of its group
(same gen_len, block_len and batch size). No terminal code: `format.py` renders the records.

Measurement: warm-up runs are not timed; the device is synchronised before and after each timed
run (the engine also syncs at every step when it copies the step's decisions to the host); tokens
are counted up to the end of each answer (Result.generated_tokens); every record carries the
conditions it was measured under.

Repetitions are interleaved (every case's first repetition, then every case's second, ...), so a
load that comes and goes on a busy machine falls on every case alike rather than on whichever
ran then. A record keeps each repetition's tokens/s, their median and spread ((fastest - slowest)
/ median); a speed-up is median over median, and `reliable` says whether the spreads allow it.

Infilling sets (PromptSet.suffixes): each prompt is the template prefix + hole + suffix, the hole
being the case's gen_len; templates run one at a time, raw text only.

Data parallel (`share`: rank, processes): the batches of every case are planned over the whole
prompt set as alone, and rank r runs batches r, r + N, ... (its own warm-up on its first); `merge`
puts the ranks' Shares back in batch order, so every answer, agreement and quality figure is the
single process's, and tokens/s is all answer tokens over the slowest rank's seconds.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterator

from ..decode.engine import Result
from ..decode.rules import rule_fields
from ..errors import UsageError
from . import rounds
from .cases import BASELINE, Case
from .clock import run_batch as _run
from .clock import timed_run as _timed_run
from .inputs import prepare
from .prompts import PromptSet
from .rounds import speedup_fields, spread_fields


@dataclass
class Measured:
    record: dict
    answers: list[list[int]] = field(default_factory=list)   # per prompt (first repetition)
    unquantized: list[list[int]] | None = None             # the same case's answers on unquantized weights


@dataclass
class Share:
    """One rank's part of a case: the indices of its batches and, per repetition, their Results."""
    case: Case
    batches: list[int]
    reps: list[list[Result]]
    prompt_set: PromptSet
    shared: dict


def count_runs(cases: list[Case], n_prompts: int, repetitions: int | str, warmup: int,
               share: tuple[int, int] = (0, 1)) -> int:
    """How many engine runs `measure` makes for sure (for a progress bar; `auto` may add rounds):
    warm-ups, then timed batches (of rank `share[0]` among `share[1]` processes)."""
    mine = [runs_per_round(c, n_prompts, share) for c in cases]
    warm = len({_warm_key(c) for c, n in zip(cases, mine) if n}) * warmup
    return warm + sum(mine) * rounds.planned(repetitions, share[1])


def runs_per_round(case: Case, n_prompts: int, share: tuple[int, int] = (0, 1)) -> int:
    """The batches of `case` that rank `share[0]` of `share[1]` runs in one repetition."""
    rank, size = share
    return len(range(rank, -(-n_prompts // case.batch_size), size))


def measure(lm, cases: list[Case], prompt_set: PromptSet, *, chat: bool | None = None,
            repetitions: int | str = 1, warmup: int = 1,
            on_run: Callable[[Case, str], None] | None = None, constraint=None) -> Iterator[Measured]:
    """Run every case on every prompt; yield one Measured per case as it finishes (so that an
    interrupted bench keeps its finished rows). Comparisons are added by `compare`."""
    for part in measure_share(lm, cases, prompt_set, chat=chat, repetitions=repetitions, warmup=warmup, on_run=on_run,
                              constraint=constraint):
        yield merge([part])


def measure_share(lm, cases: list[Case], prompt_set: PromptSet, *, chat: bool | None = None,
                  repetitions: int | str = 1, warmup: int = 1, on_run: Callable[[Case, str], None] | None = None,
                  share: tuple[int, int] = (0, 1), constraint=None) -> Iterator[Share]:
    """`measure` for rank `share[0]` of `share[1]` processes: its batches of each case, as a Share.
    Warm-ups first, then rounds of the cases (rounds.py: a fixed count, or `auto`); a case's Share
    is yielded once it runs no more rounds (in case order). `constraint` (decode.constraint.Compiled):
    what the cases with a `constraint` label decode under."""
    check_counts(repetitions, warmup)
    inputs = prepare(lm, cases, prompt_set, chat)
    shared = conditions(lm, prompt_set, chat, repetitions, warmup)
    rank, size = share
    plans = []                                              # (case, its batches, this rank's indices)
    for case in cases:
        fills = inputs[case.cfg.gen_len]
        batches = [fills[i:i + case.batch_size] for i in range(0, len(fills), case.batch_size)]
        plans.append((case, batches, list(range(rank, len(batches), size))))
    warmed = set()
    for case, batches, mine in plans:
        if mine and _warm_key(case) not in warmed:        # lazy init (kernels, allocator, weight packing)
            warmed.add(_warm_key(case))
            for _ in range(warmup):
                _run(lm, batches[mine[0]], case.cfg, constraint if case.constraint else None)
                if on_run:
                    on_run(case, "warm-up")
    reps = [[] for _ in plans]                              # per case, per repetition: its Results
    cases_run, finished, fixed = [p[0] for p in plans], 0, rounds.fixed(repetitions, size)

    def another_round() -> list[int]:                       # rounds.py; a yielded case is never run again
        speeds = [[_speed(rep) for rep in done] for done in reps]
        return [k for k in rounds.next_round(cases_run, speeds, repetitions, size) if k >= finished]

    def release() -> Iterator[Share]:                       # in case order, each once it runs no more
        nonlocal finished
        later = another_round()
        while finished < len(plans) and finished not in later:
            case, _, mine = plans[finished]
            yield Share(case, mine, reps[finished], prompt_set, shared)
            finished += 1

    again, r = another_round(), 0
    while again:
        r += 1
        for k in again:
            case, batches, mine = plans[k]
            reps[k].append([])
            for i in mine:
                reps[k][-1].append(_timed_run(lm, batches[i], case.cfg, constraint if case.constraint else None))
                if on_run:
                    on_run(case, f"rep {r}/{fixed}" if fixed else f"rep {r}")
            if fixed:                                       # a fixed count: a case is done after its last run
                yield from release()
        yield from release()
        again = another_round()


def _speed(rep: list[Result]) -> float:
    """One repetition's tokens/s on this rank (its batches' tokens over their seconds)."""
    return sum(r.generated_tokens for r in rep) / max(sum(r.seconds_total for r in rep), 1e-12)


def merge(shares: list[Share]) -> Measured:
    """The ranks' Shares of one case (in rank order) as one Measured: batches back in their order;
    each repetition's seconds are its slowest rank's."""
    first = shares[0]
    owner = {i: rank for rank, s in enumerate(shares) for i in s.batches}
    order = sorted(owner)
    results = [{i: res for s in shares for i, res in zip(s.batches, s.reps[r])} for r in range(len(first.reps))]
    reps = [[by_batch[i] for i in order] for by_batch in results]
    measured = summarise(first.case, reps, first.prompt_set, first.shared, [owner[i] for i in order], len(shares))
    if len(shares) > 1:
        measured.record["ranks"] = [_rank_figures(rank, s.reps)
                                    for rank, s in enumerate(shares)]
    return measured


def _rank_figures(rank: int, reps: list[list[Result]]) -> dict:
    tokens = sum(r.generated_tokens for r in reps[0]) if reps else 0
    seconds = statistics.median(sum(r.seconds_total for r in rep) for rep in reps) if reps else 0.0
    return {"rank": rank, "prompts": sum(r.batch for r in reps[0]) if reps else 0, "generated_tokens": tokens,
            "seconds": round(seconds, 4), "tokens_per_second": round(tokens / seconds, 3) if seconds else None}


def check_counts(repetitions: int | str, warmup: int) -> None:
    if repetitions != rounds.AUTO and repetitions < 1:
        raise UsageError(f"--repetitions {repetitions}: give at least 1")
    if warmup < 0:
        raise UsageError(f"--warmup {warmup}: give 0 or more")


def summarise(case: Case, reps: list[list[Result]], prompt_set: PromptSet, shared: dict,
              owners: list[int] | None = None, processes: int = 1) -> Measured:
    """One record from the Results of every repetition (each a list of per-batch Results);
    `owners`: the rank that ran each batch (a repetition lasts as long as its slowest rank)."""
    first = reps[0]
    owners = owners or [0] * len(first)

    def seconds(rep: list[Result]) -> float:
        per_rank = [0.0] * processes
        for owner, r in zip(owners, rep):
            per_rank[owner] += r.seconds_total
        return max(per_rank)

    speeds = [sum(r.generated_tokens for r in rep) / max(seconds(rep), 1e-12) for rep in reps]
    texts = [t for r in first for t in r.texts]
    cfg = case.cfg
    record = {
        "config": case.name, "cache": cfg.cache, **rule_fields(cfg),
        "block_len": cfg.block_len, "batch_size": case.batch_size, "group": list(case.group),
        **spread_fields(speeds),
        "speedup": None, "speedup_min": None, "speedup_max": None, "speedup_reliable": None,
        "nfe": sum(r.nfe for r in first),                 # forwards for the whole prompt set
        # answer tokens (up to each end token) per forward of a row; beside them, positions committed (end padding too)
        "tokens_per_forward": round(sum(r.generated_tokens for r in first) / max(sum(r.nfe * r.batch for r in first), 1), 3),
        "committed_per_forward": round(sum(r.committed for r in first) / max(sum(r.nfe * r.batch for r in first), 1), 3),
        # the work behind the speed: answer length, and canvas positions a forward runs (engine.generate)
        "answer_tokens": round(sum(r.generated_tokens for r in first) / max(sum(r.batch for r in first), 1), 1),
        "positions_per_forward": round(sum(r.positions_run or 0 for r in first) / max(sum(r.nfe for r in first), 1), 1),
        # token editing: written tokens overwritten, per block of each row
        "edits_per_block": round(sum(r.edits for r in first) / max(sum(r.blocks_decoded * r.batch for r in first), 1), 2)
        if cfg.edit_threshold is not None else None,
        **_constraint_fields(case, first),
        "agreement_tokens": None, "agreement_answers": None,
        "agreement_unquantized_tokens": None, "agreement_unquantized_answers": None,
        "quality": _round(prompt_set.quality(texts)), "quality_metric": prompt_set.quality_metric,
        "generated_tokens": sum(r.generated_tokens for r in first),
        "seconds": round(statistics.median(seconds(rep) for rep in reps), 4), "processes": processes,
        "peak_memory_bytes": max(r.peak_memory_bytes for rep in reps for r in rep),
        "peak_memory_kind": first[0].peak_memory_kind,
        "cache_bytes": max(r.cache_bytes for r in first),
        **{k: getattr(cfg, k) for k in ("confidence", "temperature", "seed", "refresh_every", "early_stop",
                                        "credit", "prophet", "dpad_window", "leap_anchor", "leap_radius",
                                        "prompt_interval", "gen_interval", "transfer_ratio", "focus_alpha",
                                        "focus_delayed")},   # the accelerator options
        **shared,
        "repetitions": len(reps), "repetitions_asked": shared["repetitions"],   # rounds.py: auto varies per row
    }
    return Measured(record, [ids for r in first for ids in r.ids])


def _constraint_fields(case: Case, first: list[Result]) -> dict:
    """Structured output: the constraint's label, how many answers completed their sentence (each
    valid by construction; the others the length cut) and the matcher's ms per forward."""
    if case.constraint is None:
        return {"constraint": None, "constraint_complete": None, "matcher_ms_per_step": None}
    done = [c for r in first for c in (r.complete or [None] * r.batch)]
    return {"constraint": case.constraint, "constraint_complete": [sum(c is True for c in done), len(done)],
            "matcher_ms_per_step": round(1e3 * sum(r.matcher_seconds for r in first) / max(sum(r.nfe for r in first), 1), 3)}


def conditions(lm, prompt_set: PromptSet, chat: bool | None, repetitions: int | str, warmup: int) -> dict:
    """What every record of one bench shares: model, placement, software, prompts, repetitions."""
    import torch
    import transformers

    info = lm.info
    infilling = prompt_set.suffixes is not None
    return {"prompt_set": prompt_set.name, "n_prompts": len(prompt_set.prompts), "infill": infilling,
            "chat_template": False if infilling else lm.has_chat_template if chat is None else chat,
            "repetitions": repetitions, "warmup": warmup,
            "model": info.get("path"), "model_name": Path(str(info.get("path"))).name,
            "family": info.get("family"), "device": info.get("device"), "dtype": info.get("dtype"),
            "quantize": info.get("quantize"), "torch": torch.__version__,
            "transformers": transformers.__version__, "fastdllm": _version(), "python": sys.version.split()[0]}


def agreement(answers: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """(share of identical tokens over the positions either answer generated, share of identical
    answers). Two empty answers agree."""
    same = sum(x == y for a, b in zip(answers, reference) for x, y in zip(a, b))
    positions = sum(max(len(a), len(b)) for a, b in zip(answers, reference))
    exact = sum(a == b for a, b in zip(answers, reference)) / max(len(reference), 1)
    return (same / positions if positions else 1.0), exact


def compare(measured: list[Measured]) -> list[dict]:
    """Fill speedup (tokens/s ratio) and agreement against the baseline of each record's group;
    left None where the group has no baseline row. A baseline's speed-up is 1 and not judged.
    With unquantized answers, also each record's agreement with its own case on unquantized
    weights. Returns the records."""
    def group(m):
        return tuple(m.record["group"])

    baselines = {group(m): m for m in measured if m.record["config"] == BASELINE}
    for m in measured:
        if m.unquantized is not None:
            tokens, answers = agreement(m.answers, m.unquantized)
            m.record["agreement_unquantized_tokens"] = round(tokens, 4)
            m.record["agreement_unquantized_answers"] = round(answers, 4)
        base = baselines.get(group(m))
        if base is None:
            continue
        reps = m.record.get("tokens_per_second_reps") or [m.record["tokens_per_second"]]
        base_reps = base.record.get("tokens_per_second_reps") or [base.record["tokens_per_second"]]
        m.record.update(speedup_fields(reps, base_reps))
        if m is base:
            m.record.update(speedup_min=None, speedup_max=None, speedup_reliable=None)
        tokens, answers = agreement(m.answers, base.answers)
        m.record["agreement_tokens"], m.record["agreement_answers"] = round(tokens, 4), round(answers, 4)
    return [m.record for m in measured]


def _warm_key(case: Case) -> tuple:
    """Warm-up depends on the code path and shapes, not on the commit rule."""
    return case.cfg.cache, case.cfg.gen_len, case.cfg.block_len, case.batch_size, case.constraint


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _version() -> str:
    try:
        return metadata.version("fastdllm")
    except metadata.PackageNotFoundError:
        return "unknown"
