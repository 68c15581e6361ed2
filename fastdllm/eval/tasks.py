"""`fastdllm eval`: accuracy beside speed, for every task and profile, on lm-evaluation-harness.

Each (task, profile) pair is one lm-eval run (`simple_evaluate`) of a FastdllmLM over the model
loaded once; the task's metrics and standard errors come from lm-eval, the speed figures from
what the answers cost (harness.Stats: answer tokens up to the end token, never the prompt). Each
record is complete when yielded, so an interrupted run keeps the finished pairs.

Parallel runs (distributed.py): every rank runs every pair on its share of the documents; after
each pair the ranks exchange their counters (and any error), and rank 0 alone yields the record:
counts summed, tokens/s over the slowest rank's decoding time, each rank's figures in `ranks`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..decode.config import DecodeConfig
from ..errors import UsageError, UserError
from . import distributed

HUB_ERRORS = ("ConnectionError", "LocalEntryNotFoundError", "OfflineModeIsEnabled", "HfHubHTTPError", "DatasetNotFoundError")


@dataclass(frozen=True)
class Options:
    limit: int | None = None
    num_fewshot: int | None = None
    chat: bool = False
    confirm_run_unsafe_code: bool = False
    batch_size: int = 1
    mc_num: int = 128
    mc_batch: int = 32
    check_greedy: bool = True


def task_manager(include_paths: list[Path], tasks: list[str]):
    """lm-eval's TaskManager over its own tasks, fastdllm's built-in tasks (builtin_tasks/: tiny-gsm,
    tiny-code, ...) and `include_paths` (which may override a built-in task of the same name);
    unknown task names are a usage error (said before the model is loaded)."""
    from .builtin_tasks import FOLDER

    quiet()
    for path in include_paths:
        if not path.is_dir():
            raise UsageError(f"--include-path {path}: not a directory")
    paths = (str(FOLDER), *(str(p) for p in include_paths))
    # Only local tasks asked for (built-in or included): index the local folders alone (ms, not lm-eval's ~10-20 s).
    local = _indexed(paths, defaults=False)
    if all(_is_plain_task(local, t) for t in tasks):
        return local
    manager = _indexed(paths, defaults=True)
    known = set(manager.all_tasks)
    unknown = [t for t in tasks if t not in known and not t.endswith(".yaml")]
    if unknown:
        raise UsageError(f"unknown task{'s' * (len(unknown) > 1)} {', '.join(unknown)} (lm-eval knows {len(known)}: "
                         f"`lm-eval ls tasks`; a local task: --include-path DIR with its YAML)")
    return manager


@functools.lru_cache(maxsize=4)
def _indexed(paths: tuple[str, ...], defaults: bool):
    """One index per process and set of paths (a server or a test run evaluates again and again);
    lm-eval's own tasks' index from disk where it was built before (task_index.py)."""
    from .task_index import build_manager

    return build_manager(list(paths), defaults)


def _is_plain_task(manager, name: str) -> bool:
    """A task (not a group or tag, which may name lm-eval's own tasks) in `manager`'s index."""
    entry = getattr(manager, "task_index", {}).get(name)
    if isinstance(entry, dict):                     # older lm-eval 0.4 releases: {"type": "task", ...}
        return entry.get("type") == "task"
    return entry is not None and getattr(getattr(entry, "kind", None), "name", None) == "TASK"


def quiet() -> None:
    """lm-eval, datasets and the hub log and draw progress bars on stderr; fastdllm draws its own."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in ("lm_eval", "lm-eval", "datasets", "huggingface_hub", "evaluate", "absl"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
        from huggingface_hub.utils import disable_progress_bars
        from huggingface_hub.utils import logging as hub_logging

        disable_progress_bars()
        hub_logging.set_verbosity_error()
    except ImportError:
        pass


@dataclass(frozen=True)
class Setting:
    """A row of the results: a profile or a bench suite's row, its resolved config and, from
    `--gen-lens`, the answer length that replaces every task's max_gen_toks (None: the task's own)."""
    name: str
    cfg: DecodeConfig
    gen_len: int | None = None


def run(lm, tasks: list[str], settings: list[Setting], manager, options: Options,
        progress: Callable[[str, int, int], None] | None = None,
        world: distributed.World = distributed.World()) -> Iterator[dict]:
    """One record per (task, setting), task by task, settings in the order given (on rank 0)."""
    for task in tasks:
        for s in settings:
            r = evaluate_one(lm, task, s.name, s.cfg, manager, options, progress, world, gen_len=s.gen_len)
            if r is not None:
                yield r


def evaluate_one(lm, task: str, profile: str, cfg: DecodeConfig, manager, options: Options, progress=None,
                 world: distributed.World = distributed.World(), gen_len: int | None = None) -> dict | None:
    from lm_eval import simple_evaluate

    from .harness import FastdllmLM

    model = FastdllmLM(lm=lm, cfg=cfg, batch_size=options.batch_size, mc_num=options.mc_num,
                       mc_batch=options.mc_batch, check_greedy=options.check_greedy, world=world,
                       max_gen_toks=gen_len)
    model.task = task
    if progress:
        model.progress = lambda done, total: progress(f"{task} · {profile}", done, total)
    started = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):   # lm-eval prints (bootstrapping notes): stdout stays ours
            out = simple_evaluate(model=model, tasks=[task], task_manager=manager, limit=options.limit,
                                  num_fewshot=options.num_fewshot, apply_chat_template=options.chat,
                                  confirm_run_unsafe_code=options.confirm_run_unsafe_code, log_samples=False,
                                  verbosity="ERROR", random_seed=cfg.seed)
    except Exception as e:
        raise explained(e, task) from None
    wall = time.perf_counter() - started
    shares = world.report(model.failure, (model.stats, wall))
    if not world.first:
        return None
    stats, wall, ranks = merged(shares)
    r = record(task, profile, cfg, out, stats, wall, lm, options)
    return {**r, "gen_len": gen_len, "processes": world.size, "ranks": ranks}


def merged(shares: list) -> tuple:
    """(the ranks' Stats summed, seconds of the slowest rank, per-rank figures or None alone).
    Decoding seconds are the slowest rank's: the answers are all there only when it is done, so
    tokens/s is every rank's answer tokens over that time."""
    if len(shares) == 1:
        stats, wall = shares[0]
        return stats, wall, None
    total = type(shares[0][0])()
    for stats, _ in shares:
        for name in vars(total):
            if name != "seconds":
                setattr(total, name, getattr(total, name) + getattr(stats, name))
    total.seconds = max(stats.seconds for stats, _ in shares)
    ranks = [{"rank": rank, "answers": s.answers, "answer_tokens": s.answer_tokens,
              "tokens_per_second": round(s.answer_tokens / s.seconds, 3) if s.row_forwards and s.seconds else None,
              "decode_seconds": round(s.seconds, 4), "seconds": round(wall, 2)}
             for rank, (s, wall) in enumerate(shares)]
    return total, max(wall for _, wall in shares), ranks


def explained(e: Exception, task: str) -> Exception:
    """A task that cannot run, as one line (a bug stays a traceback)."""
    kind = type(e).__name__
    if isinstance(e, UserError):
        return e
    if kind in HUB_ERRORS or isinstance(e, ConnectionError):
        return UserError(f"task {task}: its data comes from the Hugging Face hub, which cannot be reached ({kind}); "
                         f"copy the data and give the task as a local YAML with --include-path DIR")
    if isinstance(e, FileNotFoundError):           # datasets: "Unable to find '/abs/path/data.jsonl'"
        return UserError(f"task {task}: its data cannot be found: {e} (a task YAML's data_files are read from "
                         f"the current folder: give an absolute path, or load them beside the YAML as "
                         f"examples/eval/hooks.py does)")
    text = str(e)
    if "unsafe" in text and "confirm_run_unsafe_code" in text:
        return UserError(f"task {task} runs the code the model writes: allow it with --confirm-run-unsafe-code "
                         f"(and HF_ALLOW_CODE_EVAL=1, which its metric asks for)")
    if "HF_ALLOW_CODE_EVAL" in text:
        return UserError(f"task {task} runs the code the model writes: set HF_ALLOW_CODE_EVAL=1 to allow it")
    return e


def metrics_of(result: dict) -> dict[str, tuple[float, float | None]]:
    """lm-eval's {"exact_match,strict-match": v, "exact_match_stderr,strict-match": s, ...} as
    {"exact_match,strict-match": (v, s)}."""
    out = {}
    for key, value in result.items():
        metric, _, flt = key.partition(",")
        if not flt or metric.endswith("_stderr") or not isinstance(value, (int, float)):
            continue
        stderr = result.get(f"{metric}_stderr,{flt}")
        out[key] = (float(value), float(stderr) if isinstance(stderr, (int, float)) else None)
    return out


def record(task: str, profile: str, cfg: DecodeConfig, out: dict, stats, wall: float, lm, options: Options) -> dict:
    import torch

    results = out["results"]
    metrics = {}
    for name, result in results.items():
        metrics.update({(f"{name}/{k}" if name != task else k): v for k, v in metrics_of(result).items()})
    if not metrics:
        raise UserError(f"task {task}: lm-eval returned no metric")
    first = next(iter(metrics))
    value, stderr = metrics[first]
    info = lm.info
    return {
        "task": task, "profile": profile, "metric": first, "value": value, "stderr": stderr,
        "change": None, "metrics": {k: {"value": v, "stderr": s} for k, (v, s) in metrics.items()},
        "samples": sum(n.get("effective", n.get("original", 0)) for n in out.get("n-samples", {}).values()),
        "answers": stats.answers, "answer_tokens": stats.answer_tokens,
        "tokens_per_second": round(stats.answer_tokens / stats.seconds, 3) if stats.row_forwards else None,
        "nfe_per_answer": round(stats.answer_forwards / stats.answers, 2) if stats.answers else None,
        # answer tokens per forward of a row; beside them, positions committed (end padding included)
        "tokens_per_forward": round(stats.answer_tokens / stats.row_forwards, 3) if stats.row_forwards else None,
        "committed_per_forward": round(stats.committed / stats.row_forwards, 3) if stats.row_forwards else None,
        "seconds": round(wall, 2), "decode_seconds": round(stats.seconds, 4),   # 4: tokens/s reproducible from it
        "limit": options.limit, "num_fewshot": options.num_fewshot, "chat": options.chat,
        "config": cfg.to_dict(), "model": info.get("path"), "family": info.get("family"),
        "device": info.get("device"), "dtype": info.get("dtype"), "quantize": info.get("quantize"),
        "torch": torch.__version__, "cuda": torch.version.cuda, "lm_eval": _version("lm-eval"),
        "fastdllm": _version("fastdllm"), "machine": machine(info), "python": platform.python_version(),
    }


def compare(records: list[dict]) -> list[dict]:
    """Each record's change against the first record of its task at the same answer length
    (`gen_len`, from --gen-lens; None: the task's own): the metric's difference and the tokens/s
    ratio (the speed-up)."""
    first: dict[tuple, dict] = {}
    for r in records:
        base = first.setdefault((r["task"], r.get("gen_len")), r)
        if base is r:
            continue
        speed = base["tokens_per_second"]
        r["change"] = {"profile": base["profile"], "value": round(r["value"] - base["value"], 6),
                       "speed": round(r["tokens_per_second"] / speed, 3) if speed and r["tokens_per_second"] else None}
    return records


def machine(info: dict) -> str:
    if str(info.get("device", "")).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs" + (
        f" ({info['cpu_capability']})" if info.get("cpu_capability") else "")


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "unknown"
