"""Each model family's own decoding defaults, by config.json's `model_type` (torch-free: profile
resolution reads it). They form the "model-family defaults" layer (below profiles, environment and
flags), and name the profile used when none is given: block-diffusion families are trained for
their own block size and decode by their authors' rules, so the generic default would not fit."""

from __future__ import annotations

# model_type -> (profile used when none is given, config.json -> DecodeConfig defaults)
FAMILY_DEFAULTS = {
    "Fast_dLLM_Qwen": ("fast-dllm-v2", lambda c: {
        "block_len": c.get("bd_size") or 32, "sub_block_len": 8, "rule": "dynamic", "threshold": 0.9,
        "cache": "prefix"}),
    "sdar": ("sdar", lambda c: {
        "block_len": c.get("block_size") or 4, "rule": "dynamic", "threshold": 0.95, "cache": "prefix"}),
}


def decode_defaults(config: dict) -> dict:
    entry = FAMILY_DEFAULTS.get(config.get("model_type"))
    return entry[1](config) if entry else {}


def default_profile(config: dict) -> str:
    entry = FAMILY_DEFAULTS.get(config.get("model_type"))
    return entry[0] if entry else "default"
