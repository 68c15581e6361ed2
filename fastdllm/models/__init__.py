"""Model families, one file each, named after config.json's `model_type`."""

from __future__ import annotations

from transformers import AutoConfig, AutoModel

from .base import DiffusionLM
from .dream import DreamConfig, DreamModel
from .llada import LLaDAConfig, LLaDAModelLM

# model_type -> (config class, model class, the `architectures` entries we implement)
FAMILIES: dict[str, tuple[type, type[DiffusionLM], tuple[str, ...]]] = {
    "llada": (LLaDAConfig, LLaDAModelLM, ("LLaDAModelLM",)),
    "Dream": (DreamConfig, DreamModel, ("DreamModel",)),
}

for _cfg, _model, _ in FAMILIES.values():
    # Registering our classes makes AutoConfig/AutoModel use them instead of the `auto_map` Python
    # files that published checkpoints carry: no code from a checkpoint directory ever runs.
    AutoConfig.register(_cfg.model_type, _cfg, exist_ok=True)
    AutoModel.register(_cfg, _model, exist_ok=True)

__all__ = ["FAMILIES", "DiffusionLM", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM"]
