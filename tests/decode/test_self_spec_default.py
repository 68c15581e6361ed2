"""Nemotron's `--mode self_spec` with no rule drafts as the checkpoint's linear_spec_generate does
by default (threshold 0: one draft forward fills every mask, docs/specs/nemotron-diffusion.md 5), not by
the family profile's block-decoding threshold 0.9; a rule or threshold named with the mode, or
after it, is kept. On the tiny Nemotron the default equals the reference's threshold-0 run."""

from __future__ import annotations

import pytest
import torch
import reference_nemotron as ref
from helpers import BYTE_IDS, prompt_of, upto_stop

from fastdllm.checkpoints.loading import load
from fastdllm.decode.engine import run
from fastdllm.decode.profiles import Profile, default_profile_for, find, resolve

pytestmark = pytest.mark.usefixtures("one_thread")          # tests/conftest.py
L, G = 8, 32                   # block length, answer length (as in test_nemotron_modes)
NO_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def tiny_dir(tiny):
    return tiny("nemotron", dtype=torch.float32, block_size=L, favoured=2, favour_scale=8.0)


def drafts(flags, environ=NO_ENV, profile="nemotron-diffusion", model_dir=None):
    cfg = resolve(find(profile) if isinstance(profile, str) else profile, flags, model_dir, environ)
    return cfg.mode, cfg.rule, cfg.threshold if cfg.rule == "threshold" else None


def test_the_mode_alone_drafts_with_threshold_0():
    assert drafts({"mode": "self_spec"}) == ("self_spec", "fixed", None)
    assert drafts({}, {"FASTDLLM_MODE": "self_spec"}) == ("self_spec", "fixed", None)
    assert drafts({"mode": "self_spec", "steps": None}, {"FASTDLLM_STEPS": "8"}) == ("self_spec", "fixed", None)


def test_a_rule_or_threshold_named_with_the_mode_or_later_is_kept():
    assert drafts({"mode": "self_spec", "rule": "threshold"}) == ("self_spec", "threshold", 0.9)
    assert drafts({"mode": "self_spec", "threshold": 0.5}) == ("self_spec", "threshold", 0.5)
    assert drafts({"threshold": 0.7}, {"FASTDLLM_MODE": "self_spec"}) == ("self_spec", "threshold", 0.7)
    both = Profile("spec", "user", None, {"mode": "self_spec", "rule": "threshold", "threshold": 0.8})
    assert drafts({}, profile=both) == ("self_spec", "threshold", 0.8)
    assert drafts({}) == ("diffusion", "threshold", 0.9)                # block decoding: the profile's


def test_the_default_decodes_as_linear_spec_generate_with_threshold_0(tiny_dir):
    lm = load(tiny_dir, dtype="fp64", device="cpu")
    profile = find(default_profile_for(tiny_dir))
    assert profile.name == "nemotron-diffusion"
    cfg = resolve(profile, {"mode": "self_spec", "gen_len": G, "block_len": L}, tiny_dir, NO_ENV)
    result = run(lm.decoder, [prompt_of(21, **BYTE_IDS)], cfg)
    W, config = ref.load(tiny_dir)
    out, nfe, _ = ref.linear_spec_generate(W, config, torch.tensor([prompt_of(21, **BYTE_IDS)]), G, L, 0.0, None)
    assert result.ids[0] == upto_stop(out[0, 21:].tolist(), config["eos_token_id"])[:G] and result.nfe == nfe
    # the profile's threshold, named with the mode: the same tokens, more forwards
    slow = run(lm.decoder, [prompt_of(21, **BYTE_IDS)], resolve(profile, {"mode": "self_spec", "rule": "threshold", "gen_len": G,
                                                           "block_len": L}, tiny_dir, NO_ENV))
    assert slow.ids == result.ids and slow.nfe > result.nfe
