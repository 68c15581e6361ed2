"""The models on this machine: the built-in one, the Hugging Face cache and a models folder
(--models-dir, FASTDLLM_MODELS), each with its name, family, size on disk, quantization and when
it was last used; and removing one of them (its files only). A GGUF file is a model of its own,
named `NAME:TAG` with its quant tag and its real size. No torch, no network."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError, UserError
from . import catalog
from .builtin import builtin_models
from .gguf_repo import cached_choices, local_choices
from .gguf_tags import architecture, choices
from .locate import hub_settings, is_complete

GGUF_FAMILIES = {"llada": "llada", "dream": "Dream", "rnd1": "rnd1", "llada-moe": "llada"}   # what gguf_arch.ARCHS reads each as


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
            elif child.is_file() and child.suffix.lower() == ".gguf":
                found.extend(_ggufs(folder, choices([(child.name, child.stat().st_size)]), "models-dir", child.name))
            elif child.is_dir():                  # a folder of GGUF files: `-m DIR:TAG` names each
                found.extend(_ggufs(child, local_choices(child), "models-dir", child.name))
    return found


def find_local(name: str, models_folder: str | Path | None = None) -> LocalModel:
    """The local model a name means: short name, hub id or folder name (case-insensitive)."""
    entry = catalog.lookup(name)
    wanted = {name.lower()} | ({entry.name.lower(), entry.hub.lower()} if entry else set())
    if entry is not None and entry.gguf and name.lower() not in (entry.name.lower(), entry.hub.lower()):
        tag = name.rpartition(":")[2]                     # ORG/X-GGUF:Q4_K_M is the entry's NAME:Q4_K_M
        wanted = {name.lower(), f"{entry.name}:{tag}".lower(), f"{entry.hub}:{tag}".lower()}
    models = local_models(models_folder)
    for model in models:
        gguf = model.quantization.startswith("GGUF")    # one file of a repo: by its own name only
        if ({model.name.lower()} | (set() if gguf else {(model.hub or "").lower()})) & wanted:
            return model
    tagged = [m.name for m in models if m.name.lower().startswith(tuple(f"{w}:" for w in wanted))]
    if tagged:
        raise UserError(f"'{name}' is here as {len(tagged)} GGUF files: name one, {', '.join(tagged)}")
    raise UserError(f"no local model '{name}' (`fastdllm list` shows what is here)")


def remove(model: LocalModel) -> int:
    """Delete the model's own files; returns the bytes freed. A GGUF file: that file (and, in the
    Hugging Face cache, the blob its link names), not the other tags beside it."""
    if model.remove_root is None:
        what = "the built-in model; it is part of the installed package" if model.where == "built-in" else \
            f"a split GGUF file; remove its parts ({model.path.parent}) yourself"
        raise UsageError(f"{model.name} is {what}")
    if model.remove_root.is_dir() and not model.remove_root.is_symlink():
        shutil.rmtree(model.remove_root)
    else:
        if model.remove_root.is_symlink():
            model.remove_root.resolve().unlink(missing_ok=True)
        model.remove_root.unlink(missing_ok=True)
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
        entry = catalog.lookup(repo.repo_id)
        for choice, snapshot in cached_choices(repo.repo_id):      # GGUF files a pull left, one per tag
            found.extend(_ggufs(snapshot, [choice], "hf-cache", entry.name if entry else repo.repo_id,
                                hub=repo.repo_id))
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


def _ggufs(folder: Path, found: list, where: str, name: str, hub: str | None = None) -> list[LocalModel]:
    """One model per GGUF file (or split set) of a folder: `NAME:TAG`, its real size, the family its
    architecture is read as; `rm` removes that file only."""
    models = []
    for choice in found:
        path = folder / choice.files[0]
        arch = architecture(path)
        family = GGUF_FAMILIES.get(arch, f"{arch} (not read)" if arch else "?")
        label = f"{name}:{choice.label}" if name != choice.files[0] else name
        split = f", {len(choice.files)} parts" if len(choice.files) > 1 else ""
        models.append(LocalModel(name=label, where=where, path=path, family=family, size_bytes=choice.size,
                                 quantization=f"GGUF {choice.tag or '?'}{split}", last_used=path.stat().st_atime,
                                 hub=hub, remove_root=path if len(choice.files) == 1 else None))
    return models


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
