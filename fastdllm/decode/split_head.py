"""The decision from a vocabulary head split over tensor-parallel ranks (docs/specs/tensor-parallel.md).

For the default decision (greedy token, confidence = its softmax probability) each rank sends three
numbers per position, (max, argmax, logsumexp) of its rows, instead of its V/N logits: the token is
the argmax of the largest max (ties to the lower rank, as torch.argmax over the whole row takes the
first index), its confidence exp(max - logsumexp of the ranks' logsumexps). As in `predict`, the
banned ids (the mask id) stay in the normaliser and are only kept out of the token. Every other
measure or rule reads more of the row and gets the gathered rows (the head's default output)."""

from __future__ import annotations

import torch

from ..models.tensor_parallel import local_rows, split_head
from .rules import RULES
from .selection import max_without


def split_decider(model, cfg, accelerators) -> object | None:
    """The model's split head where this step's decision needs only each rank's (max, argmax, lse), else None."""
    head = split_head(model)
    if head is None or accelerators or cfg.temperature > 0 or cfg.confidence != "prob" \
            or RULES[cfg.rule].bound is not None or model.authors_softmax == "logits":
        return None
    return head


def decide(head, forward, banned) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward with the head's rows kept on each rank; (tokens (B, K), confidences (B, K) float64)."""
    with local_rows(head):
        rows = forward()                                                  # (B, K, V/N)
    return combine(head.gather_numbers(local_numbers(rows, head.offset, banned)))


def local_numbers(rows: torch.Tensor, offset: int, banned) -> torch.Tensor:
    """rows (B, K, n): this rank's logits for vocabulary ids [offset, offset + n) -> (B, K, 3) float64:
    the max and argmax over its ids less the banned ones (first index on ties), the logsumexp over all."""
    n = rows.shape[-1]
    ids = sorted({b - offset for b in banned if offset <= b < offset + n})
    if len(ids) == n:                                                     # every id here is banned
        top = rows.new_full(rows.shape[:-1], float("-inf"))
        at = torch.zeros(rows.shape[:-1], dtype=torch.long, device=rows.device)
    else:
        top, at = max_without(rows, ids)
    lse = rows.to(torch.promote_types(rows.dtype, torch.float32)).logsumexp(-1)
    return torch.stack([top.double(), (at + offset).double(), lse.double()], dim=-1)


def combine(numbers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """numbers (N, B, K, 3), every rank's (max, argmax, lse) -> tokens (B, K) long, confidence (B, K) float64."""
    top, at, lse = numbers.unbind(-1)                                     # (N, B, K) each
    best = top.argmax(0, keepdim=True)                                    # first (lowest) rank on ties
    tokens = at.gather(0, best)[0].long()
    confidence = (top.gather(0, best)[0] - lse.logsumexp(0)).exp()
    return tokens, confidence


def refuse(model, cfg) -> None:
    """What a tensor-parallel model does not decode with (UserError, one line): settings that read a
    rank's own heads (dLLM-Cache's value similarity, FOCUS's attention), which would differ by rank."""
    from ..errors import UserError
    from .cache_modes import CACHE_MODES

    if split_head(model) is None:
        return
    if CACHE_MODES[cfg.cache].features:
        raise UserError(f"cache {cfg.cache} under tensor parallel: its refresh reads each rank's own value heads, "
                        "so the ranks would decide apart; use none, prefix or dual")
    if cfg.focus_alpha is not None:
        raise UserError("focus under tensor parallel: it ranks the masks by each rank's own attention heads, "
                        "so the ranks would decide apart")
