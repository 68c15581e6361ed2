"""An independent, deliberately naive float64 transcription of the two MoE diffusion families and their
reference decoders, written for these tests from docs/specs/llada2-moe.md (H1: the checkpoint's own forward
and `generate`; D1's decode rule as a second rule) and docs/specs/llada-moe.md (M1 forward, M2: the model
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
    """LLaDA2.2's block routing (docs/specs/llada2-2.md §2), for a sequence at positions 0..n-1 (logits (n, E)):
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


# the decoders live in reference_moe_decode.py (this file: the naive forwards and routers)
from reference_moe_decode import Trace, greedy, llada2_generate, llada_moe_generate, most_confident  # noqa: E402,F401
