"""DUS, the Dilated Unmasking Scheduler (docs/accelerators/dus.md 6.3): the block's coarse-to-fine
levels, and the spacing post-filter of adaptive rules (the authors' Sec. 4.4).

A block of L slots is split into levels of slots far apart from each other; the `dilated` rule
(rules.py) commits one whole level a step, lowest first, so tokens committed together are never
neighbours while the slots between them are unknown. Positions do not depend on confidences: the
levels are a plan, fixed by (L, base, skip).

Pure Python (no torch): the rules table, profiles and `--help` import it.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=64)
def dilated_levels(length: int, base: int, skip: int) -> tuple[tuple[int, ...], ...]:
    """The levels of a block of `length` slots as offsets 0..length-1, each in increasing order.

    Strides length // base**skip, then divided by `base` down to 1: each level is the offsets that
    are multiples of its stride and in no earlier level; leftovers form a last level; a last level
    shorter than the one before joins it. L = 32, base 2, skip 1: {0,16} {8,24} {4,12,20,28}
    {2,6,..,30} {1,3,..,31}. base 1, or L < base**skip: one level, the whole block."""
    if base < 1 or skip < 1:
        raise ValueError(f"dilation base {base} and skip {skip} must be >= 1")
    if base == 1:
        return (tuple(range(length)),)
    levels, revealed = [], set()
    stride = length // base ** skip
    while stride >= 1:
        level = [i for i in range(length) if i % stride == 0 and i not in revealed]
        if level:
            levels.append(level)
            revealed.update(level)
        stride //= base
    leftovers = [i for i in range(length) if i not in revealed]
    if leftovers:
        levels.append(leftovers)
    if len(levels) >= 2 and len(levels[-1]) < len(levels[-2]):   # merge a short last level
        levels[-2] = levels[-2] + levels.pop()
    return tuple(tuple(level) for level in levels)


@lru_cache(maxsize=64)
def level_of(length: int, base: int, skip: int) -> tuple[int, ...]:
    """(length,) each block offset's level: the per-offset priority the `dilated` rule ranks by."""
    out = [0] * length
    for t, level in enumerate(dilated_levels(length, base, skip)):
        for i in level:
            out[i] = t
    return tuple(out)


def spacing_gap(masked: int, block_len: int, stride: int) -> int:
    """The spacing filter's gap: max(2, floor(M g0 / L)), M the block's masks left, g0 = stride.
    Never below 2 (the authors' code; its docstring says it relaxes to 1): no two neighbours a step."""
    return max(2, masked * stride // block_len)


def spaced(ranked: list[int], gap: int) -> tuple[list[int], list[int]]:
    """(accepted, deferred): walk the chosen offsets best first, accept each one at least `gap`
    from every accepted one; the rest stay masked for the next step. The best is always accepted."""
    accepted: list[int] = []
    deferred: list[int] = []
    for i in ranked:
        (accepted if all(abs(i - a) >= gap for a in accepted) else deferred).append(i)
    return accepted, deferred
