"""Decoding rules on hand-made confidence tensors."""

from __future__ import annotations

import pytest
import torch

from fastdllm.decode.config import ConfigError, DecodeConfig
from fastdllm.decode.selection import fixed_schedule, predict, select

T, F = True, False


def pick(conf, cand=None, **cfg):
    conf = torch.tensor(conf, dtype=torch.float64)
    cand = torch.ones_like(conf, dtype=torch.bool) if cand is None else torch.tensor(cand)
    scheduled = cfg.pop("scheduled", None)
    return select(conf, cand, DecodeConfig(**cfg), scheduled=scheduled).tolist()


def test_threshold_inclusive_and_fallback_to_best():
    assert pick([[0.95, 0.9, 0.3, 0.89]], rule="threshold", threshold=0.9) == [[T, T, F, F]]
    # nobody clears the threshold: the single most confident is committed
    assert pick([[0.2, 0.5, 0.3]], rule="threshold", threshold=0.9) == [[F, T, F]]
    # rows are independent; non-candidates are never committed even when confident
    assert pick([[0.99, 0.95, 0.1], [0.1, 0.2, 0.3]], [[F, T, T], [T, T, T]], rule="threshold",
                threshold=0.9) == [[F, T, F], [F, F, T]]


def test_dinfer_rule_inclusive_with_a_band_around_the_best():
    d = dict(rule="dinfer", threshold=0.9)
    assert pick([[0.95, 0.9, 0.3, 0.89]], **d) == [[T, T, F, F]]                 # >= (dynamic: >)
    # nobody reaches it: the best one and every candidate within 1e-5 of it (threshold: the best only)
    assert pick([[0.5, 0.499995, 0.3, 0.49998]], **d) == [[T, T, F, F]]
    assert pick([[0.5, 0.499995, 0.3, 0.49998]], rule="threshold", threshold=0.9) == [[T, F, F, F]]
    # no schedule: one candidate left is always committed; non-candidates never are
    assert pick([[0.1, 0.99]], [[T, F]], **d) == [[T, F]]


def test_factor_rule_boundaries():
    f = dict(rule="factor", factor=1.0)
    # n = 1 only: rank 2 fails (3 * (1 - 0.6) = 1.2 >= 1)
    assert pick([[0.6, 0.99]], **f) == [[F, T]]
    # all pass: (2)(0.01) (3)(0.02) (4)(0.05) all < 1
    assert pick([[0.99, 0.98, 0.95]], **f) == [[T, T, T]]
    # at least one even if rank 1 "fails" the bound (2 * (1 - 0.1) = 1.8)
    assert pick([[0.1, 0.05]], **f) == [[T, F]]
    # the (n+1) eps = f edge is excluded (strict <): 0.75 gives 4 * 0.25 = 1 for rank 3
    assert pick([[1.0, 1.0, 0.75]], **f) == [[T, T, F]]
    assert pick([[1.0, 1.0, 0.7501]], **f) == [[T, T, T]]


def test_block_diffusion_rules():
    sched = torch.tensor([2])
    # dynamic: strictly above the threshold, at least the step's share of the schedule
    assert pick([[0.95, 0.9, 0.3, 0.91]], rule="dynamic", threshold=0.9, scheduled=sched) == [[T, F, F, T]]
    assert pick([[0.95, 0.9, 0.3, 0.89]], rule="dynamic", threshold=0.9, scheduled=sched) == [[T, T, F, F]]
    assert pick([[1.0, 1.0]], rule="dynamic", threshold=1.0, scheduled=torch.tensor([1])) == [[T, F]]
    # sequential: the leftmost candidates, whatever their confidence
    assert pick([[0.1, 0.9, 0.99, 0.5]], [[F, T, T, T]], rule="sequential", scheduled=sched) == [[F, T, T, F]]
    # entropy_bounded (confidence = sum p log p = -entropy): lowest entropies while the sum < budget
    eb = dict(rule="entropy_bounded", confidence="neg_entropy", entropy_budget=0.35)
    assert pick([[-0.2, -0.05, -0.1, -0.9]], **eb) == [[F, T, T, F]]          # 0.05 + 0.1 < 0.35; + 0.2 is not
    assert pick([[-0.2, -0.05, -0.1, -0.01]], **eb) == [[F, T, T, T]]         # 0.16 < 0.35
    assert pick([[-1.2, -2.0]], **eb) == [[T, F]]                              # at least one
    with pytest.raises(ConfigError, match="entropy_bounded rule needs confidence neg_entropy"):
        DecodeConfig(rule="entropy_bounded")


def test_fixed_schedule_counts_match_llada():
    sched = fixed_schedule(torch.tensor([32, 7, 0]), 4)
    assert sched.tolist() == [[8, 8, 8, 8], [2, 2, 2, 1], [0, 0, 0, 0]]
    assert pick([[0.1, 0.9, 0.5, 0.7]], rule="fixed", scheduled=torch.tensor([2])) == [[F, T, F, T]]
    # never more than the candidates; always at least one while candidates remain
    assert pick([[0.1, 0.9]], [[T, F]], rule="fixed", scheduled=torch.tensor([3])) == [[T, F]]
    assert pick([[0.1, 0.9]], rule="fixed", scheduled=torch.tensor([0])) == [[F, T]]


def test_predict_bans_mask_and_reports_probability():
    logits = torch.tensor([[[5.0, 1.0, 0.0], [0.0, 0.0, 9.0]]])     # mask id 0 would win row 0
    full = torch.softmax(logits.double(), -1)
    tokens, conf = predict(logits, temperature=0, measure="prob", banned=torch.tensor([0]), generator=None)
    assert tokens.tolist() == [[1, 2]]
    # the probability under the full softmax, the banned mask id in its normaliser (as every author)
    assert torch.allclose(conf, full[..., 1:].max(-1).values, rtol=1e-7, atol=0)   # fp32 exponents
    assert torch.equal(torch.softmax(logits.double(), -1), full)     # the caller's logits are left alone
    assert conf.dtype == torch.float64                               # as a float64 softmax gives it


def test_every_measure_keeps_the_banned_id_in_the_distribution():
    """p(mask) = 0.3 here: the banned id changes the prediction only, never the distribution the
    confidence is measured on (Dream's maskgit_plus, topk_margin, entropy)."""
    p = torch.tensor([[[0.3, 0.5, 0.15, 0.05]]], dtype=torch.float64)       # id 0 banned
    banned = torch.tensor([0])
    got = {m: predict(p.log(), temperature=0, measure=m, banned=banned, generator=None) for m in ("prob", "margin", "neg_entropy")}
    assert all(tokens.tolist() == [[1]] for tokens, _ in got.values())
    assert got["prob"][1].item() == pytest.approx(0.5, abs=1e-12)             # not 0.5 / 0.7
    assert got["margin"][1].item() == pytest.approx(0.5 - 0.3, abs=1e-12)     # top-2 of the full softmax
    assert got["neg_entropy"][1].item() == pytest.approx((p * (p + 1e-10).log()).sum().item(), abs=1e-12)


def test_confidence_measures():
    logits = torch.log(torch.tensor([[[0.6, 0.3, 0.1]]], dtype=torch.float64))
    none = torch.tensor([], dtype=torch.long)
    _, margin = predict(logits, temperature=0, measure="margin", banned=none, generator=None)
    _, negent = predict(logits, temperature=0, measure="neg_entropy", banned=none, generator=None)
    assert margin.item() == pytest.approx(0.3)
    p = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    assert negent.item() == pytest.approx((p * p.log()).sum().item())
    # a banned id (p = 0) does not turn the entropy into nan
    _, negent = predict(logits, temperature=0, measure="neg_entropy", banned=torch.tensor([2]), generator=None)
    assert torch.isfinite(negent).all()


def test_seeded_sampling_is_reproducible_and_varies_with_seed():
    logits = torch.zeros(2, 6, 50)
    draw = lambda seed: predict(logits, temperature=1.0, measure="prob", banned=torch.tensor([0]),
                                generator=torch.Generator().manual_seed(seed))[0]
    assert torch.equal(draw(1), draw(1))
    assert not torch.equal(draw(1), draw(2))
    assert (draw(3) != 0).all()


@pytest.mark.parametrize("values, message", [
    (dict(gen_len=100, block_len=32), "not a multiple"),
    (dict(rule="fixed", gen_len=64, block_len=32, steps=33), "not divisible"),
    (dict(threshold=0.0), "greater than 0"),
    (dict(threshold=1.5), "above the maximum"),
    (dict(factor=0.0), "greater than 0"),
    (dict(cache="both"), "not one of"),
    (dict(rule="threshold", confidence="neg_entropy"), "not a probability"),
])
def test_config_validation(values, message):
    with pytest.raises(ConfigError, match=message):
        DecodeConfig(**values)


def test_config_from_dict_parses_strings_and_suggests_names():
    cfg = DecodeConfig.from_dict({"gen-len": "64", "threshold": "0.8", "early_stop": "off", "refresh_every": "none"})
    assert (cfg.gen_len, cfg.threshold, cfg.early_stop, cfg.refresh_every) == (64, 0.8, False, None)
    with pytest.raises(ConfigError, match="did you mean 'threshold'"):
        DecodeConfig.from_dict({"treshold": 0.5})
    with pytest.raises(ConfigError, match="expected int"):
        DecodeConfig.from_dict({"gen_len": "lots"})
