"""The device step: one step of the active block as tensor ops on the device, no host read inside.

The host-planned step (step.decode_step) plans on the host: which positions are candidates (from the
host copy of the canvas), how many the fixed schedule asks for, then runs forward, predict and
select on the device and reads the result back. The device step keeps all of that on the device
with static shapes, so that on one CUDA device the whole step is one graph (graphs.py):

    per block (eager, once)   positions (B, L) = the block [s, e); schedule (B, S) from the device
                              canvas's mask count; step counter (a device scalar)
    per step  (one graph)     logits (B, L, V) at every block position -> predict -> candidates =
                              the block's masks on the device canvas -> select (the rule's count,
                              the scheduled count read at the device step counter) -> commit with
                              torch.where into the canvas -> step += 1 -> the record (3, B, L)
    per step  (host)          one transfer of the record: tokens, confidences, committed, 3 B L
                              numbers; the host copy of the canvas takes the commits, and from it
                              the engine knows, without asking the device, whether the block is done

Committed positions are in the candidate rows too and are kept out by masking (confidence -inf in
select), so a row with no mask left commits nothing. The tokens, commit order and NFE equal today's
path (tests/decode/test_device_step.py, float64, every cache mode and rule; greedy against the masked-only
candidate lists of a CPU run, sampled against the full-block lists, whose noise has the same shape).

It applies (DeviceStep.applies) to mask-predict decoding of a bidirectional family (LLaDA, Dream,
infilling too) without token editing or sub-blocks, under rules whose count reads the sorted
confidences and the schedule only (threshold, factor, frechet, fixed, dynamic, dinfer, sequential,
entropy_bounded). The rest stays on today's path: block-causal families (SDAR, Fast-dLLM v2,
LLaDA2.x: store passes, sub-blocks, editing), RND1's rules (entropy schedule over one global canvas,
eb_gamma's second number), DUS's levels, CreditDecoding's credit, the renoising sampler. It is
used where the engine's SpanForward says so (`device_step`: by default where CUDA graphs run; a CPU
run keeps logits at the masked positions only, fewer rows of the head). Sampling (temperature > 0,
random confidences) reads a torch.Generator: those steps run the same tensor ops with the forward
alone in the graph, as before (a user generator in a captured graph needs torch's generator
registration; not relied on here).
"""

from __future__ import annotations

import torch

from .config import DecodeConfig
from .graphs import SpanForward
from .rules import RULES
from .selection import authors_dtype, block_schedule, predict, select


def to_host(record: torch.Tensor) -> torch.Tensor:
    """The step's one device-to-host transfer (a synchronisation on a GPU)."""
    return record.cpu()


class DeviceStep:
    """The steps of one block [s, e): calling it runs one and returns what the host learns."""

    @staticmethod
    def applies(cfg: DecodeConfig, causal: bool) -> bool:
        """Whether the device step decodes this configuration (the module docstring says which)."""
        rule = RULES[cfg.rule]
        return (not causal and cfg.edit_threshold is None and (cfg.sub_block_len or cfg.block_len) >= cfg.block_len
                and not (rule.bound or rule.whole_canvas or rule.renoise)   # DUS's levels are a bound too
                and not cfg.credit)                       # credit.py: host path only

    def __init__(self, forward: SpanForward, cfg: DecodeConfig, s: int, e: int, mask: int, banned,
                 generator: torch.Generator | None):
        canvas = forward.canvas
        B, device = canvas.shape[0], canvas.device
        self.forward, self.cfg, self.s, self.e, self.mask, self.banned = forward, cfg, s, e, mask, banned
        self.generator = generator
        self.host_positions = torch.arange(s, e).repeat(B, 1)                       # (B, L)
        self.positions = self.host_positions.to(device)                             # (B, L), fixed address
        self.schedule = block_schedule((canvas[:, s:e] == mask).sum(1), cfg)        # (B, S) on the device
        self.counter = torch.zeros((), dtype=torch.long, device=device)             # the block's step
        # a whole-step graph only without random numbers (see the module docstring)
        self.whole = forward.graphs and cfg.temperature == 0 and cfg.confidence != "random"

    def __call__(self, span: tuple[int, int]):
        """One step recomputing `span`: (positions, tokens, confidences, committed), each (B, L) on
        the host, positions in canvas coordinates. The device canvas has the commits already."""
        if self.whole:
            record = self.forward.graphed(("step", span, self.s, self.e),
                                          lambda: self.decide(self.forward.eager(span, self.positions)))
        else:
            record = self.decide(self.forward(span, self.positions))
        packed = to_host(record)
        return self.host_positions, packed[0].long(), packed[1], packed[2].bool()

    def decide(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (B, L, V) -> the record (3, B, L): predict, select, commit. Tensor ops only, static
        shapes, no host read (capturable)."""
        cfg, canvas = self.cfg, self.forward.canvas
        logits = logits.to(canvas.device)
        tokens, conf = predict(logits, temperature=cfg.temperature, measure=cfg.confidence, banned=self.banned,
                               generator=self.generator, softmax_dtype=authors_dtype(self.forward.model, logits))
        block = canvas[:, self.s:self.e]                                            # (B, L) a view
        steps = self.schedule.shape[1]
        at = self.counter.clamp_max(steps - 1).expand(block.shape[0], 1)            # (B, 1)
        chosen = select(conf, block == self.mask, cfg, self.schedule.gather(1, at)[:, 0])
        block.copy_(torch.where(chosen, tokens, block))                            # the commit, in place
        self.counter.add_(1)
        return torch.stack([tokens.double(), conf.double(), chosen.double()])        # ids exact in float64
