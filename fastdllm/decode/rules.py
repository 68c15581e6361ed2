"""Commit rules: one table. A rule answers, per row and step, how many of the candidate positions
to commit; the committed ones are always the most confident (selection.select). DecodeConfig's
choices, the CLI help, bench labels and the live view's header are all read from this table, so a
new rule is one entry here.

Torch-free on purpose (profiles and `--help` must not import torch): the count functions use
tensor methods only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import UserError
from ..units import plural


@dataclass(frozen=True)
class Rule:
    name: str
    param: str | None                     # the DecodeConfig field that tunes it (None: nothing)
    count: Callable                       # (sorted_conf (B, K) desc, cfg, scheduled (B,)) -> n (B,)
    value: Callable[[Any], Any]           # cfg -> the parameter's effective value
    label: Callable[[Any, int], str]      # (value, gen_len) -> header text, e.g. "threshold 0.9"
    short: Callable[[Any, int], str]      # (value, gen_len) -> table cell, e.g. "t=0.9"
    help: str
    scheduled: bool = False               # follows the fixed per-step schedule (steps per block)
    needs_probability: bool = False       # compares confidences with probabilities
    by_position: bool = False             # commits the leftmost candidates, not the most confident
    measure: str | None = None            # the confidence measure it needs, if one
    renoise: bool = False                 # a renoising sampler's acceptance (DiffusionGemma), not a commit rule
    whole_canvas: bool = False            # defined over one global canvas: block_len is gen_len (RND1)
    bound: str | None = None              # a second number per candidate its count reads ("entropy";
                                          # "level": DUS's planned order, which also ranks the candidates;
                                          # "position": the canvas positions LocalLeap's radius reads;
                                          # "stable": KLASS's stable candidates, klass.py)
    fills_last_step: bool = False         # commits whatever is left at step S (selection.block_schedule)


def _threshold(sorted_conf, cfg, scheduled):
    return (sorted_conf >= cfg.threshold).sum(-1)


def _factor(sorted_conf, cfg, scheduled):
    rank = sorted_conf.new_ones(sorted_conf.shape[-1]).cumsum(0)    # 1, 2, ..., K
    ok = (rank + 1) * (1 - sorted_conf) < cfg.factor                # monotone in rank: a prefix
    return ok.long().cumprod(-1).sum(-1)


def _frechet(sorted_conf, cfg, scheduled):
    # Fast-dLLM++'s Frechet profile (docs/accelerators/frechet.md 6.4): over the candidates' confidences c_1 >=
    # c_2 >= ..., score_n = (c_1 + .. + c_n - (n - 1)) - (1 - c_n), the Frechet lower bound on the
    # first n all being right less the bound on a rival of the n-th; count every n with score_n >
    # frechet_margin, the first always. score_n never rises with n, so the n counted are a prefix;
    # counted as the authors do (not cut at the first failure), in their order of operations, so that
    # a rounding decides alike. Non-candidates (-inf, last) add 0 to the sum and are never counted.
    valid = sorted_conf > float("-inf")                                          # (B, K)
    cum = sorted_conf.masked_fill(~valid, 0.0).cumsum(-1)                        # (B, K)
    rank0 = sorted_conf.new_ones(sorted_conf.shape[-1]).cumsum(0) - 1            # (K,) 0, 1, .., K-1
    score = (cum - rank0) - (1.0 - sorted_conf)
    return (((score > cfg.frechet_margin) & valid) | (rank0 == 0)).sum(-1)


def _fixed(sorted_conf, cfg, scheduled):
    return scheduled


def _dynamic(sorted_conf, cfg, scheduled):
    return (sorted_conf > cfg.threshold).sum(-1).maximum(scheduled)


def _dinfer(sorted_conf, cfg, scheduled):
    # inclusive threshold; when none reaches it, the best one and every candidate within 1e-5 of it
    bar = (sorted_conf[:, :1] - 1e-5).clamp_max(cfg.threshold)
    return (sorted_conf >= bar).sum(-1)


def _eb_sampler(sorted_conf, cfg, scheduled):
    # confidences are -entropy, best first: accept while the entropies ranked before a position add
    # up to at most the bound (the EB-sampler; the lowest-entropy position is always accepted)
    entropy = -sorted_conf
    return ((entropy.cumsum(-1) - entropy) <= cfg.entropy_bound).sum(-1)


def _entropy_bounded(sorted_conf, cfg, scheduled):
    # confidences are neg_entropy (sum p log p), best first: the longest prefix whose entropies add up
    # to less than the budget (non-candidates at -inf add +inf and are never counted)
    return ((-sorted_conf).cumsum(-1) < cfg.entropy_budget).sum(-1)


def _entropy_schedule(sorted_conf, cfg, scheduled):
    # RND1's diffusion_sample: of a canvas's M masks, floor(M * (t / S)) stay masked after step t
    # (t = S-1, ..., 1; none after the last), the product in float32 as theirs (an integer M t / S
    # may round below). From the m still masked (the candidates) the next of these states below m:
    # the steps that would commit nothing (S > M, or a float32 step of two) are skipped.
    # M is the block: the whole canvas (Rule.whole_canvas, block_len = gen_len); confidences are -entropy.
    m = (sorted_conf > float("-inf")).sum(-1)                                  # (B,)
    t = sorted_conf.new_ones(cfg.steps_per_block).double().cumsum(0) - 1      # (S,) 0 .. S-1
    kept = (cfg.block_len * (t / cfg.steps_per_block).float()).long()         # (S,) masks left after step t
    below = kept[None, :].where(kept[None, :] < m[:, None], -1)               # (B, S)
    return m - below.max(-1).values


def _eb_gamma(sorted_conf, cfg, scheduled, sorted_entropy):
    # RND1's eb_gamma: candidates ranked by log p of their token, best first; the longest prefix whose
    # entropies, less the largest of them, add up to at most the bound (the first always); at step S
    # whatever is left (the schedule's count then). Non-candidates (-inf) rank last and are not counted.
    excess = sorted_entropy.cumsum(-1) - sorted_entropy.cummax(-1).values
    n = ((excess <= cfg.entropy_bound) & (sorted_conf > float("-inf"))).long().cumprod(-1).sum(-1)
    return n.maximum(scheduled)


def _dilated(sorted_conf, cfg, scheduled, sorted_level):
    # DUS (decode/dilation.py): candidates ranked by their level in the block's dilated order, then
    # position; commit every candidate of the lowest level left (one level a step, as the authors';
    # a level with no mask left in a row is skipped, never a step that commits nothing)
    if sorted_level is None:
        raise UserError("rule dilated: select was given no candidate levels (the engine passes them as the bound)")
    return ((sorted_level == sorted_level[:, :1]) & (sorted_conf > float("-inf"))).sum(-1)


def _local_leap(sorted_conf, cfg, scheduled, sorted_position):
    # LocalLeap (local_leap.py): select() ranks the anchors and their leaps first, by leap_key
    from .local_leap import leap_count

    return leap_count(sorted_conf)


def _klass(sorted_conf, cfg, scheduled, sorted_stable):
    # KLASS (klass.py): select() ranks the ready candidates first; all of them, or the schedule's count
    from .klass import ready_count

    return ready_count(sorted_conf, scheduled)


def _steps_text(steps: int, gen_len: int) -> str:
    return "1/step" if steps == gen_len else plural(steps, "step")


RULES: dict[str, Rule] = {r.name: r for r in [
    Rule("threshold", "threshold", _threshold, lambda cfg: cfg.threshold,
         lambda v, n: f"threshold {v:g}", lambda v, n: f"t={v:g}",
         "commit every candidate with confidence >= threshold (at least the best one)",
         needs_probability=True),
    Rule("factor", "factor", _factor, lambda cfg: cfg.factor,
         lambda v, n: f"factor {v:g}", lambda v, n: f"f={v:g}",
         "commit the largest n with (n+1)(1 - c_n) < factor (the paper's Theorem 1)",
         needs_probability=True),
    Rule("frechet", "frechet_margin", _frechet, lambda cfg: cfg.frechet_margin,
         lambda v, n: f"frechet margin {v:g}", lambda v, n: f"fr>{v:g}",
         "Fast-dLLM++'s Frechet profile: the largest n with (c_1 + .. + c_n - (n-1)) - (1 - c_n) > "
         "frechet_margin over the sorted confidences (docs/accelerators/frechet.md 6.4)",
         needs_probability=True),
    Rule("fixed", "steps", _fixed, lambda cfg: cfg.total_steps,
         lambda v, n: f"fixed {plural(v, 'step')}", _steps_text,
         "LLaDA's schedule: steps spread evenly over the blocks (default gen_len: one token per step)",
         scheduled=True),
    Rule("dynamic", "threshold", _dynamic, lambda cfg: cfg.threshold,
         lambda v, n: f"dynamic {v:g}", lambda v, n: f"d={v:g}",
         "every candidate with confidence > threshold (strictly), at least the step's share of the "
         "schedule (SDAR's low_confidence_dynamic; Fast-dLLM v2's rule with one token per step)",
         scheduled=True, needs_probability=True),
    Rule("dinfer", "threshold", _dinfer, lambda cfg: cfg.threshold,
         lambda v, n: f"dinfer threshold {v:g}", lambda v, n: f"t>={v:g}",
         "dInfer's threshold decoder: every candidate with confidence >= min(threshold, best - 1e-5), "
         "no per-step quota (docs/specs/llada2-moe.md 6.3)",
         needs_probability=True),
    Rule("sequential", "steps", _fixed, lambda cfg: cfg.total_steps,
         lambda v, n: f"sequential {plural(v, 'step')}", _steps_text,
         "the step's share of the schedule, leftmost candidates first (SDAR's sequential)",
         scheduled=True, by_position=True),
    Rule("eb_sampler", "entropy_bound", _eb_sampler, lambda cfg: cfg.entropy_bound,
         lambda v, n: f"entropy bound {v:g}", lambda v, n: f"EB<={v:g}",
         "renoising samplers (DiffusionGemma): every step resamples the whole canvas and keeps the "
         "lowest-entropy positions whose lower-ranked entropies add up to at most entropy_bound; the "
         "rest is renoised (docs/specs/diffusion-gemma.md 5)",
         renoise=True),
    Rule("entropy_bounded", "entropy_budget", _entropy_bounded, lambda cfg: cfg.entropy_budget,
         lambda v, n: f"entropy-bounded {v:g}", lambda v, n: f"H<{v:g}",
         "the lowest-entropy candidates whose entropies add up to less than entropy_budget, at least "
         "one (SDAR's entropy_bounded as intended; the published code raises before its first step)",
         measure="neg_entropy"),
    Rule("entropy_schedule", "steps", _entropy_schedule, lambda cfg: cfg.total_steps,
         lambda v, n: f"entropy schedule, {plural(v, 'step')}", lambda v, n: f"H/{v}",
         "RND1's schedule: after step t of S, floor(M t / S) of a block's M masks stay masked, the "
         "highest-entropy ones; the others take their prediction (docs/specs/rnd1.md 5)",
         measure="entropy", whole_canvas=True),
    Rule("eb_gamma", "entropy_bound", _eb_gamma, lambda cfg: cfg.entropy_bound,
         lambda v, n: f"entropy bound {v:g} (RND1)", lambda v, n: f"EBg<={v:g}",
         "RND1's eb_gamma: the most probable masks whose entropies, less their largest, add up to at "
         "most entropy_bound; whatever is left at step S (steps) takes its prediction (docs/specs/rnd1.md 5)",
         measure="logprob", whole_canvas=True, bound="entropy", fills_last_step=True, scheduled=True),
    Rule("dilated", "dilation_base", _dilated, lambda cfg: cfg.dilation_base,
         lambda v, n: f"dilated base {v}", lambda v, n: f"DUS{v}",
         "DUS: one step per level of the block's coarse-to-fine dilated order (strides block_len / "
         "dilation_base**dilation_skip down to 1), a whole level at once; steps unused (docs/accelerators/dus.md 6.3)",
         bound="level"),
    Rule("local_leap", "leap_neighbor", _local_leap, lambda cfg: cfg.leap_neighbor,
         lambda v, n: f"local leap {v:g}", lambda v, n: f"LL{v:g}",
         "LocalLeap: the fixed schedule's most confident candidates (anchors), and every candidate within "
         "leap_radius of an anchor with confidence >= leap_anchor whose own confidence is >= leap_neighbor "
         "(docs/accelerators/local-leap.md 6.2)",
         scheduled=True, needs_probability=True, bound="position"),
    Rule("klass", "klass_kl", _klass, lambda cfg: cfg.klass_kl,
         lambda v, n: f"klass KL < {v:g}", lambda v, n: f"KL<{v:g}",
         "KLASS: every masked candidate of the block with confidence > threshold whose KL between consecutive "
         "steps stayed < klass_kl for klass_history steps; where none, the fixed schedule's most confident "
         "(docs/accelerators/klass.md 6.1)",
         scheduled=True, needs_probability=True, measure="prob", bound="stable"),
]}


def describe(cfg) -> str:
    """The rule of `cfg` with its parameter and the accelerators on it, for headers: 'threshold 0.9',
    'dinfer threshold 0.8 + credit'."""
    rule = RULES[cfg.rule]
    edits = cfg.edit_threshold
    return (rule.label(rule.value(cfg), cfg.gen_len) + (f", editing > {edits:g}" if edits is not None else "")
            + "".join(f" + {name}" for name in accelerators(cfg)))


def accelerators(cfg) -> list[str]:
    """The accelerator options `cfg` turns on (docs/accelerators.md; DUS is a rule and dKV-Cache a
    cache mode, so the header names them already)."""
    window, alpha = cfg.dpad_window, cfg.focus_alpha
    return [name for name, on in (("credit", cfg.credit), ("prophet", cfg.prophet),
                                  (f"dpad {window}", window), (f"focus {alpha:g}" if alpha else "", alpha)) if on]


def rule_fields(cfg) -> dict:
    """The rule and its parameter; every other rule's parameter is None (one column per parameter);
    gen_len to read `steps` against; the token-editing threshold (None: no editing)."""
    rule = RULES[cfg.rule]
    params = dict.fromkeys(r.param for r in RULES.values() if r.param)
    return {"rule": cfg.rule, **{p: rule.value(cfg) if p == rule.param else None for p in params},
            "gen_len": cfg.gen_len, "edit_threshold": cfg.edit_threshold, "indel": cfg.indel}


def rule_text(r: dict) -> str:
    """A record's rule as a table cell (Rule.short), from rule_fields' keys: 't=0.9'."""
    rule = RULES[r["rule"]]
    edits = r.get("edit_threshold")
    return (rule.short(r[rule.param], r["gen_len"]) + (f" e>{edits:g}" if edits is not None else "")
            + (" indel" if r.get("indel") else ""))
