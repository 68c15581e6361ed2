"""What bench runs: named configurations (rows: the built-in ones and profiles), swept over
gen_len, block_len, batch size and the rules' parameters, expanded into cases. A case is one
DecodeConfig at one batch size; cases of a group (gen_len, block_len, batch size) share a baseline."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path

from ..decode.config import DecodeConfig
from ..decode.profiles import Profile, resolve
from ..decode.rules import RULES
from ..errors import UsageError


@dataclass(frozen=True)
class Row:
    """A named configuration: DecodeConfig values over the model defaults, or a whole profile."""
    name: str
    values: dict
    doc: str = ""
    profile: Profile | None = None


ONE_PER_STEP = {"rule": "fixed", "steps": "none"}     # steps none = gen_len: one token per step
PARALLEL = {"rule": "threshold", "threshold": 0.9}
CONFIGS = {row.name: row for row in [
    Row("baseline", {"cache": "none", **ONE_PER_STEP},
        "no cache, one token per step (the LLaDA schedule): the reference for speedup and agreement"),
    Row("parallel", {"cache": "none", **PARALLEL}, "no cache, commit every token with confidence >= 0.9"),
    Row("parallel-factor", {"cache": "none", "rule": "factor", "factor": 1.0},
        "no cache, factor rule f=1.0 (the paper's \"parallel (factor)\" row)"),
    Row("prefix", {"cache": "prefix", **ONE_PER_STEP}, "PrefixCache, one token per step"),
    Row("dual", {"cache": "dual", **ONE_PER_STEP}, "DualCache, one token per step"),
    Row("prefix+parallel", {"cache": "prefix", **PARALLEL}, "PrefixCache + threshold 0.9"),
    Row("dual+parallel", {"cache": "dual", **PARALLEL}, "DualCache + threshold 0.9 (the paper's setting)"),
    Row("dual+factor", {"cache": "dual", "rule": "factor", "factor": 1.0},
        "DualCache + factor rule: largest n with (n+1)(1-c_n) < 1"),
]}
# A renoising model (DiffusionGemma) has no masks to cache or commit: its rows vary its sampler.
RENOISE_CONFIGS = {row.name: row for row in [
    Row("baseline", {}, "the checkpoint's own sampler settings (transformers' generate): the reference"),
    Row("fewer-steps", {"denoise_steps": 16}, "at most 16 denoising steps per canvas"),
    Row("looser-bound", {"entropy_bound": 0.5}, "entropy bound 0.5: more positions kept at every step"),
]}
# A whole-canvas schedule (RND1's entropy schedule, one global canvas): its own setting, fewer steps,
# and Fast-dLLM's parallel rule and caches over blocks of 32 (confidence: the probability again)
_FAST = {"rule": "threshold", "threshold": 0.9, "confidence": "prob", "steps": "none", "block_len": 32}
CANVAS_CONFIGS = {row.name: row for row in [
    Row("baseline", {}, "the family's own schedule over one global canvas, one token per step: the reference"),
    Row("fewer-steps", {"steps": 64}, "the same schedule in 64 steps"),
    Row("parallel", {"cache": "none", **_FAST}, "blocks of 32, no cache, commit every token with probability >= 0.9"),
    Row("dual+parallel", {"cache": "dual", **_FAST}, "blocks of 32, DualCache + threshold 0.9 (Fast-dLLM's setting)"),
]}
# LLaDA2.1 (its model card's modes, docs/specs/llada2-editing.md): token editing against the same commit
# thresholds without it, over the prefix cache (exact: block-causal)
def _mode(threshold: float, edit: float | None) -> dict:
    return {"cache": "prefix", "rule": "dynamic", "threshold": threshold, "steps": "none",
            **({"edit_threshold": edit, "max_post_steps": 16} if edit is not None else {})}


EDIT_CONFIGS = {row.name: row for row in [
    Row("quality-no-edit", _mode(0.7, None), "PrefixCache, masks above 0.7 committed (at least one a step), no editing"),
    Row("edit-quality", _mode(0.7, 0.5), "the model card's Quality mode: as quality-no-edit, and written tokens of the "
                                         "block edited above 0.5, up to 16 edit-only rounds"),
    Row("speed-no-edit", _mode(0.5, None), "PrefixCache, masks above 0.5 committed (at least one a step), no editing"),
    Row("edit-speed", _mode(0.5, 0.0), "the model card's Speed mode: as speed-no-edit, and every changed prediction "
                                       "of a written token edited, up to 16 edit-only rounds"),
]}
# LLaDA2.2 (docs/specs/llada2-2.md §3): insert/delete editing against Speed-mode editing without it
INDEL_CONFIGS = {row.name: row for row in [
    Row("indel", {**_mode(0.5, 0.0), "indel": True}, "LLaDA2.2's InDel decoding: edit-speed plus DELETE and SPLIT "
                                                     "tokens, anti-loop, forced finish after 16 post-fill rounds"),
]}
# Nemotron-Labs Diffusion (docs/specs/nemotron-diffusion.md): its three decoders, each as its authors ship it
SEEDED_CONFIGS = {row.name: row for row in [
    Row("baseline", {"mode": "diffusion", "cache": "prefix", **ONE_PER_STEP},
        "its generate without a threshold: one token per step of each block (the reference)"),
    Row("threshold", {"mode": "diffusion", "cache": "prefix", **PARALLEL},
        "its generate with the model card's threshold 0.9 (the default profile)"),
    Row("ar", {"mode": "ar", "cache": "prefix", **ONE_PER_STEP}, "ar_generate: one token per causal forward"),
    Row("self-spec", {"mode": "self_spec", "cache": "prefix", **ONE_PER_STEP},
        "linear_spec_generate: one bidirectional draft per block, verified causally (batch 1)"),
    Row("self-spec+threshold", {"mode": "self_spec", "cache": "prefix", **PARALLEL},
        "linear_spec_generate with drafts by threshold 0.9 (several draft forwards per block)"),
]}
SEEDED_PROFILES = ("nemotron-diffusion",)
EDITING_PROFILES = ("llada2", "llada2.2")   # families whose checkpoints decode with token editing (their default profile)
BASELINE = "baseline"
# A speed-up is unreliable when the fastest and slowest repetitions of the row or of its baseline
# differ by more than this share of their median, or when the two rows' ranges overlap (then not
# even "faster" or "slower" is certain).
SPREAD_LIMIT = 0.25


def table_for(model_dir: Path | None) -> dict[str, Row]:
    """The rows that fit the model: the renoising sampler's, a whole-canvas schedule's, Nemotron-Labs
    Diffusion's three decoders, or the cache and rule rows (and, for LLaDA2.x, the token-editing
    modes beside the same thresholds without editing; for LLaDA2.2, InDel too)."""
    from ..decode.profiles import default_profile_for, model_defaults

    rule = model_defaults(model_dir).get("rule", "threshold")
    if default_profile_for(model_dir) in SEEDED_PROFILES:
        return SEEDED_CONFIGS
    if RULES[rule].renoise:
        return RENOISE_CONFIGS
    if RULES[rule].whole_canvas:
        return CANVAS_CONFIGS
    profile = default_profile_for(model_dir)
    if profile not in EDITING_PROFILES:
        return CONFIGS
    return {**CONFIGS, **EDIT_CONFIGS, **(INDEL_CONFIGS if profile == "llada2.2" else {})}


@dataclass(frozen=True)
class Sweep:
    """Comma-list flags; every combination is run. Threshold values apply to rows using the
    threshold rule and factor values to rows using the factor rule (None: the row's own value)."""
    gen_len: tuple[int, ...] = (256,)
    block_len: tuple[int, ...] | None = None   # None: the model family's (32 for LLaDA and Dream)
    batch_size: tuple[int, ...] = (1,)
    threshold: tuple[float, ...] | None = None
    factor: tuple[float, ...] | None = None
    early_stop: bool | None = None       # None: the usual layers decide (on by default)


SWEPT_PARAMS = ("threshold", "factor")    # rule parameters that bench takes as comma lists


@dataclass(frozen=True)
class Case:
    name: str
    cfg: DecodeConfig
    batch_size: int
    swept_block_len: int | None = None     # the sweep's block_len (None: each row's own)
    constraint: str | None = None          # structured output: the label of bench's one constraint

    @property
    def group(self) -> tuple[int, int | None, int]:
        """Cases of one group share a baseline: the sweep's (gen_len, block_len, batch size), so rows
        that choose their own blocks (Fast-dLLM's beside a whole-canvas schedule) meet its baseline."""
        return self.cfg.gen_len, self.swept_block_len, self.batch_size


def pick_rows(names: list[str] | None, profiles: list[Profile] = (), table: dict[str, Row] = CONFIGS) -> list[Row]:
    """The built-in rows named (all when None) followed by one row per profile."""
    for name in names or []:
        if name not in table:
            raise UsageError(f"unknown configuration '{name}' (available: {', '.join(table)})")
    rows = [table[n] for n in dict.fromkeys(names)] if names is not None else list(table.values())
    taken = {r.name for r in rows}
    for p in profiles:
        name = p.name if p.name not in taken else f"profile:{p.name}"
        rows.append(Row(name, {}, p.description, p))
        taken.add(name)
    if not rows:
        raise UsageError("no configurations to run")
    return rows


def expand(rows: list[Row], sweep: Sweep, model_dir: Path | None = None,
           environ: dict | None = None) -> list[Case]:
    """Every (gen_len, block_len, batch size) group x every row (x threshold / factor values where the
    row's rule uses them), groups in order, rows in order inside a group. Invalid combinations
    raise before anything runs."""
    cases = []
    for gen_len, block_len, batch in itertools.product(sweep.gen_len, sweep.block_len or [None], sweep.batch_size):
        for row in rows:
            # a swept block_len overrides the row's own; unswept (None), the row's stays
            flags = {**row.values, "gen_len": gen_len, "early_stop": sweep.early_stop,
                     **({"block_len": block_len} if block_len is not None else {})}
            try:
                cfg = resolve(row.profile, flags, model_dir, environ)
            except UsageError as e:
                where = f"gen_len {gen_len}" + (f", block_len {block_len}" if block_len else "")
                raise UsageError(f"{row.name} at {where}: "
                                 f"{str(e).removeprefix('flags: ')}") from None
            param = RULES[cfg.rule].param
            for value in swept_values(sweep, param) or [None]:
                cases.append(Case(row.name, cfg if value is None else replace(cfg, **{param: value}), batch, block_len))
    return cases


def with_constraint(cases: list[Case], label: str) -> tuple[list[Case], list[str]]:
    """Each case followed by its twin decoding under the constraint (named ROW+LABEL), and the lines
    for the twins left out: a row whose decoding cannot honour a constraint (engine.refuse_constrained,
    a renoising sampler)."""
    from ..decode.engine import refuse_constrained

    out, left_out = [], []
    for case in cases:
        out.append(case)
        twin = replace(case, name=f"{case.name}+{label}", constraint=label)
        try:
            if RULES[case.cfg.rule].renoise:
                raise UsageError("structured output: not combined with a renoising sampler (no masks to commit "
                                 "left to right; docs/specs/structured-output.md)")
            refuse_constrained(case.cfg, None, [label], 1)
        except UsageError as e:
            if f"{twin.name}: {e}" not in left_out:
                left_out.append(f"{twin.name}: {e}")
            continue
        out.append(twin)
    return out, left_out


def swept_values(sweep: Sweep, param: str | None) -> tuple | None:
    """The values swept for a rule parameter (threshold, factor), None when it is not swept."""
    return getattr(sweep, param, None) if param in SWEPT_PARAMS else None
