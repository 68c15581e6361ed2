"""Decoding rules as pure tensor functions, vectorised over the batch.

Every rule (the table in rules.py: fixed, threshold, factor) answers one question per row: how
many of the candidate positions to commit this step, at least one. The committed positions are
then always the most confident ones, so every rule shares one selection mechanism (`select`).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from ..errors import UserError
from .config import DecodeConfig
from .klass import ready_key
from .local_leap import leap_key
from .rules import RULES


def predict(logits: torch.Tensor, *, temperature: float, measure: str, banned: Sequence[int] | torch.Tensor,
            generator: torch.Generator | None, softmax_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, K, V) -> (tokens (B, K), confidence (B, K)); the caller's logits are left alone.

    Every confidence is the authors' own, over the full softmax: the `banned` ids (the mask id)
    stay in the normaliser, the top-2 and the entropy, as in every family's reference code. They are
    only kept out of the prediction (the reference loops forever when the mask is the argmax), so
    all agree with the references wherever the mask is not the argmax.

    Precision (docs/specs/ranking.md): probabilities are what a float64 softmax-then-gather gives, in
    float64, whatever the logits' dtype. With m the row's max, softmax at a logit l is
    exp(l - m) / (1 + r), r = the sum of exp(l' - m) over every other entry: r is summed (float64
    accumulation) from one fp32-or-better buffer of exp(l' - m) whose max entry is set to 0, so a
    near-certain row keeps r's own digits (adding the max's 1 first, in fp32, rounded them away:
    confidences 1e-6 apart ranked by rounding; torch's own fp32 softmax does so too).
    `softmax_dtype`: where a family's authors take their softmax in the logits' own dtype (Dream's
    `torch.softmax(logits)`), that softmax, literally: tokens and confidences from its
    probabilities (`authors_softmax`), so that its roundings, ties and threshold comparisons in
    bf16 or fp32 are theirs.

    The cost (one step's besides the forward): maxima and top-2 read the logits in their own dtype
    (exact in any); the exponent is one fused upcast-and-shift into a single fp32-or-better
    buffer, exponentiated and summed in place; no full-vocabulary copy for the banned ids, only
    views of them (slices, not index tensors: on a GPU a host list as an index is a copy to the
    device); float64 only for (B, K) numbers (tests/decode/test_step_cost.py)."""
    work = torch.promote_types(logits.dtype, torch.float32)
    ids = banned_ids(banned)
    if softmax_dtype is not None and measure in ("prob", "margin", "neg_entropy"):
        return authors_softmax(logits, temperature, measure, ids, generator, softmax_dtype)
    if temperature > 0:  # Gumbel-max: a sample of softmax(logits / T)
        tokens = gumbel_argmax(logits, temperature, ids, generator, work)
        top = logits.gather(-1, tokens[..., None])[..., 0]
        peak, at = logits.max(-1)
    else:
        top, tokens = max_without(logits, ids)                                          # first index on ties
        peak, at = top, tokens
        for b in ids:                                   # the whole row's max: a banned id may hold it
            above = logits[..., b] > peak
            peak, at = torch.where(above, logits[..., b], peak), torch.where(above, b, at)
    rest, shifted = rest_mass(logits, peak, at, work)                                   # (B, K) float64
    if measure == "prob":        # probability of the token the position receives
        confidence = (top.double() - peak.double()).exp_().div_(rest.add(1))
    elif measure == "margin":    # top-1 minus top-2 probability (Dream's topk_margin)
        second = logits.topk(2, dim=-1).values[..., 1]
        confidence = (second.double() - peak.double()).expm1_().neg_().div_(rest.add(1))
    elif measure == "neg_entropy":  # sum p log(p + 1e-10), Dream's entropy; 0 is the most certain
        # reuses the buffer; not floored: a near-certain row's entropy is made of the tiny terms.
        # log p = (l - max) - log(1 + r): the max taken out first, exactly (l - log_z rounds at log_z)
        p = torch.sub(logits, peak.to(work)[..., None], out=shifted).sub_(rest.log1p().to(work)[..., None]).exp_()
        confidence = (p + 1e-10).log_().mul_(p).sum(-1, dtype=torch.float64)
    elif measure == "entropy":   # RND1's: sum p log p of softmax(logits / T) (T = 1 when greedy), no epsilon
        confidence = -entropy_of(logits, temperature)
    elif measure == "logprob":   # RND1's eb_gamma ranking: log p of the token under softmax(logits / T)
        confidence = tempered_log_p(logits, temperature).gather(-1, tokens[..., None])[..., 0]
    elif measure == "random":    # LLaDA's 'random' remasking
        confidence = torch.rand(tokens.shape, generator=generator, device=logits.device, dtype=work)
    else:
        raise ValueError(f"unknown confidence measure {measure!r}")
    return tokens, confidence


def gumbel_argmax(logits: torch.Tensor, temperature: float, ids: list[int], generator, work: torch.dtype):
    """A sample of softmax(logits / T) by Gumbel-max, never one of the banned `ids`."""
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=work)
    noisy = u.clamp_min_(torch.finfo(work).tiny).log_().neg_().log_().neg_()          # Gumbel noise, in place
    noisy.add_(logits.to(work) / temperature)
    for b in ids:                                                                    # never predicted
        noisy[..., b] = float("-inf")
    return noisy.argmax(-1)


def authors_softmax(logits, temperature: float, measure: str, ids: list[int], generator, dtype: torch.dtype):
    """predict as authors who take torch.softmax in `dtype` (the logits' own): the token is the
    probabilities' argmax (first index on ties, the banned ids left out), its confidence that
    probability; margin and entropy from the same probabilities, in `dtype`."""
    probs = torch.softmax(logits.to(dtype), -1)
    if temperature > 0:
        tokens = gumbel_argmax(logits, temperature, ids, generator, torch.promote_types(logits.dtype, torch.float32))
        top = probs.gather(-1, tokens[..., None])[..., 0]
    else:
        top, tokens = max_without(probs, ids)
    if measure == "prob":
        return tokens, top
    if measure == "margin":
        top2 = probs.topk(2, dim=-1).values
        return tokens, top2[..., 0] - top2[..., 1]
    return tokens, (probs * (probs + 1e-10).log()).sum(-1)


def rest_mass(logits: torch.Tensor, peak: torch.Tensor, at: torch.Tensor, work: torch.dtype):
    """(r (B, K) float64, the (B, K, V) `work` buffer it used): r = the sum of exp(l - peak) over
    every entry of each row but its max (at `at`; another entry equal to it counts 1). The upcast,
    the shift and the exponent write one buffer; on CPU, shifted terms below `exp_floor` are raised to
    it (x86's slow underflow path; they add at most V e^floor to r, below float64's resolution of
    1 + r). A row whose max is infinite or -inf gives r = nan / 0 as softmax's nan / 0 would."""
    peak = peak.to(work)[..., None]
    shift = peak.masked_fill(peak.abs() == float("inf"), 0)
    buffer = floored(torch.sub(logits, shift)).exp_()    # promotes: a bf16 row is read once, as fp32
    buffer.scatter_(-1, at[..., None], 0.0)
    return buffer.sum(-1, dtype=torch.float64), buffer


def authors_dtype(model, logits: torch.Tensor) -> torch.dtype | None:
    """predict's softmax_dtype for `model`: the logits' own dtype where the family's authors take
    their softmax in it (the model class says `authors_softmax = "logits"`, docs/specs/ranking.md), else
    None: a float64 softmax's numbers (LLaDA's authors upcast)."""
    return logits.dtype if model.authors_softmax == "logits" else None


def tempered_log_p(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """RND1's scores (docs/specs/rnd1.md 5): log_softmax(logits / T) at fp32 or better, T = 1 when greedy."""
    scaled = logits.to(torch.promote_types(logits.dtype, torch.float32)) / (temperature if temperature > 0 else 1.0)
    return scaled - scaled.logsumexp(-1, keepdim=True)


def entropy_of(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, K) the entropy -sum p log p of RND1's tempered distribution (no epsilon, as the authors')."""
    log_p = tempered_log_p(logits, temperature)
    return -(log_p.exp() * log_p).sum(-1)


def banned_ids(banned: Sequence[int] | torch.Tensor) -> list[int]:
    """The banned ids as sorted distinct host ints (a tensor of them is read once, on the host)."""
    return sorted(set(banned.tolist() if isinstance(banned, torch.Tensor) else banned))


def max_without(logits: torch.Tensor, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) (B, K) of the max over the last dim leaving out `ids` (sorted, distinct),
    first index on ties, NaN winning as in torch.max: one read of the vocabulary in the logits'
    dtype, over the views between the banned ids (no copy, no -inf fill)."""
    best = None
    edges = [-1, *ids, logits.shape[-1]]
    for a, b in zip(edges, edges[1:]):
        if b <= a + 1:
            continue                                     # no id between two banned ones
        value, index = logits[..., a + 1:b].max(-1)
        index = index + (a + 1)
        if best is not None:                             # the earlier segment wins ties
            keep = best[0].isnan() | (best[0] >= value)
            value, index = torch.where(keep, best[0], value), torch.where(keep, best[1], index)
        best = value, index
    if best is None:
        raise ValueError("every id is banned")
    return best


def floored(shifted: torch.Tensor) -> torch.Tensor:
    """On CPU, shifted logits (in place) no lower than `exp_floor`; elsewhere as they are (a GPU's exp
    has no slow path, and the pass would be one more kernel in the step's graph)."""
    return shifted.clamp_min_(exp_floor(shifted.dtype)) if shifted.device.type == "cpu" else shifted


def exp_floor(dtype: torch.dtype) -> float:
    """The least exponent whose exp is a normal number of `dtype` (fp32: -86.3). On x86 torch's exp
    takes a slow path for results that underflow, -inf included: 30-50x slower per element (a
    vocabulary row of a peaked model is mostly such terms). Terms raised to this floor add at most
    V e^floor (fp32: 126464 x 3e-38) to a sum that holds exp(0) = 1: nothing at that precision."""
    return math.log(torch.finfo(dtype).tiny) + 1.0


def fixed_schedule(masked: torch.Tensor, steps: int) -> torch.Tensor:
    """LLaDA's `get_num_transfer_tokens`: (B,) masked counts -> (B, steps) tokens per step,
    spread evenly, the remainder going to the first steps."""
    base, remainder = masked[:, None] // steps, masked[:, None] % steps
    return base + (torch.arange(steps, device=masked.device)[None, :] < remainder).long()


def block_schedule(counted: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """(B, S) the counts a block's steps must reach at least: LLaDA's fixed schedule, or for a rule
    that fills at its last step (RND1's eb_gamma) nothing before step S and everything at it."""
    steps = cfg.steps_per_block
    if not RULES[cfg.rule].fills_last_step:
        return fixed_schedule(counted, steps)
    schedule = torch.zeros(counted.shape[0], steps, dtype=torch.long, device=counted.device)
    schedule[:, -1] = counted
    return schedule


def commit_counts(sorted_conf: torch.Tensor, candidates: torch.Tensor, cfg: DecodeConfig,
                  scheduled: torch.Tensor | None = None, sorted_bound: torch.Tensor | None = None) -> torch.Tensor:
    """How many to commit per row (the rule's count, rules.py). sorted_conf (B, K) descending,
    non-candidates at -inf; candidates (B,) their number; scheduled (B,) the schedule's counts;
    sorted_bound (B, K): a rule's second number per candidate (the entropy it bounds), same order."""
    rule = RULES[cfg.rule]
    n = rule.count(sorted_conf, cfg, scheduled, sorted_bound) if rule.bound else rule.count(sorted_conf, cfg, scheduled)
    return torch.minimum(n.clamp_min(1), candidates)   # at least the best one; never beyond candidates


def select(confidence: torch.Tensor, candidate: torch.Tensor, cfg: DecodeConfig,
           scheduled: torch.Tensor | None = None, bound: torch.Tensor | None = None) -> torch.Tensor:
    """confidence, candidate (B, K) -> (B, K) bool: the n most confident candidates of each row.
    bound (B, K): the rule's second number per candidate, where it has one (Rule.bound)."""
    if RULES[cfg.rule].bound == "level" and bound is not None:   # DUS: a planned order, by level then position
        confidence = -bound.to(confidence.dtype)                   # (columns are in position order; stable sort)
    elif RULES[cfg.rule].bound == "position":                      # LocalLeap: anchors and their leaps first
        if bound is None or scheduled is None:
            raise UserError("rule local_leap: select was given no candidate positions or schedule")
        confidence = leap_key(confidence, candidate, bound, scheduled, cfg)
    elif RULES[cfg.rule].bound == "stable":                        # KLASS: the ready candidates first
        if bound is None or scheduled is None:
            raise UserError("rule klass: select was given no stability or schedule")
        confidence = ready_key(confidence, bound, cfg)
    elif RULES[cfg.rule].by_position:      # candidates come in position order: rank by index
        confidence = -torch.arange(confidence.shape[-1], device=confidence.device, dtype=confidence.dtype).expand_as(confidence)
    conf = confidence.masked_fill(~candidate, float("-inf"))
    sorted_conf, order = conf.sort(dim=-1, descending=True, stable=True)
    sorted_bound = None if bound is None else bound.gather(-1, order)
    n = commit_counts(sorted_conf, candidate.sum(-1), cfg, scheduled, sorted_bound)
    take = torch.arange(conf.shape[-1], device=conf.device)[None, :] < n[:, None]   # in sorted order
    return torch.zeros_like(take).scatter(-1, order, take)


def select_edits(tokens: torch.Tensor, probability: torch.Tensor, current: torch.Tensor, editable: torch.Tensor,
                 threshold: float) -> torch.Tensor:
    """Token editing (T2T): (B, K) bool, the editable positions whose prediction differs from the
    token written there and whose probability exceeds `threshold` (strictly, as the references).
    All arguments (B, K): predicted tokens, their probabilities, the canvas tokens, editable."""
    return editable & (probability > threshold) & (tokens != current)


def sub_block(block_masked: torch.Tensor, sub_len: int | None, s: int, host: torch.Tensor, mask: int):
    """Candidates restricted to each row's first sub-block that still has masks (Fast-dLLM v2), and
    the span of that sub-block when every row is in the same one and its first token is committed
    (then its forward can reuse the rest of the block, the DualCache of sub-blocks); else None."""
    B, L = block_masked.shape
    if sub_len is None or sub_len >= L:
        return block_masked, None
    grouped = block_masked.view(B, L // sub_len, sub_len)
    current = grouped.any(-1).float().argmax(-1)                                   # (B,) first with a mask
    keep = torch.arange(L // sub_len)[None, :] == current[:, None]
    candidates = (grouped & keep[..., None]).view(B, L)
    a = s + int(current[0]) * sub_len
    same = bool((current == current[0]).all()) and bool((host[:, a] != mask).all())
    return candidates, (a, a + sub_len) if same else None
