"""An independent, deliberately naive transcription of the two block-diffusion reference decoders,
written for these tests from docs/specs/sdar.md (R2, JetAstra/SDAR's evaluation harness) and
docs/specs/fast-dllm-v2.md (S2, the checkpoint's `generate`), with the decisions of each doc's §7 applied:

- SDAR: prefill of the whole prompt blocks when L >= B; quota schedule; R2's guard (a non-mask is
  never rewritten); strict `>` threshold; ties: lowest position first; no store pass after the last
  block decoded (Q5: the authors' count is one more).
- v2: prefill when L >= B (Q1; the authors need L > B); shift-by-one logits; AR token at each block
  start; sub-blocks left to right; strict `>` with at least one per step (first index on ties);
  stop inside a block; cache-write pass, skipped after the last block when it ends by length (Q6);
  attention granularity `bd_size` everywhere (Q3); the block-cache variant of §4.4.
- Greedy: argmax (first index on ties), confidence = float64 softmax probability of the argmax.

Shares no code with fastdllm: NaiveQwen reads config.json and the safetensors files by tensor name,
computes in float64, loops over heads, and caches keys after RoPE. Batch size 1 only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

INF = float("inf")


class NaiveQwen:
    """Qwen2 (q/k/v biases when present) and Qwen3 (q_norm/k_norm over head_dim before RoPE) blocks."""

    def __init__(self, path):
        path = Path(path)
        self.cfg = c = json.loads((path / "config.json").read_text())
        index = path / "model.safetensors.index.json"
        self.w = {}
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            for f in sorted(set(weight_map.values())):
                part = load_file(str(path / f))
                assert all(weight_map[k] == f for k in part), f"{f} holds tensors the index places elsewhere"
                self.w.update({k: v.double() for k, v in part.items()})
            assert set(self.w) == set(weight_map)
        else:
            self.w = {k: v.double() for k, v in load_file(str(path / "model.safetensors")).items()}
        self.n_layers, self.H, self.KV = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or c["hidden_size"] // self.H
        self.theta, self.eps = float(c["rope_theta"]), float(c["rms_norm_eps"])
        self.head = self.w.get("lm_head.weight", self.w["model.embed_tokens.weight"])  # tied when absent

    def empty_cache(self):
        return [(torch.zeros(self.KV, 0, self.hd, dtype=torch.float64),) * 2 for _ in range(self.n_layers)]

    def rms(self, x, weight):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    def rope(self, x, positions):  # x (heads, n, hd); rotate-half layout
        inv = 1.0 / self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd)
        ang = torch.tensor(list(positions), dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        half = self.hd // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def forward(self, ids, positions, past, allowed, rows=None):
        """New token `ids` at absolute `positions`, attending to `past` (per layer (k, v), each
        (KV, c, hd), keys after RoPE; None = nothing) then to themselves, where `allowed` (n, c + n)
        says which keys each new query may see. Returns (logits (len(rows), V) for the requested
        rows of the new tokens (all by default), per-layer (k, v) of the new tokens)."""
        n, positions = len(ids), list(positions)
        x = self.w["model.embed_tokens.weight"][torch.tensor(ids, dtype=torch.long)]
        new = []
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            h = self.rms(x, self.w[p + "input_layernorm.weight"])
            q = self.lin(h, p + "self_attn.q_proj").view(n, self.H, self.hd).transpose(0, 1)
            k = self.lin(h, p + "self_attn.k_proj").view(n, self.KV, self.hd).transpose(0, 1)
            v = self.lin(h, p + "self_attn.v_proj").view(n, self.KV, self.hd).transpose(0, 1)
            if p + "self_attn.q_norm.weight" in self.w:
                q = self.rms(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.rms(k, self.w[p + "self_attn.k_norm.weight"])
            q, k = self.rope(q, positions), self.rope(k, positions)
            new.append((k, v))
            keys, values = (k, v) if past is None else (torch.cat([past[i][0], k], 1), torch.cat([past[i][1], v], 1))
            assert allowed.shape == (n, keys.shape[1])
            out = torch.zeros(self.H, n, self.hd, dtype=torch.float64)
            for head in range(self.H):
                g = head // (self.H // self.KV)          # GQA: consecutive query heads share a K/V head
                scores = (q[head] @ keys[g].T) / math.sqrt(self.hd)
                scores = scores.masked_fill(~allowed, -INF)
                out[head] = torch.softmax(scores, -1) @ values[g]
            x = x + self.lin(out.transpose(0, 1).reshape(n, self.H * self.hd), p + "self_attn.o_proj")
            x = x + self.mlp(self.rms(x, self.w[p + "post_attention_layernorm.weight"]), i)
        x = self.rms(x, self.w["model.norm.weight"])
        if rows is not None:
            x = x[torch.tensor(list(rows), dtype=torch.long)]
        return x @ self.head.T, new

    def mlp(self, h, layer):
        """The dense SwiGLU of layer `layer` on h (n, d) (tests/references/reference_sdar_moe.py: the MoE one)."""
        p = f"model.layers.{layer}.mlp."
        return self.lin(torch.nn.functional.silu(self.lin(h, p + "gate_proj")) * self.lin(h, p + "up_proj"),
                        p + "down_proj")


def block_causal(q_positions, k_positions, granularity):
    """Allowed iff the query's block index >= the key's (bidirectional inside a block)."""
    q = torch.tensor(list(q_positions))[:, None] // granularity
    k = torch.tensor(list(k_positions))[None, :] // granularity
    return q >= k


def full_logits(naive, ids, granularity, rows=None):
    """No cache at all: the whole sequence at positions 0.. under the block-causal mask."""
    pos = range(len(ids))
    return naive.forward(list(ids), pos, None, block_causal(pos, pos, granularity), rows)[0]


def append_cache(cache, kv):
    return [(torch.cat([ck, k], 1), torch.cat([cv, v], 1)) for (ck, cv), (k, v) in zip(cache, kv)]


BANNED = []   # token ids never predicted: fastdllm bans the mask id (the references do not)


def greedy(logits):
    """argmax (first index on ties) and its float64 softmax probability, per row."""
    x = logits.index_fill(-1, torch.tensor(BANNED, dtype=torch.long), float("-inf")).argmax(-1) if BANNED else logits.argmax(-1)
    p = torch.softmax(logits.double(), -1).gather(-1, x[:, None])[:, 0]
    return [int(t) for t in x], [float(c) for c in p]


@dataclass
class Trace:
    tokens: list                 # generated ids after the prompt, through the first stop (if any)
    nfe: int = 0                 # forward calls, decisions applied (prefill, denoising, store/cache-write)
    steps: list = field(default_factory=list)        # per denoising forward: (block, sorted [(pos, token)])
    confidences: list = field(default_factory=list)  # per denoising forward: {pos: conf} of its candidates
    ar_tokens: list = field(default_factory=list)    # v2: (pos, token) from prefill / cache-write passes
    canvas: list = field(default_factory=list)       # final x: prompt + everything written (masks included)
    stopped: bool = False
    nfe_published: int = 0       # the authors' count: SDAR nfe + 1 (Q5); v2 nfe + 1 when it ends by length (Q6)
    cache_err: float = 0.0       # check_cache: max |cached logits - full recompute| over exact forwards
    partial: int = 0             # v2 block cache: forwards of a sub-block alone (the approximate path)

    def steps_per_block(self):
        out = {}
        for b, _ in self.steps:
            out[b] = out.get(b, 0) + 1
        return out


def _finish(tr, x, L, stop_ids):
    tr.canvas, out = list(x), list(x[L:])
    hits = [j for j, t in enumerate(out) if t in stop_ids]
    tr.stopped = bool(hits)
    tr.tokens = out[: hits[0] + 1] if hits else out
    return tr


def _check(tr, naive, x, end, granularity, logits, rows):
    ref = full_logits(naive, x[:end], granularity, rows)
    tr.cache_err = max(tr.cache_err, float((ref - logits).abs().max()))


def sdar_generate(naive, prompt, *, mask_id, stop_ids, gen_length, block_length=4, denoising_steps=4,
                  strategy="low_confidence_dynamic", threshold=0.95, check_cache=False) -> Trace:
    assert strategy in ("low_confidence_static", "low_confidence_dynamic", "sequential")
    B, T, L = block_length, denoising_steps, len(prompt)
    nb = -(-(L + gen_length) // B)
    x = list(prompt) + [mask_id] * (nb * B - L)
    tr, cache = Trace(tokens=[]), naive.empty_cache()
    P = (L // B) * B
    if P > 0:                                                   # prefill, K/V stored
        _, cache = naive.forward(x[:P], range(P), None, block_causal(range(P), range(P), B), rows=[])
        tr.nfe += 1
    quota = [B // T + (1 if i < B % T else 0) for i in range(T)]
    for b in range(L // B, nb):
        s = b * B
        pos = list(range(s, s + B))
        allowed = block_causal(pos, range(s + B), B)
        for i in range(T + 1):
            if mask_id not in x[s:s + B]:
                last = b == nb - 1 or any(t in stop_ids for t in x[L:])
                if not last:                                    # store pass (skipped after the last block)
                    _, kv = naive.forward(x[s:s + B], pos, cache, allowed, rows=[])
                    cache = append_cache(cache, kv)
                    tr.nfe += 1
                break
            assert i < T, "quotas sum to B: the block is full after T steps"
            logits, _ = naive.forward(x[s:s + B], pos, cache, allowed)
            tr.nfe += 1
            if check_cache:
                _check(tr, naive, x, s + B, B, logits, range(s, s + B))
            x0, p = greedy(logits)
            is_mask = [x[j] == mask_id for j in pos]
            conf = [p[j] if is_mask[j] else -INF for j in range(B)]
            masked = [j for j in range(B) if is_mask[j]]
            order = sorted(masked, key=lambda j: (-conf[j], j))  # most confident first, lowest position on ties
            if strategy == "low_confidence_static":
                commit = order[:min(quota[i], len(masked))]
            elif strategy == "low_confidence_dynamic":
                hi = sum(1 for j in masked if conf[j] > threshold)
                commit = order[:max(min(quota[i], len(masked)), hi)]
            else:                                               # sequential
                commit = [j for j in masked if masked[0] <= j < masked[0] + quota[i]]
            for j in commit:                                    # R2's guard: only masks are written
                x[s + j] = x0[j]
            tr.steps.append((b, sorted((s + j, x0[j]) for j in commit)))
            tr.confidences.append({s + j: conf[j] for j in masked})
        if any(t in stop_ids for t in x[L:]):
            break
    tr.nfe_published = tr.nfe + 1
    return _finish(tr, x, L, stop_ids)


def v2_generate(naive, prompt, *, mask_id, stop_id, max_new_tokens, block_size=32, small_block_size=8,
                threshold=0.9, use_block_cache=False, check_cache=False) -> Trace:
    B, S, L = block_size, small_block_size, len(prompt)
    g = naive.cfg.get("bd_size", 32)                            # attention granularity (Q3)
    assert B % g == 0 and B % S == 0
    x, tr, cache = list(prompt), Trace(tokens=[]), naive.empty_cache()
    if L >= B:                                                  # prefill (Q1: also when L == B)
        P = (L // B) * B
        logits, cache = naive.forward(x[:P], range(P), None, block_causal(range(P), range(P), g), rows=[P - 1])
        tr.nfe += 1
        if L % B == 0:                                          # AR token at L
            x.append(greedy(logits)[0][0])
            tr.ar_tokens.append((L, x[-1]))
    num_blocks = max_new_tokens // B
    ended_by_length = False
    for blk in range(num_blocks):
        if stop_id in x[L:]:
            break
        start = len(x)                                          # `prompt_length` of the reference
        s = (start // B) * B
        x += [mask_id] * (B - start % B)
        pos = list(range(s, s + B))
        allowed = block_causal(pos, range(s + B), g)

        def stop_reached():
            tail = x[start:]
            return stop_id in tail and mask_id not in tail[:tail.index(stop_id)]

        block_cache = None
        while not stop_reached():
            if mask_id not in x[s:s + B]:
                if blk == num_blocks - 1:                       # Q6: no cache-write after the last block
                    ended_by_length = True
                    break
                logits, kv = naive.forward(x[s:s + B], pos, cache, allowed, rows=[B - 1])
                tr.nfe += 1
                if check_cache:
                    _check(tr, naive, x, s + B, g, logits, [s + B - 1])
                cache = append_cache(cache, kv)
                x.append(greedy(logits)[0][0])                  # next block's first token, from s+B-1
                tr.ar_tokens.append((s + B, x[-1]))
                break
            for k in range(B // S):
                lo, hi = s + k * S, s + (k + 1) * S
                while mask_id in x[lo:hi] and not stop_reached():
                    # the shift: span row r is predicted from fed row r - 1 (the first fed row from itself)
                    if not use_block_cache or block_cache is None or x[lo] == mask_id:
                        src = [max(r - 1, 0) for r in range(k * S, (k + 1) * S)]
                        logits, kv = naive.forward(x[s:s + B], pos, cache, allowed, rows=src)
                        if check_cache:
                            _check(tr, naive, x, s + B, g, logits, [s + r for r in src])
                        block_cache = [(k_.clone(), v_.clone()) for k_, v_ in kv] if use_block_cache else None
                    else:                                       # sub-block only, against prefix + block cache
                        keep = [j for j in range(B) if not k * S <= j < (k + 1) * S]   # stale rows replaced
                        past = [(torch.cat([ck, bk[:, keep]], 1), torch.cat([cv, bv[:, keep]], 1))
                                for (ck, cv), (bk, bv) in zip(cache, block_cache)]
                        n_keys, tr.partial = past[0][0].shape[1] + S, tr.partial + 1
                        logits, kv = naive.forward(x[lo:hi], range(lo, hi), past, torch.ones(S, n_keys, dtype=torch.bool),
                                                   rows=[max(r - 1, 0) for r in range(S)])
                        for (bk, bv), (k_, v_) in zip(block_cache, kv):   # fresh K/V written into the block cache
                            bk[:, k * S:(k + 1) * S], bv[:, k * S:(k + 1) * S] = k_, v_
                    tr.nfe += 1
                    x1, p = greedy(logits)
                    is_mask = [x[lo + j] == mask_id for j in range(S)]
                    conf = [p[j] if is_mask[j] else -INF for j in range(S)]
                    best = max(range(S), key=lambda j: conf[j])   # first index among equal maxima
                    commit = [j for j in range(S) if is_mask[j] and (conf[j] > threshold or j == best)]
                    for j in commit:
                        x[lo + j] = x1[j]
                    tr.steps.append((s // B, sorted((lo + j, x1[j]) for j in commit)))
                    tr.confidences.append({lo + j: conf[j] for j in range(S) if is_mask[j]})
        if ended_by_length:
            break
    tr = _finish(tr, x, L, (stop_id,))
    tr.nfe_published = tr.nfe + (1 if ended_by_length else 0)
    return tr
