"""Which split would hold a model that no single device can (fit.py's verdict proposes it): the
model's weights in layer order over the GPUs, then the CPU's RAM, then disk, the way accelerate's
planner fills them (checkpoints/split.py loads it so), with the flags that ask for it.

The arithmetic, from the totals fit.py reads off the headers: the weights are `layers` + 2 parts of
equal size (embedding, layers, head); a GPU keeps 1 GiB (fit.HEADROOM) for running and the canvas
cache of its own layers. Layers left on the CPU or on disk compute on the first GPU (accelerate
streams their weights in at every forward, and their cache sits there), so that GPU also keeps
their cache and room for one streamed part; on a machine without a GPU they compute on the CPU,
whose RAM then also holds the cache and one part read back from disk. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

HEADROOM = 2**30       # fit.HEADROOM (fit.py imports this module)
GIB = 2**30


@dataclass(frozen=True)
class Proposal:
    shares: list[tuple[str, int]]     # (device: "cuda:N", "cpu", "disk"; bytes it holds: weights + cache)
    crossing: int                     # weight bytes brought to the executing device at every forward
    flags: str                        # what asks for it

    def line(self) -> str:
        """'2 GPUs: 9.1 + 7.2 GiB (--device-map balanced)', 'GPU 22.0 GiB + CPU 9.0 GiB: slower, ...'."""
        gpus = [b for d, b in self.shares if d.startswith("cuda")]
        held = dict((d, b) for d, b in self.shares if not d.startswith("cuda"))
        where = ([f"GPU {gib(gpus[0])}" if len(gpus) == 1 else
                  f"{len(gpus)} GPUs: {' + '.join(f'{b / GIB:.1f}' for b in gpus)} GiB" if min(gpus) >= GIB / 10
                  else f"{len(gpus)} GPUs: {' + '.join(map(gib, gpus))}"] if gpus else [])
        where += [f"{'CPU' if d == 'cpu' else 'disk'} {gib(b)}" for d, b in held.items()]
        disk = held.get("disk", 0)
        cost = ("" if not self.crossing else f": slower, {gib(self.crossing)} crosses per step" if not disk else
                f": much slower, {gib(disk)} read from disk per step" if disk == self.crossing else
                f": much slower, {gib(self.crossing)} crosses per step, {gib(disk)} of it read from disk")
        return f"{' + '.join(where)}{cost} ({self.flags})"


def propose(weights: int, cache: int, layers: int, gpus: list[int], ram: int | None) -> Proposal | None:
    """The split that holds `weights` + `cache` over GPUs with `gpus` bytes free each, then `ram`
    (None: unknown, no offload proposed), then disk; None where it needs none (one device holds it)
    or no split holds it."""
    n = max(layers, 1) + 2
    part, per_layer_cache = weights / n, cache / max(layers, 1)
    if gpus and max(gpus) >= weights + cache + HEADROOM:
        return None                                        # one GPU holds it whole
    if len(gpus) > 1 and (shares := over_gpus(n, part, per_layer_cache, gpus)):
        return Proposal([(f"cuda:{i}", b) for i, b in enumerate(shares) if b], 0, "--device-map balanced")
    if ram is None:
        return None
    if not gpus:                                           # the CPU computes: the cache and one part in RAM
        if ram >= weights + cache + HEADROOM:
            return None
        room = ram - HEADROOM - cache - part
        in_ram = min(n, max(int(room // part), 0))
        if in_ram == 0:
            return None
        on_disk = (n - in_ram) * part
        return Proposal([("cpu", int(in_ram * part + cache)), ("disk", int(on_disk))], int(on_disk),
                        f"--max-memory cpu={size_flag(room)},disk")
    # GPUs first; what they cannot hold on the CPU, then disk; GPU 0 computes the offloaded layers
    rooms = [free - HEADROOM for free in gpus]
    rooms[0] -= cache + part                               # every layer's cache at worst, one streamed part
    counts, left = [], n
    for i, room in enumerate(rooms):
        fit = min(left, max(int(room // (part + (per_layer_cache if i else 0))), 0))
        counts.append(fit)
        left -= fit
    if counts[0] == 0:
        return None
    cpu_room = ram - HEADROOM
    in_ram = min(left, max(int(cpu_room // part), 0))
    on_disk = left - in_ram
    shares = [(f"cuda:{i}", int(c * part + (cache if i == 0 else 0))) for i, c in enumerate(counts) if c or i == 0]
    shares += [("cpu", int(in_ram * part))] if in_ram else []
    shares += [("disk", int(on_disk * part))] if on_disk else []
    memory = [f"{i}={size_flag(max(room, 0))}" for i, room in enumerate(rooms)] + [f"cpu={size_flag(cpu_room)}"]
    return Proposal(shares, int(left * part), f"--max-memory {','.join(memory + ['disk'] * bool(on_disk))}")


def over_gpus(n: int, part: float, per_layer_cache: float, gpus: list[int]) -> list[int] | None:
    """Bytes on each GPU when the parts are balanced over them (accelerate's `balanced`: about an
    equal share each, in layer order), or None when they cannot hold them all."""
    total = n * (part + per_layer_cache)
    target = total / len(gpus) + part                      # a share, and one part of slack as accelerate leaves
    shares, left = [], n
    for free in gpus:
        room = min(free - HEADROOM, target)
        count = min(left, max(int(room // (part + per_layer_cache)), 0))
        shares.append(int(count * (part + per_layer_cache)))
        left -= count
    return shares if left == 0 else None


def parse_gpus(text: str) -> list[int]:
    """--assume-gpus: '2x24GB' -> two of 24 GB; '24GiB,16GiB'; 'none' or '0' -> no GPU. ValueError."""
    from .split import parse_size

    text = text.strip().lower()
    if text in ("none", "0", ""):
        return []
    sizes = []
    for item in text.split(","):
        count, _, size = item.strip().rpartition("x")
        if count and not count.isdigit():
            raise ValueError(f"{item!r} (expected COUNTxSIZE, e.g. 2x24GB, or SIZE,SIZE)")
        sizes += [parse_size(size)] * int(count or 1)
    return sizes


def size_flag(n: float) -> str:
    """A --max-memory size, rounded down: '21.5GiB', '300MiB'."""
    return f"{int(n / GIB * 10) / 10:.1f}GiB" if n >= GIB else f"{int(n / 2**20)}MiB"


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.0f} MiB"
