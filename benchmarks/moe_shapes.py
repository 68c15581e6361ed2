"""The published MoE shapes of benchmarks/moe_speed.py and benchmarks/moe_memory.py: their configs (as
published, cut to fewer MoE layers or experts, or turned dense at the active expert width), the
random-weight models built from them, and what a step of those models reads.
"""

from __future__ import annotations

import harness
import torch

from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_moe import (
    PUBLISHED,
    published_config,
    write_llada2_2,
    write_llada2_moe,
    write_llada_moe,
)
from fastdllm.testing.tiny_rnd1 import rnd1_config, write_rnd1
from fastdllm.testing.tiny_sdar_moe import write_sdar_moe
from fastdllm.models.moe import SparseMoE

# name -> (model_type of the published config, tiny checkpoint writer: tokenizer and special tokens only)
SHAPES = {"llada2-mini": ("llada2_moe", write_llada2_moe), "llada2.2-mini": ("llada2_moe", write_llada2_2),
          "llada-moe-7b": ("llada_moe", write_llada_moe),
          "sdar-30b-a3b": ("sdar_moe", write_sdar_moe), "rnd1-30b-a3b": ("rnd1", write_rnd1)}
QWEN3_MOE = ("sdar_moe", "rnd1")                 # Qwen3-MoE's layer rule (decoder_sparse_step, mlp_only_layers)


# --- shapes ----------------------------------------------------------------------------------------
# LLaDA2.2-mini: LLaDA2.1-mini's config plus block routing (docs/specs/llada2-2.md §1; 48 of 256 experts per
# block is a third-party figure, no 2.2 config.json was read)
BLOCK_ROUTING = {"llada2.2-mini": {"expert_capacity": 48, "block_size": 32}}


def published(name: str) -> dict:
    """RND1: the config.json its configuration class writes (tiny_rnd1; the published file was not read)."""
    raw = rnd1_config() if SHAPES[name][0] == "rnd1" else published_config(SHAPES[name][0])
    return dict(raw, **BLOCK_ROUTING.get(name, {}))


def expert_width(raw: dict) -> int:
    return raw.get("moe_intermediate_size") or raw["expert_intermediate_size"]


def shared_width(raw: dict) -> int:
    """LLaDA2: num_shared_experts experts of the expert width; LLaDA-MoE: its own key (None published)."""
    if "num_shared_experts" in raw:
        return (raw["num_shared_experts"] or 0) * raw["moe_intermediate_size"]
    return raw.get("shared_expert_intermediate_size") or 0


def active_width(raw: dict) -> int:
    return raw["num_experts_per_tok"] * expert_width(raw) + shared_width(raw)


def dense_layers(raw: dict) -> int:
    """How many of the published layers are dense."""
    L = raw["num_hidden_layers"]
    if raw["model_type"] == "llada2_moe":
        return raw["first_k_dense_replace"]
    if raw["model_type"] in QWEN3_MOE:                                   # Qwen3-MoE's rule
        only = set(raw.get("mlp_only_layers") or [])
        return sum(1 for i in range(L) if i in only or (i + 1) % raw["decoder_sparse_step"])
    return sum(1 for f in raw["moe_layer_freq"][:L] if not f)


def moe_config(raw: dict, layers: int, experts: int) -> dict:
    """The published config with `layers` MoE layers and `experts` routed experts per layer."""
    c = dict(raw, num_hidden_layers=layers, num_experts=experts)
    if raw["model_type"] == "llada2_moe":
        c["first_k_dense_replace"] = 0
        if experts % raw["n_group"] or experts // raw["n_group"] < 2:     # groups must still split E
            c["n_group"] = c["topk_group"] = 1
    elif raw["model_type"] in QWEN3_MOE:
        c.update(decoder_sparse_step=1, mlp_only_layers=[])
    else:
        c["moe_layer_freq"] = [1] * layers
    return c


def dense_config(raw: dict, layers: int) -> dict:
    """The same class, attention and layers, every MLP dense and as wide as the active experts."""
    c = dict(raw, num_hidden_layers=layers)
    if raw["model_type"] == "llada2_moe":
        c.update(first_k_dense_replace=layers, intermediate_size=active_width(raw))
    elif raw["model_type"] in QWEN3_MOE:
        c.update(mlp_only_layers=list(range(layers)), intermediate_size=active_width(raw))
        if raw["model_type"] == "rnd1":   # RND1 refuses dense layers: the same Qwen3 layers as sdar_moe
            c.update(model_type="sdar_moe", architectures=["SDARMoeForCausalLM"])
    else:
        c.update(moe_layer_freq=[0] * layers, dense_intermediate_size=active_width(raw),
                 shared_expert_intermediate_size=None)
    return c


def family(raw: dict):
    """(config, model class) through the loader's own checks (malformed routing is refused)."""
    config, model_cls, _ = loading.family_of(raw, PUBLISHED)   # the path only names the config in errors
    return config, model_cls


# --- models ----------------------------------------------------------------------------------------
def random_model(lm: loading.LoadedModel, raw: dict, device: torch.device) -> loading.LoadedModel:
    """harness.random_weights's job with `raw` as the whole config and the class the loader picks for it
    (random_weights takes a model_type's first family, and `llada` is the dense LLaDA-8B first). Built on
    the meta device and materialised once: one normal_ pass instead of three (nn.Linear's init,
    transformers' init, then random_weights's) over 3.2 GB per fp32 LLaDA2 MoE layer."""
    config, model_cls = family(raw)
    default = torch.get_default_dtype()
    torch.set_default_dtype(lm.dtype)
    try:
        with torch.device("meta"):
            model = model_cls(config)
    finally:
        torch.set_default_dtype(default)
    model = model.to_empty(device=device).eval()
    torch.manual_seed(0)
    harness.randomize(model, fill_rest=True)                         # RMSNorm weights 1
    with torch.no_grad():
        for module in model.modules():
            for name, buffer in list(module.named_buffers(recurse=False)):
                # the routers' selection bias: zero, in fp32 as the loader keeps it
                module.register_buffer(name, torch.zeros(buffer.shape, device=device,
                                                         dtype=torch.float32 if name == "expert_bias" else buffer.dtype))
    model.prepare_for_inference()
    lm.model = model
    lm.info = loading.describe(lm)
    return lm


def nbytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def read_per_step(model, hits: list[int] | None) -> int:
    """Bytes of weights one step reads: each layer's weights but its routed experts, plus hits[i]
    routed experts of layer i, plus the final norm and the head (not the input embedding: only the
    block's rows of it are read). hits None: every layer dense."""
    total = nbytes(model.final_norm) + nbytes(model.embed if model.output_head is None else model.output_head)
    for i, block in enumerate(model.blocks):
        total += nbytes(block)
        moe = next((m for m in block.modules() if isinstance(m, SparseMoE)), None)
        if moe is not None:
            total += hits[i] * nbytes(moe.experts[0]) - nbytes(moe.experts)
    return total


def expected_hits(experts: int, k: int, tokens: int) -> float:
    """Distinct experts hit by `tokens` tokens choosing k distinct experts each, uniformly."""
    return experts * (1 - (1 - k / experts) ** tokens)


def active_parameters(model) -> int:
    """Parameters one token uses: all but (E - k) / E of the routed experts (checkpoints/info.py's count)."""
    idle = 0
    for moe in (m for m in model.modules() if isinstance(m, SparseMoE)):
        r = moe.gate.routing
        idle += sum(p.numel() for p in moe.experts.parameters()) * (r.experts - r.top_k) // r.experts
    return sum(p.numel() for p in model.parameters()) - idle

