"""What a checkpoint directory holds, read from its headers (no weights loaded), and how much memory
it needs at a given canvas length."""

from __future__ import annotations

import json
from collections import Counter
from math import prod
from pathlib import Path

from safetensors import safe_open

from ..decode.family_defaults import default_profile
from ..errors import UserError
from .family import family_of, read_config
from .gguf_folder import source_of
from .specials import load_tokenizer, special_tokens

BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "I8": 1, "U8": 1}


def variant(config: dict) -> str | None:
    """What config.json switches on beyond its family's name: LLaDA2.2's block routing
    (`expert_capacity`) and its insert/delete edit tokens (docs/specs/llada2-2.md); iLLaDA, named for
    what it is (docs/specs/illada.md 7.6)."""
    profile = default_profile(config)
    if profile == "illada":
        return "iLLaDA (LLaDA's successor: Llama layout, GQA, tied head, variable-length decoding)"
    if profile not in ("llada2", "llada2.2"):
        return None
    found = []
    if (capacity := config.get("expert_capacity")) is not None:
        found.append(f"block routing ({capacity} of {config.get('num_experts')} experts per block of "
                     f"{config.get('block_size') or 32})")
    if config.get("delete_token_id") is not None and config.get("split_token_id") is not None:
        found.append(f"insert/delete editing (DELETE id {config['delete_token_id']}, SPLIT id {config['split_token_id']})")
    return f"LLaDA2.2: {', '.join(found)}" if found else None


def shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return [path / s for s in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [path / "model.safetensors"]


def inspect_checkpoint(path: Path) -> dict:
    raw = read_config(path)
    config, model_cls, warnings = family_of(raw, path, refuse=False)     # info shows a refusal, as a warning
    if (gguf := source_of(path)) is not None:           # a GGUF file's folder: shapes from the file's table
        shapes = gguf_shapes(gguf)
        on_disk = {"dtype_on_disk": gguf["dtype_on_disk"], "bytes_on_disk": gguf["bytes_on_disk"]}
    else:
        shapes, on_disk = safetensors_shapes(path)
    tokenizer = load_tokenizer(path)
    specials = special_tokens(raw, tokenizer, path, model_cls)
    return {
        "path": gguf["file"] if gguf else str(path), "family": raw["model_type"],
        "architectures": raw.get("architectures", []), "variant": variant(raw), "profile": default_profile(raw),
        **shape_summary(shapes, config), **on_disk,
        "layers": config.num_hidden_layers, "hidden_size": config.hidden_size,
        "context_length": config.max_position_embeddings, "vocab_size": config.vocab_size,
        "mask_id": specials.mask, "eos_ids": [t for t in specials.stops if t != specials.eot],
        "end_of_turn_id": specials.eot, "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "warnings": warnings,
    }


def safetensors_shapes(path: Path) -> tuple[dict, dict]:
    """(tensor shapes by name, dtype and bytes on disk) from the shards' headers."""
    shapes, dtypes = {}, Counter()
    shards = shard_files(path)
    missing = [s.name for s in shards if not s.is_file()]
    if missing:                     # a download that stopped after config.json, or a bare config
        raise UserError(f"{path}: no weights to read: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} "
                        f"missing (a catalog model's figures without its files: fastdllm show NAME)")
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                shapes[name] = piece.get_shape()
                dtypes[piece.get_dtype()] += prod(shapes[name])
    return shapes, {"dtype_on_disk": ", ".join(d.lower() for d, _ in dtypes.most_common()),
                    "bytes_on_disk": sum(BYTES.get(d, 2) * n for d, n in dtypes.items())}


def gguf_shapes(source: dict) -> dict:
    """Published names -> torch-order shapes, from a GGUF file's tensor table (gguf_file.py)."""
    from .gguf_file import open_checked

    return {t.name: list(t.shape) for t in open_checked(Path(source["file"]))[1]}


def shape_summary(shapes: dict, config) -> dict:
    """What memory_estimate reads, from tensor shapes: a checkpoint's headers, or a model of a
    published shape built on the meta device (scripts)."""
    # kv_heads * head_dim summed over the layers: the k projections' rows (DiffusionGemma's layer
    # kinds differ), or from the config where q/k/v are one matrix (LLaDA2)
    kv_rows = sum(s[0] for n, s in shapes.items() if n.endswith("k_proj.weight")) \
        or config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    # the matrices 8/4-bit quantizes: the blocks' nn.Linear weights and packed 3-D experts
    # (checkpoints/packed_experts.py), not the MoE routers
    in_blocks = sum(prod(s) for n, s in shapes.items()
                    if len(s) in (2, 3) and (".blocks." in n or ".layers." in n) and not is_router(n))
    parameters = sum(prod(s) for s in shapes.values())
    # int8/int4 keep the input embedding as int8 rows unless a float head is tied to it
    embedding = sum(prod(s) for n, s in shapes.items() if n.endswith(("embed_tokens.weight", "transformer.wte.weight")))
    head = sum(prod(s) for n, s in shapes.items() if n in ("lm_head.weight", "model.transformer.ff_out.weight"))
    return {"parameters": parameters, "active_parameters": parameters - idle_expert_parameters(shapes, config),
            "block_matrix_parameters": in_blocks, "kv_bytes_per_token_bf16": 2 * kv_rows * 2,
            "untied_embedding_parameters": embedding if head else 0,
            # int8/int4 quantize the head as int8 where W8A8 runs (a tied one: the embedding's rows)
            "vocab_matrix_parameters": embedding + head,
            # int8/int4 refuse packed 3-D experts (DiffusionGemma; checkpoints/loading.py)
            "packed_experts": any(len(s) == 3 for s in shapes.values())}


def is_router(name: str) -> bool:
    return name.endswith(("mlp.gate.weight", "router.proj.weight"))


def idle_expert_parameters(shapes: dict, config) -> int:
    """Mixture of experts: the routed experts' parameters a token does not use, (E - k) / E of them
    (shared experts, attention, dense layers, embedding and head are used by every token)."""
    experts = getattr(config, "num_experts", None)
    k = getattr(config, "num_experts_per_tok", None) or getattr(config, "top_k_experts", None)
    if not experts or not k:
        return 0
    # per-expert modules (`.mlp.experts.N.`), or all experts packed in 3-D tensors (DiffusionGemma)
    routed = sum(prod(s) for n, s in shapes.items() if ".mlp.experts." in n or (".experts." in n and len(s) == 3))
    return routed * (experts - k) // experts


def memory_estimate(info: dict, canvas_tokens: int) -> dict[str, dict[str, int]]:
    """Weights plus the canvas KV cache (bf16), for bf16 / 8-bit / 4-bit / int8 / int4 weights. All
    four quantise the matrices inside the blocks (bitsandbytes keeps embeddings, head and norms in
    bf16); 4-bit NF4 adds one fp32 scale per 64 weights. int8 / int4 (CPU, models/cpu_quant.py): a
    bf16 scale per row (negligible) / per 32 weights a bf16 step and zero (the kernel's) and an
    int8 multiplier (W4A8's); the embedding and the head as int8 rows where this CPU runs W8A8
    (`head_pays`), else only an untied embedding, the head bf16; norms bf16."""
    from ..models.cpu_quant import head_pays

    blocks = info["block_matrix_parameters"]
    embed = info.get("vocab_matrix_parameters", 0) if head_pays() else info.get("untied_embedding_parameters", 0)
    rest = info["parameters"] - blocks
    weights = {"bf16": info["parameters"] * 2,
               "8bit": blocks * 1 + rest * 2,
               "4bit": int(blocks * (0.5 + 4 / 64)) + rest * 2,
               "int8": blocks * 1 + embed * 1 + (rest - embed) * 2,
               "int4": int(blocks * (0.5 + 5 / 32)) + embed * 1 + (rest - embed) * 2}
    if info.get("packed_experts"):
        del weights["int8"], weights["int4"]
    cache = info["kv_bytes_per_token_bf16"] * canvas_tokens
    return {k: {"weights": w, "cache": cache, "total": w + cache} for k, w in weights.items()}
