"""The flags every command shares, declared once: the decoding flags (one per DecodeConfig field),
the model flags, and how a command receives them (`generation_options`: as RunOptions;
`decoding_options`: the decoding flags only). Placement flags fall back on FASTDLLM_* variables."""

from __future__ import annotations

import functools
import inspect
import os
import typing
from dataclasses import dataclass, fields
from typing import Annotated, Any, Optional

import typer

from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.config_values import type_of
from fastdllm.errors import UsageError


def _decode_flag(f) -> tuple[Any, Any]:
    """A DecodeConfig field as a flag: --field-name, its type (None = not given), its help."""
    kind, _ = type_of(f)
    names = ((f"--{f.name.replace('_', '-')}/--no-{f.name.replace('_', '-')}",) if kind == "bool"
             else (f"--{f.name.replace('_', '-')}", *SHORT_FLAGS.get(f.name, ())))
    text = f.metadata["help"] + (f": {' | '.join(f.metadata['choices'])}" if "choices" in f.metadata else "")
    return Optional[{"int": int, "float": float, "bool": bool, "str": str}[kind]], \
        typer.Option(*names, help=text[0].upper() + text[1:] + ".")


# name -> (type, typer.Option): every DecodeConfig field, then how to load the model.
SHORT_FLAGS = {"gen_len": ("-n",), "seed": ("-s",)}
DECODE_FLAGS = {f.name: _decode_flag(f) for f in fields(DecodeConfig)}
MODEL_FLAGS = {
    "model": (Optional[str], typer.Option("--model", "-m", help="Checkpoint directory, catalog name (dream:7b) or hub id (default: built-in model).")),
    "profile": (Optional[str], typer.Option("--profile", "-P", help="Profile name or YAML file (default: 'default').")),
    "dtype": (Optional[str], typer.Option("--dtype", help="auto | bf16 | fp16 | fp32 | fp64 (auto: bf16 on GPU; on CPU bf16 where faster, AMX or a cached probe, else fp32; `info` says which).")),
    "device": (Optional[str], typer.Option("--device", help="auto | cpu | cuda | cuda:N (auto spreads over GPUs with accelerate).")),
    "quantize": (Optional[str], typer.Option("--quantize", help="none | int8 | int4 (CPU kernels) | 8bit | 4bit (bitsandbytes, for GPUs).")),
    "device_map": (Optional[str], typer.Option("--device-map", help="auto | balanced | sequential: split the model over the GPUs, the CPU and disk with accelerate's planner (docs/guide/placement.md).")),
    "max_memory": (Optional[str], typer.Option("--max-memory", help="What each device may hold, e.g. 0=20GiB,1=22GiB,cpu=30GiB,disk (disk: offload the rest to a temporary folder); implies --device-map auto.")),
    "force": (Optional[bool], typer.Option("--force", help="Load even when the memory estimate says it will not fit (FASTDLLM_FORCE=1).")),
}
# tensor parallel (cli/parallel.split_over), for the commands that split one model over processes
TENSOR_PARALLEL = typer.Option("--tp", help="Tensor parallel over N processes, one per GPU (or sharing the CPU's cores), each holding 1/N of every layer; as `torchrun --nproc-per-node N -m fastdllm COMMAND --tp N ...`, started here outside a launcher (docs/specs/tensor-parallel.md).")
# `info` and `recommend` judge this machine, or one described (checkpoints/fit.py `described`)
ASSUME_GPUS = typer.Option("--assume-gpus", help="Judge for a described machine, not this one: its GPUs, e.g. 2x24GiB, 24GiB,16GiB, none.")
ASSUME_RAM = typer.Option("--assume-ram", help="The described machine's RAM, e.g. 64GiB (default: this machine's available RAM).")
MODEL_DEFAULTS = {"dtype": "auto", "device": "auto", "quantize": "none",   # when neither flag nor env
                  "device_map": "", "max_memory": ""}                     # "": the model whole on --device


@dataclass
class RunOptions:
    model: str | None
    profile: str | None
    dtype: str
    device: str
    quantize: str
    decode: dict[str, Any]          # DecodeConfig overrides from flags (None = not given)
    force: bool = False             # skip the fit verdict (checkpoints/fit.py)
    device_map: str = ""            # a split over devices (checkpoints/split.py); "": none
    max_memory: str = ""


def generation_options(func):
    """Add the model and decoding flags to a Typer command; it receives them as `opts`."""
    flags = {**MODEL_FLAGS, **DECODE_FLAGS}

    def wrapper(**kwargs):
        values = {name: kwargs.pop(name) for name in flags}
        opts = RunOptions(model=values["model"] or os.environ.get("FASTDLLM_MODEL"),
                          profile=values["profile"] or os.environ.get("FASTDLLM_PROFILE"),
                          **model_placement(**{k: values[k] for k in MODEL_DEFAULTS}),
                          decode={k: values[k] for k in DECODE_FLAGS}, force=forced(values["force"]))
        return func(opts=opts, **kwargs)

    return with_options(func, wrapper, flags, drop="opts")


def decoding_options(func):
    """Add only the decoding flags (no model or profile flags) to a Typer command; it receives them
    as `decode` (DecodeConfig overrides, None = not given)."""
    def wrapper(**kwargs):
        return func(decode={name: kwargs.pop(name) for name in DECODE_FLAGS}, **kwargs)

    return with_options(func, wrapper, DECODE_FLAGS, drop="decode")


def with_options(func, wrapper, flags: dict, drop: str | None = None):
    """Give `wrapper` the signature Typer reads: `func`'s own parameters (less `drop`) plus
    keyword options `flags` (name -> (type, typer.Option))."""
    hints = typing.get_type_hints(func, include_extras=True)   # resolved, Annotated metadata kept
    own = [p.replace(annotation=hints[p.name]) for p in inspect.signature(func).parameters.values()
           if p.name != drop]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                               annotation=Annotated[kind, option]) for name, (kind, option) in flags.items()]
    params = own + extra
    wrapper = functools.wraps(func)(wrapper)
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


def model_placement(**given: str | None) -> dict[str, str]:
    """dtype / device / quantize / device_map / max_memory: the flag, else FASTDLLM_DTYPE etc., else
    the default; an unknown value is a usage error naming where it came from."""
    from fastdllm.checkpoints.placement import placement_error
    from fastdllm.checkpoints.split import split_of

    chosen = {}
    for key, default in MODEL_DEFAULTS.items():
        env = f"FASTDLLM_{key.upper()}"
        source, value = (f"--{key}", given[key]) if given.get(key) else (env, os.environ.get(env) or default)
        if key in PLACEMENT_KEYS and (problem := placement_error(key, value)):
            raise UsageError(f"{source}: {problem}")
        chosen[key] = value
    split_of(chosen["device"], chosen["device_map"], chosen["max_memory"])    # a usage error, one line
    return chosen


PLACEMENT_KEYS = ("dtype", "device", "quantize")      # the split's two flags are checked together (split.py)


def forced(flag: bool | None) -> bool:
    """--force, else FASTDLLM_FORCE (bench and eval, which load without the shared model flags)."""
    return bool(flag) or os.environ.get("FASTDLLM_FORCE", "") not in ("", "0")


def comma_names(values: list[str] | None) -> list[str] | None:
    """Repeated flags and comma lists alike: ['a,b', 'c'] -> ['a', 'b', 'c']."""
    if values is None:
        return None
    return [n.strip() for v in values for n in v.split(",") if n.strip()]
