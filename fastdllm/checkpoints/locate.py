"""Which checkpoint directory a command means: --model as a local directory, a GGUF file (the folder
standing for it, gguf_folder.py), a folder or hub repo of GGUF files with a quant tag
(`org/X-GGUF:Q4_K_M`, gguf_repo.py), a catalog short name (`dream:7b`), a hub id (downloaded when
the network allows; weights, configs and tokenizer files only), or the built-in model."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError, UserError
from . import catalog
from .builtin import builtin_model_path
from .hub import ALLOW_PATTERNS, hub_settings



def resolve_model_dir(spec: str | None) -> Path:
    """--model: a local directory, a short name or hub id (the local copy, else downloaded when the
    network allows), or the built-in model."""
    if spec is None:
        path = builtin_model_path()
        if path is None:
            raise UsageError("no model given and the built-in model is not installed: pass --model DIR")
        return path
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf" and not path.is_dir():   # a llama.cpp file: a folder standing for it
        if not path.is_file():
            raise UserError(f"GGUF file not found: {path}")
        from .gguf_folder import folder_for

        return folder_for(path)
    from .gguf_repo import resolve as gguf_in

    if (gguf := gguf_in(spec)) is not None:           # a folder or hub repo of GGUF files, NAME:Q4_K_M
        return gguf
    if path.exists() or spec.startswith((".", "/", "~")):
        return path                                   # loading reports a missing/malformed directory
    if (builtin := builtin_model_path(spec)) is not None:
        return builtin                                # -m tiny-code: a built-in model by name
    if catalog.is_short_name(spec):
        entry = catalog.find(spec)                    # an unknown name: one line with the close ones
        return local_copy(entry.hub, entry.revision) or _download(entry.hub, entry.revision)
    if spec.count("/") != 1:
        return path
    return local_copy(spec) or _download(spec)


def local_copy(repo_id: str, revision: str | None = None) -> Path | None:
    """The Hugging Face cache's snapshot of a repo, if one was downloaded (no network)."""
    try:
        from huggingface_hub import snapshot_download

        found = Path(snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS,
                                       local_files_only=True, **hub_settings()))
    except Exception:   # not in the cache (or a cache we cannot read): the caller downloads it
        return None
    return found if is_complete(found) else None


def is_complete(path: Path) -> bool:
    """A checkpoint with its config, a tokenizer and every weight file (a stopped download is not
    one yet)."""
    if not (path / "config.json").is_file() or not has_tokenizer(path):
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all((path / s).is_file() for s in shards)
    return (path / "model.safetensors").is_file()


def has_tokenizer(path: Path) -> bool:
    return ((path / "tokenizer.json").is_file() or (path / "vocab.json").is_file() and (path / "merges.txt").is_file()
            or (path / "tokenizer.model").is_file() or any(path.glob("*.tiktoken")))


def _download(repo_id: str, revision: str | None = None) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS, **hub_settings()))
    except Exception as e:  # offline, unknown repo, auth: all end the same way for the user
        raise UserError(f"cannot fetch '{repo_id}' from the hub ({type(e).__name__}); run `fastdllm pull "
                        f"{repo_id}` to see why, or download it elsewhere and pass its directory with --model DIR") from None
