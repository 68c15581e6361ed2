"""The models on this machine: the built-in one, the Hugging Face cache and a models folder
(--models-dir, FASTDLLM_MODELS), each with its name, family, size on disk, quantization and when
it was last used; and removing one of them (its files only). No torch, no network."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError, UserError
from . import catalog
from .builtin import builtin_models
from .locate import hub_settings, is_complete


@dataclass(frozen=True)
class LocalModel:
    name: str              # the catalog's short name, else the hub id, else the folder's name
    where: str             # "built-in", "hf-cache" or "models-dir"
    path: Path             # the snapshot (or folder) a command loads
    family: str
    size_bytes: int
    quantization: str
    last_used: float       # seconds since the epoch
    hub: str | None = None
    remove_root: Path | None = None   # what `rm` deletes: the cache's repo folder, or the model folder


def models_dir(given: str | Path | None = None) -> Path | None:
    value = given or os.environ.get("FASTDLLM_MODELS")
    return Path(value).expanduser() if value else None


def local_models(models_folder: str | Path | None = None) -> list[LocalModel]:
    found = []
    for builtin in builtin_models():
        found.append(_describe(builtin, "built-in", name=builtin.name, remove_root=None))
    found.extend(_hf_cache())
    folder = models_dir(models_folder)
    if folder is not None and folder.is_dir():
        for child in sorted(folder.iterdir()):
            if (child / "config.json").is_file():
                found.append(_describe(child, "models-dir", name=child.name, remove_root=child))
    return found


def find_local(name: str, models_folder: str | Path | None = None) -> LocalModel:
    """The local model a name means: short name, hub id or folder name (case-insensitive)."""
    entry = catalog.lookup(name)
    wanted = {name.lower()} | ({entry.name.lower(), entry.hub.lower()} if entry else set())
    for model in local_models(models_folder):
        if {model.name.lower(), (model.hub or "").lower()} & wanted:
            return model
    raise UserError(f"no local model '{name}' (`fastdllm list` shows what is here)")


def remove(model: LocalModel) -> int:
    """Delete the model's own files; returns the bytes freed."""
    if model.remove_root is None:
        raise UsageError(f"{model.name} is the built-in model; it is part of the installed package")
    shutil.rmtree(model.remove_root)
    return model.size_bytes


def _hf_cache() -> list[LocalModel]:
    try:
        from huggingface_hub import scan_cache_dir

        cache = scan_cache_dir(hub_settings().get("cache_dir"))
    except Exception:        # no cache yet (CacheNotFound), or no huggingface_hub: nothing there
        return []
    found = []
    for repo in cache.repos:
        if repo.repo_type != "model":
            continue
        for revision in sorted(repo.revisions, key=lambda r: r.last_modified, reverse=True)[:1]:
            if not is_complete(revision.snapshot_path):
                continue                  # not a checkpoint (a tokenizer), or a download still to resume
            entry = catalog.lookup(repo.repo_id)
            found.append(_describe(revision.snapshot_path, "hf-cache", name=entry.name if entry else repo.repo_id,
                                   hub=repo.repo_id, remove_root=repo.repo_path, size=repo.size_on_disk,
                                   last_used=repo.last_accessed))
    return found


def _describe(path: Path, where: str, *, name: str, remove_root: Path | None, hub: str | None = None,
              size: int | None = None, last_used: float | None = None) -> LocalModel:
    config = _config(path)
    return LocalModel(name=name, where=where, path=path, family=str(config.get("model_type", "?")),
                      size_bytes=size if size is not None else _folder_bytes(path),
                      quantization=quantization_of(config),
                      last_used=last_used if last_used is not None else _last_used(path),
                      hub=hub, remove_root=remove_root)


def quantization_of(config: dict) -> str:
    """How the weights on disk are stored: a quantization_config's method and bits, else the dtype."""
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        method = quant.get("quant_method", "quantized")
        bits = quant.get("bits") or (4 if quant.get("load_in_4bit") else 8 if quant.get("load_in_8bit") else None)
        return f"{method} {bits}-bit" if bits else str(method)
    dtype = config.get("torch_dtype") or config.get("dtype") or config.get("text_config", {}).get("dtype")
    return {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(dtype, dtype or "?")


def _config(path: Path) -> dict:
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _folder_bytes(path: Path) -> int:
    # a snapshot's files are links to blobs: count what they point at, once
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _last_used(path: Path) -> float:
    return max((f.stat().st_atime for f in path.iterdir() if f.is_file()), default=path.stat().st_mtime)
