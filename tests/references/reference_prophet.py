"""An independent, deliberately naive transcription of Prophet's decoder (pixeli99/Prophet
`generate_earlyexit.py` `generate` with `eval_llada.py`'s anchors and answer start, read at
460afe4; docs/accelerators/prophet.md 3), written for these tests: LLaDA's fixed schedule, low-confidence
remasking, greedy, no classifier-free guidance, batch 1, with the early exit on.

It shares no code with fastdllm: the model is tests/reference.py's NaiveLM (the checkpoint's
weights read in float64), anchors are a dict filled word by word, the gap is a Python float per
answer slot averaged with sum / len, selection is topk on a float64 softmax. Switches beyond the
authors' code:

- ban_mask: fastdllm never predicts the mask id (their argmax, and so their fill, may write it).
- cache 'prefix' / 'dual': the same decoder on Fast-dLLM's block cache, as tests/reference.py does
  it (a full forward at each block's first step, then the block's suffix, or the block alone,
  against the cached keys, while the block has masks); the gap is tested at the full forwards
  only (the only ones with fresh logits outside the block), the phase from block b, step i as
  b * S + i + 1. The authors' code has no cache; this is fastdllm's composition.

`record` gets one entry per forward: (committed [(generation offset, token)] sorted, empty), where
`empty` marks the authors' zero-commit steps (a block with anchors has fewer masks than steps).
"""

from __future__ import annotations

import torch
from reference import NaiveLM, cached_forward


def parse_constraints(text, encode):
    """Their _parse_constraints: 'pos:word|...' -> {offset: token id}, ' ' + word, no special tokens."""
    out = {}
    for part in text.split("|"):
        if ":" not in part:
            continue
        pos, word = part.split(":", 1)
        ids = encode(" " + word.strip())
        for i in range(len(ids)):
            out[int(pos.strip()) + i] = ids[i]
    return out


def phase_threshold(step, steps, early, mid, late):
    """Their should_early_exit's threshold at global step `step` of `steps`."""
    progress = step / steps
    if progress < 0.33:
        return early
    if progress < 0.67:
        return mid
    return late


def answer_gap(logits, positions, lo):
    """Mean of top-1 minus top-2 over the answer slots (canvas positions), as Python floats."""
    gaps = []
    for pos in positions:
        top = torch.topk(logits[0, pos - lo], k=2).values
        gaps.append(float(top[0] - top[1]))
    return sum(gaps) / len(gaps) if gaps else None


def prophet_generate(lm, prompt, encode, *, gen_length, block_length, steps, anchor, thresholds,
                     answer_length=5, mask_id, cache="none", ban_mask=True, record=None):
    """prompt (1, P). Returns (canvas (1, P + G), nfe, exit forward or None)."""
    net = NaiveLM(lm)
    early, mid, late = thresholds
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    constraints = parse_constraints(anchor, encode)
    for pos in constraints:
        if P + pos < x.shape[1]:
            x[0, P + pos] = constraints[pos]
    start = P + max(constraints.keys()) + 2
    answer = list(range(start, min(P + gen_length, start + answer_length)))
    spb = steps // (gen_length // block_length)
    shift = 1 if net.dream else 0
    nfe, global_step = 0, 0

    def argmax(logits):
        if ban_mask:
            logits = logits.clone()
            logits[..., mask_id] = float("-inf")
        return logits.argmax(-1)

    for b in range(gen_length // block_length):
        s, e = P + b * block_length, P + (b + 1) * block_length
        count = int((x[0, s:e] == mask_id).sum())
        ntt = [count // spb + (1 if i < count % spb else 0) for i in range(spb)]
        i = 0
        while i < spb:
            if cache != "none" and not (x[0, s:e] == mask_id).any():
                break                                   # Fast-dLLM's loop: no step without a mask
            global_step = b * spb + i + 1
            full = cache == "none" or i == 0
            a = s - shift
            if full:
                logits, past = net.forward(x)
                lo = 0
            else:
                logits, past, lo = cached_forward(net, x, cache, a, e, past)
            nfe += 1
            x0 = argmax(logits)
            if full:
                gap = answer_gap(logits, answer, lo)
                if gap is not None and gap >= phase_threshold(global_step, steps, early, mid, late):
                    filled = []
                    for pos in range(P, P + gen_length):  # every remaining mask, all blocks
                        if x[0, pos] == mask_id:
                            x[0, pos] = x0[0, pos - lo]
                            filled.append((pos - P, int(x[0, pos])))
                    if record is not None:
                        record.append((filled, False))
                    return x, nfe, nfe
            p = torch.softmax(logits[0, s - lo:e - lo].double(), -1)      # the block's positions: the only ones read
            conf = []
            for pos in range(s, e):
                if x[0, pos] == mask_id:
                    conf.append((float(p[pos - s, x0[0, pos - lo]]), pos))
            k = ntt[i]
            committed = []
            if k > 0:
                values = torch.tensor([c for c, _ in conf], dtype=torch.float64)
                for j in torch.topk(values, k=k).indices.tolist():
                    pos = conf[j][1]
                    x[0, pos] = x0[0, pos - lo]
                    committed.append((pos - P, int(x[0, pos])))
            for pos in constraints:                     # their re-applied constraints (never masks)
                if P + pos < x.shape[1]:
                    x[0, P + pos] = constraints[pos]
            if record is not None:
                record.append((sorted(committed), k == 0))
            i += 1
    return x, nfe, None
