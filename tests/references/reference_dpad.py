"""An independent, deliberately naive transcription of DPad's decoder (Crys-Chen/DPad `461b36e`,
`llada/generate_dropout.py`: generate / generate_with_prefix_cache / generate_with_dual_cache with
the Gaussian suffix dropout of `llada/sampler.py`), written for these tests from
docs/accelerators/dpad.md 2.

It shares no code with fastdllm's engine or suffix_dropout.py: the forward is tests/reference.py's
NaiveLM (weights read from the checkpoint files, float64), extended here with explicit position ids
(their "adaptive RoPE": query and key rotary tables gathered at a position list) and keys cached
before RoPE, as their modelling code does. The canvas is pruned physically, as theirs: the first
e + n slots of the canvas, all masks after the block, fed with the position list [0, e) + kept.

The kept set: one documented draw shared with fastdllm (docs/accelerators/dpad.md 2.5; theirs comes from
the process-global CUDA RNG, which cannot be reproduced): a CPU torch.Generator seeded with `seed`,
per block T - e float32 uniforms, slot e + j kept iff u_j < keep[j]. The profile is computed here on
its own from their formula.

What is not theirs, on purpose (README, "Differences from the authors' code"):
- `ban_mask` (default): the mask id is never the prediction;
- early termination (their `-e`) tests the block for any of `stop_ids` (fastdllm's stop tokens:
  EOS and end-of-turn) where theirs tests EOS only;
- Dream: a cached step's span starts one slot before the block (fastdllm's shifted span, as
  tests/reference.py's `shift_span`), so the block's first token has a logit.
"""

from __future__ import annotations

import math

import torch
from reference import NaiveLM, num_transfer_tokens, transfer


def gaussian_keep(gen_length, window, k, scale):
    """Their GaussianSampler.pdf: (gen_length,) float32, zero past the window."""
    x = torch.linspace(0.0, k, window)                                   # float32, as theirs
    head = scale * torch.exp(-0.5 * x ** 2) / torch.sqrt(torch.tensor(2 * math.pi))
    return torch.cat([head, torch.zeros(gen_length - window)])


def draw_suffix(pdf, e, T, generator):
    """Their Sampler.sample over the suffix slots [e, T): the kept canvas slots, increasing."""
    u = torch.rand(T - e, generator=generator)
    return torch.arange(e, T)[u < pdf[:T - e]]


def dpad_generate(lm, prompt, *, cache, gen_length, block_length, window, k, scale, seed, mask_id,
                  steps=None, threshold=None, stop_ids=(), early_termination=True, ban_mask=True,
                  record=None, blocks=None):
    """cache in {"none", "prefix", "dual"}; prompt (B, P), every row sharing the draw (theirs: B = 1).
    Returns (canvas (B, P + G), nfe). `record` gets per step the sorted [row, canvas position,
    token] of every commit; `blocks` per block (kept canvas slots, E, the spans of its steps)."""
    net = NaiveLM(lm)
    B, P = prompt.shape
    T = P + gen_length
    x = torch.full((B, T), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    nb = gen_length // block_length
    spb = (steps or gen_length) // nb
    pdf = gaussian_keep(gen_length, window, k, scale)
    generator = torch.Generator().manual_seed(seed)
    shift = 1 if net.dream else 0
    nfe = 0
    for b in range(nb):
        s, e = P + b * block_length, P + (b + 1) * block_length
        ntt = num_transfer_tokens(x[:, s:e] == mask_id, spb)
        kept = draw_suffix(pdf, e, T, generator)
        pos = torch.cat([torch.arange(e), kept])           # query/key position list, (e + n,)
        E = len(pos)
        xp = x[:, :E]                                      # the pruned canvas (a view: commits land in x)
        spans, past, i = [], None, 0
        while True:
            a = s - shift
            if cache == "none" or i == 0:                  # the whole pruned canvas
                logits, past = net.forward(xp, q_pos=pos, k_pos=pos)
                view, lo, span = xp, 0, (0, E)
            elif cache == "prefix":                        # [s, E) against the keys of [0, s)
                logits, _ = net.forward(xp[:, a:], q_pos=pos[a:], k_pos=pos, past=[(kk[:, :, :a], v[:, :, :a]) for kk, v in past])
                view, lo, span = xp[:, a:], a, (s, E)
            else:                                          # dual: the block against every other key
                logits, past = net.forward(xp[:, a:e], q_pos=pos[a:e], k_pos=pos, past=past, replace=(a, e))
                view, lo, span = xp[:, a:e], a, (s, e)
            nfe += 1
            spans.append(span)
            mask_index = view == mask_id
            mask_index[:, :s - lo] = False                 # only the block's own positions
            mask_index[:, e - lo:] = False
            fixed = ntt[:, min(i, spb - 1)] if threshold is None else None
            x0, chosen, _ = transfer(logits, mask_index, view, fixed, threshold, None, mask_id, False, ban_mask)
            view[chosen] = x0[chosen]
            if record is not None:
                record.append(sorted([r, c + lo, int(x0[r, c])] for r, c in chosen.nonzero().tolist()))
            i += 1
            if not (x[:, s:e] == mask_id).any():
                break
        if blocks is not None:
            blocks.append((kept.tolist(), E, spans))
        if early_termination and torch.isin(x[:, s:e], torch.tensor(list(stop_ids))).any(1).all():
            return x, nfe
    return x, nfe
