"""KLASS, the `klass` rule (docs/accelerators/klass.md 6.1): fastdllm against the transcription of the
authors' LLaDA `stable_confident_decode` (tests/references/reference_klass.py) in float64, the same (position,
token) pairs at every step and the same NFE, prompts on and off the block grid, histories of 1 to 3;
both of its paths (ready, fallback) really taken; a batch's rows each equal to the transcription
alone; Dream's one-canvas variant; the decision for cached steps (no previous distribution: never
stable); refusals; the profile; the CLI."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from conftest import HEAVY_PROMPT
from reference_klass import generate_klass
from cli_runner import invoke
from dus_trace import ours

from fastdllm.decode import profiles
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.combinations import refuse_family
from fastdllm.decode.selection import select
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread")]
# Random tiny weights are rarely 0.6 sure nor 0.015 stable: these bars make both paths happen
LOW = dict(threshold=0.3, klass_kl=0.2)


def test_ready_is_stable_and_strictly_above_the_bar_else_the_schedule():
    cfg = DecodeConfig(rule="klass", threshold=0.6)
    conf = torch.tensor([[0.9, 0.6, 0.7, 0.95, 0.2]], dtype=torch.float64)
    candidate = torch.tensor([[True, True, True, True, True]])
    stable = torch.tensor([[True, True, True, False, True]])
    chosen = select(conf, candidate, cfg, torch.tensor([2]), stable)
    assert chosen.tolist() == [[True, False, True, False, False]]      # 0.6 is not > 0.6; 0.95 is not stable
    none_ready = select(conf, candidate, cfg, torch.tensor([2]), stable & (conf < 0.6))
    assert none_ready.tolist() == [[True, False, False, True, False]]  # the schedule's two most confident
    with pytest.raises(UserError, match="no stability"):
        select(conf, candidate, cfg, torch.tensor([2]))


def theirs(lm, prompt, cfg, variant="llada"):
    record, paths = [], []
    x, nfe = generate_klass(lm, torch.tensor([prompt]), gen_length=cfg.gen_len, block_length=cfg.block_len,
                            steps=cfg.total_steps, conf_threshold=cfg.threshold, kl_threshold=cfg.klass_kl,
                            history=cfg.klass_history, mask_id=lm.specials.mask, variant=variant, record=record,
                            paths=paths)
    return record, x[0, len(prompt):], nfe, paths


def klass(**values):
    return DecodeConfig(**{**dict(gen_len=32, block_len=8, rule="klass", cache="none", early_stop=False, **LOW),
                           **values})


@pytest.mark.parametrize("history", [2, 1, 3])
@pytest.mark.parametrize("grid", ["off", "on"])              # prompt length 42 (42 % 8 = 2) or 40
def test_step_by_step_equal_to_the_transcription(llada64, grid, history):
    prompt = llada64.encode(HEAVY_PROMPT, chat=True)
    prompt = prompt[:40] if grid == "on" else prompt
    assert (len(prompt) % 8 == 0) == (grid == "on")
    cfg = klass(klass_history=history)
    (our_steps,), result = ours(llada64, [prompt], cfg)
    ref_steps, ref_canvas, ref_nfe, paths = theirs(llada64, prompt, cfg)
    assert our_steps == ref_steps and result.nfe == ref_nfe
    assert result.canvas[0].tolist() == ref_canvas.tolist()
    assert paths.count("ready") > 0 and paths.count("fallback") > 0     # both paths taken
    assert result.nfe < cfg.gen_len                                      # some step committed several


def test_the_first_steps_of_a_block_compare_with_the_previous_block(llada64):
    """History 1: a block's first step is stable where its KL against the previous block's last forward
    is low (theirs, and fastdllm with no cache or prefix: that forward covered the next block). On
    DualCache that forward recomputed only its own block: no previous distribution, never stable, so
    the first step of every block takes the schedule's one token."""
    prompt = llada64.encode(HEAVY_PROMPT, chat=True)
    lax = dict(klass_history=1, klass_kl=10.0, threshold=1e-6)              # stable = known, ready = every mask
    first = {}
    for cache in ("none", "prefix", "dual"):
        (steps,), result = ours(llada64, [prompt], klass(cache=cache, **lax))
        first[cache] = [len(s) for s in steps]
    # none and prefix: block 0 takes 1 then 7 (step 0 has no past); blocks 1-3 commit all 8 at once
    assert first["none"] == first["prefix"] == [1, 7, 8, 8, 8]
    assert first["dual"] == [1, 7] * 4
    ref_steps, _, ref_nfe, _ = theirs(llada64, prompt, klass(**lax))
    assert [len(s) for s in ref_steps] == first["none"]


def test_a_batch_rows_each_equal_the_transcription_alone(llada64):
    prompts = [llada64.encode(HEAVY_PROMPT, chat=True), llada64.encode("Hi.", chat=True)]
    assert len(prompts[0]) != len(prompts[1])         # left-padded; the authors' loop is batch 1
    cfg = klass()
    steps, result = ours(llada64, prompts, cfg)
    for r, prompt in enumerate(prompts):
        ref_steps, ref_canvas, _, _ = theirs(llada64, prompt, cfg)
        assert [s for s in steps[r] if s] == ref_steps              # a finished row idles
        assert result.canvas[r].tolist() == ref_canvas.tolist()


def test_dream_one_canvas_is_the_same_rule(dream64):
    """Their Dream decoder (>=, no step guard, fallback one token) on one canvas with one scheduled token
    a step: the same commits as the klass rule (they differ only at a confidence equal to the bar)."""
    prompt = dream64.encode(HEAVY_PROMPT, chat=True)
    cfg = klass(gen_len=16, block_len=16)
    (our_steps,), result = ours(dream64, [prompt], cfg)
    ref_steps, ref_canvas, ref_nfe, paths = theirs(dream64, prompt, cfg, variant="dream")
    assert our_steps == ref_steps and result.nfe == ref_nfe
    assert paths.count("ready") > 0 and paths.count("fallback") > 0


@pytest.mark.parametrize("values,words", [
    (dict(rule="klass", temperature=0.7), "greedy"),
    (dict(rule="klass", klass_kl=0), "klass_kl"),
    (dict(rule="klass", klass_kl=11), "klass_kl"),
    (dict(rule="klass", klass_history=0), "klass_history"),
    (dict(rule="klass", confidence="margin"), "needs confidence prob"),
    (dict(rule="klass", credit=True), "not combined with credit"),
    (dict(rule="klass", cache="dkv"), "not combined with cache dkv"),
    (dict(rule="klass", sub_block_len=8), "not combined with sub_block_len"),
    (dict(rule="klass", steps=3), "not divisible"),
])
def test_config_refusals_are_one_line(values, words):
    with pytest.raises(ConfigError, match=words) as err:
        DecodeConfig.from_dict(values)
    assert "\n" not in str(err.value)


def test_other_steppers_are_refused_by_name():
    causal = SimpleNamespace(name="SDAR", model=SimpleNamespace(sampler="mask", attention=SimpleNamespace(kind="block-causal", causal=True)))
    with pytest.raises(UserError, match="SDAR is block-causal"):
        refuse_family(causal.model, causal.name, "klass", UserError)
    gemma = SimpleNamespace(name="DiffusionGemma", model=SimpleNamespace(sampler="renoise", attention=SimpleNamespace(kind="bidirectional", causal=False)))
    with pytest.raises(UserError, match="DiffusionGemma decodes with its own renoise stepper"):
        refuse_family(gemma.model, gemma.name, "klass", UserError)


def test_serve_never_replans_a_klass_batch():
    from fastdllm.serve.rows import whole_answer

    assert whole_answer(klass()) and not whole_answer(DecodeConfig(rule="local_leap"))   # a new batch: a new history


def test_the_profile_and_the_cli():
    cfg = profiles.resolve(profiles.find("klass"), {})
    assert (cfg.rule, cfg.threshold, cfg.klass_kl, cfg.klass_history, cfg.cache, cfg.block_len, cfg.gen_len,
            cfg.total_steps) == ("klass", 0.6, 0.015, 2, "none", 64, 256, 256)
    r = invoke("generate", "-P", "klass", "-n", "64", "--json", "def add(a, b):")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["config"]["rule"] == "klass" and record["nfe"] < 64
