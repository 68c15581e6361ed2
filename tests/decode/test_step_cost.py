"""The step's own cost without changing its numbers: `predict` (maxima in the logits' dtype, one
fused upcast buffer for the exponents, the banned ids left out by views) gives the tokens of the
plain full-copy computation and the confidences of a float64 softmax-then-gather, in float64, fp32
and bf16, for every measure, greedy and sampled (tests/cli/test_ranking.py: their order on peaked rows)."""

from __future__ import annotations

import math

import pytest
import torch

from fastdllm.decode.selection import exp_floor, max_without, predict, rest_mass

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MEASURES = ["prob", "margin", "neg_entropy", "random"]


pytestmark = pytest.mark.sweep   # each test's first case in the fast lane, the rest in the full suite (tests/conftest.py)


def plain_predict(logits, *, temperature, measure, banned, generator):
    """The straightforward computation: a float64 copy of the whole logits and its softmax, an
    index_fill copy for the banned ids (sampling draws its noise at fp32-or-better, as predict)."""
    work = torch.promote_types(logits.dtype, torch.float32)
    p = torch.softmax(logits.double(), -1)
    sorted_p = p.sort(-1, descending=True).values
    filled = logits.to(work).index_fill(-1, banned, float("-inf"))
    if temperature > 0:
        u = torch.rand(logits.shape, generator=generator, dtype=work)
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
        tokens = (filled / temperature + gumbel).argmax(-1)
    else:
        tokens = filled.argmax(-1)
    confidence = {"prob": lambda: p.gather(-1, tokens[..., None])[..., 0],
                  "margin": lambda: sorted_p[..., 0] - sorted_p[..., 1],
                  "neg_entropy": lambda: (p * (p + 1e-10).log()).sum(-1),
                  "random": lambda: torch.rand(tokens.shape, generator=generator, dtype=work)}[measure]()
    return tokens, confidence


def tolerance(dtype, measure, reference):
    """float64 logits: rounding only. fp32 / bf16 logits: the exponents are fp32 (one ulp, 6e-8
    relative, each), so a probability p is off by at most ~1e-7 (1 - p) relative; the entropy's
    terms are fp32 too."""
    if measure == "random":
        return 0.0
    if dtype == torch.float64:
        return 1e-13 * reference.abs().clamp_min(1e-3)
    if measure == "neg_entropy":
        return 1e-6 * (reference.abs() + 1)
    return 2e-7 * reference.abs() * (1 - reference).abs() + 1e-13


def logits_like(dtype, K=7, V=3001, seed=0, scale=4.0):
    """scale 400: a peaked model's rows, most shifted terms below exp's normal range even in
    float64 (the floor that keeps CPU's exp off its slow path must leave every bit alone)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, K, V, generator=g) * scale
    x[0, 0, 11] = x[0, 0].max() + 3        # the banned id is row (0, 0)'s argmax
    x[1, 2, 40] = x[1, 2, 41] = x[1, 2].max() + 1   # a tie: the first index wins
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("measure", MEASURES)
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("scale", [4.0, 400.0])
def test_predict_is_the_float64_softmax_then_gather(dtype, measure, temperature, scale):
    logits = logits_like(dtype, scale=scale)
    before = logits.clone()
    for banned in ([11], [0, 11, 3000], []):
        ids = torch.tensor(banned, dtype=torch.long)
        new = predict(logits, temperature=temperature, measure=measure, banned=ids,
                      generator=torch.Generator().manual_seed(5))
        old = plain_predict(logits, temperature=temperature, measure=measure, banned=ids,
                            generator=torch.Generator().manual_seed(5))
        assert torch.equal(new[0], old[0]), banned
        assert new[1].dtype == (torch.float64 if measure != "random" else old[1].dtype)
        assert ((new[1] - old[1]).abs() <= tolerance(dtype, measure, old[1])).all(), (banned, (new[1] - old[1]).abs().max())
        assert not set(new[0].flatten().tolist()) & set(banned)
    assert torch.equal(logits, before)                                   # the caller's logits untouched


def test_banned_ids_may_come_as_host_ints():
    logits = logits_like(torch.bfloat16)
    a = predict(logits, temperature=0, measure="prob", banned=(11, 0), generator=None)
    b = predict(logits, temperature=0, measure="prob", banned=torch.tensor([0, 11]), generator=None)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_max_without_is_the_max_of_the_filled_logits(dtype):
    x = logits_like(dtype)
    x[1, 3, 7] = float("nan")                            # NaN wins, as in torch.max
    x[1, 4, :] = float("-inf")
    x[1, 4, 2000] = 0.0
    for ids in ([], [0], [7], [11, 12, 13], [0, 1, 2999, 3000]):
        filled = x.index_fill(-1, torch.tensor(ids, dtype=torch.long), float("-inf"))
        value, index = max_without(x, ids)
        ref_value, ref_index = filled.max(-1)
        assert torch.equal(index, ref_index), ids
        assert torch.equal(value.isnan(), ref_value.isnan())
        assert torch.equal(value.nan_to_num(), ref_value.nan_to_num())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("scale", [4.0, 400.0])
def test_the_rest_mass_leaves_out_the_rows_max_alone(dtype, scale):
    """r = sum of exp(l - max) over every entry but the max: a second entry equal to the max
    counts 1; a row of -inf but one entry has r = 0; the floor against x86's slow exp path adds
    nothing float64's 1 + r can see."""
    x = logits_like(dtype, K=33, V=32000, scale=scale)
    x[0, 5, :] = float("-inf")
    x[0, 5, 7] = 2.0
    peak, at = x.max(-1)
    work = torch.promote_types(dtype, torch.float32)
    rest, buffer = rest_mass(x, peak, at, work)
    assert rest.dtype == torch.float64 and buffer.dtype == work and buffer.shape == x.shape
    exact = torch.exp(x.double() - peak.double()[..., None]).scatter_(-1, at[..., None], 0.0).sum(-1)   # float64
    assert rest[0, 5] <= 32000 * math.exp(exp_floor(work)) and rest[1, 2] >= 1   # floored -inf; the tie counts 1
    floor = 32000 * math.exp(exp_floor(work))
    assert ((rest - exact).abs() <= 2e-7 * exact + floor).all()
    assert torch.equal((1 + rest) == 1, (1 + exact) == 1)                # saturated rows saturate alike
