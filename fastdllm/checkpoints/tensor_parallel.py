"""Loading one tensor-parallel rank's share of a checkpoint (docs/specs/tensor-parallel.md): what is
refused, by name and before any weight is read, then the family's model at its published shape on
the meta device, filled with this rank's slices read by safetensors' `get_slice` (no rank reads a
whole file). The tokenizer, special ids and the LoadedModel are those of a whole-model load."""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path

import torch

from ..errors import UsageError, UserError
from ..models.tensor_parallel import Ranks, build, refusal, shard
from .family import family_of, read_config
from .gguf_folder import source_of
from .loading import LoadedModel, _check_weights, describe
from .placement import placement_error, torch_placement
from .specials import load_tokenizer, special_tokens
from .thinking import thought_markers


def refuse(tp: int, *, quantize: str = "none", device_map: str | None = None, max_memory: str | None = None) -> None:
    """The flags --tp does not combine with (UsageError, one line), before anything is loaded."""
    if tp < 1:
        raise UsageError(f"--tp {tp}: give at least 1")
    if quantize != "none":
        raise UsageError(f"--tp {tp} with --quantize {quantize}: the packed rows of quantized weights are not sliced "
                         "yet (first version: unquantized weights)")
    if device_map or max_memory:
        raise UsageError(f"--tp {tp} with --device-map / --max-memory: each rank holds its slices on its own device; "
                         "give one or the other")


def load(path: str | Path, ranks: Ranks, *, dtype: str = "auto", device: str = "cpu") -> LoadedModel:
    """This rank's share of the checkpoint at `path` as a LoadedModel; `device`: this rank's own (cpu, cuda:R)."""
    start = time.perf_counter()
    for key, value in {"dtype": dtype, "device": device}.items():
        if problem := placement_error(key, value):
            raise UsageError(problem)
    path = Path(path).expanduser()
    raw = read_config(path)
    config, model_cls, notes = family_of(raw, path)
    if source_of(path) is not None:
        raise UserError(f"--tp {ranks.size}: a GGUF file loads whole on one device (tensor parallel reads safetensors)")
    if problem := refusal(model_cls, config, ranks.size):
        raise UserError(problem)
    _check_weights(path)
    torch_dtype = torch_placement(dtype, device)[0]
    tokenizer = load_tokenizer(path)
    from safetensors import SafetensorError, safe_open

    try:
        model = build(model_cls, config)
        with ExitStack() as files:
            tensors = {}
            for file in _weight_files(path):
                f = files.enter_context(safe_open(str(file), framework="pt", device="cpu"))
                tensors.update({name: f.get_slice(name) for name in f.keys()})
            shard(model, config, tensors, ranks, torch_dtype, torch.device(device))
        model.eval().prepare_for_inference(pack=False)
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as e:
        raise UserError(f"cannot load weights from {path}: {str(e).splitlines()[0]}") from e
    specials = special_tokens(raw, tokenizer, path, model_cls)
    loaded = LoadedModel(model, tokenizer, path, raw["model_type"], specials, config.max_position_embeddings,
                         torch_dtype, "none", time.perf_counter() - start, thought=thought_markers(tokenizer),
                         notes=notes)
    model.parameters_before_quantization = sum(p.numel() for p in model.parameters())
    loaded.info = describe(loaded) | {"tensor_parallel": {"rank": ranks.rank, "ranks": ranks.size}}
    return loaded


def _weight_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        return [path / "model.safetensors"]
    return [path / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
