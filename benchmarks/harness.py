"""What every benchmark here shares, so that each file is only its own measurement: the machine it
ran on, the common options, the published shapes and random-weight models of them (shapes.py),
warm-up and interleaved repetitions, median and spread, and JSON output.

A benchmark runs as `python benchmarks/NAME.py`; Python puts this folder on sys.path, so
`import harness` finds this file (and `from speed import ...` a sibling).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable, Hashable

import torch

from fastdllm import host_memory
from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run as engine_run
from fastdllm.models.cpu import bf16_note
# the shapes and random weights, under the names the benchmarks use (harness.SHAPES, harness.build)
from shapes import SHAPES, TINY, Shape, build, random_weights, randomize, write_random  # noqa: F401


# --- the machine ---------------------------------------------------------------------------------
def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work: a clock read after this reads finished work."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def clock(device: torch.device | str = "cpu") -> float:
    """perf_counter seconds once the device is idle."""
    sync(device)
    return time.perf_counter()


def time_ms(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Milliseconds of one call of fn, the device idle before and after."""
    start = clock(device)
    fn()
    return 1000 * (clock(device) - start)


def cpu_name() -> str:
    """The CPU's model name where Linux says it, else the platform's word."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages ('?' where the system does not say)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def machine(device: torch.device | str = "cpu", dtype: str | None = None) -> str:
    """One line for a table's header: the device ('auto': CUDA where there is one), threads, ISA
    (CPU), torch and the load now."""
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        where = f"cuda: {props.name}, {props.total_memory / 2**30:.0f} GiB"
    else:
        where = (f"cpu: {cpu_name()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, ISA "
                 f"{torch.backends.cpu.get_cpu_capability()}" + (f", {bf16_note()}" if dtype in (None, "auto", "bf16") else "")
                 + (f", malloc {host_memory.state}" if host_memory.state else ""))
    return f"{where}; torch {torch.__version__}; load {loadavg()}"


def read_bandwidth(device: torch.device | str) -> float:
    """Bytes/s of one reading pass over a buffer (1 GiB on a GPU, 256 MiB on a CPU; best of 3 after
    one warm-up pass): what a weight-bound step can hope for."""
    device = torch.device(device)
    x = torch.ones(2**28 if device.type == "cuda" else 2**26, device=device)
    best = float("inf")
    for _ in range(4):
        start = clock(device)
        x.sum()
        best = min(best, clock(device) - start)
    return x.numel() * x.element_size() / best


# --- options ---------------------------------------------------------------------------------------
def parser(doc: str | None, *, reps: int | None = 3, device: str | None = None,
           dtype: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark takes: --threads and --json; --reps, --device and --dtype where
    a default is given (None: the benchmark has no such choice)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if reps is not None:
        ap.add_argument("--reps", type=int, default=reps, help="timed repetitions, interleaved")
    if device is not None:
        ap.add_argument("--device", default=device)
    if dtype is not None:
        ap.add_argument("--dtype", default=dtype)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the records as JSON")
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    args = ap.parse_args(argv)                    # then the thread count, before any timed work
    host_memory.keep_freed()                      # as the CLI does; code compared in this process gets it too
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def add_llada_shape(ap: argparse.ArgumentParser, vocab: int = 32000) -> None:
    """--d-model, --layers, --heads, --mlp, --vocab: an LLaDA shape of one's own (defaults: `mid`'s
    dimensions); llada_shape(args) is it."""
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--mlp", type=int, default=1408)
    ap.add_argument("--vocab", type=int, default=vocab)


def llada_shape(args: argparse.Namespace, **tiny) -> Shape:
    """The LLaDA shape of add_llada_shape's flags; `tiny`: more of the tiny writer's arguments."""
    return Shape(f"random LLaDA d_model {args.d_model}, {args.layers} layers, {args.heads} heads, MLP {args.mlp}, "
                 f"vocab {args.vocab}", "llada", dict(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                                                      n_kv_heads=args.heads, mlp_hidden_size=args.mlp),
                 dict(vocab_size=args.vocab, **tiny))


def csv(text: str, kind: Callable = str) -> list:
    """'1,8,32' -> [1, 8, 32] with kind=int; empty items dropped."""
    return [kind(x) for x in text.split(",") if x.strip()]


# --- repetitions -----------------------------------------------------------------------------------
def interleaved(runs: dict[Hashable, Callable[[], object]], reps: int, warmup: int = 1,
                after_round: Callable[[int, dict], None] | None = None) -> dict[Hashable, list]:
    """Each run's results over `reps` rounds (A B C A B C ...: a load that comes and goes falls on
    every run alike), after `warmup` uncounted rounds; `after_round(i, results so far)` after each
    (a table printed as it grows: a loaded machine may not finish them all)."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    out = {key: [] for key in runs}
    for i in range(reps):
        for key, run in runs.items():
            out[key].append(run())
        if after_round:
            after_round(i, out)
    return out


def spread(xs: list[float]) -> dict:
    """median, min, max and spread ((max - min) / median; None for one value) of repetitions."""
    median = statistics.median(xs)
    return {"median": median, "min": min(xs), "max": max(xs), "n": len(xs),
            "spread": (max(xs) - min(xs)) / median if len(xs) > 1 and median else None}


def span(xs: list[float], fmt: str = ".4g") -> str:
    """'min-max' of repetitions, '-' for one."""
    return f"{min(xs):{fmt}}-{max(xs):{fmt}}" if len(xs) > 1 else "-"


def decode(lm: loading.LoadedModel, prompts: list[list[int]], cfg, warmup_blocks: int = 2):
    """(seconds, Result) of one engine run of `prompts` under `cfg`, after an uncounted run of
    `warmup_blocks` blocks under the same settings (0: none); the device idle around the clock."""
    if warmup_blocks:
        engine_run(lm.decoder, prompts, DecodeConfig.from_dict({"gen_len": cfg.block_len * warmup_blocks}, cfg))
    start = clock(lm.device)
    result = engine_run(lm.decoder, prompts, cfg)
    return clock(lm.device) - start, result


def prompt_ids(n: int, low: int = 10, high: int = 300, seed: int = 0) -> list[int]:
    """A fixed random prompt of n token ids in [low, high)."""
    return torch.randint(low, high, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# --- output ----------------------------------------------------------------------------------------
def write_json(args: argparse.Namespace, records: list[dict], **conditions) -> None:
    """With --json PATH: {"conditions": ..., "records": [...]} there (one object, nothing else)."""
    if getattr(args, "json", None):
        conditions.setdefault("machine", machine(getattr(args, "device", "cpu"), getattr(args, "dtype", None)))
        args.json.write_text(json.dumps({"conditions": conditions, "records": records}, indent=1, default=str) + "\n")
