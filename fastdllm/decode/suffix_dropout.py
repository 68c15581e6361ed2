"""DPad's suffix dropout (Crys-Chen/DPad, docs/accelerators/dpad.md 2): a canvas policy for long answers.

Under bidirectional attention every step attends to the whole masked suffix after the active block.
DPad keeps, once per block, a random part of it and drops the rest from the forward: a dropped slot
is neither computed nor attended to. Suffix offset j (slot e + j after the block [s, e)) is kept
with probability keep[j], a Gaussian profile over a window of `dpad_window` slots:

    x_j = j * dpad_k / (dpad_window - 1)       (linspace(0, k, w): k is where the window ends, in
    keep[j] = dpad_scale * exp(-x_j^2 / 2) / sqrt(2 pi)      standard deviations; 0 past the window)

drawn as theirs: one float32 uniform per suffix slot, kept iff u_j < keep[j], from a CPU generator
seeded with cfg.seed (separate from the sampling one) and shared by every row. A block draws
gen_len - (e - start) uniforms (their T - e at batch 1; the same count for a row alone and in a
batch, whatever the other rows' lengths).

How (exact, and the dropped rows are really not computed): the canvas stays as it is (every slot
from e on holds the mask id, or padding past a shorter row's end), so the compaction is positional
only. The n kept slots are laid out in the first slots after the block, [e, E) with E = e + n, each
with the RoPE position of the slot it stands for (all hold the same mask token, so only positions
differ); the key mask hides [E, T) and any kept slot past its row's own end. Spans then end at E
instead of T (the engine passes E to span_for), so a step computes [0, E) or [s, E) and never the
dropped rows; their stale keys in [E, T) are masked. Every block starts from the true positions
and the canvas's own key mask before its draw, and its first forward is a refresh over [0, E), so
nothing from the previous block's layout survives. Attention still scores the T - E masked keys
(there is no kv_end slicing): what is saved is the dropped rows' projections and MLPs.
"""

from __future__ import annotations

import math

import torch

from ..errors import UserError


def keep_profile(cfg) -> torch.Tensor:
    """(max(gen_len, window),) float32: the keep probability of suffix offset j (may exceed 1:
    then always kept). Their GaussianSampler.pdf, on the host."""
    w = cfg.dpad_window
    x = torch.linspace(0.0, cfg.dpad_k, w, dtype=torch.float32)
    prob = torch.zeros(max(cfg.gen_len, w), dtype=torch.float32)
    prob[:w] = cfg.dpad_scale * torch.exp(-0.5 * x ** 2) / torch.sqrt(torch.tensor(2 * math.pi, dtype=torch.float32))
    return prob


def draw_kept(prob: torch.Tensor, count: int, generator: torch.Generator) -> torch.Tensor:
    """(n,) increasing suffix offsets j < count that are kept: one draw of `count` uniforms."""
    u = torch.rand(count, generator=generator, dtype=torch.float32)
    return torch.nonzero(u < prob[:count])[:, 0]


def refuse(infilling: bool) -> None:
    """One-line refusal where the task decides (the family's are in combinations.FAMILY, the config's in config.py)."""
    if infilling:
        raise UserError("dpad: the slots after a block hold template text when filling holes; suffix dropout "
                        "needs a masked suffix")


class SuffixDropout:
    """One batch's kept suffix, redrawn at every block start (`block`), written into the cache's
    positions and key mask in place (fixed addresses: CUDA graphs replay it)."""

    def __init__(self, cfg, canvas, cache, infilling: bool = False):
        refuse(infilling)
        self.cfg, self.cache, self.start = cfg, cache, canvas.starts[0]   # bidirectional: one start
        self.prob = keep_profile(cfg)
        self.generator = torch.Generator().manual_seed(cfg.seed)
        self.positions = cache.positions.clone()                          # (B, T) the true positions
        self.valid = canvas.valid.to(cache.positions.device, copy=True)   # (B, T) the canvas's key mask
        # the cache's own mask (B, 1, 1, T), also where nothing is padded (it was None then, or a
        # view of canvas.valid), written in place from now on
        cache.key_mask = self.valid[:, None, None, :].clone()
        self.kept: torch.Tensor | None = None                             # the last block's offsets
        self.end: int | None = None                                       # and its E

    def block(self, s: int, e: int) -> int:
        """Before the first forward of the block [s, e): draw its kept suffix, lay it out after the
        block, and return E, where every span of this block ends."""
        T = self.cache.length
        kept = draw_kept(self.prob, self.cfg.gen_len - (e - self.start), self.generator)
        kept = kept[kept < T - e]
        E = e + kept.numel()
        source = (kept + e).to(self.positions.device)                    # (n,) the slots they stand for
        positions, valid = self.positions.clone(), self.valid.clone()
        positions[:, e:E] = self.positions[:, source]
        valid[:, e:E] = self.valid[:, source]                             # past a row's end: masked
        valid[:, E:] = False                                              # dropped
        self.cache.positions.copy_(positions)
        self.cache.key_mask[:, 0, 0].copy_(valid)
        self.kept, self.end = kept, E
        return E
