"""One step of the mask loop, for the engine (engine.py): the forward over the step's span at the
candidate slots, the prediction and the rule's decision, the commit into the device canvas, and the
step's one host transfer; and a block-causal family's store pass over a finished block."""

from __future__ import annotations

import torch

from .accelerators import Accelerator, StepSlots
from .constraint import RowConstraints
from .dilation import level_of
from .graphs import SpanForward
from .rules import RULES
from .selection import authors_dtype, entropy_of, max_without, predict, select, select_edits
from .split_head import decide, split_decider


def decode_step(forward: SpanForward, span, block_masked, s, scheduled, cfg, banned, generator, editable=None,
                accelerators: list[Accelerator] = ()):
    """One forward and one decision. block_masked (B, L): the active block's candidate positions;
    editable (B, L) or None: positions whose written token may be edited (then every position of
    the block is read); accelerators: the methods plugged in (accelerators/), each hook run over
    them in their order. Returns positions, tokens, confidences, committed and edited (B, K [+ X])."""
    canvas = forward.canvas
    device = canvas.device
    whole = forward.full_block or editable is not None
    B, L = block_masked.shape
    # Candidate slots: the whole block in position order (as device_step.py, so that sampling draws
    # alike), or each row's masked positions first then committed ones as filler: distinct indices.
    order = torch.arange(L).expand(B, L) if whole else \
        torch.argsort((~block_masked).to(torch.int8), dim=1, stable=True)[:, :int(block_masked.sum(1).max())]
    candidate = block_masked.gather(1, order)
    positions = order + s
    for a in accelerators:                      # slots also decided (Prophet: the answer, other masks)
        positions = a.widen(span, positions)
    pos_dev = positions.to(device, non_blocking=True)
    slots = StepSlots(span, s, order, candidate, positions, pos_dev, cfg, banned, generator)
    asked = positions
    for a in accelerators:                      # slots only read (KLASS: the next block)
        asked = a.ask(span, asked)
    asked = pos_dev if asked is positions else asked.to(device, non_blocking=True)
    if (head := split_decider(forward.model, cfg, accelerators)) is not None:   # tensor parallel: each rank's
        tokens, conf = decide(head, lambda: forward(span, asked), banned)       # (max, argmax, lse) per position
        bound = None
    else:
        logits = forward(span, asked).to(device)                                    # (B, K [+ X], V)
        for a in accelerators:                  # back to the decided slots' logits, then transformed
            logits = a.adjust(logits, slots)
        tokens, conf = predict(logits, temperature=cfg.temperature, measure=cfg.confidence, banned=banned,
                               generator=generator, softmax_dtype=authors_dtype(forward.model, logits))
        bound = rule_bound(RULES[cfg.rule].bound, logits, cfg, L, order, pos_dev)
    for a in accelerators:                      # KLASS's stability
        bound = a.bound(logits, slots) if bound is None else bound
    chosen = select(conf, candidate.to(device), cfg, scheduled.to(device), bound)
    for a in accelerators:                      # Prophet's fill, then the grammar's valid run
        tokens, conf, chosen = a.decide(tokens, conf, chosen, slots)
    current = canvas.gather(1, pos_dev)
    edited = (torch.zeros_like(chosen) if editable is None else
              select_edits(tokens, conf, current, editable.gather(1, order).to(device), cfg.edit_threshold))
    canvas.scatter_(1, pos_dev, torch.where(chosen | edited, tokens, current))
    packed = torch.stack([tokens.double(), conf.double(), chosen.double(), edited.double()]).cpu()   # the one sync
    return positions, packed[0].long(), packed[1], packed[2].bool(), packed[3].bool()


def rule_bound(kind: str | None, logits, cfg, L: int, order, pos_dev):
    """The rule's own second number per candidate (B, K) (rules.Rule.bound), from the logits (B, K, V)
    and the slots' block offsets `order` in a block of L; None where it has none or an accelerator
    gives it (KLASS's "stable")."""
    device = logits.device
    if kind == "entropy":                                                    # RND1's eb_gamma
        return entropy_of(logits, cfg.temperature)
    if kind == "level":                                                      # DUS's levels
        return torch.tensor(level_of(L, cfg.dilation_base, cfg.dilation_skip))[order].to(device)
    if kind == "position":                                                   # LocalLeap's radius
        return pos_dev[:, :order.shape[1]]
    return None


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

