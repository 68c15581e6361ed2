"""Decoding profiles: YAML files whose keys are DecodeConfig field names (plus `description`).

Resolution order, last wins: built-in defaults < model defaults < profile < FASTDLLM_* environment
< command-line flags. Model defaults are the family's own (family_defaults.py: block size and rule of
the block-diffusion families), then the `fastdllm` section of a checkpoint's generation_config.json
(our built-in model carries one; published checkpoints have none).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import UsageError
from .config import ConfigError, DecodeConfig
from .family_defaults import decode_defaults, default_profile
from .rules import RULES

ENV_PREFIX = "FASTDLLM_"
DEFAULTS = DecodeConfig()


@dataclass(frozen=True)
class Profile:
    name: str
    source: str               # "built-in", "user" or a file path
    path: Path | None
    values: dict[str, Any]    # DecodeConfig fields only
    description: str = ""


def user_profile_dirs() -> list[Path]:
    dirs = []
    if env := os.environ.get("FASTDLLM_PROFILE_DIR"):
        dirs.append(Path(env).expanduser())
    dirs.append(Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "fastdllm" / "profiles")
    return dirs


def builtin_profiles() -> dict[str, Path]:
    root = resources.files("fastdllm.builtin_profiles")   # the top-level profiles/ folder
    return {Path(e.name).stem: Path(str(e)) for e in root.iterdir() if e.name.endswith(".yaml")}


def available() -> list[Profile]:
    """Every profile by name, user profiles shadowing built-in ones of the same name."""
    found = {name: load_file(path, name, "built-in") for name, path in sorted(builtin_profiles().items())}
    for directory in reversed(user_profile_dirs()):
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found[path.stem] = load_file(path, path.stem, "user")
    return sorted(found.values(), key=lambda p: p.name)


def find(name_or_path: str) -> Profile:
    """A profile by name (user dirs first, then built-in) or by a file path."""
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise UsageError(f"profile file not found: {path}")
        return load_file(path, path.stem, str(path))
    for directory in user_profile_dirs():
        candidate = directory / f"{name_or_path}.yaml"
        if candidate.is_file():
            return load_file(candidate, name_or_path, "user")
    builtin = builtin_profiles()
    if name_or_path in builtin:
        return load_file(builtin[name_or_path], name_or_path, "built-in")
    names = ", ".join(sorted({p.name for p in available()}))
    raise UsageError(f"unknown profile '{name_or_path}' (available: {names})")


def load_file(path: Path, name: str, source: str) -> Profile:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(f"profile {path}: cannot parse YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UsageError(f"profile {path}: expected a mapping of settings, got {type(data).__name__}")
    description = str(data.pop("description", "") or "")
    try:
        values = DecodeConfig.parse(data)     # keys, types and ranges, each value on its own
    except ConfigError as e:
        raise UsageError(f"profile {path}: {e}") from None
    return Profile(name, source, path, values, description)


def env_overrides(environ: dict[str, str] | None = None) -> dict[str, str]:
    environ = os.environ if environ is None else environ
    names = {f.name for f in fields(DecodeConfig)}
    return {k[len(ENV_PREFIX):].lower(): v for k, v in environ.items()
            if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() in names}


def model_defaults(model_dir: Path | None) -> dict[str, Any]:
    """The family's decoding defaults (family_defaults.py; DiffusionGemma's read its published
    generation_config.json), then the `fastdllm` section of the checkpoint's generation_config.json
    (our built-in model has one)."""
    if model_dir is None:
        return {}
    generation = _json(model_dir / "generation_config.json")
    defaults = decode_defaults(_json(model_dir / "config.json"), generation)
    section = generation.get("fastdllm", {})
    return {**defaults, **(section if isinstance(section, dict) else {})}


def default_profile_for(model_dir: Path | None) -> str:
    """The profile a run uses when none is named: the family's own (SDAR, Fast-dLLM v2), else 'default'."""
    return default_profile(_json(model_dir / "config.json")) if model_dir is not None else "default"


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def resolve(profile: Profile | None, flags: dict[str, Any], model_dir: Path | None = None,
            environ: dict[str, str] | None = None) -> DecodeConfig:
    """Apply the layers in order; each layer is validated as it is applied, the result as a whole."""
    layers = [("model defaults", model_defaults(model_dir)),
              (f"profile {profile.name}" if profile else "profile", profile.values if profile else {}),
              ("environment", env_overrides(environ)),
              ("flags", {k: v for k, v in flags.items() if v is not None})]
    merged: dict[str, Any] = {}
    set_at: dict[str, int] = {}                     # key -> the layer that set it last
    for i, (label, values) in enumerate(layers):
        try:
            parsed = DecodeConfig.parse(values)       # a bad value is reported with its layer
        except ConfigError as e:
            raise UsageError(f"{label}: {e}") from None
        merged.update(parsed)
        set_at.update(dict.fromkeys(parsed, i))
    self_spec_drafts(merged, set_at)
    if "steps" in merged and "block_steps" in merged and set_at["steps"] != set_at["block_steps"]:
        merged.pop("block_steps" if set_at["steps"] > set_at["block_steps"] else "steps")   # the later layer's count
    if RULES[merged.get("rule", DEFAULTS.rule)].whole_canvas and "block_len" not in merged:
        merged["block_len"] = merged.get("gen_len", DEFAULTS.gen_len)      # one global canvas (RND1)
    return DecodeConfig.from_dict(merged)


def self_spec_drafts(merged: dict[str, Any], set_at: dict[str, int]) -> None:
    """Nemotron's mode self_spec drafts by the checkpoint's own default, linear_spec_generate's
    threshold 0 (one draft forward fills every mask; docs/specs/nemotron-diffusion.md 5), unless the layer
    that chose the mode, or a later one, chose the rule or the threshold: a profile's threshold 0.9
    for block decoding is not a draft threshold. Threshold 0 is spelled rule fixed there."""
    if merged.get("mode") != "self_spec":
        return
    mode_at = set_at["mode"]
    if max(set_at.get("rule", -1), set_at.get("threshold", -1)) < mode_at:
        merged["rule"] = "fixed"
        if set_at.get("steps", -1) < mode_at:
            merged.pop("steps", None)               # one step per token: no schedule to divide
