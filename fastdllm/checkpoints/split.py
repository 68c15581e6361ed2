"""A model split over devices: --device-map auto|balanced|sequential and --max-memory DEVICE=SIZE,...
(accelerate's own planner, run on an empty copy of the model before any weight is read), disk
offload into a temporary folder that goes with the model, and the one-line refusals of what cannot
run split. The flags are checked without torch; the plan imports it.

On a split, each block computes on its execution device (a GPU, or for layers offloaded to the CPU
or to disk the first GPU, else the CPU): accelerate's hooks bring the block's inputs and weights
there, the canvas cache allocates each layer's K/V there (models/base.py `new_cache`), and the
logits come back to the canvas's device (decode/step.py)."""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass

from ..errors import UsageError, UserError

STRATEGIES = ("auto", "balanced", "sequential")      # accelerate's: auto = balanced over the GPUs
UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,      # accelerate's reading:
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}                  # GB decimal, GiB binary


@dataclass(frozen=True)
class Split:
    strategy: str                       # auto | balanced | sequential
    budgets: dict[int | str, int]       # device (GPU index, "cpu", "mps") -> bytes; empty: what is free
    disk: bool                          # whether layers may go to a temporary offload folder
    cpu_only: bool = False              # --device cpu: the CPU (and disk) alone
    given: str = ""                     # --max-memory as written

    def describe(self) -> str:
        return f"--device-map {self.strategy}" + (f" --max-memory {self.given}" if self.given else "")


def parse_size(text: str) -> int:
    """'200MB' -> 200_000_000, '1.5GiB' -> 1610612736 (accelerate's units); ValueError otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in UNITS:
        raise ValueError(f"size {text!r} (expected a number and a unit: 200MB, 22GiB)")
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


def parse_device(text: str) -> int | str:
    """'0' / 'cuda:0' -> 0 (accelerate's key for a GPU), 'cpu', 'mps'; ValueError otherwise."""
    name = text.strip().lower()
    if re.fullmatch(r"(cuda:)?\d+", name):
        return int(name.split(":")[-1])
    if name in ("cpu", "mps"):
        return name
    raise ValueError(f"device {text!r} (expected N or cuda:N for a GPU, cpu, mps, or disk)")


def device_name(device: int | str) -> str:
    return f"cuda:{device}" if isinstance(device, int) else device


def parse_max_memory(text: str) -> tuple[dict[int | str, int], bool]:
    """'0=22GiB,cpu=9GiB,disk' -> ({0: ..., 'cpu': ...}, disk allowed). `disk` takes no size."""
    budgets, disk = {}, False
    for item in filter(None, (part.strip() for part in text.split(","))):
        if item.lower() == "disk":
            disk = True
            continue
        if "=" not in item:
            raise ValueError(f"{item!r} (expected DEVICE=SIZE, or disk)")
        name, size = item.split("=", 1)
        if name.strip().lower() == "disk":
            raise ValueError("disk takes no size (the offload folder holds what the devices do not)")
        budgets[parse_device(name)] = parse_size(size)
    if not budgets and not disk:
        raise ValueError("nothing given (expected DEVICE=SIZE,...: cpu=200MB,disk)")
    return budgets, disk


def split_of(device: str, device_map: str | None, max_memory: str | None) -> Split | None:
    """The split the flags ask for, or None (the model whole on --device). --max-memory alone means
    --device-map auto. UsageError, one line, for what does not go together."""
    if not device_map and not max_memory:
        return None
    strategy = device_map or "auto"
    if strategy not in STRATEGIES:
        raise UsageError(f"--device-map {strategy}: expected one of {', '.join(STRATEGIES)}")
    try:
        budgets, disk = parse_max_memory(max_memory) if max_memory else ({}, False)
    except ValueError as e:
        raise UsageError(f"--max-memory: {e}") from None
    if device not in ("auto", "cpu"):
        raise UsageError(f"--device {device} puts the whole model on one device; --device-map spreads it: "
                         f"name the devices in --max-memory (e.g. 0=20GiB,cpu=8GiB) instead")
    if device == "cpu" and any(d != "cpu" for d in budgets):
        raise UsageError(f"--device cpu with --max-memory {max_memory}: only cpu and disk go with --device cpu")
    return Split(strategy, budgets, disk, cpu_only=device == "cpu", given=max_memory or "")


def plan(model_cls, config, dtype, split: Split) -> dict[str, int | str]:
    """accelerate's device map for this model under `split`: module name -> GPU index, 'cpu' or
    'disk', planned on an empty model (no weight read). UserError where it needs the disk and
    `disk` was not given."""
    from accelerate import init_empty_weights, infer_auto_device_map
    from accelerate.utils import get_balanced_memory, get_max_memory

    # "Some parameters are on the meta device because they were offloaded": said by note() instead
    logging.getLogger("accelerate.big_modeling").setLevel(logging.ERROR)

    config = copy.copy(config)
    config._attn_implementation = "eager"             # as loading asks: our modules compute attention themselves
    with init_empty_weights():
        empty = model_cls(config).to(dtype)           # sizes in the dtype loaded (accelerate's `dtype` only lowers)
    free = get_max_memory()                             # what each device has free now, as accelerate reads it
    if split.cpu_only:
        free = {"cpu": free["cpu"]}
    budgets = {**({} if split.budgets else free), **split.budgets}
    no_split = model_cls._no_split_modules
    if split.strategy != "sequential":
        budgets = get_balanced_memory(empty, budgets, no_split_module_classes=no_split, dtype=dtype)
    device_map = infer_auto_device_map(empty, max_memory=budgets, no_split_module_classes=no_split, dtype=dtype)
    if "disk" in device_map.values() and not split.disk:
        on_disk = sum(1 for d in device_map.values() if d == "disk")
        raise UserError(f"{split.describe()}: {on_disk} of the model's parts fit on no device: add `disk` to "
                        f"--max-memory to offload them to a temporary folder (slower), or give the devices more")
    return device_map


def refuse_split(device_map: dict, quantize: str, cpu_formats: tuple[str, ...]) -> None:
    """What cannot run split, in one line each, with what runs instead."""
    places = set(device_map.values())
    if quantize in cpu_formats and places != {"cpu"}:
        raise UserError(f"--quantize {quantize} quantizes the weights it holds in memory, and this split leaves "
                        f"some {'on disk' if 'disk' in places else 'on a GPU'}: use --quantize {quantize} whole on "
                        f"the CPU (about {'1/2' if quantize == 'int8' else '1/4'} of bf16's memory), or --quantize "
                        f"none with the split")
    if quantize in ("8bit", "4bit") and places & {"cpu", "disk"} and places - {"cpu", "disk"}:
        raise UserError(f"--quantize {quantize} keeps bitsandbytes layers on the GPUs only: give the GPUs more "
                        f"--max-memory, or a smaller --quantize (4bit), or --quantize none to offload to cpu/disk")
    if quantize in ("8bit", "4bit") and "disk" in places:
        raise UserError(f"--quantize {quantize} with layers on disk: bitsandbytes does not offload to disk; "
                        f"use --quantize none with disk")


def note(device_map: dict) -> str | None:
    """The line a split load prints: where the parts went, and what it costs."""
    counts = summary(device_map)
    if len(counts) < 2:
        return None
    where = ", ".join(f"{n} on {d}" for d, n in counts.items())
    gpus = [d for d in counts if d.startswith("cuda")]
    # what computes elsewhere than it is kept: disk always; the CPU's parts where a GPU computes them
    brought = [d for d in ("cpu", "disk") if d in counts and (gpus or d == "disk")]
    costs = ([f"the parts on {'/'.join(brought)} are brought to {gpus[0] if gpus else 'the CPU'} at every "
              f"forward (slower)"] if brought else []) + \
        (["CUDA graphs off (a graph runs on one device): steps run eager"] if gpus else [])
    return f"split over {len(counts)} devices ({where} of the model's parts)" + (f"; {'; '.join(costs)}" if costs else "")


def summary(device_map: dict) -> dict[str, int]:
    """Device -> how many of the map's parts sit there ({'cpu': 2, 'disk': 3})."""
    counts: dict[str, int] = {}
    for device in device_map.values():
        counts[device_name(device)] = counts.get(device_name(device), 0) + 1
    return counts
