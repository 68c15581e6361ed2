"""Decoding rules as pure tensor functions, vectorised over the batch.

Every rule (the table in rules.py: fixed, threshold, factor) answers one question per row: how
many of the candidate positions to commit this step, at least one. The committed positions are
then always the most confident ones, so every rule shares one selection mechanism (`select`).
"""

from __future__ import annotations

import torch

from .config import DecodeConfig
from .rules import RULES


def predict(logits: torch.Tensor, *, temperature: float, measure: str, banned: torch.Tensor,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, K, V) -> (tokens (B, K), confidence (B, K)).

    Every confidence is the authors' own, over the full softmax: the `banned` ids (the mask id)
    stay in the normaliser, the top-2 and the entropy, as in every family's reference code. They are
    only kept out of the prediction (the reference loops forever when the mask is the argmax), so
    all agree with the references wherever the mask is not the argmax. Computed from a logsumexp at
    fp32 or better; no full-vocabulary float64 softmax."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_z = logits.logsumexp(-1, keepdim=True)                                    # (B, K, 1)
    if measure == "margin":      # top-1 minus top-2 probability (Dream's topk_margin)
        top2 = (logits.topk(2, dim=-1).values - log_z).exp()
        margin = top2[..., 0] - top2[..., 1]
    elif measure == "neg_entropy":  # sum p log(p + 1e-10), Dream's entropy; 0 is the most certain
        p = (logits - log_z).exp()
        entropy = (p * (p + 1e-10).log()).sum(-1)
    logits = logits.index_fill(-1, banned.to(logits.device), float("-inf"))      # never predicted; the caller's stay
    if temperature > 0:  # Gumbel-max: a sample of softmax(logits / T)
        u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
        tokens = (logits / temperature + gumbel).argmax(-1)
        top = logits.gather(-1, tokens[..., None])[..., 0]
    else:
        top, tokens = logits.max(-1)                                              # first index on ties
    if measure == "prob":        # probability of the token the position receives
        confidence = (top - log_z[..., 0]).exp()
    elif measure == "margin":
        confidence = margin
    elif measure == "neg_entropy":
        confidence = entropy
    elif measure == "random":    # LLaDA's 'random' remasking
        confidence = torch.rand(tokens.shape, generator=generator, device=logits.device, dtype=logits.dtype)
    else:
        raise ValueError(f"unknown confidence measure {measure!r}")
    return tokens, confidence


def fixed_schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's `get_num_transfer_tokens`: (B,) masked counts -> (B, steps) tokens per step,
    spread evenly, the remainder going to the first steps."""
    base, remainder = masked[:, None] // steps, masked[:, None] % steps
    return base + (torch.arange(steps, device=masked.device)[None, :] < remainder).long()


def commit_counts(sorted_conf: torch.Tensor, candidates: torch.Tensor, cfg: DecodeConfig,
                  scheduled: torch.Tensor | None = None) -> torch.Tensor:
    """How many to commit per row (the rule's count, rules.py). sorted_conf (B, K) descending,
    non-candidates at -inf; candidates (B,) their number; scheduled (B,) the fixed schedule's counts."""
    n = RULES[cfg.rule].count(sorted_conf, cfg, scheduled)
    return torch.minimum(n.clamp_min(1), candidates)   # at least the best one; never beyond candidates


def select(confidence: torch.Tensor, candidate: torch.Tensor, cfg: DecodeConfig,
           scheduled: torch.Tensor | None = None) -> torch.Tensor:
    """confidence, candidate (B, K) -> (B, K) bool: the n most confident candidates of each row."""
    if RULES[cfg.rule].by_position:        # candidates come in position order: rank by index
        confidence = -torch.arange(confidence.shape[-1], device=confidence.device, dtype=confidence.dtype).expand_as(confidence)
    conf = confidence.masked_fill(~candidate, float("-inf"))
    sorted_conf, order = conf.sort(dim=-1, descending=True, stable=True)
    n = commit_counts(sorted_conf, candidate.sum(-1), cfg, scheduled)
    take = torch.arange(conf.shape[-1], device=conf.device)[None, :] < n[:, None]   # in sorted order
    return torch.zeros_like(take).scatter(-1, order, take)


def select_edits(tokens: torch.Tensor, probability: torch.Tensor, current: torch.Tensor, editable: torch.Tensor,
                 threshold: float) -> torch.Tensor:
    """Token editing (T2T): (B, K) bool, the editable positions whose prediction differs from the
    token written there and whose probability exceeds `threshold` (strictly, as the references).
    All arguments (B, K): predicted tokens, their probabilities, the canvas tokens, editable."""
    return editable & (probability > threshold) & (tokens != current)
