"""Accelerators: methods that plug into one step of the mask loop (step.decode_step), each through
the hooks of `Accelerator` (every hook's default does nothing). One module per method:

    klass        KLASS's KL history: asks for the next block's logits, gives the rule's `stable` bound
    prophet      Prophet's stop test: widens the decided slots, tests the answer gap, fills an exiting row
    end_think    iLLaDA's end-of-thinking boost: one logit per row raised
    credit       CreditDecoding: logits + alpha log(1 + credit)
    constraint   structured output: the frontier's logits masked, the rule's choice cut to the valid run

The mask loop holds its active ones in a list, in the order klass, prophet, end_think, credit,
constraint, and every hook runs over that list in that order, which is the order exactness needs:
the forward's extra columns come off in the reverse of the order they were added (klass's next
block last, so first), then the logits transforms (boost, credit, grammar) and, after the rule's
choice, Prophet's fill before the grammar's cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepSlots:
    """One step's slots as the hooks read them: B rows, K candidate slots of the block (+ X: the
    slots a `widen` added)."""
    span: tuple                 # the canvas span the forward recomputes
    s: int                      # the block's first canvas position
    order: torch.Tensor         # (B, K) host: block offsets of the candidate slots
    candidate: torch.Tensor     # (B, K) host bool: the slots that may be committed
    positions: torch.Tensor     # (B, K [+ X]) host: canvas positions decided
    on_device: torch.Tensor     # (B, K [+ X]) the same, on the canvas's device
    cfg: object                 # the DecodeConfig
    banned: tuple               # ids never predicted
    generator: torch.Generator | None

    @property
    def live(self) -> torch.Tensor:
        """(B, K) the candidates on the device."""
        return self.candidate.to(self.on_device.device)


class Accelerator:
    """The hooks a method may fill in; each default leaves the step as it is."""

    def start_block(self, block: int, blocks: list[tuple[int, int]]) -> None:
        """Before the first step of canvas.blocks[block]."""

    def plan(self, host: torch.Tensor, span, step: int, nfe: int) -> None:
        """Before a host-planned step's forward (outside inference mode): host (B, T) the canvas
        before it; step: the step in the block; nfe: this forward's number."""

    def widen(self, span, positions: torch.Tensor) -> torch.Tensor:
        """positions (B, K) -> (B, K + X): slots the step also decides (and may commit)."""
        return positions

    def ask(self, span, asked: torch.Tensor) -> torch.Tensor:
        """asked (B, n) -> (B, n + X): slots whose logits the forward also gives, read only
        (`adjust` takes their columns off again)."""
        return asked

    def adjust(self, logits: torch.Tensor, slots: StepSlots) -> torch.Tensor:
        """The forward's logits, (B, n, V), before any prediction reads them."""
        return logits

    def bound(self, logits: torch.Tensor, slots: StepSlots) -> torch.Tensor | None:
        """The rule's second number per candidate (B, K) where this method gives it (rules.Rule.bound)."""
        return None

    def decide(self, tokens, conf, chosen, slots: StepSlots):
        """The rule's choice (B, K) -> (tokens, conf, chosen), possibly widened to (B, K + X)."""
        return tokens, conf, chosen
