"""An independent, deliberately naive transcription of LocalLeap's commit (Kong et al., arXiv
2510.07081; read in the `dlmserve` 0.1.1 package on PyPI, `sampler.py: commit_with_local_leap` and
`denoise_loop.py`, which cites the authors' friedrichor/LocalLeap `scripts/llada/run.sh` for its
defaults; docs/accelerators/local-leap.md 6.2), written for these tests, batch 1, greedy.

Per block: LLaDA's fixed schedule from the block's masked count; per step the top-k masked
positions of the block by confidence (the anchors) take their argmax, and for every anchor whose
confidence is >= anchor_threshold, each masked position of the block in [pos - radius, pos +
radius] whose confidence is >= neighbor_threshold takes its argmax too; the block ends when it has
no mask. It shares no code with fastdllm: positions are scanned one by one; the model is
tests/reference.py's NaiveLM in float64. Switches beyond theirs:

- ban_mask: fastdllm never predicts the mask id (their argmax runs over the whole vocabulary).
- k is at most the block's masked count (theirs takes topk over the whole canvas with -inf off the
  block, so a k beyond it would also write a masked position past the block; fastdllm never does).
- cache 'prefix' / 'dual': the same commits on Fast-dLLM's block cache (tests/reference.py's way);
  dlmserve's loop has no cache. Dream's cached forwards start one slot before the block.
"""

from __future__ import annotations

import torch
from reference import NaiveLM, cached_forward, num_transfer_tokens


def generate_local_leap(lm, prompt, *, gen_length, block_length, steps, anchor_threshold, neighbor_threshold,
                        radius, mask_id, cache="none", record=None):
    """prompt (1, P). Returns (canvas (1, P+G), nfe). `record` (a list) gets, per forward, the
    sorted (generation-relative position, token) pairs it commits."""
    net = NaiveLM(lm)
    P = prompt.shape[1]
    x = torch.full((1, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    shift = 1 if net.dream else 0
    spb = steps // (gen_length // block_length)
    nfe = 0
    for b in range(gen_length // block_length):
        s, e = P + b * block_length, P + (b + 1) * block_length
        schedule = num_transfer_tokens(x[:, s:e] == mask_id, spb)[0]
        t = 0
        while (x[0, s:e] == mask_id).any():
            if cache == "none" or t == 0:
                logits, past = net.forward(x)
                lo = 0
            else:
                logits, past, lo = cached_forward(net, x, cache, s - shift, e, past)
            nfe += 1
            block = logits[0, s - lo:e - lo]                        # the block's positions: the only ones read
            p = torch.softmax(block.double(), -1)                   # over the whole vocabulary
            banned = block.clone()
            banned[:, mask_id] = float("-inf")
            x0 = banned.argmax(-1)
            conf = {}
            for pos in range(s, e):
                if x[0, pos] == mask_id:
                    conf[pos] = float(p[pos - s, x0[pos - s]])
            k = min(int(schedule[min(t, spb - 1)]), len(conf))
            k = max(k, 1)
            ranked = sorted(conf, key=lambda q: (-conf[q], q))      # ties: the leftmost first
            anchors = ranked[:k]
            picked = set(anchors)
            for a in anchors:
                if conf[a] >= anchor_threshold:
                    for q in range(a - radius, a + radius + 1):
                        if q in conf and conf[q] >= neighbor_threshold:
                            picked.add(q)
            step = []
            for q in sorted(picked):
                x[0, q] = x0[q - s]
                step.append((q - P, int(x[0, q])))
            if record is not None:
                record.append(step)
            t += 1
    return x, nfe
