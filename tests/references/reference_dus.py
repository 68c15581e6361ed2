"""An independent, deliberately naive transcription of DUS (omerlux/DUS `generate.py`, read at
abd7723/c917168; docs/accelerators/dus.md 6.3), written for these tests: `generate_scheduled` with
scheduler 'dilated' (`dilated_unmask_levels` + `merge_last_level`), remasking off (their eval's
default, confidence_threshold 0), batch 1, greedy; and `apply_spacing_filter` with the gap of
`generate_cb_sampler_spaced`.

It shares no code with fastdllm: levels are lists of absolute canvas positions built by scanning
every position, the model is tests/reference.py's NaiveLM (weights read from the checkpoint
files in float64). Switches beyond the authors' code:

- ban_mask: fastdllm never predicts the mask id (the authors' argmax runs over the whole vocabulary).
- cache 'prefix' / 'dual': the same levels on Fast-dLLM's block cache, as tests/reference.py does
  it (a full forward at each block's first step, then the block's suffix, or the block alone, against
  the cached keys); the authors' DUS has no cache (it composes by construction: it only picks
  positions). Dream's cached forwards start one slot before the block (its logit shift).
"""

from __future__ import annotations

import torch
from reference import NaiveLM, cached_forward


def unmask_levels(start, end, base=2, skip_exp=1):
    """Their dilated_unmask_levels over the inclusive range [start..end]: absolute positions."""
    if base < 1 or skip_exp < 1:
        raise ValueError("base and skip_exp must be >= 1")
    if base == 1:
        return [list(range(start, end + 1))]
    stride = (end - start + 1) // (base ** skip_exp)
    levels, seen = [], []
    while stride >= 1:
        now = []
        for pos in range(start, end + 1):
            if (pos - start) % stride == 0 and pos not in seen:
                now.append(pos)
        if len(now) > 0:
            levels.append(now)
            seen = seen + now
        stride = stride // base
    rest = [pos for pos in range(start, end + 1) if pos not in seen]
    if len(rest) > 0:
        levels.append(rest)
    return levels


def merge_last(levels):
    """Their merge_last_level: a last level shorter than the one before is appended to it."""
    if len(levels) >= 2 and len(levels[-1]) < len(levels[-2]):
        levels[-2] = levels[-2] + levels[-1]
        levels = levels[:-1]
    return levels


def spacing_filter(ranked, masked_left, block_length, start_stride):
    """Their apply_spacing_filter with generate_cb_sampler_spaced's gap, on positions best first."""
    min_gap = max(2, int(masked_left * start_stride // block_length))
    accepted, deferred = [], []
    for pos in ranked:
        far = True
        for a in accepted:
            if abs(pos - a) < min_gap:
                far = False
        if far:
            accepted.append(pos)
        else:
            deferred.append(pos)
    return accepted, deferred


def generate_scheduled(lm, prompt, *, gen_length, block_length, base=2, base_skip=1, mask_id, cache="none",
                       ban_mask=True, record=None):
    """prompt (1, P). Returns (canvas (1, P+G), nfe). `record` (a list) gets, per forward, the
    (generation-relative position, token) pairs it commits."""
    net = NaiveLM(lm)
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    shift = 1 if net.dream else 0
    nfe = 0
    for b in range(gen_length // block_length):
        s = P + b * block_length
        e = s + block_length
        schedule = merge_last(unmask_levels(s, e - 1, base=base, skip_exp=base_skip))
        for t, level in enumerate(schedule):
            if not (x == mask_id).any():
                break
            a = s - shift
            if cache == "none" or t == 0:          # their every step; the cache's refresh
                logits, past = net.forward(x)
                lo = 0
            else:
                logits, past, lo = cached_forward(net, x, cache, a, e, past)
            nfe += 1
            if ban_mask:
                logits = logits.clone()
                logits[..., mask_id] = float("-inf")
            x0 = logits.argmax(-1)
            step = []
            for pos in level:                      # every slot of the level still masked takes x0
                if x[0, pos] == mask_id:
                    x[0, pos] = x0[0, pos - lo]
                    step.append((pos - P, int(x[0, pos])))
            if record is not None:
                record.append(sorted(step))
    return x, nfe
