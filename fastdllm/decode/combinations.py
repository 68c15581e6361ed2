"""Which settings combine: the pairwise refusals of the decoding settings, one table (PAIRS) read by
one function (`refuse_pairs`) that names the conflict in one line:

    "<method's head> not combined with <the other setting> (<why>)"

Each method's rows are tried in the table's order, at the point of its checks where the caller
asks (config.DecodeConfig.__post_init__'s per-method checks; the mask loop for structured output),
so that of several conflicts the same one is named first as before. A row's names may hold
{cache}, {mode} and {rule}, filled from the config. Refusals that are not a pair of settings (a
rule's needs, a family's attention, a value out of range) stay with the code they guard.
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
