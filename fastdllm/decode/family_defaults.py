"""Each model family's own decoding defaults, by config.json's `model_type`, or by `architectures`
where one model_type names several families (`llada`: LLaDA-8B and LLaDA-MoE). Torch-free: profile
resolution reads it. They form the "model-family defaults" layer (below profiles, environment and
flags), and name the profile used when none is given: block-diffusion families are trained for
their own block size and decode by their authors' rules, so the generic default would not fit.

What is here is read from config.json (and generation_config.json: block sizes, step counts,
DiffusionGemma's sampler, LLaDA2.2's edit tokens), or is the rule and cache a family decodes by
whatever profile is named (SDAR under `-P credit` keeps blocks of 4, the dynamic rule and the
prefix cache): that layer sits below every profile, so it cannot live in the family's profile
without changing what other profiles resolve to. Anything else about a family lives elsewhere
(`info`'s variant line: checkpoints/info.py)."""

from __future__ import annotations

_LLADA2 = ("llada2", lambda c, g: {       # H1's generate: blocks of 32, > 0.95, at least 1 of 32 steps
    "block_len": 32, "rule": "dynamic", "threshold": 0.95, "cache": "prefix"})


_ILLADA = ("illada", lambda c, g: {"block_len": 32, "variable_length": True})


def _diffusion_gemma(config: dict, generation: dict) -> dict:
    """The canvas from config.json; the sampler from generation_config.json (transformers' keys,
    with its defaults where a key is absent): docs/diffusion-gemma.md 1.3."""
    sampler = generation.get("sampler_config") or {}
    canvas = config.get("canvas_length") or 256
    length = generation.get("max_new_tokens") or 256
    return {"block_len": canvas, "gen_len": -(-length // canvas) * canvas, "rule": "eb_sampler", "cache": "prefix",
            "entropy_bound": sampler.get("entropy_bound", 0.1), "denoise_steps": generation.get("max_denoising_steps", 48),
            "t_max": generation.get("t_max", 0.8), "t_min": generation.get("t_min", 0.4),
            "stability_steps": generation.get("stability_threshold", 1),
            "confidence_stop": generation.get("confidence_threshold", 0.005)}


# model_type or architecture -> (profile used when none is given,
#                                (config.json, generation_config.json) -> DecodeConfig defaults)
FAMILY_DEFAULTS = {
    "Fast_dLLM_Qwen": ("fast-dllm-v2", lambda c, g: {
        "block_len": c.get("bd_size") or 32, "sub_block_len": 8, "rule": "dynamic", "threshold": 0.9,
        "cache": "prefix"}),
    "sdar": ("sdar", lambda c, g: {
        "block_len": c.get("block_size") or 4, "rule": "dynamic", "threshold": 0.95, "cache": "prefix"}),
    "llada2_moe": _LLADA2,
    "bailing_moe_v2": _LLADA2,
    "LLaDAMoEModelLM": ("llada-moe", lambda c, g: {
        "block_len": 32, "rule": "threshold", "threshold": 0.9, "cache": "dual"}),
    "diffusion_gemma": ("diffusion-gemma", _diffusion_gemma),
    # the checkpoint's generate with the model card's block_length 32, threshold 0.9 (docs/nemotron-diffusion.md 3)
    "nemotron_labs_diffusion": ("nemotron-diffusion", lambda c, g: {
        "block_len": c.get("block_size") or 32, "rule": "threshold", "threshold": 0.9, "cache": "prefix"}),
    # RND1's diffusion_sample (docs/rnd1.md 5): one global canvas (the rule sets block_len to
    # gen_len), its entropy schedule over num_diffusion_steps steps, no cache (the reference
    # recomputes the whole canvas every step)
    "rnd1": ("rnd1", lambda c, g: {
        "gen_len": 256, "rule": "entropy_schedule", "confidence": "entropy",
        "steps": c.get("num_diffusion_steps") or 256, "cache": "none"}),
    # Steerling's generate_full (docs/steerling.md 5, 7): its blocks are the attention's, one token per
    # step, the authors' sampling; the prefix cache gives the same logits and NFE as their full canvas
    "steerling": ("steerling", lambda c, g: {"block_len": c.get("diff_block_size") or 64, "rule": "fixed",
                                            "cache": "prefix"}),
    # iLLaDA's var_generate (docs/illada.md 3.2): the canvas grows by blocks of 32
    "illada": _ILLADA,
    "ILLaDAForCausalLM": _ILLADA,        # found by its class name whatever its model_type (models/illada.py)
}
FAMILY_DEFAULTS["LLaDAMoEModel"] = FAMILY_DEFAULTS["LLaDAMoEModelLM"]
FAMILY_DEFAULTS["sdar_moe"] = FAMILY_DEFAULTS["sdar"]    # SDAR-30B-A3B decodes as dense SDAR (docs/sdar-moe.md)


def _entry(config: dict):
    keys = [*(config.get("architectures") or []), config.get("model_type")]
    return next((FAMILY_DEFAULTS[k] for k in keys if isinstance(k, str) and k in FAMILY_DEFAULTS), None)


def decode_defaults(config: dict, generation: dict | None = None) -> dict:
    entry = _entry(config)
    return entry[1](config, generation or {}) if entry else {}


def default_profile(config: dict) -> str:
    entry = _entry(config)
    if entry is _LLADA2 and config.get("delete_token_id") is not None and config.get("split_token_id") is not None:
        return "llada2.2"                      # LLaDA2.2's edit tokens: its InDel decoder (docs/llada2-2.md)
    return entry[0] if entry else "default"
