"""iLLaDA's end-of-thinking boost (../growing.py) as an accelerator: planned on the host canvas
before each forward, one logit per row raised in place before anything reads them."""

from __future__ import annotations

from ..growing import Bonus, EndThinkBoost
from . import Accelerator, StepSlots


class EndThink(Accelerator):
    def __init__(self, boost: EndThinkBoost):
        self.boost = boost
        self.block: tuple[int, int] = (0, 0)
        self.bonus: Bonus | None = None

    def start_block(self, block, blocks) -> None:
        self.block = blocks[block]

    def plan(self, host, span, step, nfe) -> None:
        self.bonus = self.boost.plan(host, *self.block)

    def adjust(self, logits, slots: StepSlots):
        return logits if self.bonus is None else self.bonus.apply(logits, slots.positions)
