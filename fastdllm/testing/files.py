"""What every tiny writer shares: tensors into safetensors files as the published checkpoints lay
them out (one file, or shards with `model.safetensors.index.json`), JSON files as transformers
writes them, dtype names as config.json spells them, and the random weight makers."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

# torch dtype -> config.json's spelling (`torch_dtype` / `dtype`)
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
               torch.float64: "float64"}


def write_safetensors(out: Path, tensors: dict[str, torch.Tensor], shard_of: Callable[[str], int] | None = None,
                      *, total_parameters: bool = False) -> None:
    """`tensors` as written (dtype kept), into `out/model.safetensors` when `shard_of` is None, else
    into shards `model-0000i-of-0000N.safetensors` (i = shard_of(name), 1-based; N the largest i)
    with `model.safetensors.index.json`: weight_map in name order, metadata total_size (and
    total_parameters before it, where the family's published index has it)."""
    out = Path(out)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if shard_of is None:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    number = {k: shard_of(k) for k in tensors}
    n = max(number.values())
    files = {k: f"model-{i:05d}-of-{n:05d}.safetensors" for k, i in number.items()}
    for f in sorted(set(files.values())):
        save_file({k: v for k, v in tensors.items() if files[k] == f}, str(out / f), metadata={"format": "pt"})
    meta = {"total_size": sum(v.numel() * v.element_size() for v in tensors.values())}
    if total_parameters:
        meta = {"total_parameters": sum(v.numel() for v in tensors.values()), **meta}
    write_json(out / "model.safetensors.index.json", {"metadata": meta, "weight_map": dict(sorted(files.items()))})


def layer_shards(n_layers: int, n_shards: int, last: int | None = None) -> Callable[[str], int]:
    """The usual sharding: the embedding in shard 1, layer i in 1 + i * n_shards // n_layers, every
    other tensor (final norm, head) in `last` (default n_shards). One layer never spans shards."""
    def shard(name: str) -> int:
        if ".layers." in name:
            return 1 + int(name.split(".layers.")[1].split(".")[0]) * n_shards // n_layers
        return 1 if "embed" in name else (last or n_shards)
    return shard


def write_json(path: Path, obj, sort_keys: bool = False) -> None:
    """Indented by 2, UTF-8 as is (no \\u escapes), a final newline."""
    Path(path).write_text(json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=sort_keys) + "\n", encoding="utf-8")


def normal_makers(g: torch.Generator, std: float):
    """`mat(*shape)`: N(0, std^2) entries; `norm(n)`: an RMSNorm weight 1 + N(0, 0.1^2); both drawn from `g`."""
    def mat(*shape):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1.0 + 0.1 * torch.randn(n, generator=g)
    return mat, norm


def write_config(out: Path, published: dict, family: str, tiny: dict, overrides: dict, drop=(),
                 dtype: torch.dtype = torch.bfloat16) -> tuple[Path, dict]:
    """A tiny writer's config.json: the published keys at the tiny sizes, then `overrides` (each must
    be a published key), `dtype` named as config.json names it, the keys in `drop` removed.
    Returns (the created folder, the config)."""
    unknown = set(overrides) - set(published)
    if unknown:
        raise ValueError(f"not an {family} config key: {sorted(unknown)}")
    config = {**published, **tiny, **overrides}
    config["dtype"] = DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))     # float64 for exactness tests
    for key in drop:
        del config[key]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", config)
    return out, config
