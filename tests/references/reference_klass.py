"""An independent, deliberately naive transcription of KLASS (Kim et al., arXiv 2511.05664; the
authors' shkim0116/KLASS at ad87ecb: `src/model/llada_klass.py: stable_confident_decode` with
alg "klass", unmask_strategy "all", temperature 0; and `src/model/dream_klass.py: _sample` with
alg "klass"; docs/accelerators/klass.md 6.1), written for these tests, batch 1, greedy.

LLaDA (`variant="llada"`): per block, LLaDA's fixed schedule from the block's masked count; at most
steps_per_block steps, a step only while the block has a mask. Each step one full forward; p the
float64 softmax at every position; x0 its argmax, conf = p(x0); KL = sum p (log(p + 1e-12) -
log(p_prev + 1e-12)) against the previous forward's p (zeros before the first); each position's
history of its last H KLs, carried across blocks; stable = block-local step >= H - 1 and all H
below kl_threshold; ready = stable, conf > conf_threshold, masked, in the block. All ready take x0;
if none, the schedule's top-k masked positions of the block by confidence.

Dream (`variant="dream"`): one canvas (block_length = gen_length), conf >= conf_threshold
(inclusive), no step guard, and where none is ready the single most confident mask.

It shares no code with fastdllm: histories are Python lists per position, positions are scanned one
by one; the model is tests/reference.py's NaiveLM in float64. Switches beyond theirs:

- fastdllm never predicts the mask id (their argmax runs over the whole vocabulary): banned here.
- k is at most the block's masked count (their topk over -inf entries would write a position that is
  not a mask; unreachable with one scheduled token a step, their scripts' setting).
- p and the KLs are kept for the generated positions only (theirs at the prompt's too, never read).
- `record` gets per forward the committed (position, token) pairs; `paths` "ready" or "fallback".
"""

from __future__ import annotations

import torch
from reference import NaiveLM, num_transfer_tokens

EPS = 1e-12


def generate_klass(lm, prompt, *, gen_length, block_length, steps, conf_threshold, kl_threshold, history,
                   mask_id, variant="llada", record=None, paths=None):
    """prompt (1, P). Returns (canvas (1, P+G), nfe)."""
    net = NaiveLM(lm)
    P = prompt.shape[1]
    T = P + gen_length
    x = torch.full((1, T), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    dream = variant == "dream"
    if dream:
        assert block_length == gen_length, "their Dream decoder is one canvas"
    blocks = gen_length // block_length
    spb = steps // blocks
    kl_history = {pos: [0.0] * history for pos in range(P, T)}   # theirs starts at zeros
    log_prev = None                                              # log(p_prev + eps); theirs: p_prev zeros (T, V)
    nfe = 0
    for b in range(blocks):
        s, e = P + b * block_length, P + (b + 1) * block_length
        schedule = num_transfer_tokens(x[:, s:e] == mask_id, spb)[0]
        for step in range(spb):
            if not (x[0, s:e] == mask_id).any():
                break
            logits, _ = net.forward(x)
            nfe += 1
            # theirs at every canvas slot; here at the generated ones (G = T - P), the only ones read
            p = torch.softmax(logits[0, P:].double(), -1)            # (G, V) over the whole vocabulary
            log_now = (p + EPS).log()
            if log_prev is None:
                log_prev = torch.zeros_like(log_now) + torch.tensor(EPS, dtype=torch.float64).log()   # p_prev = 0
            banned = logits[0, P:].clone()
            banned[:, mask_id] = float("-inf")
            x0 = banned.argmax(-1)
            for pos in range(P, T):
                kl = float((p[pos - P] * (log_now[pos - P] - log_prev[pos - P])).sum())
                kl_history[pos] = kl_history[pos][1:] + [kl]
            log_prev = log_now
            conf, ready = {}, []
            for pos in range(s, e):
                if x[0, pos] != mask_id:
                    continue
                conf[pos] = float(p[pos - P, x0[pos - P]])
                guard = dream or step >= history - 1
                stable = guard and all(k < kl_threshold for k in kl_history[pos])
                confident = conf[pos] >= conf_threshold if dream else conf[pos] > conf_threshold
                if stable and confident:
                    ready.append(pos)
            if ready:
                picked = ready
            else:
                k = 1 if dream else min(int(schedule[step]), len(conf))
                picked = sorted(conf, key=lambda q: (-conf[q], q))[:k]     # ties: the leftmost first
            if paths is not None:
                paths.append("ready" if ready else "fallback")
            chosen = []
            for q in sorted(picked):
                x[0, q] = x0[q - P]
                chosen.append((q - P, int(x0[q - P])))
            if record is not None:
                record.append(chosen)
    return x, nfe
