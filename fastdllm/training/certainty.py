"""Certainty-forcing distillation, dParallel's second stage (Chen et al., arXiv 2509.26488; the
authors' LLaDA training script in czg1225/dParallel), for the built-in model.

The rows are the training split's word problems and function tasks with the generator's answers
(see CertaintySource for why these stand for the model's own trajectories). Each row is masked
in the state block-wise decoding meets, as dParallel does: the answer's first j blocks clean
(j uniform over the row's blocks), block j masked at a fixed ratio, everything after it masked; and a
second forward sees the complementary mask of block j, so every token of the block is predicted
once. The loss is the cross-entropy on the masked positions (the mean over them) plus
`entropy_weight` times the entropy of softmax(logits / temperature) at the masked positions the
model already predicts right: it is pushed to be sure of what it gets right, which is what lets a
threshold commit many tokens per step.
"""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from .data import autocast, device_of
from .mixture import PROMPTED, WEIGHTS, Mixture, MixtureSource, shares


def semi_ar_masks(prompt_len: torch.Tensor, L: int, rng: random.Random, block: int = 32, ratio: float = 0.5):
    """(masked, complement) (B, L) bool: per row, the first j answer blocks clean (j uniform over the
    row's blocks, the last one possibly shorter), block j masked at `ratio` in `masked` and the
    other way round in `complement`, every position after it masked in both."""
    B = len(prompt_len)
    masked = torch.zeros(B, L, dtype=torch.bool)
    complement = torch.zeros(B, L, dtype=torch.bool)
    gen = torch.Generator().manual_seed(rng.getrandbits(62))
    for r in range(B):
        start = int(prompt_len[r])
        lo = start + rng.randrange(max(1, -(-(L - start) // block))) * block   # a block of the answer
        hi = min(lo + block, L)
        pick = torch.rand(hi - lo, generator=gen) < ratio
        masked[r, lo:hi], complement[r, lo:hi] = pick, ~pick
        masked[r, hi:], complement[r, hi:] = True, True
    return masked, complement


def certainty_loss(logits: torch.Tensor, tokens: torch.Tensor, masked: torch.Tensor, entropy_weight: float,
                   temperature: float) -> torch.Tensor:
    """Mean cross-entropy over the masked positions + entropy_weight x the mean entropy (at
    `temperature`) over the masked positions whose argmax is already the right token."""
    logits = logits.float()
    if not masked.any():
        return logits.sum() * 0.0
    ce = F.cross_entropy(logits[masked], tokens[masked])
    right = masked & (logits.argmax(-1) == tokens)
    if not right.any():
        return ce
    logp = F.log_softmax(logits[right] / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1).mean()
    return ce + entropy_weight * entropy


class CertaintySource(MixtureSource):
    """train.py's data source for the certainty stage: the generator's training rows (word problems
    and function tasks, raw and chat; no stdlib source), two forwards per batch (a mask and its
    complement); rows, held-out rows and the random state as MixtureSource keeps them.

    dParallel distils the model's own greedy answers because a pretrained model's answers differ
    from any dataset; a model trained from scratch on these generators answers their training
    prompts with the generator's own text wherever it is right, so the generator's answers stand
    for the trajectories dParallel keeps, at no decoding cost (the card states this)."""

    def __init__(self, cfg, tok, ids: dict[str, int], texts: list[str]):
        self.cfg, self.tok, self.ids, self.rng = cfg, tok, ids, random.Random(cfg.seed + 1)
        tasks = {k: WEIGHTS[k] for k in PROMPTED if k.startswith(("gsm", "code"))}   # the graded kinds
        self.mixture = Mixture(tok, torch.zeros(0, dtype=torch.long), [], ids, shares(cfg.row_lengths), tasks)

    def describe(self) -> str:
        return f"generated task rows {self.mixture.weights}, entropy weight {self.cfg.entropy_weight}"

    def loss(self, model, tokens: torch.Tensor, prompt: torch.Tensor, mask_id: int) -> torch.Tensor:
        total, device = 0.0, device_of(model)
        tokens = tokens.to(device)
        for masked in semi_ar_masks(prompt, tokens.shape[1], self.rng):
            masked = masked.to(device)
            with autocast(device):
                logits = model(torch.where(masked, mask_id, tokens)).logits
            total = total + certainty_loss(logits, tokens, masked, self.cfg.entropy_weight, self.cfg.entropy_temperature)
        return total
