"""One bench record: the flat, JSON-ready dict `runner.measure` returns per case, from the Results
of its repetitions (speed, forwards, the work behind them, memory, quality, the accelerator
options), and the conditions every record of one bench shares (model, placement, software,
prompts). `runner.compare` fills the speed-ups and agreements against the baseline row later.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from ..decode.engine import Result
from ..decode.rules import rule_fields
from .cases import Case
from .prompts import PromptSet
from .rounds import spread_fields


@dataclass
class Measured:
    record: dict
    answers: list[list[int]] = field(default_factory=list)   # per prompt (first repetition)
    unquantized: list[list[int]] | None = None             # the same case's answers on unquantized weights


def summarise(case: Case, reps: list[list[Result]], prompt_set: PromptSet, shared: dict,
              owners: list[int] | None = None, processes: int = 1) -> Measured:
    """One record from the Results of every repetition (each a list of per-batch Results);
    `owners`: the rank that ran each batch (a repetition lasts as long as its slowest rank)."""
    first = reps[0]
    owners = owners or [0] * len(first)

    def seconds(rep: list[Result]) -> float:
        per_rank = [0.0] * processes
        for owner, r in zip(owners, rep):
            per_rank[owner] += r.seconds_total
        return max(per_rank)

    speeds = [sum(r.generated_tokens for r in rep) / max(seconds(rep), 1e-12) for rep in reps]
    texts = [t for r in first for t in r.texts]
    cfg = case.cfg
    record = {
        "config": case.name, "cache": cfg.cache, **rule_fields(cfg),
        "block_len": cfg.block_len, "batch_size": case.batch_size, "group": list(case.group),
        **spread_fields(speeds),
        "speedup": None, "speedup_min": None, "speedup_max": None, "speedup_reliable": None,
        "nfe": sum(r.nfe for r in first),                 # forwards for the whole prompt set
        # answer tokens (up to each end token) per forward of a row; beside them, positions committed (end padding too)
        "tokens_per_forward": round(sum(r.generated_tokens for r in first) / max(sum(r.nfe * r.batch for r in first), 1), 3),
        "committed_per_forward": round(sum(r.committed for r in first) / max(sum(r.nfe * r.batch for r in first), 1), 3),
        # the work behind the speed: answer length, and canvas positions a forward runs (engine.generate)
        "answer_tokens": round(sum(r.generated_tokens for r in first) / max(sum(r.batch for r in first), 1), 1),
        "positions_per_forward": round(sum(r.positions_run or 0 for r in first) / max(sum(r.nfe for r in first), 1), 1),
        # token editing: written tokens overwritten, per block of each row
        "edits_per_block": round(sum(r.edits for r in first) / max(sum(r.blocks_decoded * r.batch for r in first), 1), 2)
        if cfg.edit_threshold is not None else None,
        **_constraint_fields(case, first),
        "agreement_tokens": None, "agreement_answers": None,
        "agreement_unquantized_tokens": None, "agreement_unquantized_answers": None,
        "quality": _round(prompt_set.quality(texts)), "quality_metric": prompt_set.quality_metric,
        "generated_tokens": sum(r.generated_tokens for r in first),
        "seconds": round(statistics.median(seconds(rep) for rep in reps), 4), "processes": processes,
        "peak_memory_bytes": max(r.peak_memory_bytes for rep in reps for r in rep),
        "peak_memory_kind": first[0].peak_memory_kind,
        "cache_bytes": max(r.cache_bytes for r in first),
        **{k: getattr(cfg, k) for k in ("confidence", "temperature", "seed", "refresh_every", "early_stop",
                                        "credit", "prophet", "dpad_window", "leap_anchor", "leap_radius",
                                        "prompt_interval", "gen_interval", "transfer_ratio", "focus_alpha",
                                        "focus_delayed")},   # the accelerator options
        **shared,
        "repetitions": len(reps), "repetitions_asked": shared["repetitions"],   # rounds.py: auto varies per row
    }
    return Measured(record, [ids for r in first for ids in r.ids])


def _constraint_fields(case: Case, first: list[Result]) -> dict:
    """Structured output: the constraint's label, how many answers completed their sentence (each
    valid by construction; the others the length cut) and the matcher's ms per forward."""
    if case.constraint is None:
        return {"constraint": None, "constraint_complete": None, "matcher_ms_per_step": None}
    done = [c for r in first for c in (r.complete or [None] * r.batch)]
    return {"constraint": case.constraint, "constraint_complete": [sum(c is True for c in done), len(done)],
            "matcher_ms_per_step": round(1e3 * sum(r.matcher_seconds for r in first) / max(sum(r.nfe for r in first), 1), 3)}


def conditions(lm, prompt_set: PromptSet, chat: bool | None, repetitions: int | str, warmup: int) -> dict:
    """What every record of one bench shares: model, placement, software, prompts, repetitions."""
    import torch
    import transformers

    info = lm.info
    infilling = prompt_set.suffixes is not None
    return {"prompt_set": prompt_set.name, "n_prompts": len(prompt_set.prompts), "infill": infilling,
            "chat_template": False if infilling else lm.has_chat_template if chat is None else chat,
            "repetitions": repetitions, "warmup": warmup,
            "model": info.get("path"), "model_name": Path(str(info.get("path"))).name,
            "family": info.get("family"), "device": info.get("device"), "dtype": info.get("dtype"),
            "quantize": info.get("quantize"), "torch": torch.__version__,
            "transformers": transformers.__version__, "fastdllm": _version(), "python": sys.version.split()[0]}


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _version() -> str:
    try:
        return metadata.version("fastdllm")
    except metadata.PackageNotFoundError:
        return "unknown"
