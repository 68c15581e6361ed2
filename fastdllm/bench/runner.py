"""Benchmark decoding configurations: expand a sweep into cases, run every case on one prompt set,
return one flat, JSON-ready record per case (built by records.py), and compare each with the
`baseline` row of its group (same gen_len, block_len and batch size). No terminal code:
`format.py` renders the records.

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
from dataclasses import dataclass
from typing import Callable, Iterator

from ..decode.engine import Result
from ..errors import UsageError
from . import rounds
from .cases import BASELINE, Case
from .clock import run_batch as _run
from .clock import timed_run as _timed_run
from .inputs import prepare
from .prompts import PromptSet
from .records import Measured, conditions, summarise
from .rounds import speedup_fields


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
