"""Model families, one file each, named after config.json's `model_type`."""

from __future__ import annotations

from transformers import AutoConfig, AutoModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from .base import DiffusionLM
from .diffusion_gemma import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion
from .dream import DreamConfig, DreamModel
from .fast_dllm_qwen import FastDLLMQwenConfig, FastDLLMQwenForCausalLM
from .illada import ILLaDAConfig, ILLaDAForCausalLM
from .llada import LLaDAConfig, LLaDAModelLM
from .llada2_moe import BailingMoeV2Config, LLaDA2MoeConfig, LLaDA2MoeModelLM
from .llada_moe import LLaDAMoEConfig, LLaDAMoEModelLM
from .nemotron_labs_diffusion import NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel
from .rnd1 import RND1LM, RND1Config
from .sdar import SDARConfig, SDARForCausalLM
from .sdar_moe import SDARMoeConfig, SDARMoeForCausalLM
from .steerling import SteerlingConfig, SteerlingForCausalLM

Family = tuple[type, type[DiffusionLM], tuple[str, ...]]   # config class, model class, `architectures` entries
_LLADA2 = ("LLaDA2MoeModelLM",)

# model_type -> the families published under it; `architectures` picks one (the first when a
# config.json names none): `llada` is both the dense LLaDA-8B and LLaDA-MoE.
FAMILIES: dict[str, list[Family]] = {
    "llada": [(LLaDAConfig, LLaDAModelLM, ("LLaDAModelLM",)),
              (LLaDAMoEConfig, LLaDAMoEModelLM, ("LLaDAMoEModelLM", "LLaDAMoEModel"))],
    "Dream": [(DreamConfig, DreamModel, ("DreamModel",))],
    "Fast_dLLM_Qwen": [(FastDLLMQwenConfig, FastDLLMQwenForCausalLM, ("Fast_dLLM_QwenForCausalLM",))],
    "sdar": [(SDARConfig, SDARForCausalLM, ("SDARForCausalLM",))],
    "sdar_moe": [(SDARMoeConfig, SDARMoeForCausalLM, ("SDARMoeForCausalLM",))],
    "llada2_moe": [(LLaDA2MoeConfig, LLaDA2MoeModelLM, _LLADA2)],
    "bailing_moe_v2": [(BailingMoeV2Config, LLaDA2MoeModelLM, _LLADA2)],
    "rnd1": [(RND1Config, RND1LM, ("RND1", "RND1LM"))],
    "nemotron_labs_diffusion": [(NemotronLabsDiffusionConfig, NemotronLabsDiffusionModel, ("NemotronLabsDiffusionModel",))],
    "diffusion_gemma": [(DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion,
                         ("DiffusionGemmaForBlockDiffusion", "DiffusionGemma4ModelForBlockDiffusion"))],
    "steerling": [(SteerlingConfig, SteerlingForCausalLM, ("SteerlingForCausalLM",))],
    "illada": [(ILLaDAConfig, ILLaDAForCausalLM, ("ILLaDAForCausalLM",))],
}
# Architectures that name their family whatever config.json's model_type says: iLLaDA's model_type
# was only ever seen in third-party test doubles ("illada", docs/specs/illada.md 1.1), its class name in
# loaders that read the real file. If the published type differs, it is read as this family (with
# a note); then name it in FAMILIES too.
BY_ARCHITECTURE = {"ILLaDAForCausalLM": "illada"}
# Families people download that are not implemented yet: named in the error.
NOT_YET = {"llada2_moe_veomni": "LLaDA2's training format (experts merged per layer; convert to the published one)",
           "causal_diffusion": "Steerling's training-package layout (concept keys nested; use the Hub layout, model_type "
                               "steerling)"}

for _type, _families in FAMILIES.items():
    # Registering our classes makes AutoConfig/AutoModel use them instead of the `auto_map` Python
    # files that published checkpoints carry: no code from a checkpoint directory ever runs.
    # AutoConfig knows one class per model_type: the first family's. A model_type transformers
    # implements itself (diffusion_gemma) keeps its own classes there: we load ours directly.
    if _type in CONFIG_MAPPING_NAMES:
        continue
    AutoConfig.register(_type, _families[0][0], exist_ok=True)
    for _cfg, _model, _ in _families:
        if _model.config_class is _cfg:
            AutoModel.register(_cfg, _model, exist_ok=True)

__all__ = ["BY_ARCHITECTURE", "FAMILIES", "NOT_YET", "DiffusionLM", "DreamConfig", "DreamModel", "ILLaDAConfig",
           "ILLaDAForCausalLM", "LLaDA2MoeConfig", "LLaDA2MoeModelLM",
           "LLaDAConfig", "LLaDAMoEConfig", "LLaDAMoEModelLM", "LLaDAModelLM", "RND1Config", "RND1LM", "SDARMoeConfig",
           "SDARMoeForCausalLM"]
