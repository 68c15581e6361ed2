"""An independent float64 transcription of FOCUS as its authors decode (docs/accelerators/focus.md 1-3, from
sands-lab/FOCUS@277f1d1: SGLangFOCUS's LowConfidence delayed path, `forward_focus`, the CPU
importance and selection of dllm/focus.py), written for these tests: batch 1, greedy, no early stop.

Per block (grid from the prompt's first token; the prompt's whole blocks prefilled once):
  state: uncached = all, warm, token_sum = 0 (float32), steps = 0, progress = -1
  per step, while the block holds a mask:
    1. avg = token_sum / steps (float32; 1 before the first step that committed)
    2. uncached |= masks; P = the block if warm (or delayed cache off), else the uncached positions
    3. m = P's masks; target = min(m, max(1, ceil(max(avg, 1) * alpha))) in float32; evict iff m > target
    4. layer 0 over P (keys: everything before the block, the block up to max P), importance I0;
       layer 1: q/k/v of P, K/V stored for P, importance I1, the kept set K (section 3 of the doc),
       attention for K (keys up to max K), MLP for K; layers 2..: K alone (K/V stored for K)
    5. progress = max(progress, max K); mark cached (a token with a token right of it, before commits)
    6. LowConfidence among K's masks: every p > threshold, else the most confident (first on ties)
    7. token_sum += committed, steps += 1 if any
  then, unless it is the last block, a store pass: the whole block, every layer's K/V stored.

Keys/values live in a store per layer and position (the paged cache): a position's entry is the
one of the last forward that computed it at that layer. Shares no code with fastdllm: the models are
the naive ones of reference_blockdiff (SDAR) and reference_moe (LLaDA2.0), driven layer by layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from reference_blockdiff import BANNED

INF = float("inf")


class SDARLayers:
    """SDAR's layer pieces on reference_blockdiff.NaiveQwen (Qwen3: q/k norm before RoPE)."""

    def __init__(self, naive):
        self.n, self.w, self.layers = naive, naive.w, naive.n_layers
        self.H, self.KV, self.hd = naive.H, naive.KV, naive.hd

    def embed(self, ids):
        return self.w["model.embed_tokens.weight"][torch.tensor(ids, dtype=torch.long)]

    def qkv(self, i, x, positions):
        """x (n, d) the layer's input -> q (H, n, hd), k, v (KV, n, hd), after norm and RoPE."""
        n, p = x.shape[0], f"model.layers.{i}."
        h = self.n.rms(x, self.w[p + "input_layernorm.weight"])
        q = self.n.lin(h, p + "self_attn.q_proj").view(n, self.H, self.hd).transpose(0, 1)
        k = self.n.lin(h, p + "self_attn.k_proj").view(n, self.KV, self.hd).transpose(0, 1)
        v = self.n.lin(h, p + "self_attn.v_proj").view(n, self.KV, self.hd).transpose(0, 1)
        q = self.n.rms(q, self.w[p + "self_attn.q_norm.weight"])
        k = self.n.rms(k, self.w[p + "self_attn.k_norm.weight"])
        return self.n.rope(q, positions), self.n.rope(k, positions), v

    def rest(self, i, x, out):
        """x (n, d) the rows' input, out (n, H*hd) their attention -> the layer's output rows."""
        p = f"model.layers.{i}."
        x = x + self.n.lin(out, p + "self_attn.o_proj")
        return x + self.n.mlp(self.n.rms(x, self.w[p + "post_attention_layernorm.weight"]), i)

    def logits(self, x):
        return self.n.rms(x, self.w["model.norm.weight"]) @ self.n.head.T


class LLaDA2Layers(SDARLayers):
    """LLaDA2.0's on reference_moe.NaiveLLaDA2 (fused q/k/v, q/k norm, partial RoPE, MoE layers)."""

    def __init__(self, naive):
        self.n, self.w, self.layers = naive, naive.w, naive.n_layers
        self.H, self.KV, self.hd = naive.H, naive.KV, naive.hd

    def embed(self, ids):
        return self.w[self.n.embed][torch.tensor(ids, dtype=torch.long)]

    def qkv(self, i, x, positions):
        n, p, H, KV = x.shape[0], f"model.layers.{i}.", self.H, self.KV
        h = self.n.rms(x, p + "input_layernorm.weight")
        qkv = self.n.lin(h, p + "attention.query_key_value").view(n, H + 2 * KV, self.hd).transpose(0, 1)
        q, k, v = qkv[:H], qkv[H:H + KV], qkv[H + KV:]
        if self.n.qk_norm:
            q, k = self.n.rms(q, p + "attention.query_layernorm.weight"), self.n.rms(k, p + "attention.key_layernorm.weight")
        return self.n.rope(q, positions), self.n.rope(k, positions), v

    def rest(self, i, x, out):
        p = f"model.layers.{i}."
        x = x + self.n.lin(out, p + "attention.dense")
        return x + self.n.mlp_block(self.n.rms(x, p + "post_attention_layernorm.weight"), i)

    def logits(self, x):
        return self.n.rms(x, "model.norm.weight") @ self.w["lm_head.weight"].T


@dataclass
class FocusStep:
    block: int
    processing: list        # block offsets recomputed at layers 0 and 1
    kept: list              # block offsets computed by the later layers
    committed: list         # sorted [(canvas position, token)]


@dataclass
class FocusTrace:
    canvas: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    nfe: int = 0            # prefill + steps + store passes (none after the last block)
    dropped: int = 0        # masked positions of P left out of K, over all steps


def attend(m, q, store, keys):
    """q (H, n, hd) against the stored K/V at positions `keys` -> (n, H*hd), looping over heads."""
    k = torch.stack([store[p][0] for p in keys], 1)                    # (KV, c, hd)
    v = torch.stack([store[p][1] for p in keys], 1)
    out = torch.zeros(m.H, q.shape[1], m.hd, dtype=torch.float64)
    for h in range(m.H):
        g = h // (m.H // m.KV)
        out[h] = torch.softmax(q[h] @ k[g].T / math.sqrt(m.hd), -1) @ v[g]
    return out.transpose(0, 1).reshape(q.shape[1], m.H * m.hd)


def importance(m, q, k, rows):
    """Per masked row j (rows: their indices in q/k, canvas order): the summed softmax weight, over
    heads and masked queries, of the max of its scores and its two neighbours' in the list."""
    total = [0.0] * len(rows)
    for h in range(m.H):
        g = h // (m.H // m.KV)
        for i in rows:
            s = [float(q[h, i] @ k[g, j]) * m.hd ** -0.5 for j in rows]
            pooled = [max(s[max(j - 1, 0):j + 2]) for j in range(len(rows))]
            top = max(pooled)
            e = [math.exp(a - top) for a in pooled]
            for j in range(len(rows)):
                total[j] += e[j] / sum(e)
    return total


def retain(delta, offsets, target, evict, progress):
    """The authors' `_focus_select_mask` then `_focus_enforce_rules` over a row's masks of P."""
    n = len(delta)
    if evict:
        base = set(sorted(range(n), key=lambda j: (-delta[j], j))[:target])
        mean = sum(delta) / n
        std = math.sqrt(sum((d - mean) ** 2 for d in delta) / n)
        over = {j for j in range(n) if delta[j] >= mean + std}
        base = over if len(over) >= target else base
    else:
        base = set(range(n))
    keep = [j in base for j in range(n)]
    for j in range(n - 1):                                   # adjacency, from the base choice
        if offsets[j + 1] - offsets[j] == 1 and (j + 1) in base and j not in base:
            keep[j] = True
    if not any(keep):
        keep = [True] * n
    right = max(offsets[j] for j in range(n) if keep[j])
    return [keep[j] or (offsets[j] < right and offsets[j] > progress) for j in range(n)]


def forward_all(m, stores, x, positions, keys_of):
    """Every position of `positions` through every layer, K/V stored (prefill and store passes)."""
    h = m.embed([x[p] for p in positions])
    for i in range(m.layers):
        q, k, v = m.qkv(i, h, positions)
        for c, p in enumerate(positions):
            stores[i][p] = (k[:, c], v[:, c])
        h = m.rest(i, h, torch.cat([attend(m, q[:, c:c + 1], stores[i], keys_of(p)) for c, p in enumerate(positions)]))


def focus_step(m, stores, x, s, P, masks, target, evict, progress):
    """One step's forward (docs 2). Returns the kept offsets and {offset: logits} of K's masks."""
    pos, kept = [s + j for j in P], list(P)
    h = m.embed([x[p] for p in pos])
    mrows = [c for c, j in enumerate(P) if j in masks]
    scores = []
    for i in range(m.layers):
        q, k, v = m.qkv(i, h, pos)                     # layers 0, 1: P; later layers: K
        for c, p in enumerate(pos):
            stores[i][p] = (k[:, c], v[:, c])
        if i < 2 and evict:
            scores.append(importance(m, q, k, mrows))
        if i == 1 and evict:
            offsets = [P[c] for c in mrows]
            keep = retain([b - a for a, b in zip(*scores)], offsets, target, evict, progress)
            kept = [j for j in P if j not in masks or keep[offsets.index(j)]]
            rows = [P.index(j) for j in kept]
            q, h, pos = q[:, rows], h[rows], [s + j for j in kept]
        right = max(P) if i == 0 else max(kept)
        h = m.rest(i, h, attend(m, q, stores[i], range(0, s + right + 1)))
    logits = m.logits(h)
    return kept, {j: logits[c] for c, j in enumerate(kept) if j in masks}


def focus_generate(m, prompt, *, mask_id, gen_length, block_length, threshold, alpha, delayed=True) -> FocusTrace:
    B, L = block_length, len(prompt)
    nb = -(-(L + gen_length) // B)
    x = list(prompt) + [mask_id] * (nb * B - L)
    stores, tr = [{} for _ in range(m.layers)], FocusTrace()
    causal = lambda p: range(0, (p // B + 1) * B)                               # noqa: E731  block-causal keys
    if L // B:
        forward_all(m, stores, x, list(range(L // B * B)), causal)
        tr.nfe += 1
    for b in range(L // B, nb):
        s = b * B
        uncached, warm, progress = [True] * B, True, -1
        token_sum, steps = torch.zeros((), dtype=torch.float32), torch.zeros((), dtype=torch.float32)
        while mask_id in x[s:s + B]:
            masks = {j for j in range(B) if x[s + j] == mask_id}
            uncached = [u or j in masks for j, u in enumerate(uncached)]
            avg = token_sum / steps if steps > 0 else torch.ones((), dtype=torch.float32)
            P = list(range(B)) if warm or not delayed else ([j for j in range(B) if uncached[j]] or list(range(B)))
            warm = False
            n_masks = sum(j in masks for j in P)
            target = min(n_masks, max(1, int(torch.ceil(torch.clamp(avg, min=1.0) * alpha))))
            kept, logits = focus_step(m, stores, x, s, P, masks, target, n_masks > target, progress)
            tr.dropped += sum(j in masks for j in P) - len(logits)
            progress = max(progress, max(kept))
            if delayed:                                              # from the tokens before the commits
                for j in range(B):
                    if j not in masks and (j == B - 1 or (j + 1) not in masks):
                        uncached[j] = False
            best = {}
            for j, row in logits.items():
                row = row.clone()
                row[BANNED] = -INF
                token = int(row.argmax())
                best[j] = (token, float(torch.softmax(logits[j], -1)[token]))
            commit = [j for j in sorted(best) if best[j][1] > threshold] or \
                [max(sorted(best), key=lambda j: (best[j][1], -j))]
            for j in commit:
                x[s + j] = best[j][0]
            token_sum, steps = token_sum + len(commit), steps + 1
            tr.nfe += 1
            tr.steps.append(FocusStep(b, list(P), list(kept), sorted((s + j, best[j][0]) for j in commit)))
        if b < nb - 1:                                                # the store pass
            forward_all(m, stores, x, list(range(s, s + B)), causal)
            tr.nfe += 1
    tr.canvas = x
    return tr
