"""Which checkpoint directory a command means: --model as a local directory, a hub id (downloaded
when the network allows; weights, configs and tokenizer files only), or the built-in model."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError, UserError
from .builtin import builtin_model_path


def resolve_model_dir(spec: str | None) -> Path:
    """--model: a local directory, a hub id (downloaded when the network allows), or the built-in model."""
    if spec is None:
        path = builtin_model_path()
        if path is None:
            raise UsageError("no model given and the built-in model is not installed: pass --model DIR")
        return path
    path = Path(spec).expanduser()
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        return path                                   # loading reports a missing/malformed directory
    return _download(spec)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        # weights, configs and tokenizer files only: no Python file of a checkpoint is fetched
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model"]))
    except Exception as e:  # offline, unknown repo, auth: all end the same way for the user
        raise UserError(f"cannot fetch '{repo_id}' from the hub ({type(e).__name__}); "
                        f"download it elsewhere and pass its local directory with --model DIR") from None
