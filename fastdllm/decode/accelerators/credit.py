"""CreditDecoding (../credit.py) as an accelerator: the credit zeroed at every block start, and
the decision's logits fused with it at every step."""

from __future__ import annotations

from ..credit import CreditTrace
from . import Accelerator, StepSlots


class Credit(Accelerator):
    def __init__(self, trace: CreditTrace):
        self.trace = trace                          # (B, L, V) per-block credit

    def start_block(self, block, blocks) -> None:
        self.trace.reset()                          # credit never outlives its block

    def adjust(self, logits, slots: StepSlots):
        """logits + alpha log(1 + credit), after any graph (a new tensor, fp32 or better)."""
        return self.trace(slots.on_device - slots.s, slots.live, logits)
