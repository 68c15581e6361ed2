"""Structured output (../constraint.py) as an accelerator: the frontier's disallowed tokens to
-inf, and of the rule's choice only the valid run from each constrained row's frontier (a host
round trip before the commit)."""

from __future__ import annotations

from ..constraint import RowConstraints
from . import Accelerator, StepSlots


class Constraint(Accelerator):
    def __init__(self, rows: RowConstraints):
        self.rows = rows

    def adjust(self, logits, slots: StepSlots):
        return self.rows.restrict(logits, slots.candidate)          # in place

    def decide(self, tokens, conf, chosen, slots: StepSlots):
        device = tokens.device
        tokens, chosen = (t.to(device) for t in self.rows.decide(tokens.cpu(), chosen.cpu(), slots.candidate))
        return tokens, conf, chosen
