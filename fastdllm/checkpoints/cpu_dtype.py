"""What `--dtype auto` means on a CPU: bf16 where it is the faster format here, fp32 elsewhere.

bf16 halves every weight's bytes but pays only where the CPU multiplies bf16 in hardware. AMX
(amx_bf16) always does: 4.1x fp32 at block-sized rows (issue 39). On AVX-512, with or without
avx512_bf16, it depends on the core and on oneDNN's kernels, so a short probe decides there, once
per machine (cached). Without oneDNN bf16 kernels (AVX2) torch emulates bf16 and fp32 wins.
Both formats are the same quality class for these models (the checkpoints are published in bf16).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..cache_folder import cache_folder
from ..errors import UsageError

ENV = "FASTDLLM_CPU_DTYPE"     # fp32 | bf16: what auto means on a CPU, with no detection or probe (CI)
PROBE_SHAPE = (32, 896, 4864)  # a block of 32 rows through a 0.5B model's MLP up-projection
FASTER = 0.9                   # bf16 must beat fp32 by 10%: within the noise, fp32's precision wins
CACHE_FILE = "cpu-dtype-probe.json"


@dataclass(frozen=True)
class Choice:
    dtype: str      # "bf16" | "fp32"
    reason: str     # one short phrase: "bf16: AMX"


@dataclass(frozen=True)
class Capabilities:
    flags: frozenset[str]    # /proc/cpuinfo's flags
    bf16_native: bool        # oneDNN has bf16 kernels here (models/cpu.py)
    amx_allowed: bool = True  # ONEDNN_MAX_CPU_ISA does not cap oneDNN below AMX

    @property
    def amx(self) -> bool:
        return "amx_bf16" in self.flags and self.bf16_native and self.amx_allowed


def decide(caps: Capabilities, probe: Callable[[], tuple[float, float]]) -> Choice:
    """The choice for a CPU with `caps`; `probe()` -> (bf16 ms, fp32 ms), called only where the
    flags cannot tell."""
    if not caps.bf16_native:
        return Choice("fp32", "fp32: no bf16 kernels on this CPU (emulated)")
    if caps.amx:
        return Choice("bf16", "bf16: AMX")
    bf16_ms, fp32_ms = probe()
    figures = f"probe {bf16_ms:.1f} ms vs {fp32_ms:.1f} ms"
    if bf16_ms <= FASTER * fp32_ms:
        return Choice("bf16", f"bf16: faster here ({figures})")
    return Choice("fp32", f"fp32: bf16 not faster here ({figures})")


def auto_choice() -> Choice:
    """This machine's choice: the FASTDLLM_CPU_DTYPE pin, else decide() with the cached probe."""
    pinned = os.environ.get(ENV, "").strip()
    if pinned:
        if pinned not in ("fp32", "bf16"):
            raise UsageError(f"{ENV}={pinned}: expected fp32 or bf16 (or unset: decided by the CPU)")
        return Choice(pinned, f"{pinned}: {ENV}={pinned}")
    return decided()


def decided() -> Choice:
    """decide() for this machine, its probe cached per machine."""
    return decide(this_cpu(), lambda: cached_probe(cache_path(), probe_key()))


def this_cpu() -> Capabilities:
    from ..models import cpu

    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    return Capabilities(cpu_flags(), cpu.bf16_native(), amx_allowed=not isa or "AMX" in isa or isa == "ALL")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux); empty elsewhere, where the probe decides."""
    return _cpuinfo()[1]


@functools.cache
def _cpuinfo() -> tuple[str, frozenset[str]]:
    name, flags = "unknown CPU", frozenset()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name == "unknown CPU":
                name = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = frozenset(value.split())
    except OSError:
        pass
    return name, flags


def probe_key() -> str:
    """Everything that changes the probe's answer: CPU model and flags, torch, threads, ISA caps."""
    import platform

    import torch

    name, flags = _cpuinfo()
    limits = ",".join(os.environ.get(v, "") for v in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"))
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return f"{name or platform.processor()}|flags {digest}|torch {torch.__version__}|" \
           f"{torch.get_num_threads()} threads|isa {limits}"


def cache_path() -> Path:
    return cache_folder() / CACHE_FILE


_probed: dict[tuple[str, str], tuple[float, float]] = {}    # this process's answers, by (file, key)


def cached_probe(path: Path, key: str, measure: Callable[[], tuple[float, float]] | None = None) -> tuple[float, float]:
    """(bf16 ms, fp32 ms) for `key`: from this process, else from the cache file, else measured
    and written there. A corrupt or unreadable cache is ignored (and rewritten)."""
    if (str(path), key) in _probed:
        return _probed[str(path), key]
    entries = _read(path)
    hit = entries.get(key)
    if isinstance(hit, list) and len(hit) == 2 and all(isinstance(v, (int, float)) and v > 0 for v in hit):
        figures = (float(hit[0]), float(hit[1]))
    else:
        figures = (measure or measure_linear)()
        entries[key] = list(figures)
        _write(path, entries)
    _probed[str(path), key] = figures
    return figures


def _read(path: Path) -> dict:
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def _write(path: Path, entries: dict) -> None:
    try:      # a read-only home costs a probe per process, nothing else
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        os.replace(tmp, path)      # whole or not at all: a concurrent reader never sees half a file
    except OSError:
        pass


def measure_linear(rows: int = PROBE_SHAPE[0], d_in: int = PROBE_SHAPE[1], d_out: int = PROBE_SHAPE[2],
                   reps: int = 5) -> tuple[float, float]:
    """(bf16 ms, fp32 ms): the best of `reps` calls of a rows x d_in -> d_out linear, at this
    process's thread count; the formats interleaved, so that a burst of load hits both alike."""
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, d_in, generator=g), torch.randn(d_out, d_in, generator=g) / d_in ** 0.5
    pairs = {"bf16": (x.bfloat16(), w.bfloat16()), "fp32": (x, w)}
    best = {name: float("inf") for name in pairs}
    with torch.no_grad():
        for a, b in pairs.values():
            F.linear(a, b)          # warm-up: oneDNN builds its kernel on the first call
        for _ in range(reps):
            for name, (a, b) in pairs.items():
                start = time.perf_counter()
                F.linear(a, b)
                best[name] = min(best[name], time.perf_counter() - start)
    return best["bf16"] * 1e3, best["fp32"] * 1e3
