"""How many timed repetitions (rounds) each bench case gets.

A round runs every case still measured once, in case order (interleaved: a load that comes and goes
falls on all of them alike). A fixed count N gives every case N rounds. `auto`, the default, gives
every case AUTO_FIRST rounds, then further rounds, up to AUTO_MOST in all, only to the cases whose
speed is still unsettled in a way another round can fix: a row (the baseline included) whose
spread is above STEADY runs again alone (a cheap cached row does not rerun its expensive
baseline), and ranges that overlap while the medians differ by more than SAME_SPEED rerun the row
with its baseline. On a quiet machine that is two rounds (the wall time of two passes over the
prompts); a burst of load buys what it spoiled more rounds, and the median then outvotes it. A
spread is taken over the rounds the median keeps (`outvoted`: from three rounds on, all but the one
farthest from it), so one burst does not stand in the table however many rounds follow; every
round's tokens/s stays in the record. Data-parallel runs take
AUTO_FIXED rounds of every case instead: each rank sees only its share of the timings, and every
rank must run the same rounds.
"""

from __future__ import annotations

import statistics

from ..errors import UsageError
from .cases import BASELINE, SPREAD_LIMIT, Case

AUTO = "auto"
AUTO_FIRST, AUTO_MOST, AUTO_FIXED = 2, 5, 3
SAME_SPEED = 0.10                  # medians this close (ratio 0.9-1.1) with overlapping ranges: the same speed
STEADY = 0.10                      # a spread above this runs the row again (a speed-up is marked ~ only above SPREAD_LIMIT)


def parse(text: str) -> int | str:
    """`--repetitions` as given: a count of at least 1, or 'auto'."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        count = int(text)
    except ValueError:
        raise UsageError(f"--repetitions {text}: give a count or 'auto'") from None
    if count < 1:
        raise UsageError(f"--repetitions {text}: give at least 1")
    return count


def fixed(repetitions: int | str, processes: int = 1) -> int | None:
    """The rounds every case gets when the count is fixed (given, or `auto` over several processes);
    None for `auto` in one process."""
    if repetitions != AUTO:
        return repetitions
    return None if processes == 1 else AUTO_FIXED


def planned(repetitions: int | str, processes: int = 1) -> int:
    """The rounds every case gets for sure (the progress bar's count; `auto` may add more)."""
    count = fixed(repetitions, processes)
    return AUTO_FIRST if count is None else count


def next_round(cases: list[Case], speeds: list[list[float]], repetitions: int | str, processes: int = 1) -> list[int]:
    """The indices of the cases that run another round, given each case's tokens/s per round so far
    (`speeds`, in case order; every case has had the same rounds or fewer). [] when measuring is done."""
    count = fixed(repetitions, processes)
    if count is not None:
        return [k for k, s in enumerate(speeds) if len(s) < count]
    if min(len(s) for s in speeds) < AUTO_FIRST:
        return [k for k, s in enumerate(speeds) if len(s) < AUTO_FIRST]
    # its own noise: more of the row alone (a baseline, or a row without one, too)
    wanted = {k for k, s in enumerate(speeds) if kept_spread(s) > STEADY and len(s) < AUTO_MOST}
    baselines = {c.group: k for k, c in enumerate(cases) if c.name == BASELINE}
    for k, case in enumerate(cases):
        base = baselines.get(case.group)
        if base is None or base == k:
            continue
        _, _, overlap = _noise(speeds[k], speeds[base])
        # ranges that overlap while the medians are close say "the same speed" however many rounds run
        ratio = statistics.median(speeds[k]) / max(statistics.median(speeds[base]), 1e-12)
        if overlap and abs(ratio - 1) > SAME_SPEED and max(len(speeds[k]), len(speeds[base])) < AUTO_MOST:
            wanted |= {k, base}
    return sorted(wanted)


def spread_fields(speeds: list[float]) -> dict:
    """A record's speed figures from each repetition's tokens/s: the median, every repetition, the
    spread of the repetitions the median keeps ((fastest - slowest) / median, see `outvoted`), that
    of all of them, and the std (older readers); spreads and std are None with one repetition."""
    several = len(speeds) > 1
    return {"tokens_per_second": round(statistics.median(speeds), 3),
            "tokens_per_second_reps": [round(s, 3) for s in speeds],
            "tokens_per_second_spread": round(kept_spread(speeds), 4) if several and any(speeds) else None,
            "tokens_per_second_spread_all": round(_spread(speeds), 4) if several and any(speeds) else None,
            "tokens_per_second_std": round(statistics.stdev(speeds), 3) if several else None}


def kept_spread(speeds: list[float]) -> float:
    """(fastest - slowest) / median of the repetitions the median keeps; 0 for one repetition."""
    return _spread(outvoted(speeds))


def _spread(speeds: list[float]) -> float:
    return (max(speeds) - min(speeds)) / max(statistics.median(speeds), 1e-12)


def speedup_fields(reps: list[float], base: list[float]) -> dict:
    """speedup (median over median), its range (slowest row over fastest baseline, and the other
    way round) and whether the spreads allow reading it (None: one repetition, spread unknown),
    judged on the repetitions the median keeps (`outvoted`)."""
    mid, base_mid = statistics.median(reps), statistics.median(base)
    if not base_mid or not min(base):
        return {"speedup": None, "speedup_min": None, "speedup_max": None, "speedup_reliable": None}
    reliable = None
    if len(reps) > 1 and len(base) > 1:
        row_spread, base_spread, overlap = _noise(reps, base)
        reliable = max(row_spread, base_spread) <= SPREAD_LIMIT and not overlap
    return {"speedup": round(mid / base_mid, 3), "speedup_min": round(min(reps) / max(base), 3),
            "speedup_max": round(max(reps) / min(base), 3), "speedup_reliable": reliable}


def _noise(reps: list[float], base: list[float]) -> tuple[float, float, bool]:
    """The row's and the baseline's spreads on the repetitions their medians keep, and whether
    those ranges overlap."""
    kept, kept_base = outvoted(reps), outvoted(base)
    return _spread(kept), _spread(kept_base), min(kept) <= max(kept_base) and min(kept_base) <= max(kept)


def outvoted(speeds: list[float]) -> list[float]:
    """The repetitions a median of three or more stands on: all but the one farthest from it (one
    burst of load cannot keep a row unreliable however many rounds follow). Two or fewer: all."""
    if len(speeds) < 3:
        return speeds
    median = statistics.median(speeds)
    far = max(range(len(speeds)), key=lambda i: abs(speeds[i] - median))
    return speeds[:far] + speeds[far + 1:]
