"""The reference's own switches (its factor quirk) and fp32 decoding against tests/reference.py. The
float64 step-by-step equality for LLaDA and Dream (every rule, cache mode and confidence measure)
is the shared runner's (tests/references/test_exactness.py)."""

from __future__ import annotations

import pytest
import torch
from conftest import HEAVY_PROMPT
from reference import reference_generate

from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import StepEvent, generate

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.sweep]   # tiny float64 ops (tests/conftest.py)


def ours(lm, prompt, cfg):
    steps, result = [], None
    for event in generate(lm.decoder, [prompt], cfg):
        if isinstance(event, StepEvent):
            P = len(prompt)
            picked = event.positions[event.committed] + P
            rows = event.committed.nonzero()[:, 0]
            steps.append(sorted([int(r), int(c)] for r, c in zip(rows, picked)))
        else:
            result = event
    return steps, result


def theirs(lm, prompt, cfg, **quirks):
    record = []
    rule = {"fixed": {}, "threshold": {"threshold": cfg.threshold}, "factor": {"factor": cfg.factor}}[cfg.rule]
    canvas, nfe = reference_generate(
        lm, torch.tensor([prompt]), cache=cfg.cache, gen_length=cfg.gen_len, block_length=cfg.block_len,
        steps=cfg.total_steps, mask_id=lm.specials.mask, record=record, **rule, **quirks)
    return [sorted(s) for s in record], canvas[0, len(prompt):], nfe


def test_reference_factor_quirk_differs_from_paper_rule():
    """The reference commits every candidate when only the last-ranked one fails its bound; with two
    masks left it always commits both. fastdllm follows the paper: (n+1)(1 - c_n) < f."""
    from reference import transfer

    from fastdllm.decode.selection import select

    conf = torch.tensor([[0.99, 0.5]], dtype=torch.float64)     # rank 2: 3 * 0.5 = 1.5 >= f = 1
    cand = torch.tensor([[True, True]])
    ours_pick = select(conf, cand, DecodeConfig(rule="factor", factor=1.0))
    assert ours_pick.tolist() == [[True, False]]
    logits = torch.log(torch.tensor([[[0.99, 0.01, 0.0], [0.5, 0.0, 0.5]]], dtype=torch.float64))
    x = torch.tensor([[2, 2]])
    for quirk, expected in ((True, [[True, True]]), (False, [[True, False]])):
        _, chosen, _ = transfer(logits, cand, x, None, None, 1.0, mask_id=2, factor_quirk=quirk, ban_mask=False)
        assert chosen.tolist() == expected


def test_quirk_flag_changes_reference_on_a_model(llada64):
    """On real decoding the quirk matters: the quirky reference takes fewer forwards than the paper rule."""
    prompt = llada64.encode("Write a function that adds two numbers.", chat=True)
    cfg = DecodeConfig(gen_len=32, block_len=8, cache="dual", rule="factor", factor=1.0, early_stop=False)
    _, _, nfe_paper = theirs(llada64, prompt, cfg)
    _, _, nfe_quirk = theirs(llada64, prompt, cfg, factor_quirk=True)
    assert nfe_quirk < nfe_paper


@pytest.fixture(scope="module")
def llada32_peaked(tmp_path_factory):
    """fp32 with large logits (up to ~140: the head scaled 20x), confidences up to 0.99999999 a few
    1e-7 apart: where fp32 rounding of the normaliser used to pick another token (15 of 32 equal)."""
    from fastdllm.checkpoints import loading
    from fastdllm.testing.tiny_random import FIXTURES, write_llada

    path = write_llada(tmp_path_factory.mktemp("peaked") / "tiny-llada", init_std=0.3, logit_scale=20.0, fixtures=FIXTURES)
    return loading.load(path, dtype="fp32")


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("rule", ["fixed", "threshold"])
def test_fp32_with_large_logits_decodes_as_the_reference_in_fp32(llada32_peaked, cache, rule):
    """The reference's forward in fp32 and its float64 softmax of those logits (LLaDA's authors'):
    the same tokens at the same steps as fastdllm in fp32 (docs/specs/ranking.md)."""
    lm = llada32_peaked
    prompt = lm.encode(HEAVY_PROMPT, chat=True)
    extra = {"threshold": 0.9} if rule == "threshold" else {"steps": 32}
    cfg = DecodeConfig(gen_len=32, block_len=16, cache=cache, rule=rule, early_stop=False, **extra)
    our_steps, result = ours(lm, prompt, cfg)
    record = []
    canvas, nfe = reference_generate(lm, torch.tensor([prompt]), cache=cache, gen_length=32, block_length=16, steps=32,
                                     mask_id=lm.specials.mask, record=record, dtype=torch.float32,
                                     **({"threshold": 0.9} if rule == "threshold" else {}))
    assert (our_steps, result.nfe) == ([sorted(s) for s in record], nfe)
    assert result.canvas[0].tolist() == canvas[0, len(prompt):].tolist()
