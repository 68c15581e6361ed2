"""The built-in models shipped with the package: tiny-llada (word problems and small Python
functions, a chat template; the default once shipped) and tiny-code (Python continuation only).
Each folder has its card (README.md). `-m tiny-code` names one of them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

NAMES = ("tiny-llada", "tiny-code")           # the first one installed is the default


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
