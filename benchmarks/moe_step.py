"""The step benchmarks/moe_speed.py times: one decoding forward of a MoE model or its dense twin, as the
family decodes (a cached block, or RND1's whole canvas without a cache), with per-layer times and the
experts the step's tokens hit."""

from __future__ import annotations

import statistics
from contextlib import contextmanager

import harness
import torch

from fastdllm.models.moe import SparseMoE

WHOLE_CANVAS = ("rnd1",)   # families that decode one global canvas with no cache: every step is a full forward


class Step:
    """One decoding step's forward over a canvas of T slots (prefix P, then gen_len), logits at the
    step's K masked positions (the last layer computes its MLP, hence its routing, for those K rows
    only). Cached families: the block [P, P+B) against the cache, filled once by a forward over the
    whole canvas; a `--masked` share of the block is masks. RND1 (WHOLE_CANVAS): the whole canvas
    [0, T), no cache, a `--masked` share of the answer's gen_len slots still masks (mid-decode)."""

    def __init__(self, lm, args):
        model, device = lm.model, lm.device
        P, B, T = args.prefix, args.block, args.prefix + args.gen_len
        self.whole = lm.family in WHOLE_CANVAS
        g = torch.Generator().manual_seed(0)
        canvas = torch.randint(0, 4096, (1, T), generator=g)
        open_slots = args.gen_len if self.whole else B
        masked = torch.randperm(open_slots, generator=g)[:max(1, round(args.masked * open_slots))].sort().values
        canvas[:, P + masked] = lm.specials.mask
        if not self.whole:
            canvas[:, P + B:] = lm.specials.mask
        self.model, self.device, self.span = model, device, (0, T) if self.whole else (P, P + B)
        self.canvas = canvas.to(device)
        self.positions = (P + masked).to(device)[None]             # (1, K): logits where masks are, as the engine asks
        # RND1's dense twin is built as sdar_moe (RND1 refuses dense layers): its whole-canvas step is
        # bidirectional like RND1's, so the cache's attention mask is asked without blocks.
        block = None if self.whole else model.attention.block
        self.cache = model.new_cache(torch.ones_like(self.canvas, dtype=torch.bool), block=block)
        if not self.whole:
            with torch.inference_mode():
                model.forward_span(self.canvas, 0, T, self.cache, self.positions)

    def describe(self, args) -> str:
        K, T = self.positions.shape[1], self.canvas.shape[1]
        if self.whole:
            return (f"the whole canvas of {T} tokens (a {args.prefix}-token prompt and {args.gen_len} answer "
                    f"slots, {K} of them masks: logits there), no cache, as RND1 decodes")
        return (f"a block of {args.block} tokens, {K} of them masks (logits there), against {args.prefix} "
                f"cached tokens, canvas {T}")

    def tokens(self) -> int:
        """Rows every full-span layer routes."""
        return self.span[1] - self.span[0]

    def __call__(self):
        return self.model.forward_span(self.canvas, *self.span, self.cache, self.positions)

    def timed(self, reps: int) -> tuple[float, list[float]]:
        """(ms per step, ms per decoder layer): medians of `reps` steps after a warm-up. The layer
        times come from hooks that synchronise the device around each layer; on a GPU, where that
        stops the host from queueing kernels ahead, the step time comes from runs without them."""
        marks: list[float] = []

        def mark(*_):
            marks.append(harness.clock(self.device))
        hooks = [h for b in self.model.blocks for h in (b.register_forward_pre_hook(mark), b.register_forward_hook(mark))]
        steps, layers = [], []
        try:
            with torch.inference_mode():
                for _ in range(reps + 1):
                    marks.clear()
                    steps.append(self.run_once())
                    layers.append([1000 * (b - a) for a, b in zip(marks[::2], marks[1::2])])
        finally:
            for h in hooks:
                h.remove()
        if self.device.type != "cpu":
            with torch.inference_mode():
                steps = [self.run_once() for _ in range(reps + 1)]
        return statistics.median(steps[1:]), [statistics.median(layer) for layer in zip(*layers[1:])]

    def run_once(self) -> float:
        return harness.time_ms(self, self.device)

    def expert_hits(self) -> list[int | None]:
        """Distinct routed experts the step's tokens chose in each layer (None: a dense layer)."""
        hits: list[int | None] = [None] * len(self.model.blocks)
        hooks = []
        for i, block in enumerate(self.model.blocks):
            moe = next((m for m in block.modules() if isinstance(m, SparseMoE)), None)
            if moe is not None:
                hooks.append(moe.gate.register_forward_hook(
                    lambda _m, _in, out, i=i: hits.__setitem__(i, int(out[1].unique().numel()))))
        try:
            with torch.inference_mode():
                self()
        finally:
            for h in hooks:
                h.remove()
        return hits


@contextmanager
def uniform_routing(model, seed: int = 0):
    """Every router's choice replaced by k distinct experts drawn uniformly for each token (its
    weights kept): the spread of a router that balances load perfectly within a block."""
    g = torch.Generator(device=model.input_device).manual_seed(seed)

    def draw(router, _inputs, out):
        weights, chosen = out
        scores = torch.rand(chosen.shape[0], router.routing.experts, device=chosen.device, generator=g)
        return weights, scores.topk(chosen.shape[1], dim=-1).indices
    hooks = [m.gate.register_forward_hook(draw) for m in model.modules() if isinstance(m, SparseMoE)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()
