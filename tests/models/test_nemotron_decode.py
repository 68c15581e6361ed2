"""Nemotron-Labs Diffusion's decoders (decode/seeded.py) step by step against float64
transcriptions of the checkpoint's `generate` (tests/references/reference_nemotron.py): the seeds, the
positions committed at every step and the tokens, NFE, with and without a threshold, prompts on and
off the block grid, positions past original_max_position_embeddings, a batch equal to its rows alone,
an answer that ends mid-block."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import reference_nemotron as ref

from fastdllm.checkpoints.loading import load
from fastdllm.testing.tiny_nemotron import EOS_ID
from fastdllm.decode.config import DecodeConfig
from fastdllm.decode.engine import generate
from fastdllm.decode.events import BlockEvent, Result, StepEvent
from fastdllm.errors import UserError

pytestmark = pytest.mark.usefixtures("one_thread")          # tests/conftest.py
L = 8


@pytest.fixture(scope="module")
def tiny_dir(tiny):
    return tiny("nemotron", dtype=torch.float32, block_size=L)


@pytest.fixture(scope="module")
def lm(tiny_dir):
    return load(tiny_dir, dtype="fp64", device="cpu")


@pytest.fixture(scope="module")
def naive(tiny_dir):
    return ref.load(tiny_dir)


def prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(1000, 1256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def cfg(threshold: float | None, gen_len=3 * L, **kw) -> DecodeConfig:
    rule = dict(rule="threshold", threshold=threshold) if threshold is not None else dict(rule="fixed")
    return DecodeConfig(gen_len=gen_len, block_len=L, cache="prefix", **rule, **kw)


def ours(lm, prompts, c):
    """(steps: list of (block, step, committed positions per row, tokens written), result)."""
    steps, result = [], None
    for event in generate(lm.decoder, prompts, c):
        if isinstance(event, StepEvent):
            steps.append(event)
        elif isinstance(event, Result):
            result = event
    return steps, result


def reference_steps(trace, P):
    """The transcription's trace as (block, step, committed generation-relative positions of row 0)."""
    out = []
    for k, (_, steps) in enumerate(trace):
        for i, committed, _ in steps:
            out.append((k, i, sorted(k * L + j for j in committed[0])))
    return out


@pytest.mark.parametrize("n", [16, 21, 37])               # on the grid, off it, long (positions past 16 and 32)
@pytest.mark.parametrize("threshold", [0.3, None])
def test_generate_step_by_step(lm, naive, n, threshold):
    W, config = naive
    p = prompt(n, n)
    c = cfg(threshold, early_stop=True)
    steps, result = ours(lm, [p], c)
    out, nfe, trace = ref.generate(W, config, torch.tensor([p]), c.gen_len, L, threshold)
    expected_answer = out[0, n:].tolist()
    if EOS_ID in expected_answer:
        expected_answer = expected_answer[:expected_answer.index(EOS_ID)]
    assert result.ids[0] == expected_answer
    # seeds: the prefill's and each commit pass's token is the block's first
    seeds = [int(e.tokens[0, 0]) for e in steps if e.step == -1]
    assert seeds == [int(s[0]) for s, _ in trace][:len(seeds)]
    denoise = [(e.block, e.step, sorted(e.positions[0][e.committed[0]].tolist())) for e in steps if e.step >= 0]
    assert denoise == reference_steps(trace, n)
    # NFE: C counts denoise steps and commit passes, not the prefill; we run the prefill and skip
    # the last commit pass (its seed is never used)
    assert result.nfe == nfe
    assert result.nfe == len(steps)
    if threshold is None:               # the even schedule: one token per step, L - 1 steps a block
        assert all(int(e.committed[0].sum()) == 1 for e in steps if e.step >= 0)


def test_threshold_commits_several(lm, naive):
    """The threshold run commits several positions at some step (the test above checks which)."""
    steps, _ = ours(lm, [prompt(21, 21)], cfg(0.3))
    assert max(int(e.committed[0].sum()) for e in steps if e.step >= 0) > 1


def test_batch_rows_equal_rows_alone(lm):
    prompts = [prompt(16, 1), prompt(21, 2), prompt(9, 3)]
    for threshold in (0.3, None):
        c = cfg(threshold)
        _, batched = ours(lm, prompts, c)
        for r, p in enumerate(prompts):
            _, alone = ours(lm, [p], c)
            assert batched.ids[r] == alone.ids[0]
            assert torch.equal(batched.canvas[r], alone.canvas[0])


def test_stop_mid_block(lm, naive, tmp_path):
    """A checkpoint whose eos is a token it predicts: the row stops inside a block as C does."""
    W, config = naive
    p = prompt(21, 21)
    _, result = ours(lm, [p], cfg(0.3))
    token = result.ids[0][L + 3]                     # a token decoded in the second block
    config = {**config, "eos_token_id": token}
    out, nfe, trace = ref.generate(W, config, torch.tensor([p]), 3 * L, L, 0.3)
    decoder = replace(lm.decoder, specials=replace(lm.decoder.specials, stops=(token,)))
    events = list(generate(decoder, [p], cfg(0.3)))
    got = events[-1]
    expected = out[0, 21:].tolist()
    assert got.ids[0] == expected[:expected.index(token)]
    assert got.nfe == nfe and got.blocks_decoded < 3 and out.shape[1] < 21 + 3 * L
    assert sum(isinstance(e, BlockEvent) for e in events) == got.blocks_decoded


@pytest.mark.parametrize("change, words", [(dict(cache="dual"), "cache dual"), (dict(rule="eb_sampler"), "rule"),
                                            (dict(sub_block_len=4), "sub-blocks")])
def test_refusals_are_one_line(lm, change, words):
    with pytest.raises(UserError, match=words):
        list(generate(lm.decoder, [prompt(5)], DecodeConfig(gen_len=L, block_len=L, **{"cache": "prefix", **change})))


def test_other_families_decode_by_diffusion_only(llada64):
    with pytest.raises(UserError, match="mode ar"):
        list(generate(llada64.decoder, [[5, 6, 7]], DecodeConfig(gen_len=L, block_len=L, mode="ar")))


def test_sampling_is_seeded_and_rows_stay_independent(lm):
    """temperature > 0 (fastdllm's own seeded Gumbel-max; C's global-RNG draws are not reproduced):
    the same seed gives the same tokens, another seed others."""
    p = prompt(21, 21)
    a = ours(lm, [p], cfg(0.3, temperature=1.0, seed=1))[1].ids[0]
    assert a == ours(lm, [p], cfg(0.3, temperature=1.0, seed=1))[1].ids[0]
    assert a != ours(lm, [p], cfg(0.3, temperature=1.0, seed=2))[1].ids[0]


def test_the_reference_couples_batch_rows(lm, naive):
    """Why fastdllm's rows are independent (docs §3): C's generate breaks a block for the whole
    batch when one row meets its stop, so a row's tokens depend on its batch mate."""
    W, config = naive
    p, q = prompt(21, 21), prompt(21, 2)
    _, result = ours(lm, [p], cfg(0.3))
    token = result.ids[0][L + 3]
    config = {**config, "eos_token_id": token}
    both, _, _ = ref.generate(W, config, torch.tensor([p, q]), 3 * L, L, 0.3)
    alone, _, _ = ref.generate(W, config, torch.tensor([q]), 3 * L, L, 0.3)
    n = min(alone.shape[1], both.shape[1])
    decoder = replace(lm.decoder, specials=replace(lm.decoder.specials, stops=(token,)))
    ours_both = list(generate(decoder, [p, q], cfg(0.3)))[-1]
    ours_alone = list(generate(decoder, [q], cfg(0.3)))[-1]
    assert ours_both.ids[1] == ours_alone.ids[0]
    assert not torch.equal(both[1, :n], alone[0, :n])
