"""Model families, one file each, named after config.json's `model_type`. Each declares what it
serves (`SERVES`) and is imported by name when a checkpoint of that model_type is read
(registry.py): importing this package imports no family, and no torch."""

from __future__ import annotations

import importlib.util

from .registry import NOT_YET, Family, all_families, by_architecture, class_named, families, model_types


def __getattr__(name: str):
    """`FAMILIES` (model_type -> families, every family imported), `BY_ARCHITECTURE`, `DiffusionLM`,
    and each family's config and model class by name (`from fastdllm.models import LLaDAModelLM`)."""
    if name == "FAMILIES":
        return all_families()
    if name == "BY_ARCHITECTURE":
        return by_architecture()
    if name == "DiffusionLM":
        from .base import DiffusionLM
        return DiffusionLM
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is None:
        if (cls := class_named(name)) is not None:
            globals()[name] = cls
            return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")   # a submodule: the import system loads it


__all__ = ["BY_ARCHITECTURE", "FAMILIES", "NOT_YET", "DiffusionLM", "Family", "all_families", "by_architecture",
           "class_named", "families", "model_types"]
