"""Which settings combine: the pairwise refusals of the decoding settings, one table (PAIRS) read by
one function (`refuse_pairs`) that names the conflict in one line:

    "<method's head> not combined with <the other setting> (<why>)"

Each method's rows are tried in the table's order, at the point of its checks where the caller
asks (config.DecodeConfig.__post_init__'s per-method checks; the mask loop for structured output),
so that of several conflicts the same one is named first as before. A row's names may hold
{cache}, {mode} and {rule}, filled from the config.

A second table (FAMILY) holds a method against what a family is, read from the model class's
declared contract (models/base.py): `refuse_family` names the first that applies. Refusals that are
neither (a rule's needs, a value out of range, the task's shape) stay with the code they guard.
"""

from __future__ import annotations

from .cache_modes import CACHE_MODES
from .rules import RULES

UNSET = "unset one"
GRID = "its canvas counts blocks from the prompt's end; use block_align prompt"
GROWING = "it reads the canvas after the current block, which does not exist yet"
SPLIT = "it splits the whole canvas at the prompt's end, the same slot in every row"
ANCHORS = "its anchors stand in the suffix; unset one"
GRAMMAR = "; docs/specs/structured-output.md"
EARLY, EDITS = "it commits every remaining mask at once" + GRAMMAR, "it overwrites committed tokens" + GRAMMAR
DROPS = "it drops masks the grammar may need" + GRAMMAR

HEADS = {                       # how each method's refusal begins
    "focus_alpha": "focus_alpha:",
    "klass": "the klass rule is",
    "grid": "block_align grid:",
    "variable_length": "variable_length:",
    "features": "cache {cache}:",           # dLLM-Cache (cache_modes: a feature cache)
    "dpad": "dpad:",
    "prophet": "prophet:",
    "structured": "structured output:",
}


def delayed(c) -> bool:
    return CACHE_MODES[c.cache].delayed


PAIRS = (
    # method           whether the other setting is set                      its name             why
    ("focus_alpha",     lambda c: c.sub_block_len,                           "sub_block_len",     UNSET),
    ("focus_alpha",     lambda c: c.edit_threshold is not None,              "edit_threshold",    UNSET),
    ("focus_alpha",     lambda c: c.indel,                                   "indel",             UNSET),
    ("focus_alpha",     lambda c: c.credit,                                  "credit",            UNSET),
    ("focus_alpha",     lambda c: c.prophet,                                 "prophet",           UNSET),
    ("focus_alpha",     lambda c: c.dpad_window,                             "dpad",              UNSET),
    ("focus_alpha",     lambda c: c.variable_length,                         "variable_length",   UNSET),
    ("focus_alpha",     lambda c: c.end_think_boost,                         "end_think_boost",   UNSET),
    ("focus_alpha",     lambda c: c.batch_invariant,                         "batch_invariant",   UNSET),
    ("focus_alpha",     lambda c: c.mode != "diffusion",                     "mode {mode}",       UNSET),
    ("klass",           lambda c: c.credit,                                  "credit",            UNSET),
    ("klass",           lambda c: c.prophet,                                 "prophet",           UNSET),
    ("klass",           lambda c: c.dpad_window,                             "dpad",              UNSET),
    ("klass",           lambda c: c.edit_threshold is not None,              "edit_threshold",    UNSET),
    ("klass",           lambda c: c.sub_block_len,                           "sub_block_len",     UNSET),
    ("klass",           delayed,                                             "cache {cache}",     UNSET),
    ("grid",            lambda c: c.prophet,                                 "prophet",           GRID),
    ("grid",            lambda c: c.dpad_window,                             "dpad",              GRID),
    ("grid",            delayed,                                             "{cache}",           GRID),
    ("variable_length", lambda c: c.prophet,                                 "prophet",           GROWING),
    ("variable_length", lambda c: c.dpad_window,                             "dpad",              GROWING),
    ("variable_length", lambda c: c.rule == "klass",                         "rule klass",        GROWING),
    ("variable_length", lambda c: RULES[c.rule].renoise,                     "rule {rule}",       GROWING),
    ("variable_length", lambda c: delayed(c) or CACHE_MODES[c.cache].features, "cache {cache}",   GROWING),
    ("features",        lambda c: c.dpad_window,                             "dpad",              SPLIT),
    ("features",        lambda c: c.block_align == "grid",                   "block_align grid",  SPLIT),
    ("dpad",            lambda c: c.prophet,                                 "prophet",           ANCHORS),
    ("prophet",         lambda c: c.edit_threshold is not None,              "edit_threshold",    UNSET),
    ("prophet",         lambda c: c.credit,                                  "credit",            UNSET),
    ("structured",      lambda c: c.prophet,                                 "prophet",           EARLY),
    ("structured",      lambda c: c.edit_threshold is not None,              "edit_threshold",    EDITS),
    ("structured",      lambda c: c.focus_alpha is not None,                 "focus_alpha",       DROPS),
)


def refuse_pairs(cfg, method: str, error: type[Exception]) -> None:
    """Raise `error` naming the first setting of PAIRS that `method` is not combined with, if any."""
    names = {"cache": cfg.cache, "mode": cfg.mode, "rule": cfg.rule}
    for row, on, other, why in PAIRS:
        if row == method and on(cfg):
            raise error(f"{HEADS[method].format(**names)} not combined with {other.format(**names)} ({why})")


FOCUS_FAMILIES = "SDAR, TraDo, LLaDA2.0/2.1"
FAMILY = (
    # method            whether this model refuses it                 the line ({name}, {sampler}, {kind} filled)
    ("focus_alpha",     lambda m: m.sampler != "mask",               "focus_alpha: {name}'s decoder is not the mask loop; FOCUS "
                                                                     "drops masked tokens of a block"),
    ("focus_alpha",     lambda m: not m.attention.causal,            "focus_alpha: FOCUS drops tokens inside a block of a block-"
                                                                     "causal model (SDAR, TraDo, LLaDA2.x); {name} attends {kind}"),
    ("focus_alpha",     lambda m: m.logit_shift,                     "focus_alpha: {name} predicts each position from the slot "
                                                                     "before it; FOCUS keeps masked slots that predict themselves "
                                                                     f"({FOCUS_FAMILIES})"),
    ("focus_alpha",     lambda m: m.routing_block,                   "focus_alpha: {name} picks a routing block's experts from all "
                                                                     "its tokens (LLaDA2.2's block routing); dropping tokens would "
                                                                     "change the routes"),
    ("focus_alpha",     lambda m: len(m.blocks) < 2,                 "focus_alpha: FOCUS reads layers 0 and 1; {name} has one layer"),
    ("klass",           lambda m: m.sampler != "mask",               "rule klass: {name} decodes with its own {sampler} stepper; "
                                                                     "KLASS is built for mask decoding of bidirectional models "
                                                                     "(LLaDA, Dream)"),
    ("klass",           lambda m: m.attention.causal,                "rule klass: {name} is block-causal; KLASS is built for "
                                                                     "bidirectional models (LLaDA, Dream), whose every step may "
                                                                     "read the next block"),
    ("edit_threshold",  lambda m: not m.attention.causal,            "{name} attends bidirectionally: an edit would change what "
                                                                     "every earlier block saw; token editing needs block-causal "
                                                                     "attention (LLaDA2.x)"),
    ("edit_threshold",  lambda m: m.logit_shift,                     "{name} predicts each token from the one before it; token "
                                                                     "editing needs a family that predicts each position from "
                                                                     "itself (LLaDA2.x)"),
    ("dpad",            lambda m: m.attention.causal,                "dpad drops attention to the masked suffix; {name} attends "
                                                                     "block-causally and never sees it"),
    ("batch_invariant", lambda m: m.attention.causal,                "batch_invariant: not implemented with block-causal attention "
                                                                     "({name}); it covers bidirectional models with cache none, "
                                                                     "prefix or dual"),
)


def refuse_family(model, name: str, method: str, error: type[Exception]) -> None:
    """Raise `error` with the first line of FAMILY by which `model` (a DiffusionLM) refuses `method`."""
    for row, refuses, line in FAMILY:
        if row == method and refuses(model):
            raise error(line.format(name=name, sampler=model.sampler, kind=model.attention.kind))
