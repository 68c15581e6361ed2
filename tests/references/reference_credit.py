"""An independent, deliberately naive transcription of dInfer's credit decoding on LLaDA
(inclusionAI/dInfer `fce4e32`: `CreditThresholdParallelDecoder.decode` and `_apply_credit_fusion`
in `python/dinfer/decoding/parallel_strategy.py`, called by `BaseDiffusionIteration.forward` inside
`BlockRunner.decode`, `generate_uniform.py`), written for these tests from docs/accelerators/credit.md 4.

It shares no code with fastdllm's engine or its credit module: the forward is tests/reference.py's
NaiveLM (weights read from the checkpoint files, float64); the credit is a plain float64 tensor
updated position by position in Python loops; confidences come from a float64 softmax over the whole
vocabulary; the commit rule loops over rows.

Block loop (theirs, batch 1, temperature 0): blocks of `block_length` from the prompt's end (their
library's default), or with `grid` from (P // block_length) * block_length, the first block holding
the prompt's tail and the last one cut at the answer's end (`BlockIteratorFactory(start_block_align=True)`,
as their benchmark and evaluation scripts build it, `BlockIterator.__next__` at fce4e32); a block
is decoded while it has a mask; with a cache, the block's first call decides on the logits of the
refresh forward over the whole canvas (their `require_update` at block entry), every later one on
the cached forward (prefix: the block and everything after it; dual: the block alone); without a
cache every call runs the whole canvas. One call = one forward = one step.

What is not theirs, on purpose (docs/accelerators/credit.md 4.4, docs/specs/llada2-moe.md Q5):
- the credit is zeroed at every block start (theirs is keyed by the block's (start, end) and is
  cleared only when the whole canvas has no mask left, so it leaks into the next generation);
- the loop stops as soon as the block has no mask (their unrolling and the cached forward after a
  refresh that already finished the block add forwards that commit nothing: NFE only);
- `ban_mask` (default): the mask id is never the prediction (the position takes its best other
  token); their `rm_mask` instead drops a position whose fused argmax is the mask id from the
  candidates. The two agree wherever the mask id is not the fused argmax; `ban_mask=False` runs
  theirs (and raises where a row would have no candidate left: theirs would loop forever).
"""

from __future__ import annotations

import torch
from reference import NaiveLM


def credit_fuse(credit, first_call, logits, masked, alpha, gamma, beta):
    """Their `_apply_credit_fusion` on one block. credit (B, L, V) float64, updated in place;
    logits (B, L, V) of the block's positions; masked (B, L) bool. Returns the fused logits."""
    B, L, _ = logits.shape
    if not first_call:
        credit *= beta                                               # the whole matrix decays
    probs = torch.softmax(logits.double(), -1)
    for b in range(B):
        for i in range(L):
            if masked[b, i]:                                         # only masked positions gain
                j = int(torch.argmax(probs[b, i]))                   # top-1, the mask id included
                credit[b, i, j] += float(probs[b, i, j]) ** gamma
    return logits.double() + alpha * torch.log(credit + 1)


def threshold_decide(fused, masked, threshold, mask_id, ban_mask=True):
    """Their `get_transfer_index_threshold` at temperature 0 on the fused logits: argmax, confidence
    = softmax(fused) at it (float64 here), candidates = masked positions (theirs: whose argmax is not
    the mask id), commit every candidate with confidence >= min(threshold, best - 1e-5).
    Returns x0 (B, L), commit (B, L) bool, confidence (B, L)."""
    p = torch.softmax(fused, -1)
    scores = fused.clone()
    if ban_mask:
        scores[..., mask_id] = float("-inf")
    x0 = scores.argmax(-1)
    conf = p.gather(-1, x0[..., None])[..., 0]
    commit = torch.zeros_like(masked)
    for b in range(masked.shape[0]):
        cand = [i for i in range(masked.shape[1]) if masked[b, i] and int(x0[b, i]) != mask_id]
        if not cand:
            if bool(masked[b].any()):
                raise RuntimeError("every masked position's argmax is the mask id: dInfer would loop forever")
            continue
        bar = min(threshold, max(float(conf[b, i]) for i in cand) - 1e-5)
        for i in cand:
            if float(conf[b, i]) >= bar:
                commit[b, i] = True
    return x0, commit, conf


def credit_generate(lm, prompt, *, cache, gen_length, block_length, threshold, mask_id, alpha=0.7, gamma=0.2,
                    beta=0.8, ban_mask=True, record=None, grid=False):
    """cache in {"none", "prefix", "dual"}; prompt (B, P). Returns (canvas (B, P+G), nfe). `record`
    (a list) gets, per step, the sorted [row, canvas position, token] of every commit."""
    net = NaiveLM(lm)
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    nfe, total = 0, P + gen_length
    first = P // block_length * block_length if grid else P
    for s in range(first, total, block_length):
        e = min(s + block_length, total)
        credit, calls, past = None, 0, None
        while (x[:, s:e] == mask_id).any():
            if cache == "none" or calls == 0:                        # the refresh at block entry
                logits, full_past = net.forward(x)
                past = full_past if cache != "none" else None
                block_logits = logits[:, s:e]
            elif cache == "prefix":
                logits, _ = net.forward(x[:, s:], offset=s, past=[(k[:, :, :s], v[:, :, :s]) for k, v in past])
                block_logits = logits[:, :e - s]
            else:
                logits, past = net.forward(x[:, s:e], offset=s, past=past, replace=(s, e))
                block_logits = logits
            nfe += 1
            if credit is None:                                       # zeroed at every block start
                credit = torch.zeros(block_logits.shape, dtype=torch.float64)
            masked = x[:, s:e] == mask_id
            fused = credit_fuse(credit, calls == 0, block_logits, masked, alpha, gamma, beta)
            x0, commit, _ = threshold_decide(fused, masked, threshold, mask_id, ban_mask)
            block = x[:, s:e]
            block[commit] = x0[commit]
            calls += 1
            if record is not None:
                record.append(sorted([r, s + i, int(x0[r, i])] for r, i in commit.nonzero().tolist()))
    return x, nfe
