"""An independent, deliberately naive transcription of Fast-dLLM++'s Frechet-profile commit (Kasa et
al., arXiv 2606.02955; Ringo-Star/FastdLLM_plusplus at 29fd03401acc, files unchanged since
518b90f4228f: `get_transfer_index_frechet_profile` in `v1/llada/generate.py`, its CPU checks in
`v1/llada/test_frechet_rule.py`; docs/accelerators/frechet.md 6.4), written for these tests.

Their selection, per row of a (B, L) canvas: confidences off the row's masked positions are the
dtype's most negative number; sort descending; with n_masked the row's masked count, only the first
n_masked sorted entries are valid; cum = the running sum of the valid entries (the others as 0);
score[j] = (cum[j] - j) - (1 - value[j]) for the 0-based column j; invalid columns score -inf, column
0 scores +inf (at least one); topn = how many columns score > margin, at least 1; the first topn
sorted positions are committed where masked (a row with no mask commits nothing).

It shares no code with fastdllm's rule: the sort, the sums and the count run row by row in Python
over the float values. Confidences are tests/reference.py's (a float64 softmax over the whole
vocabulary; the mask id stays in the normaliser and, with `ban_mask`, out of the prediction, as
fastdllm). The block loop is Fast-dLLM's (their `generate`, `generate_with_prefix_cache`,
`generate_with_dual_cache` with `frechet_margin`), on tests/reference.py's NaiveLM, the same
as `reference_generate` there. Decided where theirs leaves it open: among equal confidences the
lower position first (their `torch.sort` is not stable; fastdllm's ties, docs/specs/ranking.md).
"""

from __future__ import annotations

import torch
from reference import NaiveLM, cached_forward, confidence_at


def frechet_select(confidence: torch.Tensor, mask_index: torch.Tensor, margin: float) -> torch.Tensor:
    """confidence (B, L) float, mask_index (B, L) bool -> (B, L) bool, the committed positions."""
    floor = torch.finfo(confidence.dtype).min
    conf = torch.where(mask_index, confidence, torch.tensor(floor, dtype=confidence.dtype))
    chosen = torch.zeros_like(mask_index)
    for row in range(conf.shape[0]):
        values, order = conf[row].sort(descending=True, stable=True)
        n_masked = int(mask_index[row].sum())
        topn, cum = 0, torch.zeros((), dtype=conf.dtype)
        for j in range(conf.shape[1]):
            if j >= n_masked:
                score = float("-inf")
            else:
                cum = cum + values[j]                                 # the running sum, in their dtype
                score = float((cum - float(j)) - (1.0 - values[j]))
            if j == 0:
                score = float("inf")
            if score > margin:
                topn += 1
        topn = max(topn, 1)
        for j in range(topn):
            chosen[row, order[j]] = bool(mask_index[row, order[j]])
    return chosen


def frechet_generate(lm, prompt: torch.Tensor, *, cache: str, gen_length: int, block_length: int, margin: float,
                     mask_id: int, record: list | None = None, ban_mask: bool = True):
    """Fast-dLLM's block loop with the Frechet commit, greedy, float64. prompt (B, P) without padding;
    cache in {"none", "prefix", "dual"}. Returns (canvas (B, P + G), nfe); `record` gets each step's
    committed [row, canvas position] pairs."""
    net = NaiveLM(lm)
    B, P = prompt.shape
    x = torch.full((B, P + gen_length), mask_id, dtype=torch.long)
    x[:, :P] = prompt
    shift = 1 if net.dream else 0              # Dream: a cached span starts one slot before the block
    nfe = 0
    for b in range(gen_length // block_length):
        s, e = P + b * block_length, P + (b + 1) * block_length
        logits, past = net.forward(x)          # the block's first step: the whole canvas (the refresh)
        view, lo = x, 0
        nfe += 1
        while True:
            mask_index = view == mask_id
            mask_index[:, :s - lo] = False     # only the block's own positions
            mask_index[:, e - lo:] = False
            x0, conf = view.clone(), torch.full(view.shape, float("-inf"), dtype=torch.float64)
            a, z = s - lo, e - lo              # the block's columns (each softmax is its own position's)
            x0[:, a:z], conf[:, a:z] = confidence_at(logits[:, a:z], mask_index[:, a:z], view[:, a:z], mask_id,
                                                     ban_mask, "prob")
            chosen = frechet_select(conf, mask_index, margin)
            view[chosen] = x0[chosen]
            if record is not None:
                record.append([[r, c + lo] for r, c in chosen.nonzero().tolist()])
            if not (x[:, s:e] == mask_id).any():
                break
            if cache == "none":
                logits, _ = net.forward(x)
                view, lo = x, 0
            else:
                logits, past, lo = cached_forward(net, x, cache, s - shift, e, past)
                view = x[:, lo:] if cache == "prefix" else x[:, lo:e]
            nfe += 1
    return x, nfe
