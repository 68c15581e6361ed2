"""Each family's decoding defaults and default profile, pinned: every model_type and architecture
that has any, read as model_type and as an architecture, from configs with the keys they read set,
falsy and absent, LLaDA2.2's edit tokens, DiffusionGemma's generation_config.json with its keys
present, zero and absent, and the lookup order (architectures first, then model_type). The values
were taken from the central table the families' declarations replaced (family_defaults.py before
issue 52's item 4): moving them must not change one of them."""

from __future__ import annotations

import pytest

from fastdllm.decode.family_defaults import decode_defaults, default_profile

KEYS = ["Fast_dLLM_Qwen", "sdar", "sdar_moe", "llada2_moe", "bailing_moe_v2", "LLaDAMoEModelLM", "LLaDAMoEModel",
        "diffusion_gemma", "nemotron_labs_diffusion", "rnd1", "steerling", "illada", "ILLaDAForCausalLM",
        "llada", "LLaDAModelLM", "Dream", "DreamModel", "unknown"]
READS = {"bd_size": 16, "block_size": 8, "num_diffusion_steps": 128, "diff_block_size": 32, "canvas_length": 64}
EDITS = {"delete_token_id": 5, "split_token_id": 6}
GENERATION = {"max_new_tokens": 300, "max_denoising_steps": 24, "t_max": 0.9, "t_min": 0.3, "stability_threshold": 2,
              "confidence_threshold": 0.01, "sampler_config": {"entropy_bound": 0.2}}


def cases() -> dict[str, tuple[dict, dict | None]]:
    """case id -> (config.json, generation_config.json)"""
    found: dict[str, tuple[dict, dict | None]] = {}
    for key in KEYS:
        found[f"{key}/type"] = {"model_type": key}, None
        found[f"{key}/architecture"] = {"architectures": [key], "model_type": "other"}, {}
        found[f"{key}/reads"] = {"model_type": key, **READS}, GENERATION
        found[f"{key}/falsy"] = {"model_type": key, **dict.fromkeys(READS, 0)}, {}
        found[f"{key}/none"] = {"architectures": None, "model_type": key, **dict.fromkeys(READS)}, None
        found[f"{key}/edits"] = {"model_type": key, **EDITS}, None
        found[f"{key}/one-edit"] = {"model_type": key, "delete_token_id": 5}, None
        found[f"{key}/zero-edits"] = {"architectures": [key], **dict.fromkeys(EDITS, 0)}, None
    found.update({
        "empty": ({}, None),
        "llada-moe-by-architecture": ({"architectures": ["LLaDAMoEModelLM"], "model_type": "llada"}, None),
        "llada-8b-by-architecture": ({"architectures": ["LLaDAModelLM"], "model_type": "llada"}, None),
        "illada-under-llada": ({"architectures": ["ILLaDAForCausalLM"], "model_type": "llada", "block_size": 8}, None),
        "first-architecture-wins": ({"architectures": ["unknown", "rnd1", "sdar"], "model_type": "steerling"}, None),
        "architecture-over-type": ({"architectures": ["sdar"], "model_type": "llada2_moe", **EDITS}, None),
        "odd-entries": ({"architectures": [3, None, ["sdar"]], "model_type": "rnd1"}, None),
        "odd-type": ({"architectures": [], "model_type": 5}, None),
        "gemma-partial": ({"model_type": "diffusion_gemma", "canvas_length": 32},
                          {"max_new_tokens": 33, "sampler_config": None, "t_min": 0.5}),
        "gemma-zeros": ({"model_type": "diffusion_gemma", "canvas_length": 0},
                        {"max_new_tokens": 0, "max_denoising_steps": 0, "t_max": 0, "t_min": 0, "stability_threshold": 0,
                         "confidence_threshold": 0, "sampler_config": {"entropy_bound": 0}}),
        "gemma-exact": ({"model_type": "diffusion_gemma", "canvas_length": 128}, {"max_new_tokens": 256, "sampler_config": {}}),
    })
    return found


TAILS = ["type", "architecture", "reads", "falsy", "none", "edits", "one-edit", "zero-edits"]
EXPECTED: dict[str, tuple[str, dict]] = {}     # case id -> (default_profile, decode_defaults), as the table gave them


def pin(profile: str, defaults: dict, *ids: str) -> None:
    """`key/*` is each of the key's cases; a later pin of one of them overrides it."""
    for case in ids:
        EXPECTED.update(dict.fromkeys([case] if not case.endswith("/*") else [f"{case[:-1]}{t}" for t in TAILS],
                                      (profile, defaults)))


FAST, SDAR = {"sub_block_len": 8, "rule": "dynamic", "threshold": 0.9}, {"rule": "dynamic", "threshold": 0.95}
pin("fast-dllm-v2", {"block_len": 32, **FAST, "cache": "prefix"}, "Fast_dLLM_Qwen/*")
pin("fast-dllm-v2", {"block_len": 16, **FAST, "cache": "prefix"}, "Fast_dLLM_Qwen/reads")
pin("sdar", {"block_len": 4, **SDAR, "cache": "prefix"}, "sdar/*", "sdar_moe/*", "architecture-over-type")
pin("sdar", {"block_len": 8, **SDAR, "cache": "prefix"}, "sdar/reads", "sdar_moe/reads")
pin("llada2", {"block_len": 32, **SDAR, "cache": "prefix"}, "llada2_moe/*", "bailing_moe_v2/*")
pin("llada2.2", {"block_len": 32, **SDAR, "cache": "prefix"}, "llada2_moe/edits", "llada2_moe/zero-edits",
    "bailing_moe_v2/edits", "bailing_moe_v2/zero-edits")
pin("llada-moe", {"block_len": 32, "rule": "threshold", "threshold": 0.9, "cache": "dual"}, "LLaDAMoEModelLM/*",
    "LLaDAMoEModel/*", "llada-moe-by-architecture")
GEMMA = {"rule": "eb_sampler", "cache": "prefix"}
SAMPLER = {"entropy_bound": 0.1, "denoise_steps": 48, "t_max": 0.8, "t_min": 0.4, "stability_steps": 1,
           "confidence_stop": 0.005}
pin("diffusion-gemma", {"block_len": 256, "gen_len": 256, **GEMMA, **SAMPLER}, "diffusion_gemma/*")
pin("diffusion-gemma", {"block_len": 64, "gen_len": 320, **GEMMA, "entropy_bound": 0.2, "denoise_steps": 24,
                        "t_max": 0.9, "t_min": 0.3, "stability_steps": 2, "confidence_stop": 0.01}, "diffusion_gemma/reads")
pin("diffusion-gemma", {"block_len": 32, "gen_len": 64, **GEMMA, **SAMPLER, "t_min": 0.5}, "gemma-partial")
pin("diffusion-gemma", {"block_len": 256, "gen_len": 256, **GEMMA, **dict.fromkeys(SAMPLER, 0)}, "gemma-zeros")
pin("diffusion-gemma", {"block_len": 128, "gen_len": 256, **GEMMA, **SAMPLER}, "gemma-exact")
pin("nemotron-diffusion", {"block_len": 32, "rule": "threshold", "threshold": 0.9, "cache": "prefix"},
    "nemotron_labs_diffusion/*")
pin("nemotron-diffusion", {"block_len": 8, "rule": "threshold", "threshold": 0.9, "cache": "prefix"},
    "nemotron_labs_diffusion/reads")
RND1 = {"gen_len": 256, "rule": "entropy_schedule", "confidence": "entropy"}
pin("rnd1", {**RND1, "steps": 256, "cache": "none"}, "rnd1/*", "first-architecture-wins", "odd-entries")
pin("rnd1", {**RND1, "steps": 128, "cache": "none"}, "rnd1/reads")
pin("steerling", {"block_len": 64, "rule": "fixed", "cache": "prefix"}, "steerling/*")
pin("steerling", {"block_len": 32, "rule": "fixed", "cache": "prefix"}, "steerling/reads")
pin("illada", {"block_len": 32, "variable_length": True}, "illada/*", "ILLaDAForCausalLM/*", "illada-under-llada")
pin("default", {}, "llada/*", "LLaDAModelLM/*", "Dream/*", "DreamModel/*", "unknown/*", "empty", "llada-8b-by-architecture",
    "odd-type")


@pytest.mark.parametrize("case", list(cases()))
def test_same_profile_and_defaults_as_the_table(case):
    config, generation = cases()[case]
    profile, defaults = EXPECTED[case]
    assert default_profile(config) == profile
    assert decode_defaults(config, generation) == defaults


def test_every_case_is_pinned():
    assert set(EXPECTED) == set(cases())


def test_declarations_are_well_formed():
    """Every DECODES entry names a built-in profile and DecodeConfig fields whose fixed values parse,
    each alias names an entry, and every family module names its checkpoints for `--help`."""
    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.profiles import builtin_profiles
    from fastdllm.models import registry

    declared = registry.decodes()
    for key, entry in declared.items():
        assert set(entry) <= {"profile", "fixed", "from_config"} and entry["profile"] in builtin_profiles(), key
        fallbacks = {field: fallback for field, (_, fallback) in entry.get("from_config", {}).items()}
        values = {**fallbacks, **entry.get("fixed", {})}
        assert DecodeConfig.parse(values) == values, key
    assert "llada2.2" in builtin_profiles()
    text = {m: (registry.FOLDER / f"{m}.py").read_text() for ms in registry.index().served.values() for m in ms}
    assert all("\nNAMES = {" in t for t in text.values()), [m for m, t in text.items() if "\nNAMES = {" not in t]
