"""Each model family's own decoding defaults, by config.json's `architectures` then its `model_type`
(one model_type can name several families: `llada` is LLaDA-8B and LLaDA-MoE). They form the
"model-family defaults" layer (below profiles, environment and flags), and name the profile used
when none is given: block-diffusion families are trained for their own block size and decode by
their authors' rules, so the generic default would not fit.

Each family module declares its own (`DECODES`: the profile, the fixed choices, the values read
from config.json; models/registry.py reads that statement from source, so this stays torch-free:
profile resolution reads it). What is declared is read from config.json, or is the rule and cache a
family decodes by whatever profile is named (SDAR under `-P credit` keeps blocks of 4, the dynamic
rule and the prefix cache): that layer sits below every profile, so it cannot live in the family's
profile without changing what other profiles resolve to. Only what a literal cannot say is computed
here: DiffusionGemma's generation_config.json sampler and canvas rounding, LLaDA2.2's profile chosen
by its edit tokens. Anything else about a family lives elsewhere (`info`'s variant line:
checkpoints/info.py)."""

from __future__ import annotations

from ..models.registry import decodes


def _diffusion_gemma(config: dict, generation: dict, declared: dict) -> dict:
    """gen_len rounded up to whole canvases, the sampler from generation_config.json (transformers'
    keys, with its defaults where a key is absent, so 0 is kept): docs/specs/diffusion-gemma.md 1.3."""
    sampler = generation.get("sampler_config") or {}
    canvas = declared["block_len"]
    length = generation.get("max_new_tokens") or 256
    return {"gen_len": -(-length // canvas) * canvas,
            "entropy_bound": sampler.get("entropy_bound", 0.1), "denoise_steps": generation.get("max_denoising_steps", 48),
            "t_max": generation.get("t_max", 0.8), "t_min": generation.get("t_min", 0.4),
            "stability_steps": generation.get("stability_threshold", 1),
            "confidence_stop": generation.get("confidence_threshold", 0.005)}


# the declared profile -> (config.json, generation_config.json, the declared values) -> more values
COMPUTED = {"diffusion-gemma": _diffusion_gemma}


def _entry(config: dict) -> dict | None:
    declared = decodes()
    keys = [*(config.get("architectures") or []), config.get("model_type")]
    return next((declared[k] for k in keys if isinstance(k, str) and k in declared), None)


def decode_defaults(config: dict, generation: dict | None = None) -> dict:
    """The family's DecodeConfig defaults: each `from_config` value is config.json's key, or the
    declared fallback where the key is absent or falsy (0, null); then the fixed ones, then any
    computed ones. Empty for a family that declares none."""
    entry = _entry(config)
    if entry is None:
        return {}
    values = {field: config.get(key) or fallback for field, (key, fallback) in entry.get("from_config", {}).items()}
    values.update(entry.get("fixed", {}))
    if compute := COMPUTED.get(entry["profile"]):
        values.update(compute(config, generation or {}, values))
    return values


def default_profile(config: dict) -> str:
    entry = _entry(config)
    if entry is None:
        return "default"
    if entry["profile"] == "llada2" and config.get("delete_token_id") is not None \
            and config.get("split_token_id") is not None:
        return "llada2.2"                      # LLaDA2.2's edit tokens: its InDel decoder (docs/specs/llada2-2.md)
    return entry["profile"]
