"""KLASS (../klass.py) as an accelerator: the forward also reads the next block where the span
covers it (its logits become that block's first previous distributions), and the rule's bound is
each candidate's stability."""

from __future__ import annotations

from ..klass import KlassTrace
from . import Accelerator, StepSlots


class Klass(Accelerator):
    def __init__(self, trace: KlassTrace):
        self.trace = trace

    def start_block(self, block, blocks) -> None:
        """Its look-ahead becomes the block's past."""
        self.trace.start_block(blocks[block + 1] if block + 1 < len(blocks) else None)

    def ask(self, span, asked):
        return self.trace.widen(span, asked)        # + the next block's positions (B, L')

    def adjust(self, logits, slots: StepSlots):
        return self.trace.split(logits, slots.candidate.any(1).to(logits.device))   # keeps the next block's

    def bound(self, logits, slots: StepSlots):
        return self.trace.stable(slots.on_device - slots.s, slots.live, logits)    # (B, K) bool
