"""The step's own cost without changing its numbers: `predict` (maxima in the logits' dtype, one
fused upcast buffer for the normaliser, the banned ids left out by views) gives exactly what the
plain full-copy computation gives: tokens equal, confidences equal bit for bit, in float64, fp32
and bf16, for every measure, greedy and sampled."""

from __future__ import annotations

import pytest
import torch

from fastdllm.decode.selection import logsumexp_from, max_without, predict

DTYPES = [torch.float64, torch.float32, torch.bfloat16]
MEASURES = ["prob", "margin", "neg_entropy", "random"]


def plain_predict(logits, *, temperature, measure, banned, generator):
    """The straightforward computation (predict as it was): an fp32-or-better copy of the whole
    logits, torch.logsumexp, an index_fill copy for the banned ids."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_z = logits.logsumexp(-1, keepdim=True)
    if measure == "margin":
        top2 = (logits.topk(2, dim=-1).values - log_z).exp()
        margin = top2[..., 0] - top2[..., 1]
    elif measure == "neg_entropy":
        p = (logits - log_z).exp()
        entropy = (p * (p + 1e-10).log()).sum(-1)
    logits = logits.index_fill(-1, banned, float("-inf"))
    if temperature > 0:
        u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype)
        gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
        tokens = (logits / temperature + gumbel).argmax(-1)
        top = logits.gather(-1, tokens[..., None])[..., 0]
    else:
        top, tokens = logits.max(-1)
    confidence = {"prob": lambda: (top - log_z[..., 0]).exp(), "margin": lambda: margin,
                  "neg_entropy": lambda: entropy,
                  "random": lambda: torch.rand(tokens.shape, generator=generator, dtype=logits.dtype)}[measure]()
    return tokens, confidence


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
def test_predict_equals_the_plain_computation(dtype, measure, temperature, scale):
    logits = logits_like(dtype, scale=scale)
    before = logits.clone()
    for banned in ([11], [0, 11, 3000], []):
        ids = torch.tensor(banned, dtype=torch.long)
        new = predict(logits, temperature=temperature, measure=measure, banned=ids,
                      generator=torch.Generator().manual_seed(5))
        old = plain_predict(logits, temperature=temperature, measure=measure, banned=ids,
                            generator=torch.Generator().manual_seed(5))
        assert torch.equal(new[0], old[0]), banned
        assert new[1].dtype == old[1].dtype and torch.equal(new[1], old[1]), banned
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
def test_logsumexp_from_is_torch_logsumexp_bit_for_bit(dtype, scale):
    x = logits_like(dtype, K=33, V=32000, scale=scale)
    x[0, 5, :] = float("-inf")                          # an empty row: -inf, as torch's
    x[1, 6, 9] = float("inf")                           # an infinite max shifts by 0
    work = torch.promote_types(dtype, torch.float32)
    log_z, buffer = logsumexp_from(x, x.amax(-1), work)
    ref = x.to(work).logsumexp(-1, keepdim=True)
    assert log_z.dtype == buffer.dtype == work and buffer.shape == x.shape
    assert torch.equal(log_z.isnan(), ref.isnan())
    assert torch.equal(log_z.nan_to_num(), ref.nan_to_num())
