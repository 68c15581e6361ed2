"""The mixture-of-experts layer shared by LLaDA2.x (`llada2_moe`), LLaDA-MoE (`llada` +
`LLaDAMoEModelLM`) and SDAR-30B-A3B (`sdar_moe`, Qwen3-MoE's MLP): a router that picks k of E
SwiGLU experts per token, the chosen experts' outputs weighted and summed, optionally plus
always-on shared experts.

The router variants are data (`Routing`) plus one small function each (`ROUTERS`); the expert
computation is one function for both: the (token, slot) choices are sorted by expert, each expert
that received tokens runs once on its contiguous segment (a loop over experts, never over tokens,
never a dense evaluation of all E), and the weighted outputs are scattered back with one index_add.

Every expert keeps its own `gate_proj` / `up_proj` / `down_proj` nn.Linear under the published
tensor names, so bitsandbytes quantizes them and accelerate places them with their layer. The
router matrix is a plain parameter, not an nn.Linear: bitsandbytes leaves it alone (it is small and
decides everything). Its matmul runs at fp32 or better, as the LLaDA references do, or in the
activations' dtype where the family's authors do so (Qwen3-MoE: `Routing.model_dtype_logits`); the
softmax / sigmoid and everything after it always at fp32 or better."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .layers import at_least_fp32, fuse_linears, swiglu


@dataclass(frozen=True)
class Routing:
    """What a family's router does with the router logits; `score` names the ROUTERS entry."""
    score: str                       # "sigmoid_grouped" (LLaDA2) | "softmax" (LLaDA-MoE, OLMoE-style;
                                     # Qwen3-MoE without norm_topk_prob) | "softmax_renorm" (Qwen3-MoE)
    experts: int                     # E
    top_k: int                       # k = num_experts_per_tok
    groups: int = 1                  # sigmoid_grouped: n_group (E/groups experts each)
    top_groups: int = 1              # sigmoid_grouped: topk_group (groups a token may choose from)
    scale: float = 1.0               # routed_scaling_factor
    model_dtype_logits: bool = False   # router matmul in the activations' dtype (bf16 logits, Qwen3-MoE)
    capacity: int | None = None      # sigmoid_grouped: LLaDA2.2's block routing (config expert_capacity):
                                     # each routing block keeps this many experts (docs/specs/llada2-2.md §2)

    def problems(self) -> list[str]:
        """Why this routing cannot work (empty when it can): the checks the references skip."""
        found = []
        if not 0 < self.top_k <= self.experts:
            found.append(f"num_experts_per_tok {self.top_k} is not in 1..num_experts ({self.experts})")
        if self.score == "sigmoid_grouped":
            per_group = self.experts // self.groups if self.groups > 0 else 0
            if self.groups <= 0 or self.experts % self.groups or per_group < 2:
                found.append(f"num_experts {self.experts} does not split into n_group {self.groups} groups of 2 or more")
            elif not 0 < self.top_groups <= self.groups:
                found.append(f"topk_group {self.top_groups} is not in 1..n_group ({self.groups})")
            elif self.top_k > self.top_groups * per_group and self.capacity is None:
                found.append(f"num_experts_per_tok {self.top_k} exceeds the {self.top_groups * per_group} experts "
                             f"of topk_group {self.top_groups} groups")
        if self.capacity is not None and not self.top_k <= self.capacity <= self.experts:
            found.append(f"expert_capacity {self.capacity} is not in num_experts_per_tok..num_experts "
                         f"({self.top_k}..{self.experts})")
        return found


def sigmoid_grouped_topk(logits: torch.Tensor, bias: torch.Tensor | None, r: Routing):
    """LLaDA2 (docs/specs/llada2-moe.md §5): sigmoid scores; the bias only chooses; a token picks its
    `top_groups` best groups (a group's score: the sum of its two best biased scores), then its k best
    experts inside them; weights are the unbiased scores, normalised (k > 1) and scaled."""
    scores = logits.sigmoid()                                             # (N, E) unbiased
    biased = scores if bias is None else scores + bias
    N = biased.shape[0]
    grouped = biased.view(N, r.groups, r.experts // r.groups)             # (N, G, E/G)
    group_score = grouped.topk(2, dim=-1).values.sum(-1)                  # (N, G)
    kept = group_score.topk(r.top_groups, dim=-1, sorted=False).indices   # (N, top_groups)
    allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, kept, True)
    candidates = grouped.masked_fill(~allowed[..., None], float("-inf")).view(N, r.experts)
    experts = candidates.topk(r.top_k, dim=-1).indices                    # (N, k) best biased first
    weights = scores.gather(1, experts)
    if r.top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * r.scale, experts


def block_capacity_topk(logits: torch.Tensor, bias: torch.Tensor | None, r: Routing, blocks: torch.Tensor):
    """LLaDA2.2's block routing (docs/specs/llada2-2.md §2): tokens with equal `blocks` id (N,) form one
    routing block; an expert's block score is the max over the block's tokens of its biased score;
    the block keeps its `capacity` best experts; each token takes its k best biased scores among
    them (no group limiting); weights as sigmoid_grouped. Returns weights, experts (N, k) and the
    block ids with their kept experts (G,), (G, capacity), best first."""
    scores = logits.sigmoid()                                             # (N, E) unbiased
    biased = scores if bias is None else scores + bias
    ids, block_of = blocks.unique(return_inverse=True)                    # (G,), (N,)
    best = biased.new_full((len(ids), r.experts), float("-inf"))
    best.scatter_reduce_(0, block_of[:, None].expand_as(biased), biased, "amax")   # (G, E) block scores
    kept = best.topk(r.capacity, dim=-1).indices                          # (G, C)
    allowed = torch.zeros_like(best, dtype=torch.bool).scatter_(1, kept, True)
    experts = biased.masked_fill(~allowed[block_of], float("-inf")).topk(r.top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if r.top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * r.scale, experts, (ids, kept)


def softmax_topk(logits: torch.Tensor, bias: torch.Tensor | None, r: Routing):
    """LLaDA-MoE (docs/specs/llada-moe.md §4): softmax over all experts, plus the bias if any (it moves
    the weights too), the k largest as they are: no renormalisation, no scaling, no groups."""
    probs = logits.softmax(-1)                                            # (N, E)
    if bias is not None:
        probs = probs + bias
    return probs.topk(r.top_k, dim=-1)                                    # weights, experts (N, k)


def softmax_topk_renorm(logits: torch.Tensor, bias: torch.Tensor | None, r: Routing):
    """Qwen3-MoE with `norm_topk_prob` (SDAR-30B-A3B, docs/specs/sdar-moe.md §4): softmax over all experts,
    the k largest, divided by their sum (no epsilon, as the authors), so a token's weights add up to 1."""
    weights, experts = softmax_topk(logits, bias, r)                      # (N, k) each
    return weights / weights.sum(-1, keepdim=True), experts


ROUTERS = {"sigmoid_grouped": sigmoid_grouped_topk, "softmax": softmax_topk, "softmax_renorm": softmax_topk_renorm}


class Router(nn.Module):
    """`gate.weight` (E, d), and for LLaDA2 `gate.expert_bias` (E). forward(x (N, d), bias, blocks) ->
    (weights (N, k) at fp32 or better, experts (N, k)); a forward hook on it sees every decision.
    With block routing (`routing.capacity`) `blocks` (N,) names each token's routing block, and
    `kept` holds the last forward's block ids and their kept experts (docs/specs/llada2-2.md §2)."""

    def __init__(self, d: int, routing: Routing, expert_bias: bool = False):
        super().__init__()
        self.routing = routing
        self.kept: tuple[torch.Tensor, torch.Tensor] | None = None
        self.weight = nn.Parameter(torch.empty(routing.experts, d))
        self.holds_bias = expert_bias              # the buffer exists only where the checkpoint has the tensor
        if expert_bias:
            self.register_buffer("expert_bias", torch.zeros(routing.experts))

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None, blocks: torch.Tensor | None = None):
        dtype = at_least_fp32(x.dtype)
        if self.routing.model_dtype_logits:                                # rounded to x's dtype, then widened
            logits = F.linear(x, self.weight.to(x.dtype)).to(dtype)        # (N, E)
        else:
            logits = F.linear(x.to(dtype), self.weight.to(dtype))          # (N, E)
        bias = self.expert_bias if self.holds_bias else bias
        bias = None if bias is None else bias.to(dtype)
        if self.routing.capacity is not None:
            if blocks is None:
                raise ValueError("block routing needs each token's routing block")
            weights, experts, self.kept = block_capacity_topk(logits, bias, self.routing, blocks.to(logits.device))
            return weights, experts
        return ROUTERS[self.routing.score](logits, bias, self.routing)


class SwiGLU(nn.Module):
    """An expert, a shared expert or a dense MLP: down(silu(gate(x)) * up(x)), no bias."""

    def __init__(self, d: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def fuse(self) -> None:
        fuse_linears(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_proj, self.up_proj, self.down_proj)


def run_experts(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, experts: nn.ModuleList) -> torch.Tensor:
    """x (N, d), weights and chosen (N, k) -> sum over slots of weight * expert(x), (N, d) in the
    weights' dtype (fp32 or better). The N*k (token, slot) pairs are sorted by expert; each expert
    with tokens runs once on its contiguous segment; one index_add puts the results back."""
    N, k = chosen.shape
    flat = chosen.reshape(-1)                                             # (N*k,) expert of each pair
    order = flat.argsort(stable=True)                                     # pairs grouped by expert
    counts = torch.bincount(flat, minlength=len(experts)).tolist()        # the one host sync
    token = order // k                                                    # (N*k,) token of each sorted pair
    inputs = x[token]                                                     # (N*k, d) grouped by expert
    outputs, start = [], 0
    for expert, n in enumerate(counts):
        if n:
            outputs.append(experts[expert](inputs[start:start + n]))
            start += n
    total = x.new_zeros(x.shape, dtype=weights.dtype)
    if outputs:
        weighted = torch.cat(outputs).to(weights.dtype) * weights.reshape(-1)[order, None]
        total.index_add_(0, token, weighted)
    return total


class SparseMoE(nn.Module):
    """Routed experts under `mlp.gate` / `mlp.experts.{j}`, plus the shared experts where the
    family keeps them under `mlp` (LLaDA2's `shared_experts`; LLaDA-MoE keeps its on the layer).
    The weighted sum is accumulated at fp32 or better and cast back to the model dtype (LLaDA2's
    order; LLaDA-MoE's bf16 accumulation differs only by rounding), then the shared output added."""

    def __init__(self, d: int, inner: int, routing: Routing, *, expert_bias: str | None = None,
                 shared: int | None = None):
        """expert_bias: where the checkpoint keeps the router's bias, `gate.expert_bias` ("gate",
        LLaDA2) or `expert_bias` ("mlp", LLaDA-MoE), or None. shared: the shared experts' width."""
        super().__init__()
        self.gate = Router(d, routing, expert_bias=expert_bias == "gate")
        self.experts = nn.ModuleList(SwiGLU(d, inner) for _ in range(routing.experts))
        self.holds_bias = expert_bias == "mlp"     # the buffer exists only where the checkpoint has the tensor
        if self.holds_bias:
            self.register_buffer("expert_bias", torch.zeros(routing.experts))
        self.shared_experts = SwiGLU(d, shared) if shared else None

    def fuse(self) -> None:
        for module in self.modules():
            if isinstance(module, SwiGLU):
                module.fuse()

    def forward(self, x: torch.Tensor, blocks: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, S, d); blocks (B, S): each token's routing block (block routing only)."""
        flat = x.reshape(-1, x.shape[-1])                                 # (N, d)
        weights, chosen = self.gate(flat, self.expert_bias if self.holds_bias else None,
                                    None if blocks is None else blocks.reshape(-1))
        y = run_experts(flat, weights, chosen, self.experts).to(x.dtype).view_as(x)
        if self.shared_experts is not None:
            y = y + self.shared_experts(x)
        return y
