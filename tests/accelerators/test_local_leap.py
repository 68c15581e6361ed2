"""LocalLeap, the `local_leap` rule (docs/accelerators/local-leap.md 6.2): the choice on a hand-made step; fastdllm
against the transcription of its commit (tests/references/reference_local_leap.py) in float64, the same
(position, token) pairs at every step and the same NFE, with no cache and on the prefix/dual block
cache, one and two anchors a step, batch 1 and a left-padded batch; leaps really happen (fewer
forwards than the schedule); refusals; the profile; the CLI."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import HEAVY_PROMPT
from reference_local_leap import generate_local_leap
from cli_runner import invoke
from dus_trace import ours

from fastdllm.decode import profiles
from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.selection import select
from fastdllm.errors import UserError

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]
# Random tiny weights are rarely 0.9 sure: low bars make anchors and leaps happen in the fixtures
LOW = dict(leap_anchor=0.2, leap_neighbor=0.05, leap_radius=2)


def test_the_anchors_and_their_confident_neighbours_are_chosen():
    cfg = DecodeConfig(rule="local_leap", leap_anchor=0.9, leap_neighbor=0.5, leap_radius=2)
    #            positions: 10    11    12    13    14    15    17    30
    conf = torch.tensor([[0.95, 0.60, 0.40, 0.55, 0.70, 0.52, 0.99, 0.80]], dtype=torch.float64)
    positions = torch.tensor([[10, 11, 12, 13, 14, 15, 17, 30]])
    candidate = torch.ones(1, 8, dtype=torch.bool)
    chosen = select(conf, candidate, cfg, torch.tensor([2]), positions)
    # anchors: 17 (0.99) and 10 (0.95), both strong; within 2 of 10: 11 (0.60), 12 (0.40 < 0.5: no);
    # within 2 of 17: 15 (0.52); 30 (0.80) is far from both; 14 (0.70) is 3 from 17 and 4 from 10
    assert positions[chosen].tolist() == [10, 11, 15, 17]
    at_bars = DecodeConfig(rule="local_leap", leap_anchor=0.95, leap_neighbor=0.6, leap_radius=2)   # inclusive
    assert positions[select(conf, candidate, at_bars, torch.tensor([2]), positions)].tolist() == [10, 11, 17]
    weak = DecodeConfig(rule="local_leap", leap_anchor=0.999, leap_neighbor=0.5, leap_radius=2)
    assert positions[select(conf, candidate, weak, torch.tensor([2]), positions)].tolist() == [10, 17]
    candidate[0, 1] = False                                   # a committed slot never leaps again
    assert positions[select(conf, candidate, cfg, torch.tensor([2]), positions)].tolist() == [10, 15, 17]
    with pytest.raises(UserError, match="no candidate positions"):
        select(conf, candidate, cfg, torch.tensor([2]))


def theirs(lm, prompt, cfg):
    record = []
    x, nfe = generate_local_leap(lm, torch.tensor([prompt]), gen_length=cfg.gen_len, block_length=cfg.block_len,
                                 steps=cfg.total_steps, anchor_threshold=cfg.leap_anchor,
                                 neighbor_threshold=cfg.leap_neighbor, radius=cfg.leap_radius,
                                 mask_id=lm.specials.mask, cache=cfg.cache, record=record)
    return record, x[0, len(prompt):], nfe


FIXTURES = ["llada64", "dream64", "llada64_heavy_mask", "dream64_heavy_mask"]     # tests/conftest.py


@pytest.mark.parametrize("steps", [32, 16])                   # one anchor a step, two
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("fixture", FIXTURES)
def test_step_by_step_equal_to_the_transcription(fixture, cache, steps, request):
    lm = request.getfixturevalue(fixture)
    prompt = lm.encode(HEAVY_PROMPT, chat=True)
    cfg = DecodeConfig(gen_len=32, block_len=8, rule="local_leap", steps=steps, cache=cache, early_stop=False, **LOW)
    (our_steps,), result = ours(lm, [prompt], cfg)
    ref_steps, ref_canvas, ref_nfe = theirs(lm, prompt, cfg)
    assert our_steps == ref_steps and result.nfe == ref_nfe
    assert result.canvas[0].tolist() == ref_canvas.tolist()
    assert result.nfe < steps                                  # some step leapt past the schedule


@pytest.mark.parametrize("cache", ["none", "dual"])
@pytest.mark.parametrize("fixture", ["llada64", "dream64"])
def test_left_padded_batch_equals_its_rows(fixture, cache, request):
    lm = request.getfixturevalue(fixture)
    prompts = [lm.encode(p, chat=True) for p in ("Hi.", HEAVY_PROMPT, "Explain the block-wise KV cache, please.")]
    cfg = DecodeConfig(gen_len=16, block_len=8, rule="local_leap", cache=cache, early_stop=False, **LOW)
    steps, result = ours(lm, prompts, cfg)
    for r, prompt in enumerate(prompts):
        ref_steps, ref_canvas, _ = theirs(lm, prompt, cfg)
        assert [s for s in steps[r] if s] == [s for s in ref_steps if s]        # a finished row idles
        assert result.canvas[r].tolist() == ref_canvas.tolist()


@pytest.mark.parametrize("values,words", [
    (dict(rule="local_leap", confidence="neg_entropy"), "is not a probability"),
    (dict(rule="local_leap", leap_anchor=1.5), "leap_anchor"),
    (dict(rule="local_leap", leap_radius=-1), "leap_radius"),
])
def test_config_refusals_are_one_line(values, words):
    with pytest.raises(ConfigError, match=words) as err:
        DecodeConfig.from_dict(values)
    assert "\n" not in str(err.value)


def test_the_profile_and_the_cli():
    cfg = profiles.resolve(profiles.find("local-leap"), {})
    assert (cfg.rule, cfg.leap_anchor, cfg.leap_neighbor, cfg.leap_radius, cfg.cache) == ("local_leap", 0.9, 0.75, 4, "none")
    r = invoke("generate", "-P", "local-leap", "--leap-anchor", "0.3", "--leap-neighbor", "0.1", "-n", "64", "--json",
               "def add(a, b):")
    assert r.exit_code == 0, r.stderr
    record = json.loads(r.stdout)
    assert record["config"]["rule"] == "local_leap" and record["nfe"] < 64
