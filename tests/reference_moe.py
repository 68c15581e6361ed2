"""An independent, deliberately naive float64 transcription of the two MoE diffusion families and their
reference decoders, written for these tests from docs/llada2-moe.md (H1: the checkpoint's own forward
and `generate`; D1's decode rule as a second rule) and docs/llada-moe.md (M1 forward, M2: the model
card's `generate`), with the docs' Decisions applied:

- Greedy only (temperature 0 = argmax, first index on ties; confidence = float64 softmax probability
  of that token over the full vocabulary). Ids in BANNED are never predicted (fastdllm bans the mask
  id, Q5; the references do not, so the default is empty).
- Top-k anywhere (expert choice, group choice, positions to commit): highest value first, lowest
  index on ties (torch.topk leaves tie order unspecified).
- The router runs on the same float64 activations as everything else (the dtype notes of docs Q8 /
  llada-moe Q2 only matter on bf16 hardware).

Shares no code with fastdllm: the models read config.json and the safetensors shards by tensor name
(asserting the exact set of names the docs list), loop over heads, run every expert on every token
and combine them with a dense (tokens, experts) weight matrix. Batch size 1, no cache: every forward
recomputes the sequence it is given, as H1 and the model card do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

INF = float("inf")
BANNED = []   # token ids never predicted: fastdllm bans the mask id (the references do not)


def load_tensors(path):
    """{name: tensor as stored}; with an index, each shard must hold exactly what the index maps to it."""
    path, out = Path(path), {}
    index = path / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(path / "model.safetensors"))
    weight_map = json.loads(index.read_text())["weight_map"]
    for f in sorted(set(weight_map.values())):
        part = load_file(str(path / f))
        assert set(part) == {k for k, v in weight_map.items() if v == f}, f"{f} differs from the index"
        out.update(part)
    return out


def llada2_route(logits, bias, *, n_group, topk_group, k, scale, group_limit=True):
    """One token's LLaDA2 router (docs §5): logits (E,) -> (expert ids in choice order, weights)."""
    s = torch.sigmoid(logits)                     # unbiased scores: the weights
    r = s + bias                                  # biased scores: the choice only
    E = len(s)
    size = E // n_group
    allowed = range(E)
    if group_limit:
        group_score = [sum(sorted(r[g * size:(g + 1) * size].tolist(), reverse=True)[:2]) for g in range(n_group)]
        kept = sorted(range(n_group), key=lambda g: (-group_score[g], g))[:topk_group]
        allowed = [j for j in range(E) if j // size in kept]
    idx = sorted(allowed, key=lambda j: (-float(r[j]), j))[:k]
    w = [float(s[j]) for j in idx]
    if k > 1:                                     # always normalised (norm_topk_prob is not read)
        total = sum(w) + 1e-20
        w = [x / total for x in w]
    return idx, [x * scale for x in w]


def llada2_block_route(logits, bias, *, capacity, block_size, k, scale):
    """LLaDA2.2's block routing (docs/llada2-2.md §2), for a sequence at positions 0..n-1 (logits (n, E)):
    tokens t with equal t // block_size share a block; an expert's block score is the max over the
    block's tokens of sigmoid + bias; the block keeps the `capacity` best (lowest index on ties); each
    token takes its k best biased scores among them, no group limiting; weights as llada2_route.
    Returns (per-token (ids, weights), {block: kept experts, best first})."""
    n, E = logits.shape
    s = torch.sigmoid(logits)
    r = [[float(s[t, j] + bias[j]) for j in range(E)] for t in range(n)]
    kept, routes = {}, []
    for b in range((n + block_size - 1) // block_size):
        tokens = range(b * block_size, min((b + 1) * block_size, n))
        best = [max(r[t][j] for t in tokens) for j in range(E)]
        kept[b] = sorted(range(E), key=lambda j: (-best[j], j))[:capacity]
    for t in range(n):
        idx = sorted(kept[t // block_size], key=lambda j: (-r[t][j], j))[:k]
        w = [float(s[t, j]) for j in idx]
        if k > 1:
            total = sum(w) + 1e-20
            w = [x / total for x in w]
        routes.append((idx, [x * scale for x in w]))
    return routes, kept


def llada_moe_route(logits, bias, *, k):
    """One token's LLaDA-MoE router (llada-moe §4): softmax, plus the bias if any (it stays in the
    weights), top-k, no renormalisation, no scaling."""
    p = torch.softmax(logits, -1)
    if bias is not None:
        p = p + bias
    idx = sorted(range(len(p)), key=lambda j: (-float(p[j]), j))[:k]
    return idx, [float(p[j]) for j in idx]


@dataclass
class Route:
    layer: int
    experts: list        # per token: the k expert ids, in choice order
    weights: list        # per token: their final weights (after normalisation and scaling)


class _NaiveMoE:
    """What both families share: pre-norm blocks, GQA attention looping over heads, rotate-half RoPE
    on the first `rotary_dim` dims of each head, SwiGLU experts, untied head, no logit shift."""

    def __init__(self, path, group_limit=True):
        self.path = Path(path)
        self.cfg = json.loads((self.path / "config.json").read_text())
        self.configure(self.cfg)
        stored = load_tensors(self.path)
        self.dtypes = {k: v.dtype for k, v in stored.items()}
        self.w = {k: v.double() for k, v in stored.items()}
        expected = self.expected_names()
        assert set(self.w) == expected, (f"missing {sorted(expected - set(self.w))[:5]}, "
                                         f"unexpected {sorted(set(self.w) - expected)[:5]}")
        self.group_limit = group_limit            # llada2 only: False = plain top-k (for the self-checks)
        self.routes = []                          # the last forward's MoE decisions, one Route per MoE layer
        self.kept = {}                            # block routing: layer -> {block: kept experts}

    def rms(self, x, name):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[name]

    def lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if name + ".bias" in self.w else y

    def swiglu(self, x, prefix):
        return self.lin(torch.nn.functional.silu(self.lin(x, prefix + "gate_proj")) * self.lin(x, prefix + "up_proj"),
                        prefix + "down_proj")

    def rope(self, x, positions):
        """x (heads, n, hd): rotate-half on the first R dims (pairs i, i + R/2), the rest unchanged."""
        R = self.rotary_dim
        inv = 1.0 / self.theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
        ang = torch.tensor(list(positions), dtype=torch.float64)[:, None] * inv[None, :]
        cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
        rot, rest = x[..., :R], x[..., R:]
        half = torch.cat([-rot[..., R // 2:], rot[..., :R // 2]], -1)
        return torch.cat([rot * cos + half * sin, rest], -1)

    def attend(self, q, k, v, allowed):
        """q (H, n, hd), k/v (KV, n, hd), allowed (n, n) -> (n, H*hd)."""
        n, out = q.shape[1], torch.zeros(self.H, q.shape[1], self.hd, dtype=torch.float64)
        for head in range(self.H):
            g = head // (self.H // self.KV)       # GQA: consecutive query heads share a K/V head
            scores = (q[head] @ k[g].T) / math.sqrt(self.hd)
            out[head] = torch.softmax(scores.masked_fill(~allowed, -INF), -1) @ v[g]
        return out.transpose(0, 1).reshape(n, self.H * self.hd)

    def forward(self, ids, attention=None, *, block_length=None, rows=None):
        """ids at positions 0..n-1 under `attention` ("bidirectional", or "block-causal" with
        `block_length`: query q sees key k iff q // B >= k // B; default: the family's own).
        Returns float64 logits (len(rows) or n, V); `self.routes` holds the MoE decisions."""
        attention = attention or self.attention
        assert attention != "block-causal" or block_length, "block-causal attention needs block_length"
        n = len(ids)
        pos = torch.arange(n)
        if attention == "bidirectional":
            allowed = torch.ones(n, n, dtype=torch.bool)
        elif attention == "block-causal":
            allowed = pos[:, None] // block_length >= pos[None, :] // block_length
        else:
            raise ValueError(attention)
        x = self.w[self.embed][torch.tensor(ids, dtype=torch.long)]
        self.routes, self.kept = [], {}
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            x = x + self.attention_block(self.rms(x, p + "input_layernorm.weight"), p, range(n), allowed)
            x = x + self.mlp_block(self.rms(x, p + "post_attention_layernorm.weight"), i)
        x = self.rms(x, "model.norm.weight")
        if rows is not None:
            x = x[torch.tensor(list(rows), dtype=torch.long)]
        return x @ self.w["lm_head.weight"].T

    def combine(self, h, i, prefix, routes):
        """sum over chosen experts of weight * expert(h), every expert run on every token."""
        dense = torch.zeros(h.shape[0], self.E, dtype=torch.float64)      # (n, E) routing weights
        for t, (idx, w) in enumerate(routes):
            dense[t, idx] = torch.tensor(w, dtype=torch.float64)
        self.routes.append(Route(i, [r[0] for r in routes], [r[1] for r in routes]))
        return sum(dense[:, j:j + 1] * self.swiglu(h, prefix + f"experts.{j}.") for j in range(self.E))


class NaiveLLaDA2(_NaiveMoE):
    """`llada2_moe` (H1): fused query_key_value, q/k RMSNorm per head before partial RoPE, dense layers
    below first_k_dense_replace, sigmoid router with expert bias and group limiting, shared experts."""
    embed, attention = "model.word_embeddings.weight", "block-causal"

    def configure(self, c):
        self.n_layers, self.H, self.KV, self.hd = (c["num_hidden_layers"], c["num_attention_heads"],
                                                   c["num_key_value_heads"], c["head_dim"])
        self.rotary_dim = int(self.hd * c["partial_rotary_factor"])            # rotary_dim key ignored (H1)
        self.theta, self.eps, self.E = float(c["rope_theta"]), float(c["rms_norm_eps"]), c["num_experts"]
        self.qk_norm = c.get("use_qk_norm", True)                                # absent = true (docs Q3)

    def expected_names(self):
        c = self.cfg
        names = {"model.word_embeddings.weight", "model.norm.weight", "lm_head.weight"}
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            names |= {p + n + ".weight" for n in ("input_layernorm", "post_attention_layernorm",
                                                  "attention.query_key_value", "attention.dense")}
            names |= {p + "attention.query_key_value.bias"} if c["use_qkv_bias"] else set()
            names |= {p + "attention.dense.bias"} if c["use_bias"] else set()
            names |= {p + "attention.query_layernorm.weight", p + "attention.key_layernorm.weight"} if self.qk_norm else set()
            mlps = ["mlp."] if i < c["first_k_dense_replace"] else [f"mlp.experts.{j}." for j in range(self.E)]
            if i >= c["first_k_dense_replace"]:
                names |= {p + "mlp.gate.weight", p + "mlp.gate.expert_bias"}
                mlps += ["mlp.shared_experts."] if c["num_shared_experts"] else []
            names |= {p + m + f"{w}_proj.weight" for m in mlps for w in ("gate", "up", "down")}
        return names

    def attention_block(self, h, p, positions, allowed):
        n, H, KV, hd = h.shape[0], self.H, self.KV, self.hd
        qkv = self.lin(h, p + "attention.query_key_value").view(n, H + 2 * KV, hd).transpose(0, 1)
        q, k, v = qkv[:H], qkv[H:H + KV], qkv[H + KV:]                 # heads: q | k | v
        if self.qk_norm:
            q, k = self.rms(q, p + "attention.query_layernorm.weight"), self.rms(k, p + "attention.key_layernorm.weight")
        q, k = self.rope(q, positions), self.rope(k, positions)
        return self.lin(self.attend(q, k, v, allowed), p + "attention.dense")

    def mlp_block(self, h, i):
        p, c = f"model.layers.{i}.mlp.", self.cfg
        if i < c["first_k_dense_replace"]:
            return self.swiglu(h, p)
        logits, bias = h @ self.w[p + "gate.weight"].T, self.w[p + "gate.expert_bias"]
        if c.get("expert_capacity") is not None:                               # LLaDA2.2 block routing
            routes, self.kept[i] = llada2_block_route(logits, bias, capacity=c["expert_capacity"],
                                                      block_size=c.get("block_size") or 32,
                                                      k=c["num_experts_per_tok"], scale=c["routed_scaling_factor"])
        else:
            routes = [llada2_route(row, bias, n_group=c["n_group"], topk_group=c["topk_group"], k=c["num_experts_per_tok"],
                                   scale=c["routed_scaling_factor"], group_limit=self.group_limit) for row in logits]
        y = self.combine(h, i, p, routes)
        return y + self.swiglu(h, p + "shared_experts.") if c["num_shared_experts"] else y


class NaiveLLaDAMoE(_NaiveMoE):
    """LLaDA-MoE (M1): split q/k/v/o, per-head q/k RMSNorm, full RoPE, bidirectional, softmax top-k
    router without renormalisation, optional dense layers, expert bias and layer-level shared expert."""
    embed, attention = "model.embed_tokens.weight", "bidirectional"

    def configure(self, c):
        self.n_layers, self.H, self.KV = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c["hidden_size"] // self.H                            # no head_dim key is read
        self.rotary_dim = int(self.hd * c["partial_rotary_factor"])
        self.theta, self.eps, self.E = float(c["rope_theta"]), float(c.get("rms_norm_eps", 1e-5)), c["num_experts"]

    def expected_names(self):
        c = self.cfg
        names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
            kinds = ("weight", "bias") if c["attention_bias"] else ("weight",)
            names |= {p + f"self_attn.{m}_proj.{t}" for m in "qkvo" for t in kinds}
            names |= {p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight"} if c["qk_layernorm"] else set()
            mlps = [f"mlp.experts.{j}." for j in range(self.E)] if c["moe_layer_freq"][i] else ["mlp."]
            mlps += ["shared_expert."] if c["shared_expert_intermediate_size"] is not None else []
            names |= {p + m + f"{w}_proj.weight" for m in mlps for w in ("gate", "up", "down")}
            names |= {p + "mlp.gate.weight"} if c["moe_layer_freq"][i] else set()
            names |= {p + "mlp.expert_bias"} if c["moe_layer_freq"][i] and c["moe_router_enable_expert_bias"] else set()
        return names

    def attention_block(self, h, p, positions, allowed):
        n, c = h.shape[0], self.cfg
        q, k, v = (self.lin(h, p + f"self_attn.{m}_proj") for m in "qkv")
        q, k, v = (t.view(n, -1, self.hd) for t in (q, k, v))            # per-head view for the q/k norms
        if c["qk_layernorm"]:
            q, k = self.rms(q, p + "self_attn.q_norm.weight"), self.rms(k, p + "self_attn.k_norm.weight")
        if c.get("clip_qkv") is not None:
            q, k, v = (t.clamp(-c["clip_qkv"], c["clip_qkv"]) for t in (q, k, v))
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        q, k = self.rope(q, positions), self.rope(k, positions)
        return self.lin(self.attend(q, k, v, allowed), p + "self_attn.o_proj")

    def mlp_block(self, h, i):
        p, c = f"model.layers.{i}.", self.cfg
        if c["moe_layer_freq"][i]:
            logits, bias = h @ self.w[p + "mlp.gate.weight"].T, self.w.get(p + "mlp.expert_bias")
            y = self.combine(h, i, p + "mlp.", [llada_moe_route(row, bias, k=c["num_experts_per_tok"]) for row in logits])
        else:
            y = self.swiglu(h, p + "mlp.")
        return y + self.swiglu(h, p + "shared_expert.") if c["shared_expert_intermediate_size"] is not None else y


# ---------------------------------------------------------------- decoders

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
        """docs/llada2-moe.md Q7: a block-causal cache adds one store forward per finished block, none
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
