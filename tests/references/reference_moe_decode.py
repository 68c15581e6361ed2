"""The decoders of tests/references/reference_moe.py's naive MoE models (LLaDA2.x's and LLaDA-MoE's generate),
kept apart from the forward transcriptions; reference_moe re-exports them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from reference_moe import BANNED, INF


def greedy(logits):
    """argmax (first index on ties, BANNED ids excluded) and its float64 softmax probability, per row."""
    banned = torch.tensor(BANNED, dtype=torch.long)
    x = (logits.index_fill(-1, banned, -INF) if BANNED else logits).argmax(-1)
    p = torch.softmax(logits.double(), -1).gather(-1, x[:, None])[:, 0]
    return [int(t) for t in x], [float(c) for c in p]


def most_confident(positions, conf, n):
    """The n most confident positions: highest first, lowest position on ties (topk)."""
    return sorted(positions, key=lambda j: (-conf[j], j))[:n]


@dataclass
class Trace:
    tokens: list                 # generated ids after the prompt, cut after the first stop id (if any)
    nfe: int = 0                 # forward calls: one per denoising step (no cache, no store pass)
    steps: list = field(default_factory=list)        # per forward: (block, sorted [(pos, token)] committed)
    confidences: list = field(default_factory=list)  # per forward: {pos: conf} of its candidates
    canvas: list = field(default_factory=list)       # final x: prompt + everything written (masks included)
    blocks: list = field(default_factory=list)       # blocks decoded (llada2: index on the absolute grid)
    stopped: bool = False        # a stop id is in the answer
    early: bool = False          # llada2 eos_early_stop returned inside a block

    def steps_per_block(self):
        out = {}
        for b, _ in self.steps:
            out[b] = out.get(b, 0) + 1
        return out

    @property
    def nfe_with_store(self):
        """docs/specs/llada2-moe.md Q7: a block-causal cache adds one store forward per finished block, none
        after the last block decoded."""
        return self.nfe + len(self.blocks) - 1


def _finish(tr, x, L, stop_ids, limit=None):
    tr.canvas = list(x)
    out = list(x[L:] if limit is None else x[L:L + limit])
    hits = [j for j, t in enumerate(out) if t in stop_ids]
    tr.stopped = bool(hits)
    tr.tokens = out[: hits[0] + 1] if hits else out
    return tr


def llada2_generate(naive, prompt, *, mask_id, eos_id, gen_length, block_length=32, steps=32, threshold=0.95,
                    minimal_topk=1, eos_early_stop=False, rule="h1") -> Trace:
    """H1's `generate` (docs §6.1) at temperature 0: canvas to the block grid, blocks from L // B, every
    step re-runs the window x[:block end] under the block-causal mask of the decoding block length;
    commit every mask with conf > threshold if at least quota[s] of them, else the quota[s] most
    confident; stop after the block that holds eos (and, with eos_early_stop, right after committing
    an eos with no mask before it); answer = x[L : L + gen_length] cut after the first eos.
    rule="dinfer": D1's decode (§6.3) in the same loop: candidates are masks whose argmax is not the
    mask id, commit those with conf >= min(threshold, best - 1e-5), no quota and no step cap (D1's
    unrolled extra forwards and its eos filling are not reproduced)."""
    assert rule in ("h1", "dinfer")
    B, L = block_length, len(prompt)
    steps = min(steps, gen_length // minimal_topk)
    nb = -(-(L + gen_length) // B)
    x = list(prompt) + [mask_id] * (nb * B - L)
    quota = [B // steps + (1 if s < B % steps else 0) for s in range(steps)]   # from B, not the mask count
    tr = Trace(tokens=[])
    for b in range(L // B, nb):
        start, end = b * B, (b + 1) * B
        tr.blocks.append(b)
        s = 0
        while rule == "dinfer" or s < steps:
            active = [j for j in range(start, end) if x[j] == mask_id]
            if not active:
                break
            logits = naive.forward(x[:end], "block-causal", block_length=B, rows=range(start, end))
            tr.nfe += 1
            x0, p = greedy(logits)
            conf = {j: p[j - start] for j in active}
            if rule == "h1":
                hi = [j for j in active if conf[j] > threshold]                  # strict
                commit = hi if len(hi) >= quota[s] else most_confident(active, conf, min(quota[s], len(active)))
            else:
                cand = [j for j in active if x0[j - start] != mask_id]
                if not cand:
                    raise RuntimeError("every argmax is the mask id: D1 would loop forever")
                bar = min(threshold, max(conf[j] for j in cand) - 1e-5)
                commit = [j for j in cand if conf[j] >= bar]                   # inclusive
            for j in commit:
                x[j] = x0[j - start]
            tr.steps.append((b, sorted((j, x0[j - start]) for j in commit)))
            tr.confidences.append(conf)
            s += 1
            if eos_early_stop and any(x[j] == eos_id for j in commit):
                e = x.index(eos_id, L)
                if mask_id not in x[L:e]:
                    tr.early = True
                    return _finish(tr, x, L, (eos_id,), gen_length)
        if eos_id in x[L:end]:
            break
    return _finish(tr, x, L, (eos_id,), gen_length)


def llada_moe_generate(naive, prompt, *, mask_id, gen_length=128, block_length=128, steps=128, cfg_scale=0.0,
                       stop_ids=()) -> Trace:
    """The model card's `generate` (llada-moe §5.1) at temperature 0, remasking low_confidence: canvas
    L + gen_length, steps // blocks forwards per block over the whole canvas (bidirectional, no early
    exit), each committing its quota of the most confident masks before the block end. `stop_ids`
    only cut `tokens` (the card decodes every position). With cfg_scale > 0 a second forward with
    the prompt masked gives logits u + (cfg + 1)(c - u) (one batched call, one NFE)."""
    B, L = block_length, len(prompt)
    assert gen_length % B == 0
    nb = gen_length // B
    assert steps % nb == 0
    spb = steps // nb
    x = list(prompt) + [mask_id] * gen_length
    tr = Trace(tokens=[])
    for b in range(nb):
        start, end = L + b * B, L + (b + 1) * B
        tr.blocks.append(b)
        n = sum(1 for t in x[start:end] if t == mask_id)
        quota = [n // spb + (1 if i < n % spb else 0) for i in range(spb)]     # from the block's mask count
        for i in range(spb):
            logits = naive.forward(x, "bidirectional")
            if cfg_scale > 0:
                u = naive.forward([mask_id] * L + x[L:], "bidirectional")
                logits = u + (cfg_scale + 1) * (logits - u)
            tr.nfe += 1
            x0, p = greedy(logits)
            cand = [j for j in range(end) if x[j] == mask_id]                  # positions >= end: -inf
            conf = {j: p[j] for j in cand}
            commit = most_confident(cand, conf, quota[i])
            for j in commit:
                x[j] = x0[j]
            tr.steps.append((b, sorted((j, x0[j]) for j in commit)))
            tr.confidences.append(conf)
    return _finish(tr, x, L, tuple(stop_ids))
