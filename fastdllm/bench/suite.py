"""`fastdllm bench --suite accelerators` (docs/accelerators/bench.md 8): the vanilla baseline, Fast-dLLM's
two settings and every built accelerator alone and on Fast-dLLM's cache and rule, in one table
against the same baseline. Each accelerator row is the method's profile (plus the overrides that
put it alone or on the cache); a row the model or the sweep refuses is left out with the method's
own one-line refusal: DecodeConfig's when the sweep is expanded, the engine's when a batch of the
loaded model is set up (no forward is run for that)."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from ..decode.engine import stepper
from ..decode.profiles import find
from ..errors import UsageError, UserError
from .cases import Case, Row, Sweep, expand, table_for
from .inputs import prepare
from .prompts import PromptSet

ONE_PER_STEP = {"rule": "fixed", "steps": "none"}
PARALLEL = {"rule": "threshold", "threshold": 0.9}
# (row, profile or None for Fast-dLLM's rows, overrides of the profile, what it measures)
ACCELERATORS = [
    ("baseline", None, {}, ""),
    ("dual+parallel", None, {}, ""),
    ("dual+factor", None, {}, ""),
    ("dus", "dus", {}, "DUS alone, as its README runs it (no cache, dilated levels of base 2)"),
    ("dual+dus", "dual-dus", {}, "DUS's levels on DualCache"),
    ("credit", "credit", {"cache": "none"}, "CreditDecoding alone: dInfer's threshold 0.8 on credited logits, no cache"),
    ("dual+dinfer", "credit", {"credit": False}, "dInfer's threshold 0.8 on DualCache without credit (credit's reference)"),
    ("dual+credit", "credit", {}, "CreditDecoding as dInfer runs it (DualCache, blocks of 64)"),
    ("dual+parallel+credit", "credit", {**PARALLEL, "block_len": 32, "block_align": "none"},
     "credit under Fast-dLLM's threshold 0.9 and blocks of 32 (beside dual+parallel)"),
    ("prophet", "prophet", {}, "Prophet alone, as their eval runs it (no cache, one token a step)"),
    ("dual+parallel+prophet", "dual-prophet", {}, "Prophet tested at each block's refresh, DualCache + threshold 0.9"),
    ("dpad", "dpad", {"cache": "none", **ONE_PER_STEP}, "DPad alone: suffix dropout, no cache, one token a step"),
    ("prefix+parallel+dpad", "dpad", {}, "DPad's best published setting (PrefixCache + threshold 0.9)"),
    ("dual+parallel+dpad", "dpad", {"cache": "dual"}, "DPad on DualCache + threshold 0.9"),
    ("dkv", "dkv", {}, "dKV-Cache-Decode as its README runs it (blocks of 64, one token a step, refresh every 8)"),
    ("dkv+parallel", "dkv", PARALLEL, "dKV-Cache with Fast-dLLM's threshold 0.9"),
    ("dllm-cache", "dllm-cache", {},
     "dLLM-Cache in its LLaDA-Instruct GSM8K setting (blocks of 8, one token a step, Kp 50, Kr 7, r 0.25)"),
    ("dllm-cache+parallel", "dllm-cache", PARALLEL, "dLLM-Cache's feature cache under Fast-dLLM's threshold 0.9"),
    ("local-leap", "local-leap", {}, "LocalLeap alone (no cache, one anchor a step, leaps of 4 at 0.9 / 0.75)"),
    ("dual+local-leap", "local-leap", {"cache": "dual"}, "LocalLeap's anchors and leaps on DualCache"),
    ("prefix+frechet", "frechet", {}, "Fast-dLLM++'s Frechet rule as their headline runs it (PrefixCache, blocks of 32, margin 0.25)"),
    ("dual+frechet", "frechet", {"cache": "dual"}, "the Frechet rule on DualCache (beside dual+parallel and dual+factor)"),
    ("klass", "klass", {}, "KLASS alone, the authors' LLaDA GSM8K script (no cache, blocks of 64, conf 0.6, KL 0.015)"),
    ("dual+klass", "klass", {"cache": "dual"},
     "KLASS on DualCache (a block's first step has no previous distribution: never stable)"),
]
# The Fast-dLLM paper's Table 1 (LLaDA and Dream on GSM8K, 256 and 512 tokens): its rows are the
# built-in table's, so that bench and eval run the same configurations under the same names
PAPER = [(name, None, {}, "") for name in
         ("baseline", "parallel", "parallel-factor", "prefix", "dual", "dual+parallel", "dual+factor")]
SUITES = {"paper": PAPER, "accelerators": ACCELERATORS}
# what a suite runs unless told otherwise (section 8: GSM8K-style prompts, so that Prophet's anchor
# and the quality check apply; the short and the long answer where DPad is meant to matter)
SUITE_DEFAULTS = {"paper": {"gen_len": "256,512", "prompt_set": "math"},
                  "accelerators": {"gen_len": "256,1024", "prompt_set": "math"}}


def suite_table(name: str, model_dir: Path | None = None) -> tuple[dict[str, Row], list[str]]:
    """The suite's rows by name, and a line for each row whose profile cannot be found. The
    reference rows are the model's own bench table's (a whole-canvas family's baseline is its own
    schedule); a family with its own profile (SDAR, LLaDA2.x, ...) gets it as a row after them, and
    a family that fixes its block size keeps it in every row (it was trained for that block; the
    profiles' blocks are LLaDA's)."""
    from ..decode.profiles import default_profile_for, model_defaults

    if name not in SUITES:
        raise UsageError(f"unknown suite '{name}' (available: {', '.join(SUITES)})")
    reference, own = table_for(model_dir), default_profile_for(model_dir)
    family_block = {"block_len": b} if (b := model_defaults(model_dir).get("block_len")) else {}
    specs = [spec for spec in SUITES[name] if spec[1] is not None or spec[0] in reference]
    if own != "default":
        specs.insert(len([s for s in specs if s[1] is None]), (own, own, {}, ""))
    rows, left_out = {}, []
    for row, profile, overrides, doc in specs:
        if profile is None:
            rows[row] = reference[row]
            continue
        try:
            found = find(profile)
        except UsageError as e:
            left_out.append(f"{row}: {e}")
            continue
        rows[row] = Row(row, {**overrides, **family_block}, doc or found.description, found)
    return rows, left_out


def expand_kept(rows: list[Row], sweep: Sweep, model_dir: Path | None = None,
                environ: dict | None = None) -> tuple[list[Case], list[str]]:
    """cases.expand, but a (row, group) that DecodeConfig refuses is left out with its one line
    (`dus at gen_len 256: ...`) instead of stopping the bench. Same order as expand."""
    cases, left_out = [], []
    for gen_len, block_len, batch in itertools.product(sweep.gen_len, sweep.block_len or [None], sweep.batch_size):
        one = replace(sweep, gen_len=(gen_len,), block_len=block_len and (block_len,), batch_size=(batch,))
        for row in rows:
            try:
                cases += expand([row], one, model_dir, environ)
            except UsageError as e:
                left_out.append(str(e))
    return cases, left_out


def applicable(lm, cases: list[Case], prompt_set: PromptSet, chat: bool | None) -> tuple[list[Case], list[str]]:
    """The cases the loaded model decodes, and a line for each one it refuses: the engine's own
    refusal, met by setting up (not running) a batch of the case's first input."""
    inputs = prepare(lm, cases, prompt_set, chat)
    kept, left_out = [], []
    for case in cases:
        first = inputs[case.cfg.gen_len][0]
        try:
            stepper(lm.decoder, [first.ids], case.cfg, holes=first.holes or None)
        except UserError as e:
            line = f"{case.name}: {e}"
            if line not in left_out:
                left_out.append(line)
        else:
            kept.append(case)
    return kept, left_out
