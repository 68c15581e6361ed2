"""config.json's model_type -> the family classes that read it, with no central table: a family's
module declares what it serves, and is imported by name when a checkpoint of that model_type is
loaded (as mlx-lm imports `models.<model_type>`).

A family module declares, at its top level:

    SERVES = {"llada": Family(LLaDAConfig, LLaDAModelLM, ("LLaDAModelLM",))}   # model_type -> family
    BY_ARCHITECTURE = {"ILLaDAForCausalLM": "illada"}    # optional: an architecture that names its
                                                         # family whatever the model_type says

and may declare how it decodes when no profile says otherwise, and what people call its checkpoints:

    DECODES = {"sdar": {"profile": "sdar",                      # model_type or architecture -> defaults
                        "fixed": {"rule": "dynamic", "threshold": 0.95, "cache": "prefix"},
                        "from_config": {"block_len": ["block_size", 4]}},   # config.json's key, or this
               "sdar_v2": "sdar"}                               # decodes as the entry named
    NAMES = {"sdar": ["SDAR", "TraDo"]}                         # model_type -> names (`fastdllm --help`)

All are read from the module's source (those statements alone, by ast) without importing it, so listing the model_types,
finding which module serves one, a checkpoint's decoding defaults (decode/family_defaults.py: profile resolution is
torch-free) or the names `--help` gives costs no torch import; the module itself is imported only when a
checkpoint of its type is read (or one of its classes is named: `from fastdllm.models import
LLaDAModelLM`). A model_type served by several modules (`llada`: LLaDA-8B in llada.py, LLaDA-MoE in
llada_moe.py; `architectures` tells them apart) lists the module named after the type first, then
the others by name; with no `architectures` in config.json the first is read.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
from pathlib import Path
from typing import NamedTuple

PACKAGE = __name__.rsplit(".", 1)[0]
FOLDER = Path(__file__).parent

# Families people download that are not implemented yet: named in the error (no module serves them).
NOT_YET = {"llada2_moe_veomni": "LLaDA2's training format (experts merged per layer; convert to the published one)",
           "causal_diffusion": "Steerling's training-package layout (concept keys nested; use the Hub layout, model_type "
                               "steerling)"}


class Family(NamedTuple):
    config: type                      # the config class built from config.json
    model: type                       # the DiffusionLM subclass
    architectures: tuple[str, ...]    # config.json's `architectures` entries it reads


class Index(NamedTuple):
    served: dict[str, list[str]]      # model_type -> modules serving it, in reading order
    by_architecture: dict[str, str]   # architecture -> model_type
    classes: dict[str, str]           # a family's config or model class name -> its module
    decodes: dict[str, dict]          # model_type or architecture -> its DECODES entry (aliases resolved)
    names: dict[str, list[str]]       # model_type -> what its checkpoints are called (`NAMES`), by module


@functools.cache
def index() -> Index:
    """Every family module's declarations, read from source: only the `SERVES`, `BY_ARCHITECTURE`,
    `DECODES` and `NAMES` statements are parsed (a whole-file parse of every family costs ~100 ms),
    and modules without them (layers, kernels) are skipped."""
    served: dict[str, list[str]] = {}
    by_architecture: dict[str, str] = {}
    classes: dict[str, str] = {}
    decodes: dict[str, dict | str] = {}
    names: dict[str, list[str]] = {}
    for info in sorted(pkgutil.iter_modules([str(FOLDER)]), key=lambda m: m.name):
        text = "" if info.ispkg else (FOLDER / f"{info.name}.py").read_text(encoding="utf-8")
        if (serves := _statement(text, "SERVES")) is not None:
            for key, value in zip(serves.keys, serves.values):
                served.setdefault(ast.literal_eval(key), []).append(info.name)
                if isinstance(value, ast.Call):
                    classes.update({a.id: info.name for a in value.args[:2] if isinstance(a, ast.Name)})
        if (claims := _statement(text, "BY_ARCHITECTURE")) is not None:
            by_architecture.update(ast.literal_eval(claims))
        if (declared := _statement(text, "DECODES")) is not None:
            decodes.update(ast.literal_eval(declared))
        if (called := _statement(text, "NAMES")) is not None:
            for model_type, spelled in ast.literal_eval(called).items():
                names.setdefault(model_type, []).extend(spelled)
    for model_type, modules in served.items():       # the module named after the type first
        modules.sort(key=lambda m: m != model_type.lower())
    aliases = {key: decodes[target] for key, target in decodes.items() if isinstance(target, str)}
    return Index(served, by_architecture, classes, {**decodes, **aliases}, names)


def _statement(text: str, name: str) -> ast.Dict | None:
    """The dict assigned to `name` at the module's top level (`NAME = {...}`, possibly over several
    lines), parsed alone."""
    start = text.find(f"\n{name} = {{")
    if start < 0:
        return None
    lines = text[start + 1:].split("\n")
    for end in range(1, len(lines) + 1):
        try:
            node = ast.parse("\n".join(lines[:end])).body[0]
        except SyntaxError:
            continue
        return node.value if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) else None
    return None


def model_types() -> list[str]:
    return list(index().served)


def by_architecture() -> dict[str, str]:
    return dict(index().by_architecture)


def decodes() -> dict[str, dict]:
    """model_type or architecture -> the family's declared decoding defaults (`DECODES`; an alias
    resolved to the entry it names, which is declared as a dict)."""
    return dict(index().decodes)


def names() -> list[str]:
    """What the families' checkpoints are called (`NAMES`), by module, each once."""
    return list(dict.fromkeys(n for called in index().names.values() for n in called))


def names_of(model_type: str) -> list[str]:
    """What checkpoints of `model_type` are called ([] where no module names them)."""
    return list(index().names.get(model_type, []))


@functools.cache
def families(model_type: str) -> list[Family]:
    """The families published under `model_type` (empty if none), their modules imported and their
    classes registered with transformers' Auto classes."""
    found = [importlib.import_module(f"{PACKAGE}.{m}").SERVES[model_type] for m in index().served.get(model_type, [])]
    if found:
        _register(model_type, found)
    return found


def all_families() -> dict[str, list[Family]]:
    """model_type -> families, every family module imported (tests, `fastdllm.models.FAMILIES`)."""
    return {model_type: families(model_type) for model_type in model_types()}


def class_named(name: str) -> type | None:
    """A family's config or model class by name, its module imported and its model_types registered
    (a library user's AutoTokenizer then reads the checkpoint's config as ours); None if no family declares it."""
    module = index().classes.get(name)
    if not module:
        return None
    loaded = importlib.import_module(f"{PACKAGE}.{module}")
    for model_type in loaded.SERVES:
        families(model_type)
    return getattr(loaded, name)


def _register(model_type: str, found: list[Family]) -> None:
    """Registering our classes makes AutoConfig/AutoModel use them instead of the `auto_map` Python
    files that published checkpoints carry: no code from a checkpoint directory ever runs.
    AutoConfig knows one class per model_type: the first family's. A model_type transformers
    implements itself (diffusion_gemma) keeps its own classes there: we load ours directly."""
    from transformers import AutoConfig, AutoModel
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if model_type in CONFIG_MAPPING_NAMES:
        return
    AutoConfig.register(model_type, found[0].config, exist_ok=True)
    for family in found:
        if family.model.config_class is family.config:
            AutoModel.register(family.config, family.model, exist_ok=True)
