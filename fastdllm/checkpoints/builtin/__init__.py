"""The built-in tiny code model shipped with the package (see tiny-code/README.md)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

NAME = "tiny-code"


def builtin_model_path() -> Path | None:
    """Directory of the built-in checkpoint, or None when this install does not include it."""
    path = Path(str(resources.files(__name__) / NAME))
    return path if (path / "config.json").is_file() else None
