"""One step of the mask loop, for the engine (engine.py): the forward over the step's span at the
candidate slots, the prediction and the rule's decision, the commit into the device canvas, and the
step's one host transfer; and a block-causal family's store pass over a finished block."""

from __future__ import annotations

import torch

from .constraint import RowConstraints
from .credit import CreditTrace
from .dilation import level_of
from .growing import Bonus
from .graphs import SpanForward
from .klass import KlassTrace
from .prophet import Check
from .rules import RULES
from .selection import authors_dtype, entropy_of, max_without, predict, select, select_edits


def decode_step(forward: SpanForward, span, block_masked, s, scheduled, cfg, banned, generator, editable=None,
                 credit: CreditTrace | None = None, check: Check | None = None,
                 constraint: RowConstraints | None = None, klass: KlassTrace | None = None,
                 bonus: Bonus | None = None):
    """One forward and one decision. block_masked (B, L): the active block's candidate positions;
    editable (B, L) or None: positions whose written token may be edited (then every position of
    the block is read); credit: CreditDecoding's state (credit.py), whose fused logits the decision
    reads; check: Prophet's stop test of this step (prophet.py), which reads more slots (X) and may
    commit them all; constraint: the rows' grammar matchers (constraint.py), which mask the logits
    at each constrained row's frontier and keep of the rule's choice the valid run from it (a host
    round trip before the commit); klass: KLASS's KL history (klass.py), whose forward also reads the
    next block where the span covers it; bonus: iLLaDA's end-think boosts of this step (growing.py),
    added to the logits before anything reads them. Returns positions, tokens, confidences, committed and edited (B, K [+ X])."""
    canvas = forward.canvas
    device = canvas.device
    whole = forward.full_block or editable is not None
    B, L = block_masked.shape
    # Candidate slots: the whole block in position order (as device_step.py, so that sampling draws
    # alike), or each row's masked positions first then committed ones as filler: distinct indices.
    order = torch.arange(L).expand(B, L) if whole else \
        torch.argsort((~block_masked).to(torch.int8), dim=1, stable=True)[:, :int(block_masked.sum(1).max())]
    candidate = block_masked.gather(1, order)
    positions = order + s if check is None else check.widen(order + s)   # prophet.py: + answer, other masks
    pos_dev = positions.to(device, non_blocking=True)
    asked = pos_dev if klass is None else klass.widen(span, positions).to(device, non_blocking=True)
    logits = forward(span, asked).to(device)                                        # (B, K [+ X], V)
    if klass is not None:
        logits = klass.split(logits, candidate.any(1).to(device))   # keeps the next block's
    if check is not None:
        logits = check.test(logits)                     # the gap test; the block's (B, K, V) decide as usual
    if bonus is not None:                       # growing.py: one logit per row raised, in place
        logits = bonus.apply(logits, positions)
    if credit is not None:                      # credit.py: logits + alpha log(1 + credit), after any graph
        logits = credit(pos_dev - s, candidate.to(device), logits)
    if constraint is not None:                  # the frontier's disallowed tokens to -inf, in place
        logits = constraint.restrict(logits, candidate)
    tokens, conf = predict(logits, temperature=cfg.temperature, measure=cfg.confidence, banned=banned,
                           generator=generator, softmax_dtype=authors_dtype(forward.model, logits))
    kind = RULES[cfg.rule].bound
    bound = (entropy_of(logits, cfg.temperature) if kind == "entropy" else                       # RND1's eb_gamma
             torch.tensor(level_of(L, cfg.dilation_base, cfg.dilation_skip))[order].to(device) if kind == "level"
             else pos_dev[:, :order.shape[1]] if kind == "position"                               # LocalLeap's radius
             else klass.stable(pos_dev - s, candidate.to(device), logits) if kind == "stable"      # KLASS
             else None)                                                                           # DUS's levels
    chosen = select(conf, candidate.to(device), cfg, scheduled.to(device), bound)
    if check is not None:                               # an exiting row commits every mask it has
        tokens, conf, chosen = check.fill(tokens, conf, chosen, candidate.to(device), cfg, banned, generator)
    if constraint is not None:                  # only the valid run from each constrained row's frontier
        tokens, chosen = (t.to(device) for t in constraint.decide(tokens.cpu(), chosen.cpu(), candidate))
    current = canvas.gather(1, pos_dev)
    edited = (torch.zeros_like(chosen) if editable is None else
              select_edits(tokens, conf, current, editable.gather(1, order).to(device), cfg.edit_threshold))
    canvas.scatter_(1, pos_dev, torch.where(chosen | edited, tokens, current))
    packed = torch.stack([tokens.double(), conf.double(), chosen.double(), edited.double()]).cpu()   # the one sync
    return positions, packed[0].long(), packed[1], packed[2].bool(), packed[3].bool()


def complete_block(forward: SpanForward, model, host: torch.Tensor, s: int, e: int, mask: int,
                   constraint: RowConstraints | None = None):
    """Block-causal: run the finished span [s, e) once more so that its keys/values are stored as
    final. A shifted family (Fast-dLLM v2) also reads the next block's first token from it, greedily
    (never the mask id), where that position is still masked; a constrained row's token is its
    matcher's (the position is its frontier). Returns positions, tokens (B, 1) and
    committed (B, 1) bool."""
    B, T = host.shape
    wanted = bool(model.logit_shift) and e < T
    at = torch.full((B, 1), e if wanted else e - 1)                 # logits: the next block's first slot
    logits = forward((s, e), at.to(forward.canvas.device))
    chosen = (host.gather(1, at) == mask) & wanted                  # (B, 1)
    if constraint is not None:
        logits = constraint.restrict(logits, chosen)
    tokens = max_without(logits, [mask])[1].cpu()                   # the argmax, never the mask id
    if constraint is not None:
        tokens, chosen = constraint.decide(tokens, chosen, chosen)
    host.scatter_(1, at, torch.where(chosen, tokens, host.gather(1, at)))
    device = forward.canvas.device
    forward.canvas.scatter_(1, at.to(device), host.gather(1, at).to(device))
    return at, tokens, chosen

