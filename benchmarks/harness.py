"""What every benchmark here shares, so that each file is only its own measurement: the machine it
ran on, the common options, the published shapes by name, random-weight models of them, warm-up and
interleaved repetitions, median and spread, and JSON output.

A benchmark runs as `python benchmarks/NAME.py`; Python puts this folder on sys.path, so
`import harness` finds this file (and `from speed import ...` a sibling).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable

import torch

from fastdllm import host_memory
from fastdllm.checkpoints import loading
from fastdllm.testing.tiny_blockdiff import write_fast_dllm_v2, write_sdar
from fastdllm.testing.tiny_random import FIXTURES, write_dream, write_llada
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import run as engine_run
from fastdllm.models import FAMILIES
from fastdllm.models.cpu import bf16_note


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


# --- shapes and random weights ---------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A model shape: `config` overrides the family's config (its published one, read from the tiny
    checkpoint of `tiny`'s arguments that lends the tokenizer and special tokens)."""
    text: str
    family: str                       # a key of TINY
    config: dict
    tiny: dict = field(default_factory=dict)


# family -> writer of a one-layer checkpoint: the tokenizer and special tokens a random model borrows
TINY = {
    "llada": lambda out, vocab_size=32000, fixtures=FIXTURES: write_llada(
        out, d_model=64, n_layers=1, n_heads=4, mlp_hidden_size=128, vocab_size=vocab_size, fixtures=fixtures,
        max_sequence_length=8192),
    "dream": lambda out: write_dream(out, hidden_size=32, n_layers=1, n_heads=2, n_kv_heads=1, intermediate_size=64),
    "sdar": lambda out: write_sdar(out, n_layers=1),
    "v2": lambda out: write_fast_dllm_v2(out, n_layers=1),
}

# the published shapes by name (random weights; only the named keys differ from the family's config)
SHAPES = {
    "mid": Shape("random LLaDA d512, 8 layers, 8 heads, MLP 1408, vocab 32000", "llada",
                 dict(d_model=512, n_layers=8, n_heads=8, n_kv_heads=8, mlp_hidden_size=1408), dict(vocab_size=32000)),
    "llada-8b": Shape("random LLaDA-8B: d4096, 32 layers, 32 heads, MLP 12288, vocab 126464", "llada",
                      dict(d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, mlp_hidden_size=12288),
                      dict(vocab_size=126464)),
    "22m": Shape("random Dream d64, 8 layers, 4 heads (2 KV), MLP 1536, vocab 152064 (Dream's), untied head", "dream",
                 dict(hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=1536, max_window_layers=8)),
    "0.5b": Shape("random Dream d896, 24 layers, 14 heads (2 KV), MLP 4864, vocab 151936, tied head "
                  "(Qwen2.5-0.5B's shape)", "dream", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                                           num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                                                           tie_word_embeddings=True, max_window_layers=24)),
    "1.5b": Shape("random Dream d1536, 28 layers, 12 heads (2 KV), MLP 8960, vocab 151936, tied head "
                  "(Qwen2.5-1.5B's shape)", "dream", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                                           num_key_value_heads=2, intermediate_size=8960, vocab_size=151936,
                                                           tie_word_embeddings=True, max_window_layers=28)),
    "sdar-1.7b": Shape("random SDAR-1.7B", "sdar", dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16,
                                                      num_key_value_heads=8, head_dim=128, intermediate_size=6144)),
    "sdar-8b": Shape("random SDAR-8B", "sdar", dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                                                  num_key_value_heads=8, head_dim=128, intermediate_size=12288)),
    "v2-1.5b": Shape("random Fast-dLLM v2 1.5B", "v2", dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                                          num_key_value_heads=2, intermediate_size=8960,
                                                          tie_word_embeddings=True, vocab_size=151936)),
    "v2-7b": Shape("random Fast-dLLM v2 7B", "v2", dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
                                                      num_key_value_heads=4, intermediate_size=18944)),
}


def build(shape: Shape | str, dtype: str, device: str = "cpu", quantize: str = "none") -> loading.LoadedModel:
    """A random model of `shape` built on the device (no checkpoint of its size on disk: writing and
    reading back an 8B one would take minutes), with the tokenizer of a tiny checkpoint loaded the
    normal way."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    with tempfile.TemporaryDirectory() as tmp:
        lm = loading.load(TINY[shape.family](Path(tmp) / "m", **shape.tiny), dtype=dtype, device=device)
    config = dict(shape.config)
    if "layer_types" in lm.model.config.to_dict():             # v2 configs list one per layer
        config["layer_types"] = ["full_attention"] * config.get("num_hidden_layers", 1)
    return random_weights(lm, config, quantize)


def randomize(model: torch.nn.Module, std: float = 0.02, fill_rest: bool = False) -> None:
    """Every weight of 2 or more dimensions (matrices, stacked experts) from N(0, std). The rest
    (norm scales, biases) stay as the classes initialised them, or with `fill_rest` (a model built
    on the meta device has no values yet) biases 0 and the others 1."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, std)
            elif fill_rest:
                p.zero_() if name.endswith("bias") else p.fill_(1.0)


def random_weights(lm: loading.LoadedModel, overrides: dict, quantize: str = "none",
                   family: str | None = None) -> loading.LoadedModel:
    """Swap `lm`'s model for a random one (2-D weights std 0.02, the rest as the classes initialise
    them) of its family (or `family`, a model_type) with `overrides` on its config, built on its
    device and dtype; `quantize` int8 / int4: converted as loading does."""
    config_cls, model_cls, _ = FAMILIES[family or lm.family][0]
    config = config_cls.from_dict({**lm.model.config.to_dict(), **overrides})
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(lm.dtype)
    try:
        with torch.device(lm.device):
            model = model_cls(config).eval()
        randomize(model)
    finally:
        torch.set_default_dtype(default)
    if quantize in ("int8", "int4"):
        model.prepare_for_inference(pack=False)
        loading.cpu_quantize(model, quantize, lm.dtype, True, ())
        lm.quantize = quantize
    else:
        model.prepare_for_inference()
    lm.model = model
    lm.info = loading.describe(lm)
    return lm


def write_random(shape: Shape, out: Path, **kw) -> Path:
    """A random-weight checkpoint of an LLaDA `shape` on disk in the published layout (bf16, shards
    of 2 GB), for the runs that load it as a user does (--quantize 8bit/4bit, the authors' code);
    `kw`: write_llada's (logit_scale, ...)."""
    assert shape.family == "llada", "on-disk random checkpoints: LLaDA's layout"
    c = shape.config
    return write_llada(out, d_model=c["d_model"], n_layers=c["n_layers"], n_heads=c["n_heads"],
                       mlp_hidden_size=c["mlp_hidden_size"], max_sequence_length=8192, shard_bytes="2GB",
                       **{**shape.tiny, **kw})


def prompt_ids(n: int, low: int = 10, high: int = 300, seed: int = 0) -> list[int]:
    """A fixed random prompt of n token ids in [low, high)."""
    return torch.randint(low, high, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# --- output ----------------------------------------------------------------------------------------
def write_json(args: argparse.Namespace, records: list[dict], **conditions) -> None:
    """With --json PATH: {"conditions": ..., "records": [...]} there (one object, nothing else)."""
    if getattr(args, "json", None):
        conditions.setdefault("machine", machine(getattr(args, "device", "cpu"), getattr(args, "dtype", None)))
        args.json.write_text(json.dumps({"conditions": conditions, "records": records}, indent=1, default=str) + "\n")
