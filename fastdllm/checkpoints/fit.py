"""Will it fit? `info`'s memory estimate against this machine (free memory of each GPU, or the
system's available RAM) or a described one (--assume-gpus 2x24GB), before any weight is read, and
the one line that refuses what cannot fit, naming the quantization and the split that would
(fit_split.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .fit_split import HEADROOM, parse_gpus, propose

GIB = 2**30          # HEADROOM: CUDA context or the process itself, allocator slack, a step's activations and logits


@dataclass(frozen=True)
class Machine:
    kind: str               # "gpu" or "cpu"
    label: str              # "this GPU", "cuda:1", "2 GPUs", "this machine's RAM"
    free_bytes: int         # where the weights go whole: the GPU(s), else RAM
    gpus: tuple[int, ...] = ()          # free bytes of each GPU a split may use (one GPU: --device cuda:N)
    ram: int | None = field(default=None)   # the RAM a split may offload to (None: not considered)

    def fits(self, need: int) -> bool:
        return need + HEADROOM <= self.free_bytes


def this_machine(device: str = "auto") -> Machine:
    """Where the weights go: the named GPU, every GPU (--device auto spreads over them), else RAM."""
    import torch

    if device != "cpu" and torch.cuda.is_available():
        if device.startswith("cuda:"):
            index = int(device.split(":")[1])
            return Machine("gpu", device, torch.cuda.mem_get_info(index)[0])
        if device == "cuda":
            return Machine("gpu", "this GPU", torch.cuda.mem_get_info(torch.cuda.current_device())[0])
        free = [torch.cuda.mem_get_info(i)[0] for i in range(torch.cuda.device_count())]
        return Machine("gpu", "this GPU" if len(free) == 1 else f"{len(free)} GPUs", sum(free), tuple(free),
                       available_ram())
    return Machine("cpu", "this machine's RAM", available_ram(), (), available_ram())


def described(gpus: str | None, ram: str | None, device: str = "auto") -> Machine:
    """This machine, or the one --assume-gpus (2x24GB, 24GiB,16GiB, none) and --assume-ram (64GB)
    describe: all of a described device's memory is free. UsageError, one line."""
    from ..errors import UsageError
    from .split import parse_size

    if gpus is None and ram is None:
        return this_machine(device)
    try:
        sizes = parse_gpus(gpus) if gpus is not None else list(this_machine(device).gpus)
        memory = parse_size(ram) if ram is not None else available_ram()
    except ValueError as e:
        raise UsageError(f"--assume-{'gpus' if gpus is not None else 'ram'}: {e}") from None
    if device == "cpu" or not sizes:
        return Machine("cpu", f"{gib(memory)} of RAM", memory, (), memory)
    label = (f"one {gib(sizes[0])} GPU" if len(sizes) == 1 else f"{len(sizes)}x {gib(sizes[0])} GPUs"
             if len(set(sizes)) == 1 else f"{len(sizes)} GPUs ({' + '.join(gib(s) for s in sizes)})")
    return Machine("gpu", label, sum(sizes), tuple(sizes), memory)


def available_ram() -> int:
    """MemAvailable (Linux: what can be had without swapping), else the physical total."""
    import os

    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def choices(kind: str, packed_experts: bool = False) -> list[tuple[str, str]]:
    """(estimate key, the flags that choose it), best quality first, for this kind of machine."""
    if kind == "gpu":
        return [("bf16", "--dtype bf16"), ("8bit", "--quantize 8bit"), ("4bit", "--quantize 4bit")]
    cpu = [("fp32", "--dtype fp32"), ("bf16", "--dtype bf16")]
    return cpu if packed_experts else cpu + [("int8", "--quantize int8"), ("int4", "--quantize int4")]


def chosen_key(kind: str, dtype: str, quantize: str) -> str:
    """The estimate key of what the flags load: --quantize, else the dtype (auto: bf16 on a GPU, fp32 on a CPU;
    check() first resolves a CPU's auto to what it will load, cpu_dtype.py)."""
    if quantize != "none":
        return quantize
    if dtype == "auto":
        return "bf16" if kind == "gpu" else "fp32"
    return {"fp16": "bf16", "fp64": "fp64"}.get(dtype, dtype)


def with_float_widths(memory: dict[str, dict[str, int]]) -> dict[str, int]:
    """memory_estimate's totals, plus fp32 / fp64 (every weight and the cache 2x / 4x bf16's)."""
    totals = {k: v["total"] for k, v in memory.items()}
    totals["fp32"], totals["fp64"] = 2 * totals["bf16"], 4 * totals["bf16"]
    return totals


def refusal(name: str, totals: dict[str, int], key: str, machine: Machine, packed_experts: bool = False,
            cache: int = 0, layers: int = 32) -> str | None:
    """None when `key` fits; else one line: what it needs, what is free, and what would fit: a
    smaller form, or the same form split (fit_split.py; `cache`: the canvas cache's bytes in
    `totals`, `layers`: the model's)."""
    need = totals.get(key)
    if need is None or fits_whole(need, machine):
        return None
    split = split_for(totals, key, machine, cache, layers)
    also = f", or split it: {split.line()}" if split else ""
    # where only the headroom is missing, say so: "needs 10.5 GiB; has 11.0 GiB free" alone would puzzle
    spare = f" and {gib(HEADROOM)} to run" if need <= machine.free_bytes else ""
    what = f"{name} needs {gib(need)} at {key}{spare}; {machine.label} has {gib(machine.free_bytes)} free"
    order = choices(machine.kind, packed_experts)
    keys = [k for k, _ in order]
    # the forms after this one, best quality first (fp64 or an unknown key: every smaller form)
    later = order[keys.index(key) + 1:] if key in keys else [c for c in order if totals.get(c[0], need) < need]
    for k, flag in later:
        if k in totals and fits_whole(totals[k], machine):
            return f"{what}: try {flag} ({gib(totals[k])}){also}, or --force to load anyway"
    if split:
        return f"{what}: split it: {split.line()}, or --force to load anyway"
    least = min(totals[k] for k, _ in choices(machine.kind, packed_experts) if k in totals)
    return (f"{what}: even the smallest form needs {gib(least)}; try a smaller model "
            f"(`fastdllm recommend`), or --force to load anyway")


def verdict(name: str, totals: dict[str, int], key: str, machine: Machine, packed_experts: bool = False,
            cache: int = 0, layers: int = 32) -> str:
    """`info`'s line: where form `key` fits on `machine` (one device, or spread over its GPUs), else
    the refusal, with the smaller form and the split that would hold it."""
    need = totals[key]
    if machine.kind == "gpu" and len(machine.gpus) > 1 and max(machine.gpus) < need + HEADROOM \
            and (spread := split_for(totals, key, machine, cache, layers, ram=False)):
        return f"fits at {key} over {spread.line()}"
    if refused := refusal(name, totals, key, machine, packed_experts, cache, layers):
        return refused
    where = f"one of {machine.label}" if len(machine.gpus) > 1 else machine.label
    return f"fits at {key} on {where} ({gib(need)} of {gib(max(machine.gpus or [machine.free_bytes]))} free)"


def fits_whole(need: int, machine: Machine) -> bool:
    """On one GPU (several: the weights split over them, as --device auto does, where they hold it), or in RAM."""
    if len(machine.gpus) > 1:
        return max(machine.gpus) >= need + HEADROOM or split_for({"x": need}, "x", machine, 0, 32, ram=False) is not None
    return machine.fits(need)


def split_for(totals: dict[str, int], key: str, machine: Machine, cache: int, layers: int, ram: bool = True):
    """The split (fit_split.Proposal) that holds form `key` here, or None. `cache`: its bf16 bytes
    (fp32 / fp64 weigh 2x / 4x). The CPU's int8 / int4 kernels quantize weights held in memory and
    bitsandbytes keeps its layers on GPUs (split.refuse_split): those split over GPUs only."""
    if key in ("int8", "int4"):
        return None
    cache *= {"fp32": 2, "fp64": 4}.get(key, 1)
    gpus = list(machine.gpus) or ([machine.free_bytes] if machine.kind == "gpu" else [])
    offload = ram and key not in ("8bit", "4bit")
    return propose(totals[key] - cache, cache, layers, gpus, machine.ram if offload else None)


def estimate(model_dir: Path, canvas_tokens: int) -> tuple[dict[str, int], bool, int, int]:
    """(totals by key, packed experts?, the bf16 canvas cache's bytes, layers) for a checkpoint
    directory, from its headers: no weights read."""
    from safetensors import safe_open

    from .family import family_of, read_config
    from .gguf_folder import source_of
    from .info import gguf_shapes, memory_estimate, shape_summary, shard_files

    config, _, _ = family_of(read_config(model_dir), model_dir, refuse=False)
    shapes = {}
    if (gguf := source_of(model_dir)) is not None:          # a GGUF file's folder (gguf_folder.py)
        shapes = gguf_shapes(gguf)
    for shard in [] if gguf else shard_files(model_dir):
        with safe_open(str(shard), "pt") as f:
            shapes.update({n: f.get_slice(n).get_shape() for n in f.keys()})
    info = shape_summary(shapes, config)
    memory = memory_estimate(info, canvas_tokens)
    return with_float_widths(memory), info["packed_experts"], memory["bf16"]["cache"], config.num_hidden_layers


def check(model_dir: Path, name: str, *, dtype: str, device: str, quantize: str, canvas_tokens: int,
          device_map: str = "", max_memory: str = "", machine: Machine | None = None) -> str | None:
    """The refusal line for loading `model_dir` this way here (or on `machine`), or None (fits, or
    cannot be told). A split the flags ask for is accelerate's to plan (split.py): not judged here."""
    if device_map or max_memory:
        return None
    try:
        totals, packed, cache, layers = estimate(model_dir, canvas_tokens)
    except Exception:      # headers unreadable: loading itself reports that in its own words
        return None
    machine = machine or this_machine(device)
    from .gguf_folder import source_of
    from .gguf_int4 import default_quantize

    if (gguf := source_of(model_dir)) is not None:           # a Q4_0 / Q4_K file loads as int4 on a CPU
        quantize, _ = default_quantize(gguf, quantize, device, dtype)
    if dtype == "auto" and machine.kind == "cpu" and quantize == "none":
        from .cpu_dtype import auto_choice

        dtype = auto_choice().dtype          # the size of what auto will load here
    return refusal(name, totals, chosen_key(machine.kind, dtype, quantize), machine, packed, cache, layers)


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.0f} MiB"
