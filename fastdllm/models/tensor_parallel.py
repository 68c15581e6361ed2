"""Tensor parallel (docs/specs/tensor-parallel.md): one rank's share of a family's model, Megatron's
layout. The family's own class is built on the meta device at the published shape; each sliced
linear then receives only this rank's rows or columns of the checkpoint (safetensors `get_slice`),
the blocks' head counts shrink to this rank's heads, the outputs of the column-split linears
(o_proj, down) are summed over the ranks, and the vocabulary head is split by rows (SplitHead).
The model code does not change.

A family is here when its table is (`LAYOUTS`, by model class): the split of each block linear, the
path of its vocabulary head, the config keys of its head, KV-head and MLP counts, and for an MoE
family where its experts live. Expert parallel: rank r holds experts [rE/N, (r+1)E/N) whole (the
others are `Elsewhere`), the router whole; the MoE layer's output is summed over the ranks."""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# how a weight splits (rows = output features, columns = input features)
HEADS, KV_HEADS, MLP = "heads", "kv_heads", "mlp"              # output rows of this rank's heads / MLP range
HEADS_IN, MLP_IN = "heads_in", "mlp_in"                        # input columns of the same; outputs summed


@dataclass(frozen=True)
class Layout:
    name: str                   # for messages
    linears: dict[str, str]     # a block linear's name inside its block -> its split
    heads: str                  # config keys: attention heads, KV heads, the MLP sizes split (None: absent)
    kv_heads: str
    mlp: tuple[str, ...]
    tied: str = "tie_word_embeddings"   # the config key saying the head is the input embedding
    experts: str | None = None          # an MoE block's expert list inside the block (its parent: the summed layer)
    expert_count: str | None = None     # the config key of the expert count


QWEN = {"self_attn.q_proj": HEADS, "self_attn.k_proj": KV_HEADS, "self_attn.v_proj": KV_HEADS,
        "self_attn.o_proj": HEADS_IN, "mlp.gate_proj": MLP, "mlp.up_proj": MLP, "mlp.down_proj": MLP_IN}
SHARED = {"shared_expert.gate_proj": MLP, "shared_expert.up_proj": MLP, "shared_expert.down_proj": MLP_IN}
# Qwen3's and LLaDA-MoE's per-head q_norm / k_norm stay whole on every rank (they read one head at a time)
LAYOUTS = {
    "LLaDAModelLM": Layout("LLaDA", {"q_proj": HEADS, "k_proj": KV_HEADS, "v_proj": KV_HEADS, "attn_out": HEADS_IN,
                                     "ff_proj": MLP, "up_proj": MLP, "ff_out": MLP_IN},
                           heads="n_heads", kv_heads="n_kv_heads",
                           mlp=("mlp_hidden_size",), tied="weight_tying"),
    "SDARForCausalLM": Layout("SDAR", QWEN, heads="num_attention_heads",
                              kv_heads="num_key_value_heads", mlp=("intermediate_size",)),
    "LLaDAMoEModelLM": Layout("LLaDA-MoE", QWEN | SHARED, heads="num_attention_heads",
                              kv_heads="num_key_value_heads",
                              mlp=("dense_intermediate_size", "shared_expert_intermediate_size"),
                              experts="mlp.experts", expert_count="num_experts"),
}


@dataclass(frozen=True)
class Ranks:
    """This process's place among `size` ranks; `group`: its torch.distributed process group (None: the default)."""
    rank: int
    size: int
    group: object = None

    def share(self, n: int) -> tuple[int, int]:
        """This rank's range of n things: [r n / N, (r + 1) n / N)."""
        return self.rank * n // self.size, (self.rank + 1) * n // self.size

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        dist.all_reduce(t, group=self.group)     # in place: sum
        return t

    def all_gather(self, t: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        """Every rank's t (..., sizes[r]) concatenated along the last dim, in rank order."""
        import torch.distributed as dist

        width = max(sizes)
        padded = F.pad(t, (0, width - t.shape[-1])).contiguous()
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(parts, padded, group=self.group)
        return torch.cat([p[..., :n] for p, n in zip(parts, sizes)], dim=-1)


def refusal(model_cls, config, size: int) -> str | None:
    """Why `size` ranks cannot split this family's model (one line), else None; read before loading."""
    layout = LAYOUTS.get(model_cls.__name__)
    if layout is None:
        return (f"--tp {size}: tensor parallel is built for {', '.join(l.name for l in LAYOUTS.values())} only; "
                f"{model_cls.__name__} is refused (docs/specs/tensor-parallel.md)")
    counts = ((layout.kv_heads, "KV heads"), (layout.heads, "attention heads"),
              *((key, "MLP size") for key in layout.mlp), (layout.expert_count, "experts"))
    for key, what in counts:
        n = getattr(config, key) if key else None
        if n is not None and n % size:
            return f"--tp {size}: {n} {what} ({key}) do not split over {size} ranks"
    return None


class SplitHead(nn.Module):
    """Rows [rV/N, (r+1)V/N) of the vocabulary head. Its output is every rank's rows gathered, (B, K, V),
    unless `local` is on (then this rank's (B, K, V/N); `rows_of` a step deciding from the split)."""

    def __init__(self, weight: torch.Tensor, ranks: Ranks, vocab: int):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)      # (V/N, d)
        self.ranks, self.vocab = ranks, vocab
        self.offset = ranks.share(vocab)[0]
        self.sizes = [b - a for a, b in (Ranks(r, ranks.size).share(vocab) for r in range(ranks.size))]
        self.local = False
        self.decisions = 0          # forwards decided from the split rows (decode/split_head.py)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        rows = F.linear(h, self.weight)                            # (B, K, V/N)
        return rows if self.local else self.ranks.all_gather(rows, self.sizes)

    def gather_numbers(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's t (B, K, c) -> (N, B, K, c), in rank order (the decision's few numbers per position)."""
        return self.ranks.all_gather(t, [t.shape[-1]] * self.ranks.size).unflatten(-1, (self.ranks.size, -1)) \
            .movedim(-2, 0)


def split_head(model) -> SplitHead | None:
    """The model's split vocabulary head under tensor parallel, else None."""
    head = model.output_head
    return head if isinstance(head, SplitHead) else None


@contextmanager
def local_rows(head: SplitHead):
    """The head gives this rank's rows only, for one forward."""
    head.local, head.decisions = True, head.decisions + 1
    try:
        yield
    finally:
        head.local = False


class Elsewhere(nn.Module):
    """An expert another rank holds: it adds nothing here (that rank's share of the sum has it)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(x.shape)


def build(model_cls, config) -> nn.Module:
    """The family's model at the published shape, on the meta device (no memory). Our modules compute
    attention themselves: a config's attn_implementation (SDAR's name flex_attention) is not transformers'."""
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = model_cls(config)
    return model


def shard(model: nn.Module, config, tensors, ranks: Ranks, dtype: torch.dtype, device: torch.device) -> None:
    """Fill the meta model with this rank's slices. `tensors`: name -> a safetensors slice (get_slice),
    for every checkpoint tensor. Block linears split by the table; their head counts shrink; the
    column-split ones sum over the ranks; experts held elsewhere leave; the vocabulary head becomes a
    SplitHead."""
    layout = LAYOUTS[type(model).__name__]
    heads, kv_heads = getattr(config, layout.heads), getattr(config, layout.kv_heads)
    ranges = {HEADS: _scaled(ranks.share(heads), model.head_dim), KV_HEADS: _scaled(ranks.share(kv_heads), model.head_dim)}
    ranges[HEADS_IN] = ranges[HEADS]
    if layout.experts:
        _place_experts(model, layout.experts, ranks)
    half = dtype in (torch.bfloat16, torch.float16)        # transformers keeps these in fp32 under a half dtype
    keep32 = (model._keep_in_fp32_modules_strict or ()) if half else ()      # transformers declares it (None)
    pattern = re.compile(r"\.\d+\.(" + "|".join(map(re.escape, layout.linears)) + r")$")     # blocks.N.<name>
    head_path = model.head_name                     # the vocabulary head (made here when the family ties it)
    for name, module in list(model.named_modules()):
        if name == head_path:
            continue
        split = (m := pattern.search(name)) and layout.linears[m.group(1)]
        for pname, _ in list(module.named_parameters(recurse=False)):
            full = f"{name}.{pname}" if name else pname
            if full not in tensors:
                raise ValueError(f"tensor parallel: {full} is not in the checkpoint")
            t = _read(tensors[full], split if pname == "weight" or split in (HEADS, KV_HEADS, MLP) else None,
                      ranges, ranks)
            if split in (HEADS_IN, MLP_IN) and pname == "bias" and ranks.rank:
                t = torch.zeros_like(t)                     # a summed output's bias is added once (rank 0)
            setattr(module, pname, nn.Parameter(t.to(device=device, dtype=dtype), requires_grad=False))
        for bname, _ in list(module.named_buffers(recurse=False)):      # whole (LLaDA-MoE's expert_bias)
            full = f"{name}.{bname}" if name else bname
            if full in tensors:
                wanted = torch.float32 if any(k in full for k in keep32) else dtype
                setattr(module, bname, tensors[full][:].to(device=device, dtype=wanted))
        if split in (HEADS_IN, MLP_IN):
            module.register_forward_hook(lambda _m, _args, out: ranks.all_reduce(out))
    for block in model.blocks:
        block.n_heads, block.n_kv_heads = heads // ranks.size, kv_heads // ranks.size
    model.n_heads, model.n_kv_heads = heads // ranks.size, kv_heads // ranks.size
    _split_head(model, layout, config, tensors, ranks, dtype, device)
    model.cuda_graphs = False              # first version: eager (graphs.py; the device step comes with them)
    left = [n for n, p in model.named_parameters() if p.is_meta] + [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise ValueError(f"tensor parallel: {', '.join(left[:3])} not loaded")


def _split_head(model, layout: Layout, config, tensors, ranks: Ranks, dtype, device) -> None:
    name = model.head_name + ".weight"
    if getattr(config, layout.tied, False) or name not in tensors:     # tied: the embedding's rows
        name = next(n for n, p in model.named_parameters() if p is model.embed.weight)
    vocab = tensors[name].get_shape()[0]
    rows = tensors[name][slice(*ranks.share(vocab))].to(device=device, dtype=dtype)
    model.set_output_head(SplitHead(rows, ranks, vocab))


def _scaled(r: tuple[int, int], k: int) -> tuple[int, int]:
    return r[0] * k, r[1] * k


def _place_experts(model, path: str, ranks: Ranks) -> None:
    """In every MoE block, experts outside this rank's range leave (Elsewhere); the layer holding them sums."""
    for block in model.blocks:
        try:
            experts = block.get_submodule(path)
        except AttributeError:                                  # a dense layer (moe_layer_freq 0)
            continue
        a, b = ranks.share(len(experts))
        for j in [*range(a), *range(b, len(experts))]:
            experts[j] = Elsewhere()
        block.get_submodule(path.rpartition(".")[0]).register_forward_hook(lambda _m, _a, out: ranks.all_reduce(out))


def _read(tensor_slice, split: str | None, ranges: dict, ranks: Ranks) -> torch.Tensor:
    """This rank's part of one checkpoint tensor: rows or columns of its range, or all of it. An MLP's
    range is this rank's share of the tensor's own size (gate/up rows, down columns: the same sizes)."""
    if split == MLP:
        return tensor_slice[slice(*ranks.share(tensor_slice.get_shape()[0]))]
    if split == MLP_IN:
        return tensor_slice[:, slice(*ranks.share(tensor_slice.get_shape()[1]))]
    if split in (HEADS, KV_HEADS):
        return tensor_slice[slice(*ranges[split])]
    if split == HEADS_IN:
        return tensor_slice[:, slice(*ranges[split])]
    return tensor_slice[:]
