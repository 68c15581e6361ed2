"""An independent, deliberately naive float64 transcription of SDAR-30B-A3B's forward, written for
these tests from docs/specs/sdar-moe.md: dense SDAR's Qwen3 decoder (tests/references/reference_blockdiff.py's
NaiveQwen: heads looped, keys cached after RoPE, block-causal masks given by the caller) with every
MLP replaced by Qwen3-MoE's where the layer is sparse. Decoding is dense SDAR's, unchanged:
reference_blockdiff.sdar_generate runs on this model as it runs on the dense one.

The MoE, token by token: router logits = h @ gate.T over all E experts, softmax, the k largest
(highest probability first, lowest expert id on ties: torch.topk leaves tie order unspecified),
divided by their sum when `norm_topk_prob`; then every expert runs on every token and the outputs are
combined with a dense (tokens, experts) weight matrix that is zero where an expert was not chosen.
A layer is sparse unless it is in `mlp_only_layers` or (layer + 1) is not a multiple of
`decoder_sparse_step`. Shares no code with fastdllm; reads config.json and the shards by tensor name,
asserting the exact set of names docs/specs/sdar-moe.md §2 lists."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from reference_blockdiff import NaiveQwen


@dataclass
class Route:
    layer: int
    experts: list        # per token: the k expert ids, in choice order
    weights: list        # per token: their weights (renormalised when norm_topk_prob)


class NaiveSDARMoE(NaiveQwen):
    def __init__(self, path):
        super().__init__(path)
        c = self.cfg
        self.E, self.k, self.renorm = c["num_experts"], c["num_experts_per_tok"], bool(c.get("norm_topk_prob"))
        dense = set(c.get("mlp_only_layers") or [])
        step = c.get("decoder_sparse_step", 1)
        self.sparse = [i not in dense and self.E > 0 and (i + 1) % step == 0 for i in range(self.n_layers)]
        assert set(self.w) == self.expected_names()
        self.routes = []              # the last forward's decisions: one Route per sparse layer, in order

    def expected_names(self):
        names = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
        for i in range(self.n_layers):
            p = f"model.layers.{i}."
            names |= {p + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                      "self_attn.q_norm.weight", "self_attn.k_norm.weight")}
            names |= {p + f"self_attn.{n}_proj.weight" for n in "qkvo"}
            mlps = [f"mlp.experts.{j}." for j in range(self.E)] if self.sparse[i] else ["mlp."]
            names |= {p + m + f"{n}_proj.weight" for m in mlps for n in ("gate", "up", "down")}
            names |= {p + "mlp.gate.weight"} if self.sparse[i] else set()
        return names

    def forward(self, *args, **kwargs):
        self.routes = []
        return super().forward(*args, **kwargs)

    def route(self, logits):
        """One token's router: logits (E,) -> (expert ids in choice order, weights)."""
        p = torch.softmax(logits, -1)
        idx = sorted(range(self.E), key=lambda j: (-float(p[j]), j))[:self.k]
        w = [float(p[j]) for j in idx]
        if self.renorm:
            total = sum(w)
            w = [x / total for x in w]
        return idx, w

    def mlp(self, h, layer):
        if not self.sparse[layer]:
            return super().mlp(h, layer)
        p = f"model.layers.{layer}.mlp."
        logits = h @ self.w[p + "gate.weight"].T                      # (n, E)
        combine = torch.zeros(len(h), self.E, dtype=torch.float64)    # (n, E): 0 where not chosen
        route = Route(layer, [], [])
        for t in range(len(h)):
            idx, w = self.route(logits[t])
            route.experts.append(idx)
            route.weights.append(w)
            for j, x in zip(idx, w):
                combine[t, j] = x
        self.routes.append(route)
        out = torch.zeros_like(h)
        for j in range(self.E):                                       # every expert on every token
            e = f"{p}experts.{j}."
            y = self.lin(torch.nn.functional.silu(self.lin(h, e + "gate_proj")) * self.lin(h, e + "up_proj"),
                         e + "down_proj")
            out = out + combine[:, j:j + 1] * y
        return out
