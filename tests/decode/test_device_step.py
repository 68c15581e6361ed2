"""The device step (decode/device_step.py): forward, predict, select and commit as device tensor ops
with static shapes, the candidates and the schedule read from the device canvas. On CPU no graph is
captured, so what is tested here is the step's arithmetic: the same tokens, the same commit order
(positions per step), the same NFE as today's path, in float64, for every cache mode, the threshold,
factor and fixed rules, batch 1 and a left-padded batch, and at most one host read per step. The
graph replay of the whole step needs a GPU: benchmarks/gpu_check.py."""

from __future__ import annotations

import pytest
import torch
from device_batches import BATCHES, assert_same, decode, prompts_of

from fastdllm.decode import device_step
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.device_step import DeviceStep

HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


def config(cache, rule, **kw):
    return DecodeConfig(gen_len=24, block_len=8, cache=cache, rule=rule, threshold=0.5, factor=1.5,
                        steps=12 if rule == "fixed" else None, early_stop=False, **kw)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("rule", ["threshold", "factor", "fixed"])
def test_device_step_equals_todays_path(family, batch, cache, rule, request, monkeypatch, one_thread):
    lm = request.getfixturevalue(f"{family}64")
    prompts = prompts_of(lm, BATCHES[batch])
    cfg = config(cache, rule)
    today = decode(lm, prompts, cfg, monkeypatch, full_block=False, on_device=False)    # masked positions only
    new = decode(lm, prompts, cfg, monkeypatch, full_block=True, on_device=True)
    assert_same(today, new)
    assert max(len(row) for s in today[0] for row in s[3]) > 1           # some steps commit several tokens


@pytest.mark.parametrize("extra", [dict(rule="fixed", steps=24, refresh_every=3), dict(rule="dynamic", steps=12),
                                   dict(rule="threshold", confidence="margin"), dict(rule="dinfer", threshold=0.9),
                                   dict(rule="sequential", steps=12),
                                   dict(rule="entropy_bounded", confidence="neg_entropy", entropy_budget=1.0)],
                         ids=["refresh", "dynamic", "margin", "dinfer", "sequential", "entropy_bounded"])
def test_device_step_other_rules_and_refreshes(extra, llada64, monkeypatch, one_thread):
    prompts = prompts_of(llada64, BATCHES["padded"])
    cfg = DecodeConfig.from_dict(extra, config("dual", "threshold"))
    today = decode(llada64, prompts, cfg, monkeypatch, full_block=False, on_device=False)
    assert_same(today, decode(llada64, prompts, cfg, monkeypatch, full_block=True, on_device=True))


def test_device_step_rows_of_other_lengths_and_early_stop(llada64, monkeypatch, one_thread):
    """Rows shorter than the batch's longest (their blocks past the end hold no mask), early stop on."""
    prompts = prompts_of(llada64, BATCHES["padded"])
    cfg = DecodeConfig(gen_len=24, block_len=8, cache="dual", threshold=0.7)
    kw = dict(gen_lens=[8, 24, 16])
    today = decode(llada64, prompts, cfg, monkeypatch, full_block=False, on_device=False, **kw)
    assert_same(today, decode(llada64, prompts, cfg, monkeypatch, full_block=True, on_device=True, **kw))


@pytest.mark.parametrize("rule,confidence", [("threshold", "prob"), ("fixed", "random")])
def test_device_step_sampled_equals_the_full_block_path(rule, confidence, dream64, monkeypatch, one_thread):
    """Seeded sampling draws noise of the candidates' shape: the device step equals today's
    full-block path (the one CUDA graphs take today), draw for draw."""
    prompts = prompts_of(dream64, BATCHES["padded"])
    cfg = config("dual", rule, temperature=0.8, seed=3, confidence=confidence)
    today = decode(dream64, prompts, cfg, monkeypatch, full_block=True, on_device=False)
    assert_same(today, decode(dream64, prompts, cfg, monkeypatch, full_block=True, on_device=True))


def test_one_host_read_per_step_and_none_inside(llada64, monkeypatch, one_thread):
    """Inside a device step (forward, predict, select, commit) nothing is read on the host but the
    step's one record (to_host); the engine's other per-step work reads only its host copy."""
    reads, calls, inside = [], [], [False]

    def counting(name, original):
        def wrapper(self, *args, **kwargs):
            if inside[0]:
                reads.append(name)
            return original(self, *args, **kwargs)
        return wrapper

    for name in HOST_READS:
        if hasattr(torch.Tensor, name):
            monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    step = DeviceStep.__call__

    def watched(self, span):
        inside[0] = True
        try:
            return step(self, span)
        finally:
            inside[0] = False
            calls.append(len(reads))
            reads.clear()

    monkeypatch.setattr(DeviceStep, "__call__", watched)
    transfers = []
    monkeypatch.setattr(device_step, "to_host", lambda t: transfers.append(t.numel()) or t.clone())
    prompts = prompts_of(llada64, BATCHES["padded"])
    _, result = decode(llada64, prompts, config("dual", "threshold"), monkeypatch, full_block=True, on_device=True)
    assert len(calls) == result.nfe and set(calls) == {0}               # no host read in the step's body
    assert transfers == [3 * len(prompts) * 8] * result.nfe             # one record (3, B, L) per step


def test_device_step_applies_to_the_common_case_only():
    assert DeviceStep.applies(DecodeConfig(), causal=False)
    assert all(DeviceStep.applies(DecodeConfig(rule=r, steps=256 if r == "fixed" else None), causal=False)
               for r in ("threshold", "factor", "fixed", "dinfer"))
    assert not DeviceStep.applies(DecodeConfig(), causal=True)          # SDAR, Fast-dLLM v2, LLaDA2.x
    assert not DeviceStep.applies(DecodeConfig(block_len=32, sub_block_len=8), causal=False)
    assert not DeviceStep.applies(DecodeConfig(credit=True), causal=False)
    assert not DeviceStep.applies(DecodeConfig(rule="dilated"), causal=False)
    assert not DeviceStep.applies(DecodeConfig(gen_len=32, block_len=32, rule="entropy_schedule",
                                               confidence="entropy"), causal=False)
    assert not DeviceStep.applies(DecodeConfig(gen_len=32, block_len=32, rule="eb_gamma", steps=8,
                                               confidence="logprob"), causal=False)


def test_infilling_on_the_device_step(llada64, monkeypatch, one_thread):
    from fastdllm.decode.infill import for_model, parse

    filling = for_model(llada64, parse("def add(a, b):\n    return <|mask:6|>\n\nprint(add(<|mask:5|>))"), 8)
    cfg = DecodeConfig(gen_len=8, block_len=8, cache="dual", threshold=0.7, early_stop=False)
    kw = dict(holes=filling.holes)
    today = decode(llada64, [filling.ids], cfg, monkeypatch, full_block=False, on_device=False, **kw)
    assert_same(today, decode(llada64, [filling.ids], cfg, monkeypatch, full_block=True, on_device=True, **kw))
