"""One exactness runner for every family that fits it (as mlx-lm tests every model with one runner):
fastdllm against an independent float64 transcription of the family's authors' decoder, on the
same tiny checkpoint: the same tokens, the same NFE and, where the transcription records them, the
same (row, position) commits at every step.

A family is one entry of EXACT: its tiny float64 checkpoint (a session fixture of tests/conftest.py,
or a writer from fastdllm/testing/) with its transcription's state, the transcription's decoder, the
prompt, the cases (DecodeConfig fields) and the family's own extra claims. The fast lane keeps the
cases each family's tests had there (`fast`); the others run in the full suite.

Not here yet, each still in its own file against its own transcription: RND1 (test_rnd1.py: the
canvas is given as holes, draws injected for sampling), Steerling (test_steerling.py: the reference
reads the folder and samples with its own seeded draws), Fast-dLLM v2 (test_blockdiff.py: the
first token of each block comes from a store pass), LLaDA2.x and LLaDA-MoE (test_moe.py,
test_llada2_2.py: routing and editing beside tokens), Nemotron (test_nemotron_decode.py: a causal
prefill and per-step denoise traces), DiffusionGemma (test_diffusion_gemma.py: the reference is
transformers' own generate)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Callable

import pytest
import reference_blockdiff
import reference_illada
import torch
from block_families import HEAVY, block_steps, heavy, sdar_moe_checkpoints, sdar_trace
from conftest import HEAVY_PROMPT
from helpers import QWEN_IDS, prompt_of
from mask_heavy import max_mask_probability
from reference import reference_generate

from fastdllm.checkpoints import loading
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import StepEvent, generate
from fastdllm.testing.tiny_illada import MASK_ID as ILLADA_MASK
from fastdllm.testing.tiny_illada import write_illada

pytestmark = pytest.mark.usefixtures("one_thread")        # tiny float64 ops (tests/conftest.py)


@dataclass(frozen=True)
class Trace:
    tokens: list[int]                     # the generated part of the canvas
    nfe: int
    steps: list | None = None             # per step the sorted [row, canvas position] committed


@dataclass(frozen=True)
class Exact:
    load: Callable                        # (request, checkpoint name) -> (LoadedModel in float64, transcription state)
    authors: Callable                     # (lm, state, prompt, cfg, case) -> Trace by the transcription
    prompt: Callable                      # (lm, case) -> prompt ids
    cases: dict[str, dict]                # case id -> DecodeConfig fields (and `checkpoint`, the family's own keys)
    check: Callable                       # (lm, prompt, cfg, case, Result): the family's own extra claims
    fast: frozenset = field(default=frozenset())   # case ids in the fast lane
    ours: Callable = None                 # (lm, prompt, cfg) -> (steps as the Trace has them, Result); None: ours()


DECODE_FIELDS = {f.name for f in fields(DecodeConfig)}


def ours(lm, prompt: list[int], cfg: DecodeConfig) -> tuple[list, object]:
    steps, result = [], None
    for event in generate(lm.decoder, [prompt], cfg):
        if isinstance(event, StepEvent):
            picked = event.positions[event.committed] + len(prompt)
            rows = event.committed.nonzero()[:, 0]
            steps.append(sorted([int(r), int(c)] for r, c in zip(rows, picked)))
        else:
            result = event
    return steps, result


# --- LLaDA and Dream: NVlabs/Fast-dLLM v1's generate, prefix and dual cache (tests/reference.py) -----

def fast_dllm_v1(lm, _state, prompt, cfg, case) -> Trace:
    record = []
    rule = {"fixed": {}, "threshold": {"threshold": cfg.threshold}, "factor": {"factor": cfg.factor}}[cfg.rule]
    canvas, nfe = reference_generate(
        lm, torch.tensor([prompt]), cache=cfg.cache, gen_length=cfg.gen_len, block_length=cfg.block_len,
        steps=cfg.total_steps, mask_id=lm.specials.mask, record=record, **rule, **case.get("quirks", {}))
    return Trace(canvas[0, len(prompt):].tolist(), nfe, [sorted(s) for s in record])


def parallel_and_unhidden(lm, prompt, cfg, case, result):
    if cfg.rule != "fixed" and "quirks" not in case:    # the model is peaked enough that parallel decoding happens
        assert result.nfe < cfg.gen_len
    if case["checkpoint"].endswith("heavy_mask") and "quirks" not in case:   # the fixture does not hide the normaliser
        assert max_mask_probability(lm, prompt + [lm.specials.mask] * cfg.gen_len) > 0.05


RULES = {"fixed": dict(rule="fixed", steps=16),           # two tokens per step (32 tokens, 16 steps)
         "threshold": dict(rule="threshold", threshold=0.7),
         "factor": dict(rule="factor", factor=1.0)}


def v1_cases(fixture: str) -> dict[str, dict]:
    cases = {f"{variant}-{rule}-{cache}": dict(checkpoint=f"{fixture}{variant}", gen_len=32, block_len=8, cache=cache,
                                               early_stop=False, **RULES[rule])
             for variant in ("", "_heavy_mask") for rule in RULES for cache in ("none", "prefix", "dual")}
    # Dream's topk_margin and entropy (also LLaDA's engine options) on the fixed schedule, with a mask
    # that takes real probability: the authors' confidences over the full softmax
    cases.update({f"heavy_mask-{measure}-{cache}": dict(
        checkpoint=f"{fixture}_heavy_mask", gen_len=32, block_len=8, cache=cache, rule="fixed", steps=16,
        confidence=measure, early_stop=False, quirks={"measure": measure})
        for measure in ("margin", "neg_entropy") for cache in ("none", "dual")})
    return cases


def session_fixture(request, name):
    return request.getfixturevalue(name), None


def models(fixture: str) -> Callable:
    return lambda request, name: request.getfixturevalue(fixture)(name)


def chat_prompt(lm, case):
    return lm.encode(HEAVY_PROMPT, chat=True)


# --- iLLaDA: ML-GSAI/LLaDA's generate and var_generate (tests/references/reference_illada.py) -------------------

ILLADA_PROMPT = [100, 7, 99, 150, 12, 13, 14]


@pytest.fixture(scope="module")
def illada_models(tmp_path_factory):
    made = {}

    def get(name):
        if name not in made:
            folder = write_illada(tmp_path_factory.mktemp("illada") / name, dtype=torch.float64)
            made[name] = (loading.load(folder, dtype="fp64"), reference_illada.NaiveILLaDA(folder))
        return made[name]
    return get


def illada_authors(lm, naive, prompt, cfg, case) -> Trace:
    x = torch.tensor([prompt])
    per_block = cfg.steps_per_block
    if cfg.variable_length:
        out, nfe = reference_illada.var_generate(naive, x, steps=per_block, gen_length=cfg.gen_len,
                                                 block_length=cfg.block_len, mask_id=ILLADA_MASK)
    else:
        out, nfe = reference_illada.fixed_generate(naive, x, steps=per_block * (cfg.gen_len // cfg.block_len),
                                                   gen_length=cfg.gen_len, block_length=cfg.block_len,
                                                   mask_id=ILLADA_MASK)
    return Trace(out[0, len(prompt):].tolist(), nfe)


def illada_k_per_step(lm, prompt, cfg, case, result):
    assert result.blocks_decoded * cfg.block_len == cfg.gen_len
    assert result.nfe == cfg.gen_len // cfg.block_len * cfg.steps_per_block   # steps < block_len: k tokens a step


ILLADA_CASES = {f"{'var' if var else 'full'}-{g}-{b}-{k}": dict(
    checkpoint="main", gen_len=g, block_len=b, block_steps=k, rule="fixed", cache="none", variable_length=var,
    early_stop=False)
    for var in (False, True) for g, b, k in [(32, 8, 8), (32, 8, 3), (24, 8, 2), (16, 16, 5)]}


# --- SDAR and SDAR-30B-A3B: JetAstra/SDAR's generate (tests/references/reference_blockdiff.py) ---------------

@pytest.fixture(scope="module")
def sdar_models(tiny, tmp_path_factory):
    made = {}

    def get(name):
        if name not in made and name == HEAVY:
            lm, _ = get("main")
            made[name] = heavy(lm, reference_blockdiff.NaiveQwen, tmp_path_factory,
                               prompt_of(5, **QWEN_IDS) + [lm.specials.mask] * 16)
        if name not in made:
            path = tiny("sdar")
            made[name] = (loading.load(path, dtype="fp64"), reference_blockdiff.NaiveQwen(path))
        return made[name]
    return get


@pytest.fixture(scope="module")
def sdar_moe_models(tmp_path_factory):
    return sdar_moe_checkpoints(tmp_path_factory)


SDAR_TRACES: dict[tuple, Trace] = {}     # one authors' run serves a case's prefix-cache and no-cache twins


def sdar_authors(lm, naive, prompt, cfg, case) -> Trace:
    key = (str(lm.path), tuple(prompt), cfg.gen_len, cfg.block_len, cfg.steps, cfg.rule, cfg.threshold)
    if key not in SDAR_TRACES:
        trace = sdar_trace(lm, naive, prompt, cfg.gen_len, cfg.block_len, cfg.steps // (cfg.gen_len // cfg.block_len),
                           cfg.rule, cfg.threshold)
        assert not trace.stopped                               # the comparison covers whole canvases
        SDAR_TRACES[key] = Trace(trace.canvas[len(prompt):], trace.nfe, [pairs for _, pairs in trace.steps if pairs])
    return SDAR_TRACES[key]


def sdar_ours(lm, prompt, cfg):
    steps, stored, result = block_steps(lm, [prompt], cfg)
    assert stored[0] == []                                     # no shift: store passes commit nothing
    return steps[0], result


def sdar_cache_used(lm, prompt, cfg, case, result):
    assert result.cache_bytes > 0 or cfg.cache != "prefix"


def sdar_cases(runs) -> dict[str, dict]:
    """runs: (checkpoint, prompt length, rule, steps per block); 16 tokens in blocks of 4, each with
    the prefix cache and without one; the heavy mask at threshold 0.9."""
    return {f"{name}-{length}-{rule}-{per_block}-{cache}": dict(
        checkpoint=name, prompt_len=length, gen_len=16, block_len=4, rule=rule, steps=per_block * 4,
        threshold=0.9 if name == HEAVY else 0.7, cache=cache, early_stop=False)
        for name, length, rule, per_block in runs for cache in ("prefix", "none")}


SDAR_RULES = [("fixed", 4), ("fixed", 2), ("fixed", 1), ("dynamic", 4), ("dynamic", 2), ("sequential", 2)]
SDAR_CASES = sdar_cases([("main", n, r, k) for n in (3, 4, 5, 11) for r, k in SDAR_RULES]
                        + [(HEAVY, n, r, k) for n in (4, 5) for r, k in SDAR_RULES if (r, k) in
                           {("fixed", 2), ("dynamic", 4), ("dynamic", 2), ("sequential", 2)}])
SDAR_MOE_CASES = sdar_cases([("main", n, r, k) for n in (3, 4, 5, 11) for r, k in SDAR_RULES] + [
    ("mixed", 4, "dynamic", 4), ("mixed", 7, "fixed", 2), (HEAVY, 4, "dynamic", 4), (HEAVY, 5, "dynamic", 2),
    (HEAVY, 4, "fixed", 2), (HEAVY, 5, "sequential", 2)])


def qwen_prompt(lm, case):
    return prompt_of(case["prompt_len"], **QWEN_IDS)


EXACT = {
    "llada": Exact(session_fixture, fast_dllm_v1, chat_prompt, v1_cases("llada64"), parallel_and_unhidden,
                   fast=frozenset({"-fixed-none", "heavy_mask-margin-none"})),
    "sdar": Exact(models("sdar_models"), sdar_authors, qwen_prompt, SDAR_CASES, sdar_cache_used, ours=sdar_ours,
                  fast=frozenset({"main-3-fixed-4-prefix", "main-3-fixed-4-none", "heavy_mask-4-fixed-2-prefix"})),
    "sdar_moe": Exact(models("sdar_moe_models"), sdar_authors, qwen_prompt, SDAR_MOE_CASES, sdar_cache_used,
                      ours=sdar_ours, fast=frozenset({"main-3-fixed-4-prefix", "mixed-4-dynamic-4-none"})),
    "Dream": Exact(session_fixture, fast_dllm_v1, chat_prompt, v1_cases("dream64"), parallel_and_unhidden),
    "illada": Exact(models("illada_models"), illada_authors, lambda lm, case: ILLADA_PROMPT, ILLADA_CASES, illada_k_per_step,
                    fast=frozenset(ILLADA_CASES)),
}
CASES = [pytest.param(f, c, id=f"{f}{'' if c.startswith('-') else '-'}{c}",
                      marks=() if c in e.fast else pytest.mark.slow) for f, e in EXACT.items() for c in e.cases]


@pytest.mark.parametrize("family, case", CASES)
def test_tokens_and_nfe_equal_the_authors(family, case, request):
    exact, settings = EXACT[family], EXACT[family].cases[case]
    lm, state = exact.load(request, settings["checkpoint"])
    cfg = DecodeConfig(**{k: v for k, v in settings.items() if k in DECODE_FIELDS})
    prompt = exact.prompt(lm, settings)
    steps, result = (exact.ours or ours)(lm, prompt, cfg)
    theirs = exact.authors(lm, state, prompt, cfg, settings)
    assert result.nfe == theirs.nfe
    if theirs.steps is not None:
        assert steps == theirs.steps
    assert result.canvas[0].tolist() == theirs.tokens
    exact.check(lm, prompt, cfg, settings, result)
