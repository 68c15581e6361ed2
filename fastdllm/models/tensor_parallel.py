"""Tensor parallel (docs/specs/tensor-parallel.md): one rank's share of a family's model, Megatron's
layout. The family's own class is built on the meta device at the published shape; each sliced
linear then receives only this rank's rows or columns of the checkpoint (safetensors `get_slice`),
the blocks' head counts shrink to this rank's heads, the outputs of the column-split linears
(o_proj, down) are summed over the ranks, and the vocabulary head is split by rows (SplitHead).
The model code does not change.

A family is here when its table is: the split of each block linear, the path of its vocabulary head
and the config keys of its head, KV-head and MLP counts."""

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
    linears: dict[str, str]     # a block linear's name inside its block -> its split
    head: str                   # the vocabulary head's module path (made when the family ties it)
    heads: str                  # config keys: attention heads, KV heads, MLP hidden size
    kv_heads: str
    mlp: str
    tied: str = "weight_tying"  # the config key saying the head is the input embedding


QWEN = {"self_attn.q_proj": HEADS, "self_attn.k_proj": KV_HEADS, "self_attn.v_proj": KV_HEADS,
        "self_attn.o_proj": HEADS_IN, "mlp.gate_proj": MLP, "mlp.up_proj": MLP, "mlp.down_proj": MLP_IN}
LAYOUTS = {
    "llada": Layout({"q_proj": HEADS, "k_proj": KV_HEADS, "v_proj": KV_HEADS, "attn_out": HEADS_IN,
                     "ff_proj": MLP, "up_proj": MLP, "ff_out": MLP_IN},
                    head="model.transformer.ff_out", heads="n_heads", kv_heads="n_kv_heads", mlp="mlp_hidden_size"),
    # Qwen3's per-head q_norm / k_norm stay whole on every rank (they read one head at a time)
    "sdar": Layout(QWEN, head="lm_head", heads="num_attention_heads", kv_heads="num_key_value_heads",
                   mlp="intermediate_size", tied="tie_word_embeddings"),
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


def refusal(model_type: str, config, size: int) -> str | None:
    """Why `size` ranks cannot split this family's model (one line), else None; read before loading."""
    layout = LAYOUTS.get(model_type)
    if layout is None:
        return (f"--tp {size}: tensor parallel is built for {', '.join(sorted(LAYOUTS))} only; "
                f"{model_type} is refused (docs/specs/tensor-parallel.md)")
    for key, what in ((layout.kv_heads, "KV heads"), (layout.heads, "attention heads"), (layout.mlp, "MLP size")):
        n = getattr(config, key)
        if n % size:
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
    head = getattr(model, "output_head", None)
    return head if isinstance(head, SplitHead) else None


@contextmanager
def local_rows(head: SplitHead):
    """The head gives this rank's rows only, for one forward."""
    head.local, head.decisions = True, head.decisions + 1
    try:
        yield
    finally:
        head.local = False


def build(model_cls, config, model_type: str) -> nn.Module:
    """The family's model at the published shape, on the meta device (no memory). Our modules compute
    attention themselves: a config's attn_implementation (SDAR's name flex_attention) is not transformers'."""
    config._attn_implementation = "eager"
    with torch.device("meta"):
        model = model_cls(config)
    return model


def shard(model: nn.Module, model_type: str, config, tensors, ranks: Ranks, dtype: torch.dtype,
          device: torch.device) -> None:
    """Fill the meta model with this rank's slices. `tensors`: name -> a safetensors slice (get_slice),
    for every checkpoint tensor. Block linears split by the table; their head counts shrink; the
    column-split ones sum over the ranks; the vocabulary head becomes a SplitHead."""
    layout = LAYOUTS[model_type]
    heads, kv_heads, mlp = (getattr(config, k) for k in (layout.heads, layout.kv_heads, layout.mlp))
    head_dim = model.head_dim
    ranges = {HEADS: _scaled(ranks.share(heads), head_dim), KV_HEADS: _scaled(ranks.share(kv_heads), head_dim),
              MLP: ranks.share(mlp)}
    ranges[HEADS_IN], ranges[MLP_IN] = ranges[HEADS], ranges[MLP]
    pattern = re.compile(r"\.\d+\.(" + "|".join(map(re.escape, layout.linears)) + r")$")     # blocks.N.<name>
    head_path = layout.head
    for name, module in list(model.named_modules()):
        if name == head_path:
            continue
        split = (m := pattern.search(name)) and layout.linears[m.group(1)]
        for pname, _ in list(module.named_parameters(recurse=False)):
            full = f"{name}.{pname}" if name else pname
            if full not in tensors:
                raise ValueError(f"tensor parallel: {full} is not in the checkpoint")
            t = _read(tensors[full], split if pname == "weight" or split in (HEADS, KV_HEADS, MLP) else None,
                      ranges.get(split))
            if split in (HEADS_IN, MLP_IN) and pname == "bias" and ranks.rank:
                t = torch.zeros_like(t)                     # a summed output's bias is added once (rank 0)
            setattr(module, pname, nn.Parameter(t.to(device=device, dtype=dtype), requires_grad=False))
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
    parent_path, _, attr = layout.head.rpartition(".")
    parent = model.get_submodule(parent_path)
    name = layout.head + ".weight"
    if getattr(config, layout.tied, False) or name not in tensors:     # tied: the embedding's rows
        name = next(n for n, p in model.named_parameters() if p is model.embed.weight)
    vocab = tensors[name].get_shape()[0]
    rows = tensors[name][slice(*ranks.share(vocab))].to(device=device, dtype=dtype)
    setattr(parent, attr, SplitHead(rows, ranks, vocab))


def _scaled(r: tuple[int, int], k: int) -> tuple[int, int]:
    return r[0] * k, r[1] * k


def _read(tensor_slice, split: str | None, rng: tuple[int, int] | None) -> torch.Tensor:
    """This rank's part of one checkpoint tensor: rows or columns of `rng`, or all of it."""
    if split in (HEADS, KV_HEADS, MLP):
        return tensor_slice[rng[0]:rng[1]]
    if split in (HEADS_IN, MLP_IN):
        return tensor_slice[:, rng[0]:rng[1]]
    return tensor_slice[:]
