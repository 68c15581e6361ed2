"""A checkpoint's config.json -> its family: the config class built from it, the model class, and
what fastdllm can say about it before any weight is read (models/config_guard.py: switches the
family does not implement are refused, keys nobody listed are named)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..models.config_guard import refusal_line, refusals, unknown_keys


def read_config(path: Path) -> dict:
    if not path.is_dir():
        raise UserError(f"model directory not found: {path}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise UserError(f"{path} has no config.json; is it a checkpoint directory?")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"cannot read {config_file}: {e}") from None
    if not isinstance(config, dict):
        raise UserError(f"{config_file} does not hold a JSON object")
    return config


def family_of(config: dict, path: Path, *, refuse: bool = True):
    """(the family's config built from config.json, its model class, notes for the user); one-line
    errors for an unknown family or a malformed config. A switch fastdllm does not implement is
    refused, or with `refuse=False` (`info`) a note; config keys no list knows are a note."""
    from ..models import registry

    model_type = config.get("model_type")
    notes = []
    by_architecture = registry.by_architecture()
    named = [by_architecture[a] for a in config.get("architectures") or [] if a in by_architecture]
    if named and model_type != named[0]:        # the class name decides (models/registry.py)
        notes.append(f"model_type {model_type!r} read as {named[0]!r}, the family of its architecture "
                     f"{config['architectures'][0]}")
        config["model_type"] = model_type = named[0]     # callers then read the family's type from config
    families = registry.families(model_type) if isinstance(model_type, str) else []   # its modules imported
    if not families:
        known = ", ".join(registry.model_types())
        what = f"{registry.NOT_YET[model_type]} is not supported yet: " if model_type in registry.NOT_YET else "unsupported "
        raise UserError(f"{what}model_type {model_type!r} in {path / 'config.json'} (supported: {known})")
    declared = config.get("architectures") or list(families[0][2])
    found = [(c, m, a) for c, m, a in families if set(declared) & set(a)]
    if not found:
        supported = ", ".join(a for _, _, architectures in families for a in architectures)
        raise UserError(f"unsupported architecture {declared} for model_type {model_type!r} (supported: {supported})")
    config_class, model_cls, architectures = found[0]
    name = model_type if len(families) == 1 else f"{model_type} ({architectures[0]})"
    if refused := refusals(config, config_class, name):
        if refuse:
            raise UserError(refusal_line(refused))
        notes.extend(refused.values())
    if unknown := unknown_keys(config, config_class):
        notes.append(f"config.json has keys fastdllm's {name} does not know: {', '.join(unknown)} (if one changes "
                     "the model, its answers may differ from its authors')")
    built = config_class.from_dict(config)
    if problems := built.malformed():       # models/base.py FamilyConfig
        raise UserError(f"malformed {path / 'config.json'}: {'; '.join(problems)}")
    return built, model_cls, notes
