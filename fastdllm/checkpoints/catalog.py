"""The catalog (catalog.yaml): short names such as `dream:7b` for published checkpoints, with their
hub id, family, profile, license and sizes. Read without torch, so that `list`, `show` and
`--help` stay fast."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import yaml

from ..errors import UsageError

CATALOG_FILE = Path(__file__).resolve().parent / "catalog.yaml"
PRECISIONS = ("bf16", "8bit", "4bit")
CANVAS_TOKENS = 384        # the sizes' KV cache: info's default canvas, 128 prompt + 256 generated
GIB = 2**30


@dataclass(frozen=True)
class Entry:
    name: str
    hub: str
    family: str
    profile: str
    license: str
    about: str = ""
    revision: str | None = None
    shape: str | None = None
    sizes: dict = field(default_factory=dict)
    gguf: dict = field(default_factory=dict)    # a repository of GGUF files: quant tag -> {bytes, source, file}
    note: str = ""

    @property
    def parameters(self) -> int | None:
        return self.sizes.get("parameters")

    @property
    def active_parameters(self) -> int | None:
        return self.sizes.get("active")

    @property
    def context(self) -> int | None:
        return self.sizes.get("context")

    def memory_gib(self, precision: str) -> float | None:
        """GiB of weights plus a bf16 KV cache of CANVAS_TOKENS, at bf16 / 8bit / 4bit; None if unknown."""
        return self.sizes.get(f"{precision}_gib")

    def gguf_bytes(self, tag: str) -> int | None:
        """The file size of a GGUF entry's quant tag (read from the hub, or computed: its `source`)."""
        return (self.gguf.get(tag) or {}).get("bytes")

    def cache_gib(self) -> float:
        """The KV cache the memory figures hold: bf16 weights and cache less the bf16 weights."""
        if not self.parameters or not self.memory_gib("bf16"):
            return 0.0
        return max(0.0, self.memory_gib("bf16") - 2 * self.parameters / GIB)

    def gguf_forms(self, kind: str) -> list[tuple[str, str, float | None]]:
        """(form, flags, GiB) of a GGUF entry, best quality (largest file) first. On a CPU each quant
        tag as fastdllm holds it: the larger of the file with the cache and its kept form (cpu_gib:
        Q6_K and the embedding widen to int8 rows); Q8_0 with --quantize int8, which keeps it 8-bit.
        On a GPU the file is dequantized: the largest tag at bf16, or 8-/4-bit by bitsandbytes."""
        tags = sorted(self.gguf, key=lambda t: -self.gguf[t]["bytes"])
        if kind == "gpu":
            run = f"-m {self.name}:{tags[0]}"
            return [(f"{tags[0]} as {p}", run + ("" if p == "bf16" else f" --quantize {p}"), self.memory_gib(p))
                    for p in PRECISIONS]
        forms = []
        for tag in tags:
            held = max(self.gguf[tag]["bytes"] / GIB + self.cache_gib(), self.gguf[tag].get("cpu_gib") or 0)
            forms.append((tag, f"-m {self.name}:{tag}" + (" --quantize int8" if tag == "Q8_0" else ""), round(held, 1)))
        return forms

    def size_label(self) -> str:
        """`8.0B`, or `16.3B (1.4B active)` for a mixture of experts."""
        if not self.parameters:
            return "unknown"
        total = f"{self.parameters / 1e9:.1f}B"
        if self.active_parameters and self.active_parameters != self.parameters:
            return f"{total} ({self.active_parameters / 1e9:.1f}B active)"
        return total


@lru_cache(maxsize=1)
def entries() -> dict[str, Entry]:
    """Every catalog entry by short name, in the file's order."""
    raw = yaml.safe_load(CATALOG_FILE.read_text())
    return {name: Entry(name=name, **dict(fields, sizes=fields.get("sizes") or {})) for name, fields in raw.items()}


def is_short_name(spec: str) -> bool:
    """`family:tag` (hub ids have a '/', directories a '/' or no ':'; Windows drives are not ours), or
    a catalog family without its tag (`dream`: the error names its tags)."""
    if "/" in spec or "\\" in spec:
        return False
    return ":" in spec or spec.strip().lower() in {n.split(":")[0] for n in entries()}


def lookup(spec: str) -> Entry | None:
    """The entry a short name or hub id names (case-insensitive), or None; a GGUF entry also with
    a quant tag (`llada:8b-instruct-gguf:Q4_K_M`, `ORG/X-GGUF:Q8_0`)."""
    wanted = spec.strip().lower()
    for entry in entries().values():
        if wanted in (entry.name.lower(), entry.hub.lower()):
            return entry
    base, _, tag = wanted.rpartition(":")
    if base and tag:
        entry = lookup(base)
        if entry is not None and entry.gguf:
            return entry
    return None


def find(name: str) -> Entry:
    """The entry a short name names; a one-line error with the closest names otherwise."""
    entry = lookup(name)
    if entry is not None:
        return entry
    family = name.split(":")[0].lower()
    close = [n for n in entries() if n.split(":")[0] == family] or list(entries())
    raise UsageError(f"unknown model '{name}': try {', '.join(close[:6])}"
                     + (" ..." if len(close) > 6 else "") + " (`fastdllm recommend --all` lists them all)")
