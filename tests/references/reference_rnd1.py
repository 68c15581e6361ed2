"""An independent, deliberately naive float64 transcription of RND1 for these tests, written from
docs/specs/rnd1.md (RadicalNumerics/RND1 `rnd/sampling.py diffusion_sample`, read, not copied).

Forward: the Qwen3-MoE transcription of tests/references/reference_sdar_moe.py (heads looped, every expert on
every token, top-k by sorting) with every key visible to every query (no mask, no cache), logits
returned unshifted; the sampler shifts them. Sampler: the authors' loop as written, over the whole
canvas at every forward: scores from logits / max(T, 1e-8), pred = argmax or a draw, entropy
-sum p log p, both shifted right by one; for step = S-1 ... 1 keep masked the floor(M0 step / S)
highest-entropy still-masked positions (ties: the lower position kept), unmask the rest; a forward
after every step while masks remain (also after a step that unmasked nothing); the rest filled with
the last prediction. Switches where fastdllm differs on purpose:

- ban_mask: the mask id is never predicted (fastdllm's policy; the authors' code may write it).
- draws: the authors draw `Categorical(logits).sample()` over every canvas position; this order cannot
  be matched by an engine that reads logits at the masked positions only, so a draw is a Gumbel-max
  over the masked positions in canvas order, its uniforms from `draws` (a torch.Generator), drawn as
  fastdllm's predict draws them: one (1, masked, V) float64 tensor per forward."""

from __future__ import annotations

import torch
from reference_sdar_moe import NaiveSDARMoE


class NaiveRND1(NaiveSDARMoE):
    def logits(self, ids: list[int]) -> torch.Tensor:
        """(T, V) unshifted logits of one bidirectional forward over the whole canvas."""
        n = len(ids)
        return self.forward(ids, range(n), None, torch.ones(n, n, dtype=torch.bool))[0]


def canvas(prefix: list[int], *, seq_len: int, mask: int, pad: int, eos: int, suffix=(), infill_length=None,
           add_eos_at_end=False) -> tuple[list[int], list[bool]]:
    """diffusion_sample's canvas when a prefix is given: pad everywhere, eos in the last slot if
    add_eos_at_end, the prefix, min(infill_length or free, free) masks (free = seq_len - prefix -
    suffix - 1: one slot is always reserved for the eos), the suffix. Returns (ids, maskable)."""
    free = seq_len - len(prefix) - len(suffix) - 1
    assert free > 0
    fill = min(infill_length or free, free)
    x = [pad] * seq_len
    if add_eos_at_end:
        x[-1] = eos
    x[:len(prefix)] = prefix
    x[len(prefix):len(prefix) + fill] = [mask] * fill
    x[len(prefix) + fill:len(prefix) + fill + len(suffix)] = list(suffix)
    maskable = [len(prefix) <= i < len(prefix) + fill for i in range(seq_len)]
    return x, maskable


def sample(net: NaiveRND1, x: list[int], maskable: list[bool], *, num_steps: int, mask: int, temperature=1.0,
           greedy=True, ban_mask=True, draws: torch.Generator | None = None, eb_gamma: float | None = None):
    """The sampling loop on canvas `x`. Returns (final ids, forwards, steps: per step that began with
    masks, the sorted [(position, token)] it unmasked (empty where it unmasked nothing); one forward
    precedes each such step)."""
    x, maskable = list(x), list(maskable)
    forwards = 0

    def scores():
        nonlocal forwards
        forwards += 1
        logp = torch.log_softmax(net.logits(x) / max(temperature, 1e-8), -1)       # (T, V)
        entropy = -(logp.exp() * logp).sum(-1)
        chooser = logp.clone()
        if ban_mask:
            chooser[:, mask] = float("-inf")
        pred = chooser.argmax(-1)
        if not greedy:
            at = [i for i in range(len(x)) if maskable[i]]
            u = torch.rand((1, len(at), logp.shape[1]), generator=draws, dtype=torch.float64)[0]
            gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))
            for slot, i in enumerate(at):                 # position i is predicted from i - 1
                pred[i - 1] = (chooser[i - 1] + gumbel[slot]).argmax()
        conf = logp.gather(-1, pred[:, None])[:, 0]              # log p of each prediction
        # shifted: position i takes the prediction, entropy and confidence of position i - 1
        return [x[0]] + pred[:-1].tolist(), [0.0] + entropy[:-1].tolist(), [float("-inf")] + conf[:-1].tolist()

    pred, entropy, conf = scores()
    total = sum(maskable)
    steps = []
    for step in range(num_steps - 1, 0, -1):
        if not any(maskable):
            continue                                      # nothing left: no record, no forward
        if eb_gamma is not None:              # most probable first; entropies summed less their max
            ranked = sorted((i for i in range(len(x)) if maskable[i]), key=lambda i: (-conf[i], i))
            unmask, acc, peak = [], 0.0, 0.0
            for i in ranked:
                acc, peak = acc + entropy[i], max(peak, entropy[i])
                if acc - peak > eb_gamma:
                    break
                unmask.append(i)
            unmask.sort()
        else:
            keep = int((torch.tensor([total]) * (step / num_steps)).long())   # float32, as the authors'
            masked = sorted((i for i in range(len(x)) if maskable[i]), key=lambda i: (-entropy[i], i))
            unmask = sorted(masked[keep:])
        for i in unmask:
            x[i], maskable[i] = pred[i], False
        steps.append([(i, x[i]) for i in unmask])
        if any(maskable):
            pred, entropy, conf = scores()
    rest = [i for i in range(len(x)) if maskable[i]]
    for i in rest:
        x[i] = pred[i]
    if rest:
        steps.append([(i, x[i]) for i in rest])
    return x, forwards, steps
