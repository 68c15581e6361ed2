"""Batch-invariant decoding (`batch_invariant: true`): a row's answer does not depend on the other
rows of its batch, in any dtype.

Why answers change in a batch at all: a bidirectional batch left-pads its prompts to the longest,
so a row's attention runs over more (masked) keys than alone, the matrix products see more rows,
and the logits are read at as many positions as the row with most masks has. Each changes the
order of floating-point sums, so in bf16 or fp32 a near-tie between two tokens can go either way
(in float64 the answers agree; docs/guide/serve.md has the counts).

The mode removes all three: every forward is run row by row on exactly the slots the row has when
decoded alone (its prompt without the batch's padding, its own canvas length: `row_view` slices
the batch's KV cache without copying, so writes land in it), and logits are read at every position
of the block for every row (the same count alone and batched). Each row then computes what it
computes alone, operation for operation. The cost is the batched matrix products (measured in the
serve guide). Configurations whose forward shape depends on the batch in other ways are refused.
"""

from __future__ import annotations

import torch

from ..errors import UserError
from ..models.kv_cache import CanvasCache


def make_batch_invariant(forward, cfg, valid: torch.Tensor, name: str) -> None:
    """Set a batch's SpanForward (graphs.py) to run row by row on each row's own slots, with logits
    at every block position; refuse (one line) what the mode does not cover."""
    refuse_unsupported(cfg, name)
    forward.row_extents, forward.full_block = row_extents(valid), True


def refuse_unsupported(cfg, name: str) -> None:
    """One line naming what the mode does not cover (each would make a row's forward batch-dependent;
    block-causal families are refused in combinations.FAMILY)."""
    problems = [(f"cache {cfg.cache}", cfg.cache not in ("none", "prefix", "dual")),
                ("dpad_window", bool(cfg.dpad_window)), ("rule klass", cfg.rule == "klass"), ("prophet", cfg.prophet),
                ("variable_length", cfg.variable_length)]
    for what, present in problems:
        if present:
            raise UserError(f"batch_invariant: not implemented with {what} ({name}); "
                            f"it covers bidirectional models with cache none, prefix or dual")


def row_extents(valid: torch.Tensor) -> list[tuple[int, int]]:
    """valid (B, T) -> each row's [first, end) real slots (its prompt's first token to its canvas end)."""
    extents = []
    for row in valid.cpu():
        slots = row.nonzero().flatten()
        extents.append((int(slots[0]), int(slots[-1]) + 1))
    return extents


def row_view(cache: CanvasCache, b: int, lo: int, hi: int) -> CanvasCache:
    """Row b's slots [lo, hi) of the batch's cache as a cache of one row (views: its writes land in
    the batch's tensors), with nothing padded, as the row's own cache alone."""
    keys = None if cache.keys is None else [k[b:b + 1, :, lo:hi] for k in cache.keys]
    values = None if cache.values is None else [v[b:b + 1, :, lo:hi] for v in cache.values]
    return CanvasCache(cache.positions[b:b + 1, lo:hi], None, keys, values, cache.block)


def forward_by_row(model, canvas: torch.Tensor, cache: CanvasCache, extents: list[tuple[int, int]],
                   span: tuple[int, int], positions: torch.Tensor, widen: bool) -> torch.Tensor:
    """The batch's logits (B, K, V) at canvas `positions` (B, K) after recomputing `span`, each row
    on its own slots. A row whose canvas ends before the block (a shorter answer) has no mask there
    and nothing is read from its logits: zeros where the span lies past its end, else logits at
    its last slot (no host read: the step stays capturable as a CUDA graph)."""
    start, end = span
    out = []
    for b, (lo, hi) in enumerate(extents):
        if start >= hi:
            out.append(None)
            continue
        out.append(model.forward_span(canvas[b:b + 1, lo:hi], max(start, lo) - lo, min(end, hi) - lo,
                                      row_view(cache, b, lo, hi), positions[b:b + 1].clamp(max=hi - 1) - lo, widen))
    shape = next(x for x in out if x is not None).shape[1:]
    ref = next(x for x in out if x is not None)
    return torch.cat([x if x is not None else ref.new_zeros((1, *shape)) for x in out])
