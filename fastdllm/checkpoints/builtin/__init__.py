"""The built-in models shipped with the package: tiny-code (Python continuation; the default) and
tiny-llada (word problems and small Python functions, a chat template; in training: it becomes the
default once its held-out accuracy is worth showing). Each folder has its card (README.md);
`-m tiny-llada` names one of them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

NAMES = ("tiny-code", "tiny-llada")           # the first one installed is the default


def builtin_model_path(name: str | None = None) -> Path | None:
    """Directory of the built-in checkpoint `name` (default: the first of NAMES installed), or None
    when this install does not include it."""
    for candidate in (name,) if name else NAMES:
        path = Path(str(resources.files(__name__) / candidate))
        if candidate in NAMES and (path / "config.json").is_file():
            return path
    return None


def builtin_models() -> list[Path]:
    """Every built-in checkpoint installed, the default first."""
    return [p for p in map(builtin_model_path, NAMES) if p is not None]


NAME = builtin_model_path().name if builtin_model_path() else NAMES[-1]   # the default's name
