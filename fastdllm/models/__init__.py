"""Model families, one file each, named after config.json's `model_type`."""

from __future__ import annotations

from transformers import AutoConfig, AutoModel

from .base import DiffusionLM
from .dream import DreamConfig, DreamModel
from .fast_dllm_qwen import FastDLLMQwenConfig, FastDLLMQwenForCausalLM
from .llada import LLaDAConfig, LLaDAModelLM
from .sdar import SDARConfig, SDARForCausalLM

# model_type -> (config class, model class, the `architectures` entries we implement)
FAMILIES: dict[str, tuple[type, type[DiffusionLM], tuple[str, ...]]] = {
    "llada": (LLaDAConfig, LLaDAModelLM, ("LLaDAModelLM",)),
    "Dream": (DreamConfig, DreamModel, ("DreamModel",)),
    "Fast_dLLM_Qwen": (FastDLLMQwenConfig, FastDLLMQwenForCausalLM, ("Fast_dLLM_QwenForCausalLM",)),
    "sdar": (SDARConfig, SDARForCausalLM, ("SDARForCausalLM",)),
}
# Families people download that are not implemented yet: named in the error.
NOT_YET = {"llada2_moe": "LLaDA2.x (mixture of experts)", "sdar_moe": "SDAR-30B-A3B (mixture of experts)",
           "llada_moe": "LLaDA-MoE (mixture of experts)"}

for _cfg, _model, _ in FAMILIES.values():
    # Registering our classes makes AutoConfig/AutoModel use them instead of the `auto_map` Python
    # files that published checkpoints carry: no code from a checkpoint directory ever runs.
    AutoConfig.register(_cfg.model_type, _cfg, exist_ok=True)
    AutoModel.register(_cfg, _model, exist_ok=True)

__all__ = ["FAMILIES", "NOT_YET", "DiffusionLM", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM"]
