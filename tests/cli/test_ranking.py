"""Candidates ranked as the authors rank them (docs/specs/ranking.md): on peaked rows (maxima 20-100,
confidences ~0.99993 a few 1e-7 apart, LLaDA's vocabulary) fastdllm's order of the candidates in
fp32 and bf16 is the order of a float64 softmax-then-gather of the same logits (LLaDA's authors'
computation), exact ties included (duplicated rows, saturated ones); where the authors' softmax
runs in the logits' own dtype (`rounding`), the confidences are theirs bit for bit. The old
computation (the max added back into log Z in fp32) fails on the same fixture."""

from __future__ import annotations

import pytest
import torch

from fastdllm.decode.selection import predict

V = 126464                                            # LLaDA's vocabulary


def peaked(dtype, K=32, seed=0, gaps=(1e-7, 1e-6)):
    """(K, V): row i has its max at M_i in [20, 100] and rest mass r_i = 7e-5 + the sum of gaps drawn
    in `gaps`, so confidences 1 / (1 + r_i) sit ~0.99993, 1e-7 to 1e-6 apart, in a random order;
    rows 3 and 4 repeat rows 1 and 2 (exact ties), rows 5 and 6 are saturated (r below 1e-16)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(V, generator=g, dtype=torch.float64) * 2
    mass = noise.exp().sum()
    steps = torch.empty(K, dtype=torch.float64).uniform_(*gaps, generator=g)
    rest = (7e-5 + steps.cumsum(0))[torch.randperm(K, generator=g)]
    rest[5], rest[6] = 1e-18, 3e-20
    peak = torch.empty(K, dtype=torch.float64).uniform_(20, 100, generator=g)
    rows = noise[None, :] + (peak - (mass / rest).log())[:, None]
    top = torch.randint(0, V, (K,), generator=g)
    rows[torch.arange(K), top] = peak
    rows[3], rows[4] = rows[1], rows[2]
    return rows.to(dtype)[None]                        # (1, K, V)


def order(confidence: torch.Tensor) -> list[int]:
    """Highest first, the lowest position first among equal values (selection.select's order)."""
    return confidence.reshape(-1).sort(descending=True, stable=True).indices.tolist()


def float64_softmax_then_gather(logits):
    p = torch.softmax(logits.double(), -1)
    return p.gather(-1, p.argmax(-1, keepdim=True))[..., 0]


def add_back_in_fp32(logits):
    """predict's old confidence: exp(top - log Z) with log Z = log(sum exp(l - max)) + max in fp32."""
    x = logits.float()
    return (x.amax(-1) - x.logsumexp(-1)).exp()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_candidates_rank_as_a_float64_softmax_then_gather(dtype, seed):
    logits = peaked(dtype, seed=seed)
    truth = float64_softmax_then_gather(logits)
    tokens, confidence = predict(logits, temperature=0, measure="prob", banned=[], generator=None)
    assert torch.equal(tokens, logits.argmax(-1))
    assert order(confidence) == order(truth)
    assert confidence[0, 3] == confidence[0, 1] and confidence[0, 4] == confidence[0, 2]     # ties stay ties
    assert confidence[0, 5] == confidence[0, 6] == truth[0, 5] == 1.0                        # saturated alike
    if dtype == torch.float32:                         # the fixture shows the old rounding (bf16 rows are coarser)
        assert order(add_back_in_fp32(logits)) != order(truth)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("measure", ["prob", "margin", "neg_entropy"])
def test_in_the_authors_dtype_the_confidences_are_their_softmax_then_gather(dtype, measure):
    """Dream's authors take torch.softmax in the logits' dtype, and its token is that softmax's
    argmax: with softmax_dtype the tokens and confidences are theirs bit for bit, roundings and
    ties included (torch's fp32 softmax is itself off by ~4e-6 on these rows; bf16 ties a lot)."""
    logits = peaked(dtype, seed=3)
    probs = torch.softmax(logits, -1)
    conf, tokens = probs.max(-1)
    if measure == "margin":
        top2 = probs.sort(-1, descending=True).values
        conf = top2[..., 0] - top2[..., 1]
    elif measure == "neg_entropy":
        conf = torch.sum(probs * torch.log(probs + 1e-10), -1)
    mine = predict(logits, temperature=0, measure=measure, banned=[], generator=None, softmax_dtype=dtype)
    assert torch.equal(mine[0], tokens) and mine[1].dtype == dtype and torch.equal(mine[1], conf)


def test_margin_and_entropy_rank_as_float64():
    logits = peaked(torch.float32, seed=4)
    p = torch.softmax(logits.double(), -1)
    top2 = p.topk(2, -1).values
    _, margin = predict(logits, temperature=0, measure="margin", banned=[], generator=None)
    _, entropy = predict(logits, temperature=0, measure="neg_entropy", banned=[], generator=None)
    assert order(margin) == order(top2[..., 0] - top2[..., 1])
    truth = (p * (p + 1e-10).log()).sum(-1)
    close = (truth[0, :, None] - truth[0, None, :]).abs() < 1e-6          # the fp32 entropy's own resolution
    agree = (entropy[0, :, None] > entropy[0, None, :]) == (truth[0, :, None] > truth[0, None, :])
    assert (agree | close).all()


@pytest.mark.parametrize("rule, extra", [("fixed", {"steps": 16}), ("threshold", {"threshold": 0.95}),
                                         ("factor", {"factor": 1.0})])
def test_exact_ties_go_to_the_lowest_position_first(rule, extra):
    """docs/specs/ranking.md's decision: among equal confidences the lowest position is committed first,
    in every rule and batch row, whatever else the row holds (saturated rows at 1.0, a block's
    end-of-text padding). A row whose ties are shuffled among other values keeps the same choice."""
    from fastdllm.decode.config import DecodeConfig
    from fastdllm.decode.selection import select

    cfg = DecodeConfig.from_dict({"gen_len": 32, "block_len": 32, "rule": rule, **extra})
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(2, 32, generator=g, dtype=torch.float64) * 0.5     # all below the tied ones
    tied = [30, 4, 17, 9]                                                # saturated, in no order
    conf[:, tied] = 1.0
    candidate = torch.ones(2, 32, dtype=torch.bool)
    candidate[1, 4] = False                                              # row 1: one tie is not a candidate
    chosen = select(conf, candidate, cfg, scheduled=torch.tensor([2, 2]))
    firsts = {0: [4, 9, 17, 30], 1: [9, 17, 30]}
    for row in (0, 1):
        picked = chosen[row].nonzero().flatten().tolist()
        n = len(picked)
        assert n >= 1 and set(picked) <= set(range(32))
        ties_taken = [p for p in picked if p in tied]
        assert ties_taken == firsts[row][:len(ties_taken)] and len(ties_taken) == min(n, len(firsts[row]))
    if rule == "fixed":                                                  # the schedule's 2: the two lowest ties
        assert chosen[0].nonzero().flatten().tolist() == [4, 9]
        assert chosen[1].nonzero().flatten().tolist() == [9, 17]


def test_lowest_first_is_torch_topk_on_the_cpu_for_one_token_a_step():
    """The authors' baseline (one token a step over a whole canvas) takes torch.topk(conf, 1); on the
    CPU its kernel keeps the first of equal maxima (what docs/specs/ranking.md measured), as fastdllm does;
    for larger k its order among ties is the kernel's, which the decision does not follow."""
    conf = torch.zeros(100, dtype=torch.float64)
    conf[[12, 32, 34, 18]] = 1.0
    assert torch.topk(conf, 1).indices.tolist() == [12]
    assert order(conf)[:4] == [12, 18, 32, 34]
