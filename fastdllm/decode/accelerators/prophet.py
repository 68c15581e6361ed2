"""Prophet (../prophet.py) as an accelerator: at a check step (a forward fresh outside the block)
the step also decides the answer region and every other mask of the row, tests the answer's gap,
and a row that passes commits every mask it has."""

from __future__ import annotations

from ..prophet import Check, Prophet
from . import Accelerator, StepSlots


class ProphetStop(Accelerator):
    def __init__(self, prophet: Prophet):
        self.prophet = prophet
        self.block = 0
        self.check: Check | None = None             # this step's test (None: a cached step, no test)

    def start_block(self, block, blocks) -> None:
        self.block = block

    def plan(self, host, span, step, nfe) -> None:
        self.check = self.prophet.check(host, span, self.block, step, nfe)

    def widen(self, span, positions):
        return positions if self.check is None else self.check.widen(positions)   # + answer, other masks

    def adjust(self, logits, slots: StepSlots):
        return logits if self.check is None else self.check.test(logits)   # the gap test; (B, K, V) decide

    def decide(self, tokens, conf, chosen, slots: StepSlots):
        if self.check is None:
            return tokens, conf, chosen
        cfg = slots.cfg                             # an exiting row commits every mask it has
        return self.check.fill(tokens, conf, chosen, slots.live, cfg, slots.banned, slots.generator)
